"""Utility metrics of sabre_pg.core.workload (and core.metrics through output_utility).

The paper's Table 2 generalization of its Table 1 is not available to us, so the AIL case
below is a *reconstruction*: a 9-tuple table with two numerical QIs (age, weight) and the
disease SA of the paper's running example (hierarchy
``* -> respiratory{SARS, pneumonia, bronchitis}, digestive{gastric ulcer, gastritis,
stomach cancer}``, counts 1, 2, 2, 1, 1, 2), generalized into three classes written out by
hand.
"""
from __future__ import annotations

import numpy as np
import pytest

from sabre_pg.core import metrics
from sabre_pg.core import workload as W
from sabre_pg.core.generalize import CategoricalNode, NumericalRange
from sabre_pg.core.hierarchy import Hierarchy

DISEASE_ROWS = [
    ["SARS", "respiratory", "*"], ["pneumonia", "respiratory", "*"], ["bronchitis", "respiratory", "*"],
    ["gastric ulcer", "digestive", "*"], ["gastritis", "digestive", "*"], ["stomach cancer", "digestive", "*"],
]
#            age weight disease            class
TABLE = [(23, 60, "gastric ulcer", 0),
         (27, 65, "pneumonia", 0),
         (29, 70, "bronchitis", 0),
         (35, 55, "stomach cancer", 1),
         (38, 80, "SARS", 1),
         (40, 75, "pneumonia", 1),
         (41, 50, "gastritis", 2),
         (43, 85, "bronchitis", 2),
         (45, 90, "stomach cancer", 2)]
# Generalization (class: age range, weight range):
#   0: [23, 29], [60, 70]   1: [35, 40], [55, 80]   2: [41, 45], [50, 90]
# Domains: age [23, 45] (span 22), weight [50, 90] (span 40).
#   IL(0) = 1/2 (6/22 + 10/40) = 0.2613636...
#   IL(1) = 1/2 (5/22 + 25/40) = 0.4261363...
#   IL(2) = 1/2 (4/22 + 40/40) = 0.5909090...
#   AIL = (3 IL(0) + 3 IL(1) + 3 IL(2)) / 9 = (15/22 + 75/40) / 6 = 0.4261363...
AIL_BY_HAND = (15 / 22 + 75 / 40) / 6
RANGES = {0: ((23, 29), (60, 70)), 1: ((35, 40), (55, 80)), 2: ((41, 45), (50, 90))}


def example():
    age = np.array([r[0] for r in TABLE], float)
    weight = np.array([r[1] for r in TABLE], float)
    ec = np.array([r[3] for r in TABLE])
    lo_age = np.array([RANGES[e][0][0] for e in ec], float)
    hi_age = np.array([RANGES[e][0][1] for e in ec], float)
    lo_w = np.array([RANGES[e][1][0] for e in ec], float)
    hi_w = np.array([RANGES[e][1][1] for e in ec], float)
    return age, weight, ec, (lo_age, hi_age), (lo_w, hi_w)


def test_disease_counts_of_the_example():
    h = Hierarchy(DISEASE_ROWS)
    counts = np.bincount(h.codes([r[2] for r in TABLE]), minlength=6)
    assert counts.tolist() == [1, 2, 2, 1, 1, 2]


def test_ail_of_the_reconstructed_example():
    age, weight, ec, a, w = example()
    ils = [metrics.il_numerical(NumericalRange(*a), age.min(), age.max()),
           metrics.il_numerical(NumericalRange(*w), weight.min(), weight.max())]
    u = W.output_utility(ec, ils, k=3)
    assert u["ail"] == pytest.approx(AIL_BY_HAND)
    assert u["ail"] == pytest.approx(0.42613636363636365)
    assert u["discernibility"] == 27
    assert u["aecs"] == 3 and u["aecs_normalized"] == 1
    assert (u["classes"], u["min_class_size"], u["max_class_size"]) == (3, 3, 3)


def test_ail_with_a_categorical_qi():
    # disease as a QI: leaf -> 0, 'respiratory' (3 of 6 leaves) -> 2/5, '*' -> 1
    h = Hierarchy(DISEASE_ROWS)
    nodes = np.array([h.node_id[(0, "SARS")], h.node_id[(1, "respiratory")], h.node_id[(2, "*")]])
    il = metrics.il_categorical(CategoricalNode(nodes, h))
    assert il.tolist() == pytest.approx([0.0, 0.4, 1.0])
    u = W.output_utility(np.array([0, 1, 2]), [il])
    assert u["ail"] == pytest.approx(1.4 / 3)


def grid_of_example(boxes=True):
    age, weight, ec, a, w = example()
    h = Hierarchy(DISEASE_ROWS)
    sa = h.codes([r[2] for r in TABLE])
    ax_a, ax_w = W.NumericalAxis(age), W.NumericalAxis(weight)
    src = np.column_stack([ax_a.cells(age), ax_w.cells(weight)])
    if boxes:
        la, ha = ax_a.box(*a)
        lw, hw = ax_w.box(*w)
        lo, hi = np.column_stack([la, lw]), np.column_stack([ha, hw])
    else:
        lo = hi = src
    return W.Grid([ax_a.size, ax_w.size], h.n_leaves, src, sa, lo, hi, sa)


