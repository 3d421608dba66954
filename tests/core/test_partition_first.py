"""Partition first, then SABRE (t-Mondrian parts, SABRE-AK inside each with the budget
t - EMD(part, table)): every class t-close and k-anonymous against the whole table."""
from __future__ import annotations

import numpy as np
import pytest

from sabre_pg.core import exact_emd as X
from sabre_pg.core import partition_first as H
from sabre_pg.core.emd import SADomain
from sabre_pg.core.hierarchy import Hierarchy
from sabre_pg.core.mondrian import mondrian
from sabre_pg.core.sabre import anonymize
from sabre_pg.synthetic import census


def _flat(dom):
    return SADomain("categorical", hierarchy=Hierarchy.flat(["s%d" % i for i in range(dom.m)]))


@pytest.mark.parametrize("flat", [False, True])
@pytest.mark.parametrize("t, k", [(0.15, 4), (0.35, 6)])
def test_every_class_is_t_close_to_the_table(flat, t, k):
    qis, codes, dom = census(3_000, seed=5)
    if flat:
        dom = _flat(dom)
    ec = H.partition_first(qis, codes, dom, t, k, part_rows=256)
    e = X.domain_class_emds(ec, codes, np.ones(len(codes), dtype=np.int64), dom)
    assert e.violations(t, k) == 0
    parts = mondrian(qis, codes, dom, t, 256)
    assert e.classes > parts.max() + 1               # SABRE cut the parts further
    # classes nest in the parts
    first_part = np.full(ec.max() + 1, -1)
    first_part[ec] = parts
    assert (first_part[ec] == parts).all()


def test_one_part_is_sabre_ak():
    """A part as large as the table (budget t): the classes of SABRE-AK's sweep."""
    qis, codes, dom = census(2_000, seed=7)
    ec = H.partition_first(qis, codes, dom, 0.25, 5, part_rows=2_000)
    ak = anonymize(qis, codes, dom, 0.25, 5, with_emds=False).ec
    pairs = set(zip(ec.tolist(), ak.tolist()))
    assert len(pairs) == ec.max() + 1 == ak.max() + 1


def test_a_part_with_a_failing_class_is_published_whole(monkeypatch):
    """The exact check decides: a takeOut whose classes fail it (here one row each, below k
    and far from the table) leaves every part one class: t-Mondrian's parts."""
    qis, codes, dom = census(2_000, seed=3)
    monkeypatch.setattr(H, "takeout_sweep", lambda bucket, keys, templates: np.arange(len(bucket)))
    ec = H.partition_first(qis, codes, dom, 0.3, 5, part_rows=200)
    parts = mondrian(qis, codes, dom, 0.3, 200)
    assert parts.max() > 0
    assert len(set(zip(ec.tolist(), parts.tolist()))) == ec.max() + 1 == parts.max() + 1


def test_part_rows_below_k_is_refused():
    qis, codes, dom = census(500, seed=1)
    with pytest.raises(ValueError, match="part_rows"):
        H.partition_first(qis, codes, dom, 0.3, 10, part_rows=5)
