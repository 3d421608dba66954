"""ECSize's two split conditions at their boundaries (§4.3): Theorem 4's EMD(half) + U <= t,
and both halves keeping at least k tuples."""
from __future__ import annotations

import numpy as np
import pytest

from sabre_pg.core import buckets
from sabre_pg.core.emd import SADomain, class_emds
from sabre_pg.core.hierarchy import Hierarchy
from sabre_pg.core.redistribute import BucketEMD, dichotomize, ec_count, ec_size, margin
from sabre_pg.core.sabre import QuasiIdentifier, anonymize, plan_from_counts

# The paper's running example (see test_paper_examples): bucket counts [5, 4] over the
# buckets respiratory / digestive, U = 7/18.
DISEASE_ROWS = [["SARS", "respiratory", "*"], ["pneumonia", "respiratory", "*"],
                ["bronchitis", "respiratory", "*"], ["gastric ulcer", "digestive", "*"],
                ["gastritis", "digestive", "*"], ["stomach cancer", "digestive", "*"]]
DISEASE_CODES = np.array([0, 1, 1, 2, 2, 3, 4, 5, 5])       # SARS 1, pneumonia 2, ...


@pytest.fixture
def disease():
    h = Hierarchy(DISEASE_ROWS)
    counts = np.bincount(DISEASE_CODES, minlength=h.n_leaves)
    bz = buckets.bucket_cat(counts / counts.sum(), h, 0.45)
    bucket_counts = bz.counts(counts)
    assert bucket_counts.tolist() == [5, 4] and bz.U == pytest.approx(7 / 18)
    return h, bz, bucket_counts, BucketEMD(bz, bucket_counts)


def root_split_threshold(bz, bucket_emd, bucket_counts) -> float:
    """The smallest t at which Theorem 4 allows splitting the whole table: U plus the larger
    bucket EMD of its two halves (here 7/18 + 1/18 = 4/9, the half (2, 2))."""
    halves = np.array(dichotomize(bucket_counts))
    return bz.U + float(bucket_emd(halves).max())


def test_theorem4_refuses_a_split_just_above_t(disease):
    """t a millionth below EMD(half) + U: the table must stay one class.  (This fails if the
    rounding tolerance of the split test grows to 1e-4.)"""
    _, bz, bucket_counts, bucket_emd = disease
    threshold = root_split_threshold(bz, bucket_emd, bucket_counts)
    assert threshold == pytest.approx(4 / 9, abs=1e-12)
    t = threshold - 1e-6
    plan = ec_size(bucket_counts, bucket_emd, bz.U, t, k=1, record_tree=True)
    assert plan.templates.tolist() == [[5, 4]]
    assert plan.tree == {(5, 4): None}
    assert ec_count(bucket_counts, bucket_emd, bz.U, t, k=1) == 1


def test_theorem4_allows_the_split_above_its_margin(disease):
    """At t = EMD(half) + U plus the rounding margin the split is allowed."""
    _, bz, bucket_counts, bucket_emd = disease
    t = root_split_threshold(bz, bucket_emd, bucket_counts) + margin(bucket_emd)
    plan = ec_size(bucket_counts, bucket_emd, bz.U, t, k=1)
    assert plan.templates.tolist() == [[3, 2], [1, 1], [1, 1]]


@pytest.mark.parametrize("above", [0.0, 1e-13, 9e-13])
def test_theorem4_never_accepts_a_split_above_t_by_rounding(disease, above):
    """The computed EMD(half) + U at or within 1e-12 above t: refused.  (A tolerance of 1e-12
    in the split test, as before, accepted classes up to 1e-12 above t.)"""
    _, bz, bucket_counts, bucket_emd = disease
    t = root_split_threshold(bz, bucket_emd, bucket_counts) - above
    assert margin(bucket_emd) < 1e-12
    assert ec_size(bucket_counts, bucket_emd, bz.U, t, k=1).templates.tolist() == [[5, 4]]
    assert ec_count(bucket_counts, bucket_emd, bz.U, t, k=1) == 1


@pytest.mark.parametrize("above, classes", [(-1e-6, 1), (1e-12, 3)])
def test_theorem4_boundary_end_to_end(disease, above, classes):
    """The whole pipeline on the 9-tuple table at t = 4/9 + above: every class is within t."""
    h, _, _, _ = disease
    t = 4 / 9 + above
    qis = [QuasiIdentifier("age", np.arange(9, dtype=np.float64))]
    domain = SADomain("categorical", hierarchy=h)
    r = anonymize(qis, DISEASE_CODES, domain, t, k=1, lookahead=0)
    assert r.n_classes == classes
    assert class_emds(r.ec, DISEASE_CODES, domain).max() <= t


