"""Property tests: the t-closeness and k guarantees of the whole pipeline on random tables,
and every EMD formula against a brute-force transportation LP."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from sabre_pg.core import buckets as bk
from sabre_pg.core.emd import (SADomain, class_emds, equal_emd, hierarchical_emd,
                               ordered_emd)
from sabre_pg.core.hierarchy import Hierarchy
from sabre_pg.core.redistribute import BucketEMD, dichotomize, ec_size
from sabre_pg.core.sabre import QuasiIdentifier, anonymize, encode_numerical

SETTINGS = dict(max_examples=40, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ----------------------------------------------------------------------------- strategies
@st.composite
def hierarchies(draw, min_height=0, max_height=3, max_leaves=16):
    """A random tree with every leaf at depth H, as ARX rows (shuffled), validated by
    Hierarchy(rows)."""
    H = draw(st.integers(min_height, max_height))
    if H == 0:
        return Hierarchy([["v0"]])
    paths = [[]]                                      # root-to-node label paths, top level first
    for lvl in range(H - 1, -1, -1):                  # build level lvl (H-1 .. 0)
        new = []
        for p in paths:
            cap = max(1, max_leaves // max(1, len(paths)))
            kids = draw(st.integers(1, min(4, cap)))
            for _ in range(kids):
                lab = ("v%d" % len(new)) if lvl == 0 else ("n%d_%d" % (lvl, len(new)))
                new.append(p + [lab])
        paths = new
    rows = [list(reversed(p)) + ["*"] for p in paths]
    perm = draw(st.permutations(range(len(rows))))
    h = Hierarchy([rows[i] for i in perm])
    assert h.height == H and h.n_leaves == len(rows)
    return h


def skewed_counts(rng, m, n, present=None):
    """n draws over m codes with a random skew; only ``present`` codes (default all) occur."""
    present = np.arange(m) if present is None else present
    w = rng.dirichlet(np.full(len(present), rng.choice([0.3, 1.0, 5.0])))
    return present[rng.choice(len(present), size=n, p=w)]


@st.composite
def tables(draw):
    n = draw(st.integers(1, 400))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    d = draw(st.integers(1, 4))
    qis = []
    for j in range(d):
        if draw(st.booleans()):
            scale = draw(st.sampled_from([1, 5, 100]))
            vals = rng.integers(0, scale + 1, n).astype(np.float64)
            if draw(st.booleans()):
                vals = vals + rng.random(n)
            qis.append(QuasiIdentifier("q%d" % j, vals))
        else:
            h = draw(hierarchies(max_height=3))
            qis.append(QuasiIdentifier("q%d" % j, rng.integers(0, h.n_leaves, n), h))
    if draw(st.booleans()):
        m = draw(st.integers(1, 30))
        raw = skewed_counts(rng, m, n) * 1000
        codes, distinct = encode_numerical(raw)
        domain = SADomain("numerical", m=len(distinct))
    else:
        h = draw(hierarchies(max_height=3))
        n_present = int(rng.integers(1, h.n_leaves + 1))
        present = np.sort(rng.choice(h.n_leaves, n_present, replace=False))
        codes = skewed_counts(rng, h.n_leaves, n, present)
        domain = SADomain("categorical", hierarchy=h)
    t = draw(st.floats(0.05, 0.6))
    k = draw(st.integers(1, min(20, n)))
    return qis, np.asarray(codes, dtype=np.int64), domain, t, k


def independent_emds(ec, codes, domain, C):
    q = np.bincount(codes, minlength=domain.m) / len(codes)
    out = []
    for c in range(C):
        p = np.bincount(codes[ec == c], minlength=domain.m) / np.count_nonzero(ec == c)
        if domain.numerical:
            out.append(ordered_emd(p, q))
        else:
            out.append(hierarchical_emd(p, q, domain.hierarchy))
    return np.array(out)


def assert_lowest_common_ancestors(h, node_of_class, ec, positions):
    """Each class's node covers all its leaves and none of the node's children does."""
    nodes = node_of_class[ec]
    assert ((h.lo[nodes] <= positions) & (positions < h.hi[nodes])).all()
    for c, node in enumerate(node_of_class):
        values = positions[ec == c]
        for child in np.flatnonzero(h.parent == node):
            assert not ((h.lo[child] <= values) & (values < h.hi[child])).all(), (c, node, child)


# ----------------------------------------------------------------------------- pipeline
@settings(**SETTINGS)
@given(tables())
def test_anonymize_guarantees(table):
    qis, codes, domain, t, k = table
    n = len(codes)
    for method, takeout in (("ak", "sweep"), ("ak", "random"), ("knn", "random")):
        r = anonymize(qis, codes, domain, t, k, method=method, takeout=takeout, seed=3)
        ec = r.ec
        C = r.n_classes
        # the ECs partition the input exactly
        assert ec.shape == (n,)
        assert set(np.unique(ec).tolist()) == set(range(C))
        sizes = np.bincount(ec, minlength=C)
        assert np.array_equal(sizes, r.sizes) and np.array_equal(sizes, r.plan.sizes)
        assert sizes.min() >= k, (method, takeout, sizes.min(), k)
        # t-closeness, recomputed from the ECs and SA codes
        e = independent_emds(ec, codes, domain, C)
        assert e.max() <= t + 1e-9, (method, takeout, e.max(), t)
        np.testing.assert_allclose(r.emds, e, atol=1e-9)
        # bucketization: U < t; every present SA value is in a bucket
        assert r.buckets.U < t
        assert r.buckets.U == pytest.approx(sum(b.bound for b in r.buckets.buckets))
        assert (r.bucket_of_tuple >= 0).all()
        # each EC takes exactly its template
        got = np.zeros_like(r.plan.templates)
        np.add.at(got, (ec, r.bucket_of_tuple), 1)
        assert np.array_equal(got, r.plan.templates)
        # generalization: each EC's exact range and the lowest common ancestor of its values
        for qi, g in zip(qis, r.generalization):
            if qi.numerical:
                lo, hi = np.full(C, np.inf), np.full(C, -np.inf)
                np.minimum.at(lo, ec, qi.values)
                np.maximum.at(hi, ec, qi.values)
                assert np.array_equal(g.lo, lo) and np.array_equal(g.hi, hi)
            else:
                assert_lowest_common_ancestors(qi.hierarchy, g.node, ec, qi.values)


@settings(**SETTINGS)
@given(st.integers(1, 30), st.integers(0, 2**32 - 1), st.floats(0.001, 0.9))
def test_bucket_num_invariants(m, seed, t):
    rng = np.random.default_rng(seed)
    q = rng.dirichlet(np.ones(m))
    bz = bk.bucket_num(q, t)
    assert bz.U < t
    assert [b.lo for b in bz.buckets] == [0] + [b.hi for b in bz.buckets[:-1]]
    assert bz.buckets[-1].hi == m
    for b in bz.buckets:
        assert b.bound == pytest.approx(bk.cet_numerical(q, b.lo, b.hi))
        if b.hi - b.lo == 1:
            assert b.bound == 0.0                 # exactly: one value, nothing to move
        # Theorem 3 bound = the worst single-value EC inside the bucket (q over the bucket)
        if b.hi - b.lo > 1:
            worst = max(sum(abs(l - i) * q[i] for i in range(b.lo, b.hi)) / (m - 1)
                        for l in range(b.lo, b.hi))
            assert b.bound == pytest.approx(worst, abs=1e-12)
    # every greedy step reduces U by its dv
    prev = bk.cet_numerical(q, 0, m)
    for s in bz.trace:
        assert s.U == pytest.approx(prev - s.dv, abs=1e-12)
        assert s.dv >= -1e-12
        prev = s.U


@settings(**SETTINGS)
@given(hierarchies(min_height=0), st.integers(0, 2**32 - 1), st.floats(0.001, 0.9))
def test_bucket_cat_invariants(h, seed, t):
    rng = np.random.default_rng(seed)
    q = np.zeros(h.n_leaves)
    present = rng.choice(h.n_leaves, int(rng.integers(1, h.n_leaves + 1)), replace=False)
    q[present] = rng.dirichlet(np.ones(len(present)))
    bz = bk.bucket_cat(q, h, t)
    assert bz.U < t
    of = bz.bucket_of_code()
    assert (of[present] >= 0).all()
    # buckets are disjoint hierarchy nodes covering all the mass
    assert sum(q[b.lo:b.hi].sum() for b in bz.buckets) == pytest.approx(1.0)
    for b in bz.buckets:
        assert (h.lo[b.node], h.hi[b.node]) == (b.lo, b.hi)
    D = h.distance_matrix()
    for b in bz.buckets:
        pr = np.flatnonzero(q[b.lo:b.hi] > 0) + b.lo
        assert len(pr) >= 1
        # Theorem 2 bound >= the worst single-value EC inside the bucket
        worst = max((D[l, pr] * q[pr]).sum() for l in pr)
        assert b.bound >= worst - 1e-12


# ----------------------------------------------------------------------------- EMD vs LP
def lp_emd(p, q, D):
    """The transportation problem min sum D_ij f_ij, rows sum to p, columns to q."""
    m1, m2 = D.shape
    A = np.zeros((m1 + m2, m1 * m2))
    for i in range(m1):
        A[i, i * m2:(i + 1) * m2] = 1
    for j in range(m2):
        A[m1 + j, j::m2] = 1
    res = linprog(D.ravel(), A_eq=A, b_eq=np.concatenate([p, q]), bounds=(0, None),
                  method="highs")
    assert res.status == 0, res.message
    return res.fun


def random_dist(rng, m, sparse=True):
    w = rng.random(m)
    if sparse and m > 1:
        w[rng.random(m) < 0.3] = 0
        if w.sum() == 0:
            w[rng.integers(m)] = 1
    return w / w.sum()


@settings(**SETTINGS)
@given(st.integers(1, 8), st.integers(0, 2**32 - 1))
def test_ordered_and_equal_emd_vs_lp(m, seed):
    rng = np.random.default_rng(seed)
    p, q = random_dist(rng, m), random_dist(rng, m)
    idx = np.arange(m)
    D = np.abs(idx[:, None] - idx[None, :]) / max(m - 1, 1)
    assert ordered_emd(p, q) == pytest.approx(lp_emd(p, q, D), abs=1e-9)
    assert equal_emd(p, q) == pytest.approx(lp_emd(p, q, 1.0 - np.eye(m)), abs=1e-9)


@settings(**SETTINGS)
@given(hierarchies(min_height=0, max_leaves=9), st.integers(0, 2**32 - 1))
def test_hierarchical_emd_vs_lp(h, seed):
    rng = np.random.default_rng(seed)
    p, q = random_dist(rng, h.n_leaves), random_dist(rng, h.n_leaves)
    assert hierarchical_emd(p, q, h) == pytest.approx(lp_emd(p, q, h.distance_matrix()), abs=1e-9)
    # vectorized over a batch equals one by one
    P = np.stack([random_dist(rng, h.n_leaves) for _ in range(4)])
    batch = hierarchical_emd(P, q, h)
    assert np.allclose(batch, [hierarchical_emd(x, q, h) for x in P])


@settings(**SETTINGS)
@given(st.integers(1, 12), st.integers(0, 2**32 - 1))
def test_flat_hierarchy_is_equal_emd(m, seed):
    rng = np.random.default_rng(seed)
    h = Hierarchy.flat(["x%d" % i for i in range(m)])
    P = np.stack([random_dist(rng, m) for _ in range(5)])
    q = random_dist(rng, m)
    assert np.allclose(hierarchical_emd(P, q, h), equal_emd(P, q), atol=1e-12)


def test_hierarchical_emd_rejects_wrong_length():
    h = Hierarchy.flat(["a", "b"])
    with pytest.raises(ValueError, match="3 values, hierarchy has 2"):
        hierarchical_emd(np.ones(3) / 3, np.ones(3) / 3, h)


# ----------------------------------------------------------------------------- bucket EMD
def random_count_vectors(rng, y_counts, n_vec):
    """Sub-count vectors of the table's bucket counts, as ECSize produces (and some others)."""
    out = []
    for _ in range(n_vec):
        v = rng.binomial(y_counts, rng.random())
        if v.sum() == 0:
            v[rng.integers(len(v))] = 1
        out.append(v)
    c1, c2 = dichotomize(y_counts)
    out += [c1, c2]
    return np.array(out)


