"""sabre_estimate's method parameter and its `stable` calibration (issue #28), without a
server: the class bounds of the partitioning methods hold on the core's own runs, and
`stable = true` is wrong at most 1 time in 20 on simulated ANALYZE samples of tables the
estimator was not tuned on."""
from __future__ import annotations

import argparse
import itertools

import numpy as np
import pytest

from sabre_pg.core.emd import SADomain
from sabre_pg.core.hierarchy import Hierarchy
from sabre_pg.core.sabre import QuasiIdentifier, anonymize
from tests.client.fake_plpy import sabre_plpy

est = sabre_plpy("preflight.estimate")


def brute_best(counts, domain, size):
    """The least EMD to the table of any multiset of ``size`` SA values (small domains)."""
    q = counts / counts.sum()
    best = np.inf
    for combo in itertools.combinations_with_replacement(range(len(q)), size):
        p = np.bincount(combo, minlength=len(q)) / size
        best = min(best, domain.emd(p, q))
    return best


@pytest.mark.parametrize("seed", range(4))
def test_best_class_emd_is_the_least_emd_of_any_class(seed):
    rng = np.random.default_rng(seed)
    counts = rng.integers(1, 30, 5)
    numerical = SADomain("numerical", m=5)
    flat = SADomain("categorical", hierarchy=Hierarchy.flat(list("abcde")))
    for domain in (numerical, flat):
        for size in (1, 2, 3, 5, 6):
            got = est.best_class_emd(counts, domain, np.array([size]))[0]
            assert got == pytest.approx(brute_best(counts, domain, size), abs=1e-12)


def test_best_class_emd_bounds_a_hierarchical_sa_from_below():
    h = Hierarchy([["a", "x", "*"], ["b", "x", "*"], ["c", "y", "*"], ["d", "y", "*"], ["e", "z", "*"]])
    domain = SADomain("categorical", hierarchy=h)
    counts = np.array([10, 3, 7, 1, 9])
    for size in (1, 2, 4, 5):
        assert est.best_class_emd(counts, domain, np.array([size]))[0] <= brute_best(counts, domain, size) + 1e-12


@pytest.mark.parametrize("method", ["refine", "mondrian"])
@pytest.mark.parametrize("seed", range(3))
def test_partition_bounds_hold_on_the_core_runs(method, seed):
    """Every class the method makes has at least min_class_rows rows, so the classes are
    within [1, classes_max]."""
    rng = np.random.default_rng(seed)
    n = 600
    qis = [QuasiIdentifier("a", rng.integers(0, 50, n).astype(float)),
           QuasiIdentifier("b", rng.integers(0, 20, n).astype(float))]
    codes = np.minimum(rng.geometric(0.3, n) - 1, 7)
    domain = SADomain("numerical", m=int(codes.max()) + 1)
    counts = np.bincount(codes, minlength=domain.m)
    for t in (0.05, 0.15, 0.3):
        for k in (2, 5):
            r = anonymize(qis, codes, domain, t, k, method=method)
            e = est.partition_bounds(counts, domain, t, k)
            least = est.min_class_rows(counts, domain, t, k)
            assert e.classes is None and e.buckets is None and e.feasible and not e.spread.stable
            assert 1 <= r.n_classes <= e.spread.classes[1]
            assert np.bincount(r.ec).min() >= least


def test_partition_bounds_row_and_infeasible_k():
    counts = np.array([5, 5])
    domain = SADomain("numerical", m=2)
    row = est.partition_bounds(counts, domain, 0.3, 2).row("stats", None, 10, "refine")
    assert row[-1] == "refine" and row[4] is None and row[13:15] == (1, 5) and row[15] is False
    assert est.partition_bounds(counts, domain, 0.3, 11).feasible is False


# ------------------------------------------------------------------ stable, calibrated
# salary counts of the SQL census generator at 500k rows, seed 13 (sabre_pg.census_sql): at
# t = 0.25 the table plans 57,121 classes while most samples plan the ceiling 65,536 -- the
# shape of the held-out table (32,768 reported as stable, 26,437 made)
CENSUS_500K = np.array([10268, 18795, 21979, 23074, 23546, 22848, 22644, 21467, 20520, 19882, 18929, 17924, 16864, 16138, 14905, 13906, 13240, 12210, 11202, 10754, 9835, 9284, 8483, 7870, 7421, 6988, 6379, 6014, 5510, 5294, 4847, 4454, 4137, 3953, 3535, 3382, 3186, 2887, 2739, 2385, 2421, 2231, 2100, 1935, 1828, 1712, 1658, 1486, 1330, 23621])
TS = (0.15, 0.25, 0.35, 0.45)


def simulated(counts, samples, seed, sample_rows=30_000, k=6):
    """(stable, within 10%) of each estimate from ``samples`` simulated ANALYZE samples of a
    table with SA ``counts`` (simple random samples of 300 x 100 rows, frequencies as float4,
    MCV list complete), against the table's own plan."""
    from sabre_pg.core.sabre import plan_counts
    domain = SADomain("numerical", m=len(counts))
    truth = plan_counts([(counts, domain)], TS, k)[0]
    rows = int(counts.sum())
    attr = argparse.Namespace(name="salary", numerical=True, typname="int4")
    rng, out = np.random.default_rng(seed), []
    for _ in range(samples):
        drawn = rng.multivariate_hypergeometric(counts, sample_rows)
        seen = drawn > 0
        freqs = (drawn[seen] / sample_rows).astype(np.float32).astype(np.float64)
        stats = est.ColumnStatistics(float(rows), 0.0, float(seen.sum()), tuple(np.flatnonzero(seen) + 1.0),
                                     tuple(freqs.tolist()), (), sample_rows // 300)
        for e, plan in zip(est.estimate_all(stats, rows, attr, None, TS, k, 4), truth):
            out.append((e.spread.stable, est.within(e.classes, plan.classes)))
    return out


def test_stable_is_wrong_at_most_one_time_in_20_on_simulated_samples():
    """The issue's ceiling case and a table of another generator (sabre_pg.synthetic, 1M rows,
    seed 404; the estimator was not tuned on it): among the estimates marked stable, at most 1
    in 20 misses the table's class count by more than 10% (before the recalibration: 5 of 61)."""
    from sabre_pg.synthetic import census
    codes = census(1_000_000, seed=404)[1]
    results = simulated(CENSUS_500K, 12, seed=1) + simulated(np.bincount(codes), 8, seed=2)
    stable = [ok for s, ok in results if s]
    assert len(stable) >= len(results) // 3                 # still said for a good share
    assert 20 * stable.count(False) <= len(stable), (stable.count(False), len(stable))


def test_statistics_covering_the_table_stay_exact_and_stable():
    """A sample of the whole table: no resample, the table's own plan, stable."""
    from sabre_pg.core.sabre import plan_counts
    counts = CENSUS_500K // 25                               # 20,000 rows, target 100 covers them
    rows = int(counts.sum())
    stats = est.ColumnStatistics(float(rows), 0.0, float(len(counts)), tuple(np.arange(1.0, len(counts) + 1)),
                                 tuple((counts / rows).astype(np.float32).astype(np.float64).tolist()), (), 100)
    attr = argparse.Namespace(name="salary", numerical=True, typname="int4")
    truth = plan_counts([(counts, SADomain("numerical", m=len(counts)))], TS, 6)[0]
    for e, plan in zip(est.estimate_all(stats, rows, attr, None, TS, 6, 4), truth):
        assert e.spread.stable and e.classes == plan.classes and e.spread.classes == (plan.classes, plan.classes)
