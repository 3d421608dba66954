"""The one check of t and of k (core.parameters), and that every core entry point applies it."""
from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest

from sabre_pg.core import buckets as bk
from sabre_pg.core.emd import SADomain
from sabre_pg.core.hierarchy import Hierarchy
from sabre_pg.core.parameters import check_k, check_lookahead, check_t
from sabre_pg.core.redistribute import BucketEMD, ec_count, ec_size
from sabre_pg.core.sabre import QuasiIdentifier, anonymize, plan_from_counts

RULES = {check_t: "t must satisfy 0 < t <= 1", check_k: "k must be an integer >= 1",
         check_lookahead: "lookahead must be an integer >= 0"}
BAD_T = [0, 0.0, -0.1, 1.0000001, 2, math.nan, math.inf, -math.inf, None, "0.3", True,
         Decimal("NaN"), Decimal("0"), 1j]
BAD_K = [0, -1, 1.5, math.nan, math.inf, None, "3", True, np.float64(2.5), Decimal("NaN")]
BAD_LOOKAHEAD = [-1, 1.5, math.nan, None, True, "2"]


@pytest.mark.parametrize("check, value, want", [
    (check_t, 1e-9, 1e-9), (check_t, 0.5, 0.5), (check_t, 1, 1.0), (check_t, np.float64(0.3), 0.3),
    (check_t, Decimal("0.25"), 0.25), (check_t, Fraction(1, 3), 1 / 3),
    (check_k, 1, 1), (check_k, 6, 6), (check_k, np.int64(3), 3), (check_k, 6.0, 6),
    (check_k, Decimal(4), 4),
    (check_lookahead, 0, 0), (check_lookahead, 4, 4), (check_lookahead, np.int64(2), 2),
    (check_lookahead, 3.0, 3),
])
def test_check_accepts(check, value, want):
    got = check(value)
    assert type(got) is type(want) and got == want


@pytest.mark.parametrize("check, value", [(check_t, v) for v in BAD_T] + [(check_k, v) for v in BAD_K]
                         + [(check_lookahead, v) for v in BAD_LOOKAHEAD])
def test_check_rejects(check, value):
    with pytest.raises(ValueError) as e:
        check(value)
    assert str(e.value) == "%s, got %r" % (RULES[check], value)


def test_check_k_against_the_table_size():
    assert check_k(5, n=5) == 5 and check_k(1, n=np.int64(1)) == 1
    with pytest.raises(ValueError, match=r"^k = 6 exceeds the 5 tuples of the table$"):
        check_k(6, n=5)
    with pytest.raises(ValueError, match=r"^the table is empty$"):
        check_k(1, n=0)
    with pytest.raises(ValueError, match="k must be"):          # k is checked before n
        check_k(0, n=0)


def _table():
    rng = np.random.default_rng(0)
    qis = [QuasiIdentifier("age", rng.integers(17, 90, 20).astype(float))]
    codes = np.arange(20) % 4
    counts = np.bincount(codes)
    domain = SADomain("numerical", m=4)
    bz = bk.bucket_num(counts / 20, 0.5)
    bucket_counts = bz.counts(counts)
    return qis, codes, counts, domain, bz, bucket_counts


def _entry_points():
    """Every core function taking t and k, as f(t, k)."""
    qis, codes, counts, domain, bz, bucket_counts = _table()
    cat = Hierarchy.flat(["a", "b"])
    return {
        "anonymize": lambda t, k: anonymize(qis, codes, domain, t, k),
        "plan_from_counts": lambda t, k: plan_from_counts(counts, domain, t, k),
        "ec_size": lambda t, k: ec_size(bucket_counts, BucketEMD(bz, bucket_counts), bz.U, t, k),
        "ec_count": lambda t, k: ec_count(bucket_counts, BucketEMD(bz, bucket_counts), bz.U, t, k),
        "bucket_num": lambda t, k: bk.bucket_num(counts / 20, t),
        "bucket_cat": lambda t, k: bk.bucket_cat(np.array([0.5, 0.5]), cat, t),
        "bucketize": lambda t, k: bk.bucketize(counts / 20, t, domain, lookahead=2),
    }


@pytest.mark.parametrize("name", list(_entry_points()))
@pytest.mark.parametrize("t", [0.0, math.nan, 1.5, None])
def test_every_entry_point_checks_t_the_same_way(name, t):
    with pytest.raises(ValueError) as e:
        _entry_points()[name](t, 2)
    assert str(e.value) == "t must satisfy 0 < t <= 1, got %r" % (t,)


@pytest.mark.parametrize("name", ["anonymize", "plan_from_counts", "ec_size", "ec_count"])
@pytest.mark.parametrize("k, message", [
    (0, "k must be an integer >= 1, got 0"),
    (math.nan, "k must be an integer >= 1, got nan"),
    (2.5, "k must be an integer >= 1, got 2.5"),
    (21, "k = 21 exceeds the 20 tuples of the table"),
])
def test_every_entry_point_checks_k_the_same_way(name, k, message):
    with pytest.raises(ValueError) as e:
        _entry_points()[name](0.5, k)
    assert str(e.value) == message


@pytest.mark.parametrize("name", list(_entry_points()))
def test_every_entry_point_accepts_valid_t_and_k(name):
    _entry_points()[name](0.5, 20)                   # k = n: one class, allowed


@pytest.mark.parametrize("lookahead", BAD_LOOKAHEAD)
def test_every_entry_point_checks_lookahead(lookahead):
    qis, codes, counts, domain, _, _ = _table()
    with pytest.raises(ValueError, match="^lookahead must be an integer >= 0"):
        plan_from_counts(counts, domain, 0.5, 2, lookahead)
    with pytest.raises(ValueError, match="^lookahead must be an integer >= 0"):
        anonymize(qis, codes, domain, 0.5, 2, lookahead=lookahead)