def test_bucket_emd_numerical_upper_bound_and_exactness():
    """For a numerical SA the bucket EMD is a feasible flow under d^u: never below the LP
    optimum, and exact (within 1e-9) in at least 95% of random cases.

    (In fact it was exact in 4200 of 4200 cases in a longer run, as expected: for disjoint
    sorted intervals d^u_ij = |c_i - c_j| + (w_i + w_j)/2 with centres c and widths w, a
    line metric plus a per-unit constant, for which keeping min(x, y) in place and moving
    the residual monotonically is optimal.)"""
    rng = np.random.default_rng(2024)
    total = exact = 0
    worst = 0.0
    for _ in range(60):
        m = int(rng.integers(2, 30))
        counts = rng.integers(1, 20, m)
        q = counts / counts.sum()
        bz = bk.bucket_num(q, float(rng.uniform(0.01, 0.3)))
        y_counts = bz.counts(counts)
        be = BucketEMD(bz, y_counts)
        # D is d^u: the largest ground distance between values of the two buckets
        for i, a in enumerate(bz.buckets):
            for j, b in enumerate(bz.buckets):
                du = 0.0 if i == j else max(abs(x - z) for x in a.codes for z in b.codes) / (m - 1)
                assert be.distance[i, j] == pytest.approx(du)
        y = y_counts / y_counts.sum()
        X = random_count_vectors(rng, y_counts, 5)
        got = be(X)
        for x, g in zip(X, got):
            lp = lp_emd(x / x.sum(), y, be.distance)
            assert g >= lp - 1e-9
            total += 1
            exact += abs(g - lp) <= 1e-9
            worst = max(worst, g - lp)
    assert exact >= 0.95 * total, "bucket EMD exact in %d of %d cases (worst excess %g)" % (
        exact, total, worst)


