"""The estimation model of sabre_estimate (plpython/preflight/estimate.py) without a server: SA counts
from pg_stats-like statistics, the hint's search, the knee of the suggest curve."""
from __future__ import annotations

import numpy as np
import pytest

from sabre_pg.core.hierarchy import Hierarchy
from sabre_pg.core.sabre import plan_from_counts
from tests.client.fake_plpy import FakePlpy, sabre_plpy

est = sabre_plpy("preflight.estimate")
request = sabre_plpy("stages.request")
errors = sabre_plpy("shared.errors")


def stats(**kw):
    base = dict(reltuples=1000.0, null_frac=0.0, n_distinct=3.0)
    base.update(kw)
    return est.ColumnStatistics(**base)


def test_n_distinct_negative_is_a_fraction_of_the_rows():
    assert stats(n_distinct=-0.25, reltuples=4000.0).distinct() == 1000
    assert stats(n_distinct=12.0).distinct() == 12


def test_rest_below_float4_noise_means_a_complete_mcv_list():
    s = stats(null_frac=0.1, mcv_values=(1.0, 2.0), mcv_freqs=(0.4, 0.49999997))
    assert s.rest() == 0.0 and s.others() == 0
    s = stats(n_distinct=10.0, mcv_values=(1.0, 2.0), mcv_freqs=(0.4, 0.3))
    assert s.rest() == pytest.approx(0.3) and s.others() == 8


@pytest.mark.parametrize("weights, total", [([1, 1, 1], 10), ([0.5, 0.25, 0.25], 7), ([3, 0, 1], 1), ([1], 0)])
def test_apportion_sums_to_the_total_and_follows_the_weights(weights, total):
    out = est.apportion(weights, total)
    assert out.sum() == total and out.dtype == np.int64
    w = np.asarray(weights, float) / sum(weights)
    assert np.all(np.abs(out - w * total) < 1)


def test_fill_spreads_equally_within_each_rooms():
    assert est.fill(7, 3).tolist() == [3, 2, 2]
    assert est.fill(10, 3, [1, 100, 100]).tolist() == [1, 5, 4]
    assert est.fill(50, 3, [1, 2, 3]).tolist() == [1, 2, 3]       # no more than the room
    assert est.fill(0, 2, [5, 5]).tolist() == [0, 0]


def test_complete_mcv_list_gives_the_frequencies_in_value_order():
    s = stats(null_frac=0.2, mcv_values=(30.0, 10.0, 20.0), mcv_freqs=(0.4, 0.3, 0.1))
    counts, domain = est.numerical_counts(s, 800, integer=True)
    assert counts.tolist() == [300, 100, 400] and domain.m == 3


def test_histogram_spreads_the_rest_over_the_other_values():
    bounds = tuple(float(x) for x in range(0, 101, 10))          # 10 buckets of 10 integers
    s = stats(reltuples=10_000.0, n_distinct=-0.009, mcv_values=(5.0, 55.0), mcv_freqs=(0.3, 0.2),
              histogram=bounds)
    assert s.distinct() == 90 and s.others() == 88
    counts, domain = est.numerical_counts(s, 10_000, integer=True)
    assert counts.sum() == 10_000 and domain.m == 90          # 2 MCVs + 11 bounds + 77 inside
    assert counts[5] == 3000 and 2000 in counts.tolist()     # the MCVs keep their rows (5 is 6th)
    values, shares = est.histogram_mass(bounds, s.rest(), s.others(), s.mcv_values, True)
    assert shares.sum() == pytest.approx(0.5)
    for lo in range(0, 100, 10):                              # equal mass per bucket: each of
        inside = shares[(values > lo) & (values < lo + 10)]     # its n points takes 1/(n + 1),
        assert len(inside) and inside == pytest.approx(0.05 / (len(inside) + 1))   # bounds half


def test_integer_buckets_hold_no_more_values_than_they_have_integers():
    bounds = (0.0, 2.0, 1000.0)                                  # 1 integer inside the first bucket
    values, _ = est.histogram_mass(bounds, 0.5, 500, (), True)
    assert np.count_nonzero((values > 0) & (values < 2)) == 1
    assert len(values) == 500                                    # the rest went to the wide bucket


