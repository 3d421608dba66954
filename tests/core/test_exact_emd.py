"""sabre_pg.core.exact_emd against a transportation LP and against the definitions evaluated
with Python fractions: random small tables, Li et al.'s examples, exact boundaries, huge
counts forcing the Python-int path, and agreement of that path with the int64 one."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from sabre_pg.core import exact_emd as X
from sabre_pg.core.hierarchy import Hierarchy

SETTINGS = dict(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ----------------------------------------------------------------------------- references
def transport_lp(p, q, ground) -> float:
    """min sum ground_ij f_ij over flows f >= 0 with row sums p and column sums q."""
    m = len(p)
    rows = sp.kron(sp.eye(m), np.ones((1, m)))          # sum_j f_ij = p_i
    cols = sp.kron(np.ones((1, m)), sp.eye(m))          # sum_i f_ij = q_j
    res = linprog(np.asarray(ground, float).ravel(), A_eq=sp.vstack([rows, cols]).tocsr(),
                  b_eq=np.r_[p, q], bounds=(0, None), method="highs")
    assert res.status == 0, res.message
    return res.fun


def ordered_ground(m):
    i = np.arange(m)
    return np.abs(i[:, None] - i[None, :]) / max(m - 1, 1)


def tree_ground(h: Hierarchy):
    """height(LCA)/H from the ARX rows: the first column where the two paths agree."""
    m, H = h.n_leaves, h.height
    g = np.zeros((m, m))
    for a in range(m):
        for b in range(m):
            lvl = next(j for j in range(H + 1) if h.rows[a][j] == h.rows[b][j])
            g[a, b] = lvl / H if H else 0.0
    return g


def distributions(ec, codes, counts, m):
    """{class id: (P counts, n)} and the table's Q counts, N."""
    Q = np.zeros(m, dtype=object)
    per = {}
    for c, j, w in zip(ec, codes, counts):
        P = per.setdefault(int(c), np.zeros(m, dtype=object))
        P[j] += int(w)
        Q[j] += int(w)
    return {c: (P, int(P.sum())) for c, P in per.items()}, Q, int(Q.sum())


def ordered_definition(P, n, Q, N) -> Fraction:
    """Li et al.: 1/(m-1) sum_{i<m-1} |F_P(i) - F_Q(i)|, in fractions."""
    m = len(Q)
    if m == 1:
        return Fraction(0)
    fp, fq = np.cumsum(P), np.cumsum(Q)
    return sum(abs(Fraction(int(fp[i]), n) - Fraction(int(fq[i]), N)) for i in range(m - 1)) / (m - 1)


def li_tree_definition(P, n, Q, N, h: Hierarchy) -> Fraction:
    """Li et al.'s hierarchical EMD: sum over internal nodes of height/H * min(pos_extra,
    neg_extra), children found from the ARX rows."""
    H = h.height
    if H == 0:
        return Fraction(0)
    extra = {}                                          # (level, label) -> extra
    for pos, row in enumerate(h.rows):
        d = Fraction(int(P[pos]), n) - Fraction(int(Q[pos]), N)
        for lvl in range(H + 1):
            extra[(lvl, row[lvl])] = extra.get((lvl, row[lvl]), 0) + d
    children = {}
    for row in h.rows:
        for lvl in range(1, H + 1):
            children.setdefault((lvl, row[lvl]), set()).add((lvl - 1, row[lvl - 1]))
    total = Fraction(0)
    for node, kids in children.items():
        pos_e = sum(extra[c] for c in kids if extra[c] > 0)
        neg_e = -sum(extra[c] for c in kids if extra[c] < 0)
        total += Fraction(node[0], H) * min(pos_e, neg_e)
    return total


# ----------------------------------------------------------------------------- strategies
@st.composite
def grouped(draw, m):
    """Random grouped rows (class id, code, count) over codes 0..m-1, in random order,
    possibly with repeated (class, code) pairs."""
    n_groups = draw(st.integers(1, 25))
    ids = draw(st.lists(st.integers(-2**40, 2**40), min_size=1, max_size=6, unique=True))
    ec = [draw(st.sampled_from(ids)) for _ in range(n_groups)]
    codes = [draw(st.integers(0, m - 1)) for _ in range(n_groups)]
    counts = [draw(st.integers(1, 7)) for _ in range(n_groups)]
    return ec, codes, counts