@settings(**SETTINGS)
@given(hierarchies(min_height=1, max_leaves=14), st.integers(0, 2**32 - 1), st.floats(0.01, 0.5))
def test_bucket_emd_categorical_exact(h, seed, t):
    rng = np.random.default_rng(seed)
    counts = np.zeros(h.n_leaves, dtype=np.int64)
    present = rng.choice(h.n_leaves, int(rng.integers(1, h.n_leaves + 1)), replace=False)
    counts[present] = rng.integers(1, 20, len(present))
    q = counts / counts.sum()
    bz = bk.bucket_cat(q, h, t)
    y_counts = bz.counts(counts)
    be = BucketEMD(bz, y_counts)
    D = h.distance_matrix()
    B = bz.n_buckets
    Du = np.array([[0.0 if i == j else D[a.lo:a.hi, b.lo:b.hi].max()
                    for j, b in enumerate(bz.buckets)] for i, a in enumerate(bz.buckets)])
    assert np.allclose(be.distance, Du)
    y = y_counts / y_counts.sum()
    X = random_count_vectors(rng, y_counts, 4)
    got = be(X)
    for x, g in zip(X, got):
        assert g == pytest.approx(lp_emd(x / x.sum(), y, Du) if B > 1 else 0.0, abs=1e-9)


