"""``reference`` (issue 27, Citus shard-local): 'refine' and 'mondrian' on a subset of a table
(a shard) cut every class t-close to the WHOLE table's SA distribution, by the exact EMD;
without it, the subset's own distribution (a shard's classes can then exceed t of the table)."""
from __future__ import annotations

import numpy as np
import pytest

from sabre_pg.core.emd import SADomain
from sabre_pg.core.mondrian import against_table
from sabre_pg.core.sabre import QuasiIdentifier, anonymize

M, T, K = 20, 0.12, 5


def _table(seed=3, n=8000):
    rng = np.random.default_rng(seed)
    age = rng.integers(17, 90, n).astype(float)
    edu = rng.integers(1, 16, n).astype(float)
    sa = (age / 5 + rng.integers(0, 6, n)).astype(int) % M
    return age, edu, sa


def _emds_against(ec, codes, table_counts):
    key, n = np.unique(ec * M + codes, return_counts=True)
    exact, keep = against_table(key // M, key % M, n, table_counts, SADomain("numerical", m=M))
    return exact.emd[keep], exact.sizes[keep]


@pytest.mark.parametrize("method", ["refine", "mondrian"])
def test_a_shard_against_its_whole_table(method):
    age, edu, sa = _table()
    table = np.bincount(sa, minlength=M)
    shard = (np.arange(len(sa)) * 2654435761 % 7) == 0          # a hash-like seventh of the rows
    qis = [QuasiIdentifier("age", age[shard]), QuasiIdentifier("edu", edu[shard])]
    with_ref = anonymize(qis, sa[shard], SADomain("numerical", m=M), T, K, method=method, reference=table)
    emd, sizes = _emds_against(with_ref.ec, sa[shard], table)
    assert with_ref.n_classes > 1 and emd.max() <= T and sizes.min() >= K
    assert np.allclose(np.sort(with_ref.emds), np.sort(emd))      # the result's EMDs are to the table too
    own = anonymize(qis, sa[shard], SADomain("numerical", m=M), T, K, method=method)
    # the shard's own distribution is not the table's: measured against the table, its classes differ
    assert not np.array_equal(own.ec, with_ref.ec) or _emds_against(own.ec, sa[shard], table)[0].max() <= T


def test_the_reference_must_hold_the_rows():
    age, edu, sa = _table(n=500)
    with pytest.raises(ValueError, match="reference"):
        anonymize([QuasiIdentifier("age", age)], sa, SADomain("numerical", m=M), T, K, method="refine",
                  reference=np.ones(M, dtype=np.int64))
    with pytest.raises(ValueError, match="'refine' or 'mondrian'"):
        anonymize([QuasiIdentifier("age", age)], sa, SADomain("numerical", m=M), T, K, method="ak",
                  reference=np.bincount(sa, minlength=M))