@st.composite
def hierarchies(draw):
    """A random tree with every leaf at depth H (0..3), rows in random order."""
    H = draw(st.integers(0, 3))
    if H == 0:
        return Hierarchy([["only"]])
    paths = [["*"]]
    for lvl in range(H - 1, -1, -1):
        paths = [p + ["%s%d_%d" % ("v" if lvl == 0 else "n", lvl, i * 4 + c)]
                 for i, p in enumerate(paths) for c in range(draw(st.integers(1, 3)))]
    rows = [list(reversed(p)) for p in paths]
    order = draw(st.permutations(range(len(rows))))
    return Hierarchy([rows[i] for i in order])


def check_against_references(res, ec, codes, counts, m, ground, definition):
    per, Q, N = distributions(ec, codes, counts, m)
    assert res.n_rows == N
    assert res.class_ids.tolist() == sorted(per)
    for i, c in enumerate(res.class_ids.tolist()):
        P, n = per[c]
        assert res.sizes[i] == n
        exact = definition(P, n, Q, N)
        assert res.fraction(i) == exact
        assert res.emd[i] == float(exact)                      # correctly rounded
        lp = transport_lp(np.asarray(P, float) / n, np.asarray(Q, float) / N, ground)
        assert float(exact) == pytest.approx(lp, abs=1e-9)


# ----------------------------------------------------------------------------- LP agreement
@settings(**SETTINGS)
@given(st.data(), st.integers(1, 9))
def test_ordered_matches_lp_and_definition(data, m):
    ec, codes, counts = data.draw(grouped(m))
    res = X.ordered_class_emds(ec, codes, counts, m)
    assert res.kind == "ordered" and res.numerators.dtype == np.int64
    check_against_references(res, ec, codes, counts, m, ordered_ground(m), ordered_definition)


@settings(**SETTINGS)
@given(st.data(), hierarchies())
def test_hierarchical_matches_lp_and_li_formula(data, h):
    ec, codes, counts = data.draw(grouped(h.n_leaves))
    res = X.hierarchical_class_emds(ec, codes, counts, h)
    check_against_references(res, ec, codes, counts, h.n_leaves, tree_ground(h),
                             lambda P, n, Q, N: li_tree_definition(P, n, Q, N, h))


@settings(**SETTINGS)
@given(st.data(), st.integers(1, 9))
def test_equal_distance_is_half_l1_and_matches_lp(data, m):
    ec, codes, counts = data.draw(grouped(m))
    res = X.equal_class_emds(ec, codes, counts, m)
    assert res.kind == "equal"

    def half_l1(P, n, Q, N):
        return sum(abs(Fraction(int(P[j]), n) - Fraction(int(Q[j]), N)) for j in range(m)) / 2

    check_against_references(res, ec, codes, counts, m, 1.0 - np.eye(m), half_l1)
    flat = X.hierarchical_class_emds(ec, codes, counts, Hierarchy.flat([str(j) for j in range(m)]))
    assert [flat.fraction(i) for i in range(flat.classes)] == [res.fraction(i) for i in range(res.classes)]


# ----------------------------------------------------------------------------- Li et al. 2007
def li2007_rows(shared_dir):
    lines = (shared_dir / "li2007" / "test2.csv").read_text().splitlines()
    return [line.split(";") for line in lines[1:] if line.strip()]


def test_li2007_salary_class_is_0_375(shared_dir):
    """Li et al.: salaries 3k..11k, the class {3k, 4k, 5k} has ordered EMD 0.375 and
    {6k, 8k, 11k} 0.167 (1/6)."""
    salaries = sorted(int(r[2]) for r in li2007_rows(shared_dir))
    assert salaries == list(range(3, 12))
    cls = {3: 0, 4: 0, 5: 0, 6: 1, 8: 1, 11: 1, 7: 2, 9: 2, 10: 2}
    res = X.ordered_class_emds([cls[s] for s in salaries], [s - 3 for s in salaries], [1] * 9, 9)
    assert res.fraction(0) == Fraction(3, 8) and res.emd[0] == 0.375
    assert res.fraction(1) == Fraction(1, 6)
    assert not res.exceeds(0.375)[0] and res.exceeds(np.nextafter(0.375, 0))[0]


