"""S-INSTANT's model (sabre_pg/core/instant.py) against exact enumeration and Monte Carlo.

The paper's worked numbers are not used (they are not consistent); every expectation here is
computed from first principles: all multinomial outcomes for small n, or many seeded draws.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from sabre_pg.core.hierarchy import Hierarchy
from sabre_pg.core.instant import (Condition, Summary, below, distinct_probability, hierarchy_levels,
                                   interval_levels, lattice_nodes, mu_expectation, mu_probability, node_lm,
                                   parents, walk)


def compositions(n, parts):
    for cut in itertools.combinations(range(n + parts - 1), parts - 1):
        edges = (-1,) + cut + (n + parts - 1,)
        yield tuple(edges[i + 1] - edges[i] - 1 for i in range(parts))


def exact_k(p, n, k):
    """(P(k-anonymous), E[outliers]) by enumerating every multinomial outcome."""
    prob = outliers = 0.0
    for c in compositions(n, len(p)):
        w = math.exp(math.lgamma(n + 1) + sum(ci * math.log(pi) - math.lgamma(ci + 1) for ci, pi in zip(c, p)))
        bad = sum(ci for ci in c if 0 < ci < k)
        prob += w * (bad == 0)
        outliers += w * bad
    return prob, outliers


@pytest.mark.parametrize("p,n,k", [([.25, .25, .25, .25], 16, 3), ([.5, .3, .15, .05], 14, 2),
                                   ([.4, .4, .1, .1], 15, 3), ([.6, .3, .1], 40, 5)])
def test_mu_expectation_is_exact(p, n, k):
    _, outliers = exact_k(p, n, k)
    assert mu_expectation(p, n, Condition.build(k)) == pytest.approx(outliers, rel=1e-9)


@pytest.mark.parametrize("p,n,k,tolerance", [([.6, .3, .1], 40, 5, 0.01), ([.45, .35, .2], 60, 12, 0.02),
                                             ([.25, .25, .25, .25], 16, 3, 0.05)])
def test_mu_probability_against_enumeration(p, n, k, tolerance):
    prob, _ = exact_k(p, n, k)
    assert mu_probability(p, n, Condition.build(k)) == pytest.approx(prob, abs=tolerance)


def monte_carlo(p, n, k, l=None, q=None, samples=100_000, seed=7):
    """(P(all buckets pass), E[outliers]) from seeded multinomial draws over (bucket, SA) cells."""
    rng = np.random.default_rng(seed)
    q = np.array([1.0]) if q is None else np.asarray(q)
    counts = rng.multinomial(n, np.outer(p, q).ravel(), size=samples).reshape(samples, len(p), len(q))
    size = counts.sum(axis=2)
    ok = (size == 0) | (size >= k)
    if l:
        ok &= (size == 0) | ((counts > 0).sum(axis=2) >= l)
    return ok.all(axis=1).mean(), (size * ~ok).sum(axis=1).mean()


@pytest.mark.parametrize("buckets,n,k", [(20, 2000, 80), (30, 3000, 60), (12, 1000, 40)])
def test_mu_probability_against_monte_carlo(buckets, n, k):
    p = np.random.default_rng(buckets).dirichlet(np.full(buckets, 8.0))
    prob, outliers = monte_carlo(p, n, k)
    cond = Condition.build(k)
    assert mu_probability(p, n, cond) == pytest.approx(prob, abs=0.02)
    assert mu_expectation(p, n, cond) == pytest.approx(outliers, rel=0.03, abs=0.5)


def test_distinct_probability_against_enumeration():
    q = np.array([.5, .3, .15, .05])
    for x in range(0, 7):
        for l in (2, 3, 4):
            exact = 0.0
            for seq in itertools.product(range(len(q)), repeat=x):
                exact += np.prod(q[list(seq)]) * (len(set(seq)) >= l)
            assert distinct_probability(q, l, [x])[0] == pytest.approx(exact, abs=1e-12), (x, l)
    # beyond the exact range the indicator approximation is close to Monte Carlo
    rng = np.random.default_rng(3)
    draws = rng.multinomial(100, q, size=200_000)
    assert distinct_probability(q, 4, [100])[0] == pytest.approx(((draws > 0).sum(1) >= 4).mean(), abs=0.005)


@pytest.mark.parametrize("n,k,l", [(400, 5, 3), (400, 10, 4), (300, 2, 3)])
def test_mu_l_against_monte_carlo(n, k, l):
    p = np.random.default_rng(n + k).dirichlet(np.full(8, 2.0))
    q = np.array([.5, .3, .15, .05])
    prob, outliers = monte_carlo(p, n, k, l, q, samples=60_000)
    cond = Condition.build(k, l, q)
    assert mu_probability(p, n, cond) == pytest.approx(prob, abs=0.02)
    assert mu_expectation(p, n, cond) == pytest.approx(outliers, rel=0.03)


def test_sd_cut_and_hybrid_agree_with_the_full_sums():
    p = np.random.default_rng(5).dirichlet(np.full(40, 3.0))
    cond = Condition.build(50)
    full = mu_probability(p, 4000, cond, sd=60.0)
    assert mu_probability(p, 4000, cond) == pytest.approx(full, abs=1e-6)
    assert mu_probability(p, 4000, cond, hybrid=True) == pytest.approx(full, abs=0.05)
    assert mu_expectation(p, 4000, cond) == pytest.approx(mu_expectation(p, 4000, cond, sd=60.0), rel=1e-6)


def small_summary(seed=0):
    rng = np.random.default_rng(seed)
    h = Hierarchy([["a", "ab", "*"], ["b", "ab", "*"], ["c", "cd", "*"], ["d", "cd", "*"]])
    cat = hierarchy_levels("c", h, rng.dirichlet(np.ones(4) * 2))
    ages = np.arange(20, 52)
    age = interval_levels("age", ages, rng.dirichlet(np.ones(len(ages)) * 2), integer=True)
    sex = hierarchy_levels("sex", Hierarchy.flat(["F", "M"]), [0.5, 0.5])
    return Summary((cat, age, sex))


def test_interval_levels_nest_and_lm_grows():
    age = small_summary().qis[1]
    assert age.intervals.widths == (2.0, 4.0, 8.0, 16.0)
    for j in range(age.top):
        # each group of level j lies inside one group of level j + 1
        pairs = set(zip(age.groups[j].tolist(), age.groups[j + 1].tolist()))
        assert len({a for a, _ in pairs}) == len(pairs)
        assert age.expected_lm(j) <= age.expected_lm(j + 1)
    assert age.expected_lm(0) == 0 and age.expected_lm(age.top) == pytest.approx(1)


def test_monotone_over_the_lattice():
    """Theorem 3.5: a more general node has a higher mu-probability and fewer expected outliers."""
    summary = small_summary()
    heights = [q.top for q in summary.qis]
    cond = Condition.build(15)
    prob, expect = {}, {}
    for node in lattice_nodes(heights):
        ell = summary.likelihoods(node)
        assert ell.sum() == pytest.approx(1.0)
        prob[node], expect[node] = mu_probability(ell, 600, cond), mu_expectation(ell, 600, cond)
    for node in prob:
        for parent in parents(node, heights):
            assert prob[parent] >= prob[node] - 1e-3, (parent, node)
            assert expect[parent] <= expect[node] + 1e-9, (parent, node)


def test_walk_prunes_exactly_the_descendants_of_failures():
    summary = small_summary(1)
    heights = [q.top for q in summary.qis]
    cond = Condition.build(10)
    result = walk(summary, 800, cond, 0.8)
    prob = {v: mu_probability(summary.likelihoods(v), 800, cond) for v in lattice_nodes(heights)}
    # a node is a candidate iff it and every more general node pass
    expected = {v for v in prob if all(prob[u] >= 0.8 for u in prob if below(v, u))}
    assert {c.node for c in result.candidates} == expected
    assert result.evaluated < result.lattice
    lms = [c.lm for c in result.candidates]
    assert lms == sorted(lms)
    assert result.candidates[-1].node == tuple(heights)       # the top, LM 1


def test_expectation_criterion_allows_suppression():
    summary = small_summary(2)
    cond = Condition.build(10)
    strict = walk(summary, 800, cond, 0.8)
    loose = walk(summary, 800, cond, 0.8, criterion="expectation", max_outliers=0.05 * 800)
    assert loose.candidates[0].lm <= strict.candidates[0].lm
    assert all(c.expectation <= 40 for c in loose.candidates)


def test_joint_summary_reproduces_the_joint_distribution():
    summary = small_summary(3)
    cells = np.array(list(itertools.product(*[range(len(q.probs)) for q in summary.qis])))
    freqs = np.random.default_rng(0).dirichlet(np.ones(len(cells)))
    joint = Summary(summary.qis, cells, freqs)
    node = (1, 2, 0)
    expected = np.zeros(len(summary.likelihoods(node)))
    shape = tuple(len(q.lm[j]) for q, j in zip(summary.qis, node))
    for c, f in zip(cells, freqs):
        expected[np.ravel_multi_index(tuple(q.groups[j][x] for q, j, x in zip(summary.qis, node, c)), shape)] += f
    assert joint.likelihoods(node) == pytest.approx(expected)


def test_node_lm_from_counts():
    summary = small_summary(4)
    counts = [np.ones(len(q.probs)) for q in summary.qis]
    heights = tuple(q.top for q in summary.qis)
    assert node_lm(summary.qis, heights, counts) == pytest.approx(1.0)
    assert node_lm(summary.qis, (0, 0, 0), counts) == 0.0


def test_nodes_with_far_more_buckets_than_rows_are_pruned_unevaluated():
    values = np.arange(0, 300)
    levels = tuple(interval_levels(name, values, np.ones(300), integer=True) for name in ("a", "b", "c"))
    summary = Summary(levels)
    result = walk(summary, 50, Condition.build(2), 0.5)
    assert all(summary.buckets(c.node) <= 1 << 16 for c in result.candidates)
    assert (0, 0, 0) not in {c.node for c in result.candidates}     # 27M buckets for 50 rows
