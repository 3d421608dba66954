"""Several SAs with ``reference`` (issue 27, the Citus push-down of the several-SA form): 'refine'
and 'mondrian' on a subset of a table (a shard or part) with every SA's counts in the whole
table cut every class t_i-close to the WHOLE table on every SA i, by the exact EMD."""
from __future__ import annotations

import numpy as np
import pytest

from sabre_pg.core.emd import SADomain
from sabre_pg.core.mondrian import against_table
from sabre_pg.core.multi_refine import partition
from sabre_pg.core.sabre import QuasiIdentifier, anonymize

M1, M2, K = 20, 6, 5
TS = (0.15, 0.2)


def _table(seed=5, n=6000):
    rng = np.random.default_rng(seed)
    age = rng.integers(17, 90, n).astype(float)
    edu = rng.integers(1, 16, n).astype(float)
    sa1 = (age / 5 + rng.integers(0, 6, n)).astype(int) % M1
    sa2 = (edu / 3 + rng.integers(0, 3, n)).astype(int) % M2
    return age, edu, sa1, sa2


def _max_emd(ec, codes, m, table_counts):
    key, n = np.unique(ec * m + codes, return_counts=True)
    exact, keep = against_table(key // m, key % m, n, table_counts, SADomain("numerical", m=m))
    return exact.emd[keep].max(), exact.sizes[keep].min()


@pytest.mark.parametrize("method", ["refine", "mondrian"])
def test_a_piece_against_its_whole_table_on_every_sa(method):
    age, edu, sa1, sa2 = _table()
    tables = [np.bincount(sa1, minlength=M1), np.bincount(sa2, minlength=M2)]
    piece = age < 60                    # a QI-local part: its SA distributions are not the table's
    qis = [QuasiIdentifier("age", age[piece]), QuasiIdentifier("edu", edu[piece])]
    doms = [SADomain("numerical", m=M1), SADomain("numerical", m=M2)]
    result = anonymize(qis, sa1[piece], doms[0], TS[0], K, method=method, reference=tables[0],
                       other_sas=[(sa2[piece], doms[1], TS[1], tables[1])])
    assert result.n_classes > 1
    for codes, m, table, t in ((sa1, M1, tables[0], TS[0]), (sa2, M2, tables[1], TS[1])):
        emd, smallest = _max_emd(result.ec, codes[piece], m, table)
        assert emd <= t and smallest >= K
    # without the references the piece's own distributions are the targets: against the table,
    # some class is then farther than t on the first SA (the piece's ages shift its salaries)
    own = anonymize(qis, sa1[piece], doms[0], TS[0], K, method=method, other_sas=[(sa2[piece], doms[1], TS[1])])
    assert _max_emd(own.ec, sa1[piece], M1, tables[0])[0] > TS[0]


def test_one_reference_per_sa():
    age, edu, sa1, sa2 = _table(n=400)
    with pytest.raises(ValueError, match="per sensitive attribute"):
        partition([QuasiIdentifier("age", age)], np.column_stack([sa1, sa2]),
                  [SADomain("numerical", m=M1), SADomain("numerical", m=M2)], TS, K, "refine",
                  reference=[np.bincount(sa1, minlength=M1)])
