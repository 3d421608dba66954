"""Several sensitive attributes (core): the thesis's examples as oracles, the relaxed class
sizing, property tests over 2-4 SAs of mixed kinds checked by an independent EMD, and the
degenerate cases.

The thesis's Figures 8, 12-13 and 15 are images; their text states the table (400 records,
X with 4 values, Y with 3), the fragmentation of Figure 13, and sums: M<<1-3; 1-2>> = 0.35 and
M<<3-4; 2-3>> = 0.25 (Figure 14), R_T = <0.5, 0.5>, C_T = <0.3, 0.7> and X_hat = 0.6 after the
split of Figure 15.  The matrices below satisfy every stated number; the bounds are computed
by hand with global normalization.
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from sabre_pg.core.emd import SADomain, hierarchical_emd, ordered_emd
from sabre_pg.core.fragments import (Fragmentation, JointBound, JointCounts, even_templates,
                                     find_fragmentation, joint_counts, make_fragment, size_classes, split)
from sabre_pg.core.hierarchy import Hierarchy
from sabre_pg.core.multi_sa import anonymize_multi, plan_from_joint_counts
from sabre_pg.core.sabre import QuasiIdentifier, anonymize, encode_numerical
from sabre_pg.synthetic import census, tree_hierarchy
from tests.core.test_properties import hierarchies

# Figure 8: rows X = 1..4, columns Y = 1..3, 400 records
FIGURE_8 = np.array([[40, 30, 30],
                     [20, 20, 40],
                     [20, 10, 40],
                     [100, 30, 20]])


def matrix_counts(matrix) -> JointCounts:
    """The multiplicity matrix as joint counts (codes = 0-based row and column)."""
    rows, cols = np.nonzero(matrix)
    return JointCounts(np.column_stack([rows, cols]).astype(np.int64), matrix[rows, cols].astype(np.int64))


def numerical(m):
    return SADomain("numerical", m=m)


def rectangle(joint, rows, cols):
    """Cell indices of the fragment M<<rows; cols>> (1-based inclusive ranges, as the thesis)."""
    r, c = joint.cells[:, 0], joint.cells[:, 1]
    return np.flatnonzero((r >= rows[0] - 1) & (r <= rows[1] - 1) & (c >= cols[0] - 1) & (c <= cols[1] - 1))


def test_figure_8_matrix_has_the_stated_sums():
    assert FIGURE_8.sum() == 400
    assert FIGURE_8[0:3, 0:2].sum() / 400 == 0.35          # Figure 14, a conforming fragment
    assert FIGURE_8[2:4, 1:3].sum() / 400 == 0.25          # Figure 14, the other


def test_figure_13_aggregate_bounds_with_global_normalization():
    joint = matrix_counts(FIGURE_8)
    domains = [numerical(4), numerical(3)]
    parts = [((1, 2), (1, 2)), ((3, 4), (1, 2)), ((1, 4), (3, 3))]
    frags = [make_fragment(joint, rectangle(joint, r, c), domains) for r, c in parts]
    assert [f.size for f in frags] == [110, 160, 130]
    # Delta of a marginal = max(sum (i - lo) q_i, sum (hi - i) q_i) / (m - 1), m of the whole domain
    assert [float(Fraction(b).limit_denominator(10000)) for b in (f.bounds[0] for f in frags)] == \
        pytest.approx([70 / 1200, 130 / 1200, 210 / 1200])
    assert [f.bounds[1] for f in frags] == pytest.approx([60 / 800, 120 / 800, 0.0])
    fragmentation = Fragmentation(frags, domains, joint)
    assert fragmentation.U == pytest.approx([410 / 1200, 180 / 800])
    # local normalization (the thesis's, denominator k - 1 of each fragment) is larger
    local_x = 70 / 400 / 1 + 130 / 400 / 1 + 210 / 400 / 3
    assert local_x > fragmentation.U[0]


def test_figure_12_fragment_marginals():
    joint = matrix_counts(FIGURE_8)
    f = make_fragment(joint, rectangle(joint, (1, 3), (1, 2)), [numerical(4), numerical(3)])
    assert f.size / 400 == 0.35
    assert list(f.lo) == [0, 0] and list(f.hi) == [2, 1]
    # rows (70, 40, 30) at X = 0, 1, 2: max(40 + 60, 2 * 140 - 100) / 400 / 3
    assert f.bounds[0] == pytest.approx(180 / 1200)
    # columns (80, 60) at Y = 0, 1: max(60, 140 - 60) / 400 / 2
    assert f.bounds[1] == pytest.approx(80 / 800)


def test_figure_15_a_split_can_raise_the_other_bound():
    """R_T = <0.5, 0.5>, C_T = <0.3, 0.7>: X_hat = 0.5, Y_hat = 0.7; splitting the columns
    gives Y_hat = 0 but X_hat = 0.6 (Proposition 6 holds for one axis only)."""
    joint = matrix_counts(np.array([[10, 40], [20, 30]]))
    domains = [numerical(2), numerical(2)]
    top = make_fragment(joint, np.arange(4), domains)
    assert top.bounds == pytest.approx([0.5, 0.7])
    parts = split(joint, top, 1, domains)
    assert np.sum([p.bounds for p in parts], axis=0) == pytest.approx([0.6, 0.0])
    # FIND-FRAGMENTATION with (t_X, t_Y) = (0.65, 0.3): the column split is what Psi prefers
    (first,) = find_fragmentation(joint, domains, [0.65, 0.3])
    assert first.n_fragments == 2 and first.U == pytest.approx([0.6, 0.0])


def test_hierarchical_fragment_bound_is_theorem_2():
    h = Hierarchy([["a", "A", "*"], ["b", "A", "*"], ["c", "B", "*"], ["d", "B", "*"]])
    joint = JointCounts(np.array([[0], [1], [2]]), np.array([5, 3, 2]))
    f = make_fragment(joint, np.arange(3), [SADomain("categorical", hierarchy=h)])
    assert f.bounds[0] == pytest.approx(1.0 * (1.0 - 0.2))          # h(LCA)/h(H) (sum q - min q)
    parts = split(joint, f, 0, [SADomain("categorical", hierarchy=h)])
    assert sorted(p.size for p in parts) == [2, 8]
    assert sum(p.bounds[0] for p in parts) == pytest.approx(0.5 * (0.8 - 0.3))


# ----------------------------------------------------------------------------- sizing (Figs 18-19)
def single_cell_fragmentation(matrix):
    joint = matrix_counts(matrix)
    domains = [numerical(matrix.shape[0]), numerical(matrix.shape[1])]
    return Fragmentation([make_fragment(joint, np.array([c]), domains) for c in range(len(joint.counts))],
                         domains, joint), joint


def reference_emds(template, joint, m):
    """Ordered EMD of a class taking template[j] tuples of single-cell fragment j, per SA,
    by the cumulative formula (independent of the engine's flow bound)."""
    out = []
    for i in range(2):
        p = np.bincount(joint.cells[:, i], weights=template, minlength=m[i]) / template.sum()
        q = np.bincount(joint.cells[:, i], weights=joint.counts, minlength=m[i]) / joint.counts.sum()
        out.append(np.abs(np.cumsum(p - q))[:-1].sum() / (m[i] - 1))
    return out


def test_figure_18_sizing_finds_the_gcd_classes():
    """|F| = 250, 100, 350, 300: 50 conforming classes of 20 (GCD 50), even with no room."""
    matrix = np.array([[250, 100], [350, 300]])
    fragmentation, joint = single_cell_fragmentation(matrix)
    assert fragmentation.U == pytest.approx([0.0, 0.0])
    plan = size_classes(fragmentation, [1e-6, 1e-6], k=1)
    assert plan.n_classes == 50
    assert (plan.templates == np.array([[5, 2, 7, 6]])).all()
    assert (plan.sizes == 20).all()


def test_figure_19_one_more_record_does_not_collapse():
    """|F| = 250, 100, 350, 301: GCD 1 would give one class of 1001; the relaxed bound
    gives many, each verified with the exact EMD."""
    matrix = np.array([[250, 100], [350, 301]])
    fragmentation, joint = single_cell_fragmentation(matrix)
    t = 0.05                 # a class of 20 or 21 departs from the shares by about 1/40
    plan = size_classes(fragmentation, [t, t], k=1)
    assert plan.n_classes >= 40
    assert plan.sizes.sum() == 1001 and (plan.templates.sum(axis=0) == [250, 100, 350, 301]).all()
    bound = JointBound(fragmentation, [t, t])
    for template in np.unique(plan.templates, axis=0):
        real = reference_emds(template.astype(float), joint, (2, 2))
        assert max(real) <= t + 1e-12
        assert (np.array(real) <= bound.bounds(template)[0] + 1e-12).all()


def test_even_templates_are_balanced_and_exact():
    counts = np.array([7, 0, 13, 5])
    templates = even_templates(counts, 6)
    assert (templates.sum(axis=0) == counts).all()
    assert templates.sum(axis=1).max() - templates.sum(axis=1).min() <= 1


# ----------------------------------------------------------------------------- properties
def lp_emd(p, q, distance):
    """EMD as a transportation LP (independent of every formula)."""
    m = len(p)
    a_eq = np.zeros((2 * m, m * m))
    for i in range(m):
        a_eq[i, i * m:(i + 1) * m] = 1
        a_eq[m + i, i::m] = 1
    res = linprog(distance.ravel(), A_eq=a_eq, b_eq=np.concatenate([p, q]), bounds=(0, None), method="highs")
    return res.fun


def sa_distance(domain):
    if domain.numerical:
        i = np.arange(domain.m)
        return np.abs(i[:, None] - i[None, :]) / max(domain.m - 1, 1)
    return domain.distance_matrix()


@st.composite
def multi_tables(draw):
    n = draw(st.integers(20, 240))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    d = draw(st.integers(2, 4))
    base = rng.integers(0, 6, n)                  # a latent variable: SAs correlated with it and the QI
    qis = [QuasiIdentifier("age", (base * 7 + rng.integers(0, 9, n)).astype(np.float64)),
           QuasiIdentifier("zone", rng.integers(0, 8, n), tree_hierarchy(8, [2], "z"))]
    codes, domains = [], []
    for _ in range(d):
        kind = draw(st.sampled_from(["ordered", "hierarchical", "equal"]))
        noise = draw(st.sampled_from([0, 1, 3]))
        if kind == "ordered":
            c, distinct = encode_numerical(base * 3 + rng.integers(0, noise + 1, n))
            domains.append(SADomain("numerical", m=len(distinct)))
        else:
            h = draw(hierarchies(min_height=1, max_height=3)) if kind == "hierarchical" else \
                Hierarchy.flat(["v%d" % i for i in range(int(rng.integers(1, 7)))])
            c = (base + rng.integers(0, noise + 1, n)) % h.n_leaves
            domains.append(SADomain("categorical", hierarchy=h))
        codes.append(np.asarray(c, dtype=np.int64))
    ts = [draw(st.floats(0.05, 0.6)) for _ in range(d)]
    k = draw(st.integers(1, 6))
    return qis, np.column_stack(codes), domains, ts, k


def independent_check(result, codes, domains, ts, k, lp_classes=3):
    """0 violations by emd.py's formulas on every class and SA, and by a transportation LP
    on the first classes; sizes >= k; a partition of the tuples."""
    ec = result.ec
    assert ec.shape == (len(codes),) and set(np.unique(ec)) == set(range(result.n_classes))
    assert np.bincount(ec).min() >= k
    for i, d in enumerate(domains):
        q = np.bincount(codes[:, i], minlength=d.m) / len(codes)
        for c in range(result.n_classes):
            members = codes[ec == c, i]
            p = np.bincount(members, minlength=d.m) / len(members)
            emd = ordered_emd(p, q) if d.numerical else hierarchical_emd(p, q, d.hierarchy)
            assert emd <= ts[i] + 1e-9, (i, c, emd, ts[i])
            assert result.emds_by_sa[c, i] == pytest.approx(emd, abs=1e-9)
            if c < lp_classes and d.m > 1:
                assert lp_emd(p, q, sa_distance(d)) <= ts[i] + 1e-7


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(multi_tables(), st.sampled_from(["auto", "merge", "fragments"]))
def test_every_class_holds_on_every_sa(table, strategy):
    qis, codes, domains, ts, k = table
    result = anonymize_multi(qis, codes, domains, ts, k, strategy=strategy, seed=1)
    independent_check(result, codes, domains, ts, k)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(multi_tables())
def test_planning_bounds_hold_before_repair(table):
    """The fragments' relaxed bound is a true upper bound: the templates' classes need no
    repair (beyond rounding), and each class's EMD is within its planned bound."""
    qis, codes, domains, ts, k = table
    joint, _ = joint_counts(codes)
    plan = plan_from_joint_counts(joint, domains, ts, k)
    assert (plan.fragmentation.U < np.asarray(ts)).all()
    result = anonymize_multi(qis, codes, domains, ts, k, strategy="fragments", plan=plan)
    assert result.merges == 0
    bound = JointBound(plan.fragmentation, ts)
    fragment = plan.fragmentation.fragment_of_cell()[joint_counts(codes)[1]]
    per_class = np.zeros((result.n_classes, plan.fragmentation.n_fragments))
    np.add.at(per_class, (result.ec, fragment), 1)
    assert (result.emds_by_sa <= bound.bounds(per_class) + 1e-9).all()


# ----------------------------------------------------------------------------- degenerate cases
@pytest.fixture(scope="module")
def census_table():
    qis, salary, domain = census(3000, seed=4)
    return qis, salary, domain


def test_perfectly_correlated_sas_cost_no_more_than_one(census_table):
    qis, salary, domain = census_table
    codes = np.column_stack([salary, salary])          # the second SA determined by the first
    single = anonymize(qis, salary, domain, 0.2, 5)
    multi = anonymize_multi(qis, codes, [domain, domain], [0.2, 0.2], 5)
    assert multi.n_classes == single.n_classes and multi.merges == 0
    assert multi.metrics()["ail"] == pytest.approx(single.metrics()["ail"])
    # joint bucketization of a diagonal joint matrix is the single SA's bucketization
    joint, _ = joint_counts(codes)
    plan = plan_from_joint_counts(joint, [domain, domain], [0.2, 0.2], 5, lookahead=0)
    alone = anonymize(qis, salary, domain, 0.2, 5, lookahead=0)
    assert plan.fragmentation.n_fragments == alone.buckets.n_buckets
    assert plan.fragmentation.U == pytest.approx([alone.buckets.U] * 2)
    assert plan.n_classes >= alone.n_classes


def test_independent_sas(census_table):
    qis, salary, domain = census_table
    rng = np.random.default_rng(0)
    other = rng.integers(0, 20, len(salary))
    codes = np.column_stack([salary, other])
    domains = [domain, SADomain("numerical", m=20)]
    for strategy in ("merge", "fragments"):
        result = anonymize_multi(qis, codes, domains, [0.15, 0.15], 4, strategy=strategy)
        assert result.n_classes > 1
        independent_check(result, codes, domains, [0.15, 0.15], 4, lp_classes=0)


def test_one_sa_with_a_single_value(census_table):
    qis, salary, domain = census_table
    constant = np.zeros(len(salary), dtype=np.int64)
    codes = np.column_stack([constant, salary])
    single = anonymize(qis, salary, domain, 0.2, 5)
    multi = anonymize_multi(qis, codes, [SADomain("numerical", m=1), domain], [0.05, 0.2], 5)
    assert multi.n_classes == single.n_classes
    assert (multi.emds_by_sa[:, 0] == 0).all()
    assert multi.metrics()["ail"] == pytest.approx(single.metrics()["ail"])


def test_bad_arguments(census_table):
    qis, salary, domain = census_table
    codes = np.column_stack([salary, salary])
    with pytest.raises(ValueError, match="one t per sensitive attribute"):
        anonymize_multi(qis, codes, [domain, domain], [0.2], 5)
    with pytest.raises(ValueError, match="t must"):
        anonymize_multi(qis, codes, [domain, domain], [0.2, 0.0], 5)
    with pytest.raises(ValueError, match="one column per SA"):
        anonymize_multi(qis, salary, [domain, domain], [0.2, 0.2], 5)
    with pytest.raises(ValueError, match="strategy"):
        anonymize_multi(qis, codes, [domain, domain], [0.2, 0.2], 5, strategy="x")
