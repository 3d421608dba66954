"""Edge cases of the pipeline and its argument checks."""
from __future__ import annotations

import math

import numpy as np
import pytest

from sabre_pg.core import buckets as bk
from sabre_pg.core.emd import SADomain, class_emds, hierarchical_emd
from sabre_pg.core.hierarchy import Hierarchy
from sabre_pg.core.redistribute import BucketEMD, ec_size
from sabre_pg.core.sabre import QuasiIdentifier, anonymize, encode_numerical
from sabre_pg.synthetic import census, tree_hierarchy

METHODS = [("ak", "sweep"), ("ak", "random"), ("knn", "random")]


def numeric_table(n=60, m=8, seed=0):
    rng = np.random.default_rng(seed)
    qis = [QuasiIdentifier("age", rng.integers(17, 90, n).astype(float)),
           QuasiIdentifier("zip", rng.integers(0, 5, n), Hierarchy.flat(list("abcde")))]
    codes, distinct = encode_numerical(rng.integers(0, m, n) * 1000)
    return qis, codes, SADomain("numerical", m=len(distinct))


def check(r, n, k):
    assert r.sizes.sum() == n and r.sizes.min() >= k
    assert set(np.unique(r.ec).tolist()) == set(range(r.n_classes))


@pytest.mark.parametrize("method, takeout", METHODS)
def test_single_distinct_sa_value(method, takeout):
    qis, _, _ = numeric_table(50)
    codes, distinct = encode_numerical(np.full(50, 42))
    dom = SADomain("numerical", m=len(distinct))
    assert dom.m == 1
    r = anonymize(qis, codes, dom, 0.1, k=4, method=method, takeout=takeout)
    check(r, 50, 4)
    assert r.buckets.n_buckets == 1 and r.buckets.U == 0
    assert np.all(r.emds == 0)
    assert r.n_classes > 1                        # nothing stops splitting down to k
    assert r.sizes.max() < 8


@pytest.mark.parametrize("method, takeout", METHODS)
def test_all_tuples_identical(method, takeout):
    n = 40
    qis = [QuasiIdentifier("a", np.full(n, 3.0)),
           QuasiIdentifier("b", np.zeros(n, dtype=np.int64), Hierarchy.flat(["x", "y"]))]
    codes = np.zeros(n, dtype=np.int64)
    dom = SADomain("categorical", hierarchy=Hierarchy.flat(["s1", "s2", "s3"]))
    r = anonymize(qis, codes, dom, 0.2, k=5, method=method, takeout=takeout)
    check(r, n, 5)
    assert np.all(r.emds == 0)
    assert np.all(r.il == 0)
    assert r.generalization[0].lo.tolist() == [3.0] * r.n_classes


@pytest.mark.parametrize("method, takeout", METHODS)
def test_t_one_gives_one_bucket(method, takeout):
    qis, codes, dom = numeric_table(80, 10)
    h = tree_hierarchy(12, [3], "d")
    cat = SADomain("categorical", hierarchy=h)
    cc = np.random.default_rng(1).integers(0, 12, 80)
    for sa_codes, domain in ((codes, dom), (cc, cat)):
        r = anonymize(qis, sa_codes, domain, 1.0, k=1, method=method, takeout=takeout)
        assert r.buckets.n_buckets == 1
        assert r.buckets.U < 1.0
        check(r, 80, 1)
        # one bucket: the bucket EMD is 0, so ECSize splits down to single tuples, and
        # Theorem 4 bounds each one's EMD by U (the bucket's CET^U), not just by t = 1
        assert r.sizes.max() <= 2
        q = np.bincount(sa_codes, minlength=domain.m) / len(sa_codes)
        emds = np.array([domain.emd(np.bincount(sa_codes[r.ec == c], minlength=domain.m) / size, q)
                         for c, size in enumerate(r.sizes)])      # one class at a time
        np.testing.assert_allclose(r.emds, emds, atol=1e-12)
        assert emds.max() <= r.buckets.U + 1e-12
        assert emds.max() > 0.5 * r.buckets.U          # and single tuples come near it