def test_boxes_are_rank_intervals():
    g = grid_of_example()
    # ages 23,27,29 are ranks 0..2; weights 60..70 are ranks 2..4 of 50,55,60,65,70,75,80,85,90
    assert g.lo[0].tolist() == [0, 2] and g.hi[0].tolist() == [2, 4]


def test_hand_computed_estimate():
    """COUNT(age <= 27 AND disease IN respiratory): exact 1 (t2); class 0 holds 2 respiratory
    tuples spread over 3 age ranks of which 2 qualify (23, 27): estimate 2 * 2/3; classes 1
    and 2 lie outside the age range."""
    g = grid_of_example()
    wl = W.Workload(np.array([[0]]), np.array([[0, 0]]), np.array([[1, 2]]), 1, 0.1)
    prec, est = W.query_counts(g, wl)
    assert prec.tolist() == [1.0]
    assert est[0] == pytest.approx(4 / 3)
    prec2, est2 = W.query_counts(g, wl, max_cells=1)          # direct path: same numbers
    assert prec2.tolist() == [1.0] and est2[0] == pytest.approx(4 / 3)
    assert W.relative_errors(prec, est)[0] == pytest.approx(1 / 3)


def test_query_error_is_zero_for_the_original_table():
    g = grid_of_example(boxes=False)                  # every class of size 1, boxes = points
    r = W.median_relative_error(g, queries=500, lam=2, theta=0.3, seed=3)
    assert r["answered"] > 0
    assert r["median_relative_error"] == pytest.approx(0.0, abs=1e-9)
    assert r["mean_relative_error"] == pytest.approx(0.0, abs=1e-9)


def test_queries_with_zero_count_are_dropped():
    prec = np.array([0, 2, 4, 0])
    est = np.array([5, 1, 4, 1])
    assert W.relative_errors(prec, est).tolist() == [0.5, 0.0]


def test_kl_is_zero_for_identical_cubes():
    assert W.kl([3, 0, 2, 5], [3, 0, 2, 5]) == pytest.approx(0.0, abs=1e-9)
    g = grid_of_example(boxes=False)
    for level in (1, 2):
        r = W.kl_divergence(g, level)
        assert r["kl_divergence"] == pytest.approx(0.0, abs=1e-9)


def test_kl_hand_computed_and_positive_when_generalized():
    # P = (1/2, 1/2, 0), Q = (1/4, 1/4, 1/2): KL = log 2
    assert W.kl([1, 1, 0], [1, 1, 2]) == pytest.approx(np.log(2))
    assert W.kl_divergence(grid_of_example(), 1)["kl_divergence"] > 0.01


def test_cube_and_direct_paths_agree_on_random_data():
    rng = np.random.default_rng(7)
    sizes = [20, 3, 7]
    n = 3000
    src = np.column_stack([rng.integers(0, s, n) for s in sizes])
    sa = rng.integers(0, 9, n)
    lo = np.maximum(src - rng.integers(0, 4, src.shape), 0)
    hi = np.minimum(src + rng.integers(0, 4, src.shape), np.array(sizes) - 1)
    g = W.Grid(sizes, 9, src, sa, lo, hi, sa)
    wl = W.make_workload(sizes, 9, 200, 2, 0.2, 11)
    p1, e1 = W.query_counts(g, wl)
    p2, e2 = W.query_counts(g, wl, max_cells=1)
    assert np.array_equal(p1, p2)
    assert np.allclose(e1, e2)
    assert abs(e1.sum() - p1.sum()) / p1.sum() < 0.2      # unbiased-ish overall


def test_workload_shape_and_selectivity():
    sizes = [79, 2, 17, 6, 9, 10, 83]
    wl = W.make_workload(sizes, 50, 4000, 3, 0.1, 1)
    assert wl.attrs.shape == (4000, 3) and wl.lo.shape == (4000, 4)
    assert (np.diff(wl.attrs, axis=1) > 0).all()              # distinct QIs per query
    m = np.column_stack([np.asarray(sizes)[wl.attrs], np.full(4000, 50)])
    assert (wl.lo >= 0).all() and (wl.hi < m).all() and (wl.hi >= wl.lo).all()
    frac = ((wl.hi - wl.lo + 1) / m).prod(axis=1)
    assert 0.05 < np.median(frac) < 0.2                       # about theta = 0.1
    again = W.make_workload(sizes, 50, 4000, 3, 0.1, 1)
    assert np.array_equal(wl.lo, again.lo) and np.array_equal(wl.attrs, again.attrs)


@pytest.mark.parametrize("kw", [dict(lam=0), dict(lam=8), dict(theta=0), dict(theta=1.5), dict(queries=0)])
def test_workload_rejects_bad_parameters(kw):
    args = dict(queries=10, lam=3, theta=0.1)
    args.update(kw)
    with pytest.raises(ValueError):
        W.make_workload([5] * 7, 4, args["queries"], args["lam"], args["theta"])


def test_binned_numerical_axis():
    ax = W.NumericalAxis(np.arange(1000.0), max_bins=10)
    assert ax.size == 10
    assert ax.cells([0, 99, 100, 999]).tolist() == [0, 0, 1, 9]
    assert [c.tolist() for c in ax.box([0, 150], [99, 420])] == [[0, 1], [0, 4]]


def test_node_of_label_prefers_the_deepest_node():
    h = Hierarchy([["Other", "Other", "*"], ["A", "G", "*"]])
    nodes = W.node_of_label(h)
    assert h.level[nodes["Other"]] == 0 and h.level[nodes["*"]] == 2
