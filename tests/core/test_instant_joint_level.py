"""S-INSTANT's summary with an MCV list over *generalized* values (expression statistics):
``Summary(joint_level=v)`` against the true joint of a correlated pair, and the choice of v."""
from __future__ import annotations

import numpy as np

from sabre_pg.core.instant import Summary, bin_groups, interval_levels, joint_level, lattice_nodes


def correlated(n=100_000, seed=3):
    """x uniform on 0..19, y = x // 2 +- 1 (clipped): (levels of x, levels of y, x, y)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 20, n)
    y = np.clip(x // 2 + rng.integers(-1, 2, n), 0, 9)
    return (interval_levels("x", np.arange(20), np.bincount(x, minlength=20) / n, True),
            interval_levels("y", np.arange(10), np.bincount(y, minlength=10) / n, True), x, y)


def truth(qx, qy, x, y, node):
    gx, gy = qx.groups[node[0]][x], qy.groups[node[1]][y]
    return np.bincount(gx * len(qy.lm[node[1]]) + gy, minlength=len(qx.lm[node[0]]) * len(qy.lm[node[1]])) / len(x)


def grouped(qx, qy, x, y, v):
    cells, counts = np.unique(np.stack([qx.groups[v[0]][x], qy.groups[v[1]][y]], axis=1), axis=0, return_counts=True)
    return Summary((qx, qy), cells, counts / len(x), v)


def test_grouped_joint_is_exact_at_and_above_its_level_and_better_than_marginals_below():
    qx, qy, x, y = correlated()
    v = (2, 1)                                     # x in fours, y in twos: 5 x 5 groups
    joint, marginals = grouped(qx, qy, x, y, v), Summary((qx, qy))
    for node in lattice_nodes([qx.top, qy.top]):
        t = truth(qx, qy, x, y, node)
        got = joint.likelihoods(node)
        assert abs(got.sum() - 1) < 1e-12
        if node[0] >= v[0] and node[1] >= v[1]:
            assert np.abs(got - t).sum() < 1e-12, node
        elif node[0] < qx.top and node[1] < qy.top:     # (a QI at * leaves one marginal: exact either way)
            assert np.abs(got - t).sum() < np.abs(marginals.likelihoods(node) - t).sum(), node


def test_grouped_joint_at_level_zero_is_the_joint_of_values():
    qx, qy, x, y = correlated()
    cells, counts = np.unique(np.stack([x, y], axis=1), axis=0, return_counts=True)
    values, grouped0 = Summary((qx, qy), cells, counts / len(x)), grouped(qx, qy, x, y, (0, 0))
    for node in lattice_nodes([qx.top, qy.top]):
        assert np.allclose(values.likelihoods(node), grouped0.likelihoods(node))


def test_joint_level_fits_the_target_balanced_and_allowed():
    qx, qy, _, _ = correlated()
    assert joint_level((qx, qy), 1000) == (0, 0)                       # 20 x 10 fit
    assert joint_level((qx, qy), 100) == (1, 0)                        # 10 x 10
    assert joint_level((qx, qy), 30) == (2, 1)                         # 5 x 5: balanced
    assert joint_level((qx, qy), 30, [(0, qx.top), range(qy.top + 1)]) == (qx.top, 0)        # x all or nothing: the QI with most groups goes
    assert bin_groups(qx, 2, [0, 4, 5]).tolist() == [0, 4, -1]         # bins of width 4 over 0..19
