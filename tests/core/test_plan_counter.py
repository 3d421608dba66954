"""PlanCounter (sabre_estimate's fast path) chooses what plan_from_counts chooses and counts
its classes, and the speculative ec_count and max_classes agree with the expanded tree."""
from __future__ import annotations

import numpy as np
import pytest

from sabre_pg.core.buckets import bucketize
from sabre_pg.core.emd import SADomain
from sabre_pg.core.redistribute import BucketEMD, ec_count, ec_counts, ec_size, max_classes
from sabre_pg.core.sabre import PlanCounter, plan_classes, plan_counts, plan_from_counts
from sabre_pg.synthetic import tree_hierarchy

TS = [0.05, 0.1, 0.15, 0.2, 0.25, 0.35, 0.45, 0.6]


def _random_counts(rng, m, n):
    weights = rng.lognormal(0.0, 1.2, m) * (rng.random(m) > 0.15)
    weights[rng.integers(m)] += 1.0
    counts = rng.multinomial(n, weights / weights.sum())
    return counts


def _cases():
    rng = np.random.default_rng(10)
    for seed in range(6):
        m = int(rng.integers(5, 60))
        n = int(rng.choice([200, 5_000, 60_000]))
        counts = _random_counts(rng, m, n)
        counts = counts[counts > 0]
        yield "num%d" % seed, counts, SADomain("numerical", m=len(counts)), int(rng.choice([1, 3, 6, 10]))
    h = tree_hierarchy(36, [3, 4], "v")
    for seed in range(3):
        counts = _random_counts(rng, h.n_leaves, 20_000)
        yield "cat%d" % seed, counts, SADomain("categorical", hierarchy=h), 4


CASES = list(_cases())


@pytest.mark.parametrize("name,counts,domain,k", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("lookahead", [0, 4])
def test_plan_counter_equals_plan_from_counts(name, counts, domain, k, lookahead):
    found = plan_classes(counts, domain, TS, k, lookahead)
    for t, fast in zip(TS, found):
        slow = plan_from_counts(counts, domain, t, k, lookahead)
        assert [(b.lo, b.hi) for b in fast.buckets.buckets] == [(b.lo, b.hi) for b in slow.buckets.buckets]
        assert fast.buckets.U == slow.buckets.U
        assert fast.classes == slow.plan.n_classes
        assert fast.t == t


def test_counts_are_shared_across_t_in_any_order():
    """Bounds from other t never change a result: descending, repeated and shuffled t agree."""
    _, counts, domain, k = CASES[1]
    counter = PlanCounter(counts, domain, k, 4)
    ascending = [counter.at(t).classes for t in TS]
    again = PlanCounter(counts, domain, k, 4)
    descending = [again.at(t).classes for t in reversed(TS)][::-1]
    assert ascending == descending == [counter.at(t).classes for t in TS]
    assert ascending == [plan_from_counts(counts, domain, t, k).plan.n_classes for t in TS]
    assert counter.known                          # counts were kept


@pytest.mark.parametrize("name,counts,domain,k", CASES, ids=[c[0] for c in CASES])
def test_speculative_ec_count_equals_the_expanded_tree(name, counts, domain, k):
    q = counts / counts.sum()
    for t in (0.1, 0.3):
        for bz in bucketize(q, t, domain, lookahead=2):
            bc = bz.counts(counts)
            bound = BucketEMD(bz, bc)
            classes = ec_count(bc, bound, bz.U, t, k)
            assert classes == ec_size(bc, bound, bz.U, t, k).n_classes
            assert 1 <= classes <= max_classes(int(counts.sum()), k)


@pytest.mark.parametrize("n,k", [(1, 1), (2, 1), (7, 3), (12, 3), (1000, 6), (99_999, 7)])
def test_max_classes_is_the_tree_only_k_limits(n, k):
    """max_classes = ec_size's classes when Theorem 4 refuses nothing (t = 1, one bucket)."""
    counts = np.array([n], dtype=np.int64)
    dom = SADomain("numerical", m=1)
    bz = bucketize(np.array([1.0]), 1.0, dom)
    plan = ec_size(counts, BucketEMD(bz, counts), bz.U, 1.0, k)
    assert max_classes(n, k) == plan.n_classes
    assert plan.sizes.min() >= k


@pytest.mark.parametrize("lookahead", [0, 4])
def test_plan_counts_of_many_tables_equal_their_plan_counters(lookahead):
    """plan_counts (the batched trees of sabre_estimate's resamples) plans every table, numerical
    and categorical, of several sizes and k, as PlanCounter plans each alone."""
    for k in (1, 6):
        tables = [(counts, domain) for _, counts, domain, _ in CASES]
        tables.append((np.array([4_000_000, 2_500_000, 1_000_003, 2_499_997]), SADomain("numerical", m=4)))
        found = plan_counts(tables, TS, k, lookahead)
        for (counts, domain), plans in zip(tables, found):
            counter = PlanCounter(counts, domain, k, lookahead)
            for t, fast in zip(TS, plans):
                slow = counter.at(t)
                assert [(b.lo, b.hi) for b in fast.buckets.buckets] == [(b.lo, b.hi) for b in slow.buckets.buckets]
                assert (fast.t, fast.buckets.U, fast.classes) == (t, slow.buckets.U, slow.classes)


def test_ec_counts_of_mixed_trees_equal_ec_count():
    """Trees of different bucketizations, widths, tables and t grown together count as alone."""
    roots, alone = [], []
    for _, counts, domain, k in CASES:
        for t in (0.1, 0.3):
            for bz in bucketize(counts / counts.sum(), t, domain, lookahead=2):
                bc = bz.counts(counts)
                roots.append((BucketEMD(bz, bc), bc, bz.U, t))
                alone.append(ec_count(bc, roots[-1][0], bz.U, t, 3))
    assert ec_counts(roots, 3) == alone
    assert len(set(alone)) > 5                  # the trees differ