@pytest.mark.parametrize("n, k, sizes", [(8, 4, [4, 4]), (9, 4, [5, 4]), (12, 3, [3, 3, 3, 3]),
                                         (7, 4, [7])])
def test_a_class_of_exactly_k_tuples_is_allowed(n, k, sizes):
    """One SA value (U = 0, every bucket EMD 0): only k limits the splits, and a half of
    exactly k tuples is allowed.  (This fails if the size test becomes > k.)"""
    counts = np.array([n])
    bz = buckets.bucket_num(np.ones(1), 0.5)
    bucket_emd = BucketEMD(bz, counts)
    plan = ec_size(counts, bucket_emd, bz.U, 0.5, k)
    assert sorted(plan.sizes.tolist(), reverse=True) == sizes
    assert ec_count(counts, bucket_emd, bz.U, 0.5, k) == len(sizes)
    qis = [QuasiIdentifier("age", np.arange(n, dtype=np.float64))]
    r = anonymize(qis, np.zeros(n, dtype=np.int64), SADomain("numerical", m=1), 0.5, k)
    assert sorted(r.sizes.tolist(), reverse=True) == sizes
    assert r.sizes.min() == min(sizes)


def test_lookahead_zero_is_the_papers_bucketization():
    """lookahead = 0: the first bucketization with U < t, and a complete, valid run."""
    rng = np.random.default_rng(5)
    n, t, k = 2000, 0.2, 5
    qis = [QuasiIdentifier("age", rng.integers(17, 90, n).astype(float)),
           QuasiIdentifier("zip", rng.integers(0, 5, n), Hierarchy.flat(list("abcde")))]
    codes = np.minimum(rng.geometric(0.15, n) - 1, 29)
    domain = SADomain("numerical", m=30)
    counts = np.bincount(codes, minlength=30)
    sa_plan = plan_from_counts(counts, domain, t, k, lookahead=0)
    bz = sa_plan.buckets
    assert bz.U < t and all(step.U >= t for step in bz.trace[:-1])     # stopped at the first
    assert [(b.lo, b.hi) for b in bz.buckets] == \
        [(b.lo, b.hi) for b in buckets.bucketize(counts / n, t, domain).buckets]
    # on this table the default look-ahead moves on to a later candidate
    assert plan_from_counts(counts, domain, t, k).buckets.n_buckets > bz.n_buckets
    r = anonymize(qis, codes, domain, t, k, lookahead=0)
    assert [(b.lo, b.hi) for b in r.buckets.buckets] == [(b.lo, b.hi) for b in bz.buckets]
    np.testing.assert_array_equal(r.plan.templates, sa_plan.plan.templates)
    assert r.n_classes > 1 and r.sizes.sum() == n and r.sizes.min() >= k
    assert class_emds(r.ec, codes, domain).max() <= t + 1e-12
    assert set(r.phases) >= {"bucketize", "redistribute", "takeout", "total"}


def test_categorical_bucket_emd_builds_no_bucket_by_bucket_matrix():
    """A flat SA of 5,000 values gives 5,000 buckets: the plan must not allocate the B x B
    distance matrix (200 MB here; 1.5 GB for 10,000 leaves) that only the numerical path uses."""
    import tracemalloc
    m = 5_000
    h = Hierarchy.flat(["v%d" % i for i in range(m)])
    counts = np.full(m, 40, dtype=np.int64)
    domain = SADomain("categorical", hierarchy=h)
    tracemalloc.start()
    try:
        plan = plan_from_counts(counts, domain, 0.2, k=2, lookahead=0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert plan.buckets.n_buckets == m and plan.plan.n_classes > 1
    assert peak < 60 * 2**20, "peak %.0f MB" % (peak / 2**20)


def test_numerical_sa_of_100k_values_at_a_tiny_t_finishes():
    """10^5 distinct numerical values at t = 1e-5 (33,618 buckets): bucketization keeps its
    candidates in a heap, d^u is looked up per pair, takeOut groups tuples by bucket once and
    ECSize deduplicates rows by bytes -- before, this ran for hours (quadratic in B).  The
    classes are t-close by the exact EMD."""
    from sabre_pg.core.exact_emd import ordered_class_emds
    m = 100_000
    codes = np.repeat(np.arange(m), 2)
    rng = np.random.default_rng(1)
    qis = [QuasiIdentifier("a", rng.random(len(codes)))]
    r = anonymize(qis, codes, SADomain("numerical", m=m), 1e-5, 2)
    assert r.buckets.U < 1e-5 and r.buckets.n_buckets > 10_000
    exact = ordered_class_emds(r.ec, codes, np.ones(len(codes), dtype=np.int64), m)
    assert exact.violations(1e-5, 2) == 0
    assert r.sizes.sum() == len(codes)