def test_li2007_disease_classes_match_lp(shared_dir):
    """The data's three classes of three (file order) under its disease hierarchy."""
    h = Hierarchy.from_arx((shared_dir / "li2007" / "test2_hierarchy_Disease.csv").read_text())
    rows = li2007_rows(shared_dir)
    ec, codes = [i // 3 for i in range(len(rows))], [h.leaf_pos[r[3]] for r in rows]
    res = X.hierarchical_class_emds(ec, codes, [1] * len(rows), h)
    check_against_references(res, ec, codes, [1] * len(rows), h.n_leaves, tree_ground(h),
                             lambda P, n, Q, N: li_tree_definition(P, n, Q, N, h))
    # stomach diseases only vs. uniform over the 6 leaves: half the mass crosses the root
    uniform = X.hierarchical_class_emds([0, 0, 0, 1, 1, 1], [h.leaf_pos[d] for d in
                                        ("gastric ulcer", "gastritis", "stomach cancer",
                                         "flu", "bronchitis", "pneumonia")], [1] * 6, h)
    assert uniform.fraction(0) == uniform.fraction(1) == Fraction(1, 2)


# ----------------------------------------------------------------------------- exact boundaries
def test_emd_equal_to_t_is_not_a_violation_one_ulp_below_is():
    # two classes: codes {0} and {1}, m = 2, equal halves: EMD 1/2 each (ordered and equal)
    for res in (X.ordered_class_emds([0, 1], [0, 1], [5, 5], 2), X.equal_class_emds([0, 1], [0, 1], [5, 5], 2)):
        assert res.fraction(0) == Fraction(1, 2)
        assert res.exceeds(0.5).tolist() == [False, False]
        assert res.exceeds(np.nextafter(0.5, 0)).tolist() == [True, True]
        assert res.violations(0.5, 5) == 0 and res.violations(0.5, 6) == 2


def test_non_dyadic_emd_against_its_rounded_float():
    # equal distance, Q = (1, 1, 1)/3; class 1 = {code 1, code 2}: EMD exactly 1/3
    res = X.equal_class_emds([0, 1, 1], [0, 1, 2], [1, 1, 1], 3)
    assert res.fraction(1) == Fraction(1, 3) and res.fraction(0) == Fraction(2, 3)
    third = 1 / 3
    assert Fraction(third) < Fraction(1, 3) and res.emd[1] == third
    assert bool(res.exceeds(third)[1]) is True                 # the float 1/3 is below 1/3
    assert bool(res.exceeds(np.nextafter(third, 1))[1]) is False


def test_one_unit_above_t_is_a_violation_although_the_float_equals_t():
    # class A: X tuples of code 0, class B: X + 1 of code 1: EMD(A) = 1/2 + 1/(2(2X+1))
    big = 2 ** 60
    for emds in (X.ordered_class_emds, X.equal_class_emds):
        res = emds([0, 1], [0, 1], [big, big + 1], 2)
        assert res.numerators.dtype == object
        assert res.fraction(0) == Fraction(big + 1, 2 * big + 1)
        assert res.emd[0] == 0.5 and res.max_emd == 0.5
        assert res.exceeds(0.5).tolist() == [True, False]
        assert res.violations(0.5, 1) == 1


# ----------------------------------------------------------------------------- int64 vs Python ints
@settings(**SETTINGS)
@given(st.data(), st.integers(1, 9), st.sampled_from([2 ** 31, 2 ** 45, 3 ** 40]))
def test_python_int_path_agrees_with_int64_path(data, m, scale):
    """Scaling every count leaves each EMD unchanged; large scales force Python ints."""
    ec, codes, counts = data.draw(grouped(m))
    h = Hierarchy.flat([str(j) for j in range(m)])
    for emds in (lambda *a: X.ordered_class_emds(*a, m), lambda *a: X.hierarchical_class_emds(*a, h)):
        small = emds(ec, codes, counts)
        large = emds(ec, codes, [c * scale for c in counts])
        assert small.numerators.dtype == np.int64
        assert large.numerators.dtype == object or small.max_emd == 0
        assert [large.fraction(i) for i in range(large.classes)] == \
               [small.fraction(i) for i in range(small.classes)]
        assert large.emd.tolist() == small.emd.tolist()
        t = float(max(small.emd)) if small.classes else 0.5
        assert large.exceeds(t).tolist() == small.exceeds(t).tolist()


def test_many_classes_wide_domain_agree_with_dense_definition():
    """Thousands of classes over a wide domain (the sparse crossing search) against the
    dense definition evaluated in int64 per class."""
    rng = np.random.default_rng(7)
    m, C = 300, 2000
    ec = rng.integers(0, C, 60_000)
    codes = np.minimum(rng.geometric(0.02, 60_000) - 1, m - 1)
    counts = rng.integers(1, 4, 60_000)
    res = X.ordered_class_emds(ec, codes, counts, m)
    P = np.zeros((C, m), dtype=np.int64)
    np.add.at(P, (ec, codes), counts)
    Q, n, N = P.sum(axis=0), P.sum(axis=1), int(P.sum())
    num = np.abs(np.cumsum(P, axis=1) * N - n[:, None] * np.cumsum(Q)[None, :])[:, :-1].sum(axis=1)
    present = np.flatnonzero(n)
    assert res.class_ids.tolist() == present.tolist()
    assert res.numerators.tolist() == num[present].tolist()
    assert res.denominators.tolist() == (n[present] * N * (m - 1)).tolist()
    assert res.sizes.tolist() == n[present].tolist()


def test_input_order_and_split_groups_do_not_matter():
    rng = np.random.default_rng(3)
    ec, codes, counts = rng.integers(0, 50, 3000), rng.integers(0, 40, 3000), rng.integers(2, 6, 3000)
    base = X.ordered_class_emds(ec, codes, counts, 40)
    perm = rng.permutation(3000)
    shuffled = X.ordered_class_emds(ec[perm], codes[perm], counts[perm], 40)
    split = X.ordered_class_emds(np.r_[ec, ec], np.r_[codes, codes], np.r_[counts - 1, np.ones_like(counts)], 40)
    for other in (shuffled, split):
        assert other.class_ids.tolist() == base.class_ids.tolist()
        assert other.sizes.tolist() == base.sizes.tolist()
        assert [other.fraction(i) for i in range(other.classes)] == [base.fraction(i) for i in range(base.classes)]


# ----------------------------------------------------------------------------- result object
def test_result_summary_and_empty_input():
    res = X.ordered_class_emds([7, 7, 9], [0, 2, 1], [2, 1, 1], 3)
    assert res.classes == 2 and res.min_class_size == 1 and res.class_ids.tolist() == [7, 9]
    assert res.max_emd == max(res.emd) and res.violating(1.0, 2).tolist() == [False, True]
    for empty in (X.ordered_class_emds([], [], [], 0), X.equal_class_emds([], [], [], 0)):
        assert (empty.classes, empty.violations(0.1, 5), empty.max_emd, empty.min_class_size) == (0, 0, 0.0, 0)
    one_value = X.ordered_class_emds([1, 2], [0, 0], [3, 4], 1)
    assert one_value.max_emd == 0.0 and one_value.violations(1e-300, 1) == 0


@pytest.mark.parametrize("call,part", [
    (lambda: X.ordered_class_emds([0], [3], [1], 3), "codes must lie"),
    (lambda: X.ordered_class_emds([0], [0], [0], 3), "counts must be positive"),
    (lambda: X.ordered_class_emds([0, 1], [0], [1], 3), "differ in length"),
    (lambda: X.ordered_class_emds([0.5], [0], [1], 3), "integers"),
    (lambda: X.tree_class_emds([0], [0], [1], [[1, 0]], 1), "non-decreasing"),
    (lambda: X.ordered_class_emds([0], [0], [1], 3).exceeds(float("nan")), "finite"),
])
def test_bad_input_is_rejected(call, part):
    with pytest.raises(ValueError, match=part):
        call()
