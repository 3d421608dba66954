"""Bucketization look-ahead: candidates beyond the paper's stopping point."""
from __future__ import annotations

import numpy as np
import pytest

from sabre_pg.core.buckets import bucketize
from sabre_pg.core.emd import class_emds
from sabre_pg.core.sabre import anonymize
from sabre_pg.synthetic import census


@pytest.fixture(scope="module")
def data():
    return census(20_000, seed=4)


@pytest.mark.parametrize("t", [0.15, 0.25, 0.3, 0.45])
def test_candidates_extend_the_papers_bucketization(data, t):
    _, codes, dom = data
    q = np.bincount(codes, minlength=dom.m) / len(codes)
    paper = bucketize(q, t, dom)
    cands = bucketize(q, t, dom, lookahead=4)
    first = cands[0]
    assert [(b.lo, b.hi) for b in first.buckets] == [(b.lo, b.hi) for b in paper.buckets]
    assert all(c.U < t for c in cands)
    # each candidate is one more greedy split of the previous one
    assert [c.n_buckets for c in cands] == list(range(first.n_buckets, first.n_buckets + len(cands)))


@pytest.mark.parametrize("t", [0.15, 0.2, 0.25, 0.3])
def test_lookahead_never_gives_fewer_classes_and_keeps_t(data, t):
    qis, codes, dom = data
    paper = anonymize(qis, codes, dom, t, 6, lookahead=0)
    ahead = anonymize(qis, codes, dom, t, 6, lookahead=4)
    assert ahead.n_classes >= paper.n_classes
    emds = class_emds(ahead.ec, codes, dom)
    assert emds.max() <= t + 1e-9 and ahead.sizes.min() >= 6


def test_lookahead_removes_the_collapse_of_classes_as_t_grows(data):
    """With the paper's rule a larger t can stop at fewer buckets with little slack t - U and
    collapse the class count (here 1813 -> 512 from t = 0.2 to 0.25).  With look-ahead a larger
    t never loses more than the LOOKAHEAD_GAIN factor a candidate must beat."""
    from sabre_pg.core.sabre import LOOKAHEAD_GAIN
    qis, codes, dom = data
    ts = [0.15, 0.2, 0.25, 0.3, 0.35]
    paper = [anonymize(qis, codes, dom, t, 6, lookahead=0).n_classes for t in ts]
    ahead = [anonymize(qis, codes, dom, t, 6, lookahead=4).n_classes for t in ts]
    assert any(b * 3 < a for a, b in zip(paper, paper[1:]))                  # the collapse exists
    assert all(b * LOOKAHEAD_GAIN >= a for a, b in zip(ahead, ahead[1:]))    # and is gone
    assert all(x >= y for x, y in zip(ahead, paper))


def test_invalid_lookahead(data):
    qis, codes, dom = data
    with pytest.raises(ValueError, match="lookahead"):
        anonymize(qis, codes, dom, 0.3, 6, lookahead=-1)


@pytest.mark.parametrize("t", [0.1, 0.2, 0.35, 0.5])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_ec_count_equals_the_expanded_tree(data, t, k):
    """Candidates are compared with ec_count; it must equal ec_size's number of classes."""
    from sabre_pg.core.redistribute import BucketEMD, ec_count, ec_size
    qis, codes, dom = data
    counts = np.bincount(codes, minlength=dom.m)
    for bz in bucketize(counts / counts.sum(), t, dom, lookahead=4):
        bc = np.array([counts[b.lo:b.hi].sum() for b in bz.buckets])
        assert ec_count(bc, BucketEMD(bz, bc), bz.U, t, k) == \
            ec_size(bc, BucketEMD(bz, bc), bz.U, t, k).n_classes