@pytest.mark.parametrize("kind", ["numerical", "categorical"])
def test_tiny_t_gives_every_value_its_own_bucket(kind):
    rng = np.random.default_rng(3)
    n = 200
    qis = [QuasiIdentifier("x", rng.random(n))]
    if kind == "numerical":
        codes, distinct = encode_numerical(rng.integers(0, 15, n))
        dom = SADomain("numerical", m=len(distinct))
    else:
        h = tree_hierarchy(20, [2, 5], "s")              # height 3
        codes = rng.choice([0, 1, 2, 7, 8, 13, 19], n)
        dom = SADomain("categorical", hierarchy=h)
    t = 1e-6
    r = anonymize(qis, codes, dom, t, k=1)
    bz = r.buckets
    assert bz.U == 0
    present = np.unique(codes)
    assert bz.n_buckets == len(present)
    for b in bz.buckets:
        assert np.count_nonzero(np.isin(present, list(b.codes))) == 1
    # with one value per bucket only the whole table satisfies t = 1e-6 (unless all ECs
    # have exactly the table's distribution); every EC still satisfies it
    assert r.emds.max() <= t + 1e-9


def test_single_value_numerical_buckets_have_zero_bound():
    """A one-value bucket has CET^U exactly 0 (cet_numerical says so); the split search used
    to give it a prefix-sum cancellation residue (~1e-17), so U > 0 with single-value buckets
    and U < t failed for t below ~1e-15."""
    rng = np.random.default_rng(3)
    rng.random(200)
    codes, _ = encode_numerical(rng.integers(0, 15, 200))
    q = np.bincount(codes) / len(codes)
    for t in (1e-6, 1e-17):
        bz = bk.bucket_num(q, t)
        assert bz.n_buckets == 15
        assert [b.bound for b in bz.buckets] == [0.0] * 15
        assert bz.U == 0.0 and bz.U < t


@pytest.mark.parametrize("method, takeout", METHODS)
def test_k_above_half_gives_one_ec(method, takeout):
    qis, codes, dom = numeric_table(31)
    r = anonymize(qis, codes, dom, 0.9, k=16, method=method, takeout=takeout)
    assert r.n_classes == 1 and r.sizes.tolist() == [31]
    assert r.emds.tolist() == [0.0]


@pytest.mark.parametrize("method, takeout", METHODS)
def test_n_equals_k_gives_one_ec(method, takeout):
    qis, codes, dom = numeric_table(12)
    r = anonymize(qis, codes, dom, 0.9, k=12, method=method, takeout=takeout)
    assert r.n_classes == 1 and r.sizes.tolist() == [12]


def test_single_tuple():
    qis, codes, dom = numeric_table(1)
    r = anonymize(qis, codes, dom, 0.5, k=1)
    assert r.ec.tolist() == [0] and r.emds.tolist() == [0.0]


def test_n_below_k_raises():
    qis, codes, dom = numeric_table(10)
    with pytest.raises(ValueError, match="k = 11 exceeds the 10 tuples"):
        anonymize(qis, codes, dom, 0.5, k=11)
    with pytest.raises(ValueError, match="k = 6 exceeds the 5 tuples"):
        ec_size(np.array([3, 2]), None, 0.0, 0.5, k=6)


@pytest.mark.parametrize("rows", [[["only", "*"]], [["only"]]])
@pytest.mark.parametrize("method, takeout", METHODS)
def test_single_leaf_sa_hierarchy(rows, method, takeout):
    h = Hierarchy(rows)
    qis, _, _ = numeric_table(30)
    codes = np.zeros(30, dtype=np.int64)
    dom = SADomain("categorical", hierarchy=h)
    r = anonymize(qis, codes, dom, 0.3, k=3, method=method, takeout=takeout)
    check(r, 30, 3)
    assert r.buckets.n_buckets == 1 and r.buckets.U == 0
    assert np.all(r.emds == 0)
    assert hierarchical_emd(np.ones(1), np.ones(1), h) == 0
    assert class_emds(r.ec, codes, dom).max() == 0