def test_categorical_named_hierarchy_spreads_the_rest_over_the_other_leaves():
    h = Hierarchy([["a", "x", "*"], ["b", "x", "*"], ["c", "y", "*"], ["d", "y", "*"]], name="h")
    sa = request.Attr("sa", {"typname": "text"}, "categorical", "h")
    s = stats(n_distinct=4.0, mcv_values=("c", "a"), mcv_freqs=(0.5, 0.3))
    counts, domain = est.categorical_counts(s, 1000, h, sa)
    assert counts.tolist() == [300, 100, 500, 100] and domain.hierarchy is h
    with pytest.raises(errors.SabreError) as e:
        est.categorical_counts(stats(mcv_values=("z",), mcv_freqs=(1.0,)), 10, h, sa)
    assert e.value.sqlstate == "22023" and '"z"' in e.value.message and e.value.hint


def test_categorical_without_hierarchy_is_flat_over_mcvs_and_unseen_values():
    sa = request.Attr("sa", {"typname": "text"}, "categorical")
    s = stats(n_distinct=5.0, mcv_values=("u", "v"), mcv_freqs=(0.4, 0.3))
    counts, domain = est.categorical_counts(s, 1000, None, sa)
    assert sorted(counts.tolist()) == [100, 100, 100, 300, 400] and domain.m == 5
    assert domain.hierarchy.height == 1


def test_smallest_t_meets_the_predicate_within_the_tolerance():
    found = est.smallest_t(lambda t: t >= 0.23714, 0.01)
    assert found == 0.2372                                       # a multiple of the tolerance
    calls = []
    assert est.smallest_t(lambda t: calls.append(t) or t >= 0.5, 0.3) == 0.5 and min(calls) > 0.3
    assert est.smallest_t(lambda t: False, 0.5) is None
    assert est.smallest_t(lambda t: t >= 1.0, 0.99) == 1.0


def test_knee_of_a_synthetic_curve():
    ts = [round(0.05 * i, 2) for i in range(1, 20)]
    saturating = [2 ** (10 * min(t, 0.3) / 0.3) for t in ts]    # doubling until 0.3, then flat
    assert ts[est.knee(ts, saturating)] == 0.3
    smooth = [1000 * (1 - np.exp(-t / 0.1)) for t in ts]          # concave: knee after the steep start
    assert 0.05 < ts[est.knee(ts, smooth)] < 0.3
    assert est.knee(ts, [7] * len(ts)) == 0                       # flat: the first t
    assert est.knee(ts, [np.exp(t * t * 10) for t in ts]) == 0    # convex: nowhere above the chord


def test_estimate_t_uses_the_core_plan_and_flags_k_beyond_the_rows():
    counts = np.array([30, 50, 20, 40, 60], dtype=np.int64)
    domain = est.SADomain("numerical", m=5)
    e = est.estimate_t(counts, domain, 0.3, 4, 4)
    plan = plan_from_counts(counts, domain, 0.3, 4, 4)
    assert (e.buckets, e.classes, e.feasible) == (plan.buckets.n_buckets, plan.plan.n_classes, True)
    assert e.ec_size == pytest.approx(200 / plan.plan.n_classes)
    bad = est.estimate_t(counts, domain, 0.3, 201, 4)
    assert (bad.feasible, bad.classes, bad.buckets, bad.ec_size) == (False, 0, None, None) and "k <= 200" in bad.hint


def test_t_values_checks_each_element_with_the_core_rule():
    assert est.t_values(0.3) == [0.3] and est.t_values([0.1, 0.2]) == [0.1, 0.2]
    for bad, state in ((None, "22004"), ([], "22023"), ([0.1, None], "22004"), ([0.1, 2.0], "22023")):
        with pytest.raises(errors.SabreError) as e:
            est.t_values(bad)
        assert e.value.sqlstate == state and e.value.hint


def test_missing_statistics_is_55000_with_the_analyze_hint():
    plpy = FakePlpy({"pg_catalog.pg_class AS c": [{"reltuples": -1.0, "analyzed": None}],
                     "pg_catalog.pg_stats": []})
    src = {"oid": 1, "nspname": "public", "relname": "t", "qname": "public.t"}
    sa = request.Attr("salary", {"typname": "int4", "type": "integer"}, "numerical")
    with pytest.raises(errors.SabreError) as e:
        est.read_statistics(plpy, src, [sa], False)
    assert e.value.sqlstate == "55000" and "ANALYZE public.t" in e.value.hint and "options.analyze" in e.value.hint
    assert all("pg_catalog." in sql for sql, _ in plpy.executed)