# ----------------------------------------------------------------------------- class_emds
@settings(**SETTINGS)
@given(st.integers(1, 300), st.integers(1, 30), st.integers(1, 40), st.integers(0, 2**32 - 1))
def test_class_emds_sparse_equals_dense_numerical(n, m, C, seed):
    rng = np.random.default_rng(seed)
    C = min(C, n)
    codes = rng.integers(0, m, n)
    ec = np.concatenate([np.arange(C), rng.integers(0, C, n - C)])
    rng.shuffle(ec)
    dom = SADomain("numerical", m=m)
    dense = class_emds(ec, codes, dom, chunk_cells=10**9)
    sparse = class_emds(ec, codes, dom, chunk_cells=1)
    np.testing.assert_allclose(sparse, dense, atol=1e-9)
    np.testing.assert_allclose(dense, independent_emds(ec, codes, dom, C), atol=1e-9)


@settings(**SETTINGS)
@given(hierarchies(min_height=0), st.integers(1, 200), st.integers(1, 20), st.integers(0, 2**32 - 1))
def test_class_emds_chunked_equals_dense_categorical(h, n, C, seed):
    rng = np.random.default_rng(seed)
    C = min(C, n)
    codes = rng.integers(0, h.n_leaves, n)
    ec = np.concatenate([np.arange(C), rng.integers(0, C, n - C)])
    rng.shuffle(ec)
    dom = SADomain("categorical", hierarchy=h)
    dense = class_emds(ec, codes, dom)
    chunked = class_emds(ec, codes, dom, chunk_cells=1)
    np.testing.assert_allclose(chunked, dense, atol=1e-12)
    np.testing.assert_allclose(dense, independent_emds(ec, codes, dom, C), atol=1e-9)


# ----------------------------------------------------------------------------- ECSize
@settings(**SETTINGS)
@given(st.integers(1, 6), st.integers(0, 2**32 - 1), st.floats(0.05, 0.6), st.integers(1, 20))
def test_ec_size_templates(B, seed, t, k):
    rng = np.random.default_rng(seed)
    m = int(rng.integers(B, B + 10))
    counts = rng.integers(1, 30, m)
    q = counts / counts.sum()
    bz = bk.bucket_num(q, t)
    y = bz.counts(counts)
    k = min(k, int(y.sum()))
    be = BucketEMD(bz, y)
    plan = ec_size(y, be, bz.U, t, k)
    T = plan.templates
    assert np.array_equal(T.sum(axis=0), y)                 # templates partition the buckets
    assert (T.sum(axis=1) >= k).all()
    if len(T) > 1:                                          # Theorem 4 for every template
        assert (be(T) + bz.U <= t + 1e-9).all()
    c1, c2 = dichotomize(y)
    assert np.array_equal(c1 + c2, y) and abs(int(c1.sum()) - int(c2.sum())) <= 1