def test_single_leaf_qi_hierarchy():
    n = 20
    qis = [QuasiIdentifier("c", np.zeros(n, dtype=np.int64), Hierarchy([["a", "*"]]))]
    codes = np.arange(n) % 4
    r = anonymize(qis, codes, SADomain("numerical", m=4), 0.3, k=2)
    check(r, n, 2)
    assert np.all(r.il == 0)


@pytest.mark.parametrize("t", [0, 0.0, -0.1, 1.0000001, 2, float("nan"), -math.inf, math.inf])
def test_invalid_t(t):
    qis, codes, dom = numeric_table(10)
    with pytest.raises(ValueError, match=r"t must satisfy 0 < t <= 1"):
        anonymize(qis, codes, dom, t, k=1)


@pytest.mark.parametrize("k", [0, -1, 1.5])
def test_invalid_k(k):
    qis, codes, dom = numeric_table(10)
    with pytest.raises(ValueError, match=r"k must be an integer >= 1"):
        anonymize(qis, codes, dom, 0.5, k=k)
    with pytest.raises(ValueError, match=r"k must be an integer >= 1"):
        ec_size(np.array([3, 2]), None, 0.0, 0.5, k=k)


def test_invalid_method_and_takeout():
    qis, codes, dom = numeric_table(10)
    with pytest.raises(ValueError, match=r"method must be one of ak, knn, mondrian, refine, got 'tmondrian'"):
        anonymize(qis, codes, dom, 0.5, method="tmondrian")
    with pytest.raises(ValueError, match=r"takeout must be one of sweep, random, got 'x'"):
        anonymize(qis, codes, dom, 0.5, takeout="x")


def test_invalid_inputs():
    qis, codes, dom = numeric_table(10)
    with pytest.raises(ValueError, match="table is empty"):
        anonymize(qis, codes[:0], dom, 0.5)
    with pytest.raises(ValueError, match="at least one quasi-identifier"):
        anonymize([], codes, dom, 0.5)
    with pytest.raises(ValueError, match="QI age has 10 values for 9 tuples"):
        anonymize(qis, codes[:9], dom, 0.5)
    with pytest.raises(ValueError, match="SA kind"):
        SADomain("ordinal", m=3)
    with pytest.raises(ValueError, match="needs a hierarchy"):
        SADomain("categorical")
    with pytest.raises(ValueError, match="m >= 1"):
        SADomain("numerical", m=0)
    with pytest.raises(ValueError, match="q has 2 values, hierarchy has 3 leaves"):
        bk.bucket_cat(np.array([0.5, 0.5]), Hierarchy.flat(list("abc")), 0.1)


def test_census_like_data():
    """The synthetic census generator end to end, every method."""
    qis, codes, dom = census(3000, seed=1)
    for method, takeout in METHODS:
        r = anonymize(qis, codes, dom, 0.15, k=5, method=method, takeout=takeout, seed=2)
        check(r, 3000, 5)
        assert r.emds.max() <= 0.15 + 1e-9
        assert r.n_classes > 10
        measures = r.metrics()
        assert measures["rows"] == 3000 and measures["max_emd"] == pytest.approx(r.emds.max())
        # AIL is the mean over tuples of their class's IL (the metric sums over classes)
        assert measures["ail"] == pytest.approx(r.il[r.ec].mean())
        assert 0 < measures["ail"] < 1
        assert measures["aecs_normalized"] == pytest.approx(3000 / r.n_classes / 5)


def test_bucket_emd_single_bucket_is_zero():
    q = np.array([0.5, 0.5])
    bz = bk.bucket_num(q, 1.0)
    be = BucketEMD(bz, np.array([10]))
    assert be(np.array([[3], [7]])).tolist() == [0.0, 0.0]