def test_resampled_statistics_only_when_sampled_and_reproducible():
    base = dict(null_frac=0.1, n_distinct=3.0, mcv_values=(1.0, 2.0, 3.0), mcv_freqs=(0.5, 0.3, 0.1))
    whole = est.ColumnStatistics(20000.0, target=100, **base)             # 30,000 >= 20,000 rows
    assert whole.sample_rows() == 20000 and not whole.sampled() and est.resampled_statistics(whole) == []
    sampled = est.ColumnStatistics(1e6, target=100, **base)
    assert sampled.sample_rows() == 30000 and sampled.sampled()
    drawn = est.resampled_statistics(sampled)
    assert len(drawn) == est.RESAMPLES and drawn == est.resampled_statistics(sampled)     # fixed seed
    freqs = np.array([d.mcv_freqs for d in drawn])
    assert all(d.mcv_values == base["mcv_values"] and d.null_frac == 0.1 for d in drawn)
    assert np.allclose(freqs.sum(axis=1), 0.9) and len({tuple(f) for f in freqs}) == est.RESAMPLES
    # a larger sample of the same table (and the finite-population factor) scatters less
    closer = np.array([d.mcv_freqs for d in est.resampled_statistics(est.ColumnStatistics(1e6, target=3000, **base))])
    assert np.abs(closer - base["mcv_freqs"]).max() < np.abs(freqs - base["mcv_freqs"]).max()


def test_spread_is_the_range_over_point_and_resamples():
    from types import SimpleNamespace as NS
    plan = lambda b, c: NS(buckets=NS(n_buckets=b), classes=c)      # noqa: E731
    s = est.Spread.of(plan(5, 1000), [plan(5, 950), plan(6, 1040)])
    assert (s.buckets, s.classes, s.stable) == ((5, 6), (950, 1040), False)
    assert est.Spread.of(plan(5, 1000), [plan(5, 950), plan(5, 1050)]).stable is True
    # every draw covered, but only just: the table's plan falls beyond the extremes too often
    assert est.Spread.of(plan(5, 1000), [plan(5, 901), plan(5, 1100)]).stable is False
    assert est.Spread.of(plan(5, 1000), [plan(5, 818)]).stable is False   # no value within 10% of both
    assert est.Spread.of(plan(3, 7), []) == est.Spread((3, 3), (7, 7), True, 7)


def test_likeliest_classes_covers_the_most_draws_nearest_the_point():
    # no draws (the sample is the table): the point itself
    assert est.likeliest_classes(1000, []) == (1000, 1)
    # the point covers every draw: it stays
    assert est.likeliest_classes(1000, [950, 1040, 1090]) == (1000, 4)
    # a skewed set: the point is a low draw; the value nearest it within 10% of the four others
    value, covered = est.likeliest_classes(800, [1000, 1010, 990, 1005])
    assert covered == 4 and value == 909                    # ceil(1010 x 0.9): within 10% of 1010, 1005, 1000, 990
    assert all(est.within(value, d) for d in (1000, 1010, 990, 1005)) and not est.within(value, 800)
    # two modes 22% apart and more: no value covers both; the larger group wins
    assert est.likeliest_classes(131072, [106000, 106000, 131072])[1] == 2
    # two modes closer than 22%: one value covers both (the census t = 0.25 case: 0.86 and 1.0)
    value, covered = est.likeliest_classes(13600, [15800, 15800, 13600])
    assert covered == 4 and est.within(value, 13600) and est.within(value, 15800)


def test_spread_reports_the_likeliest_classes():
    from types import SimpleNamespace as NS
    plan = lambda b, c: NS(buckets=NS(n_buckets=b), classes=c)      # noqa: E731
    s = est.Spread.of(plan(5, 800), [plan(5, 1000), plan(5, 1010), plan(5, 990), plan(5, 1005)])
    assert s.estimate == 909 and s.classes == (800, 1010) and s.stable is False
    s = est.Spread.of(plan(5, 13600), [plan(5, 15800)])
    assert s.stable is False and 13600 < s.estimate < 15800  # one value within 10% of both, no margin
    assert est.Spread.of(plan(5, 14000), [plan(5, 15000)]).stable is True
    assert est.Spread.of(plan(5, 13600), [plan(6, 15800)]).stable is False     # buckets differ


def test_estimate_all_reports_the_likeliest_classes_of_point_and_resamples():
    """Sampled statistics: buckets and U are the point plan's, classes the likeliest within 10%
    over the point's and the resamples' plans (plan_counts); the sample being the table: the
    plan's own count."""
    from sabre_pg.core.sabre import plan_counts
    sa = request.Attr("salary", {"typname": "int4"}, "numerical", None)
    freqs = tuple(np.random.default_rng(3).dirichlet(np.full(20, 4.0)).astype(np.float32).tolist())
    base = dict(null_frac=0.0, n_distinct=20.0, mcv_values=tuple(float(v) for v in range(1, 21)), mcv_freqs=freqs)
    ts = [0.1, 0.15]
    moved = 0
    for reltuples, target in ((200_000.0, 100), (20_000.0, 100)):
        s = est.ColumnStatistics(reltuples, target=target, **base)
        rows = int(reltuples)
        found = est.estimate_all(s, rows, sa, None, ts, 6, 4)
        tables = [est.sa_counts(s, rows, sa, None)] + [
            est.jittered(*est.sa_counts(r, rows, sa, None), seed=est.RESAMPLE_SEED + i)
            for i, r in enumerate(est.resampled_statistics(s))]
        plans = plan_counts(tables, ts, 6, 4)
        assert len(plans) == (1 + est.RESAMPLES if s.sampled() else 1)
        for i, e in enumerate(found):
            point, draws = plans[0][i], [p[i].classes for p in plans[1:]]
            assert (e.buckets, e.u) == (point.buckets.n_buckets, point.buckets.U)
            assert e.classes == est.likeliest_classes(point.classes, draws)[0] == e.spread.estimate
            assert e.spread.classes[0] <= e.classes <= e.spread.classes[1] and e.ec_size == rows / e.classes
            if not s.sampled():
                assert e.classes == point.classes and e.spread.stable
            moved += e.classes != point.classes
    assert moved                                   # here the point's count is not the likeliest


@pytest.mark.parametrize("kind", ["numerical", "categorical"])
def test_the_mcv_lists_order_does_not_change_the_estimate(kind):
    """pg_stats orders the most common values by their sampled frequency, and ANALYZE's
    random sample orders near-equal ones at random: the same statistics in any order give the
    same ColumnStatistics (value order) and so the same point, spread and stable flag."""
    typname = "int4" if kind == "numerical" else "text"
    sa = request.Attr("sa", {"typname": typname}, kind, None)
    values = [float(v) for v in range(1, 21)] if kind == "numerical" else ["v%02d" % v for v in range(20)]
    freqs = np.random.default_rng(5).dirichlet(np.full(20, 4.0)).astype(np.float32).tolist()
    freqs[3] = freqs[7]                                  # a tie, as ANALYZE's sample often has
    found = []
    for seed in range(4):
        order = np.random.default_rng(seed).permutation(20)
        mcv, shares = est.by_value([values[i] for i in order], [freqs[i] for i in order])
        assert mcv == sorted(values) and list(shares) == [freqs[values.index(v)] for v in mcv]
        s = est.ColumnStatistics(200_000.0, 0.0, 20.0, tuple(mcv), shares, (), 100)
        found.append([(e.buckets, e.classes, e.spread.buckets, e.spread.classes, e.spread.stable)
                      for e in est.estimate_all(s, 200_000, sa, None, [0.1, 0.15, 0.3], 6, 4)])
    assert all(f == found[0] for f in found[1:])


def test_read_statistics_keeps_the_mcvs_in_value_order():
    rows = {"pg_catalog.pg_class AS c": [{"reltuples": 1000.0, "analyzed": "now"}],
            "pg_catalog.pg_stats AS s": [{"name": "salary", "null_frac": 0.0, "n_distinct": 3.0, "mcv": "{3,1,2}",
                                          "freqs": [0.5, 0.3, 0.2], "histogram": None, "target": 100}],
            "pg_catalog.unnest": lambda params: [{"vs": [float(v) for v in params[0].strip("{}").split(",")]}]}
    src = {"oid": 1, "nspname": "public", "relname": "t", "qname": "public.t"}
    sa = request.Attr("salary", {"typname": "int4", "type": "integer", "category": "N"}, "numerical")
    stats, _ = est.read_statistics(FakePlpy(rows), src, [sa], False)
    assert stats["salary"].mcv_values == (1.0, 2.0, 3.0) and stats["salary"].mcv_freqs == (0.3, 0.2, 0.5)
