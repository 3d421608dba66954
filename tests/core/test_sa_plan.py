"""The SA plan (bucketization + EC-size tree) made from the SA frequencies alone, before
any tuple is read, as the database does with a GROUP BY."""
from __future__ import annotations

import numpy as np
import pytest

from sabre_pg.core.sabre import anonymize, plan_from_counts
from sabre_pg.synthetic import census


@pytest.fixture(scope="module")
def data():
    return census(20_000, seed=8)


@pytest.mark.parametrize("t,k,lookahead", [(0.2, 4, 4), (0.35, 6, 0), (0.5, 10, 2)])
def test_sa_plan_gives_the_same_result(data, t, k, lookahead):
    qis, codes, dom = data
    counts = np.bincount(codes, minlength=dom.m)
    sa_plan = plan_from_counts(counts, dom, t, k, lookahead)
    assert sa_plan.plan.templates.sum() == len(codes)
    assert sa_plan.buckets.U < t and list(sa_plan.phases) == ["bucketize", "redistribute"]
    a = anonymize(qis, codes, dom, t, k, lookahead=lookahead, sa_plan=sa_plan)
    b = anonymize(qis, codes, dom, t, k, lookahead=lookahead)
    np.testing.assert_array_equal(a.ec, b.ec)
    np.testing.assert_array_equal(a.plan.templates, b.plan.templates)
    assert a.metrics() == b.metrics()
    # a given plan's phases are its own; a plan made inside is timed by the run
    assert "bucketize" not in a.phases and "bucketize" in b.phases
    assert list(a.phases) == ["redistribute", "hilbert", "takeout", "generalize", "metrics", "total"]
    assert a.metrics()["aecs_normalized"] == pytest.approx(len(codes) / a.n_classes / k)


def test_codes_must_match_the_sa_plan(data):
    qis, codes, dom = data
    counts = np.bincount(codes, minlength=dom.m)
    counts[0] += 1                                   # a tuple the read did not see
    sa_plan = plan_from_counts(counts, dom, 0.3, 5)
    with pytest.raises(ValueError, match="frequencies the plan was made from"):
        anonymize(qis, codes, dom, 0.3, 5, sa_plan=sa_plan)


@pytest.mark.parametrize("counts,t,k,match", [
    ([0, 0, 0], 0.3, 1, "empty"),
    ([1, 2, 0], 0.3, 4, "k = 4 exceeds the 3"),
    ([1, 2, 3], 0.3, 0, "k must be an integer >= 1"),
    ([1, 2, 3], 0.3, float("nan"), "k must be an integer >= 1"),
    ([1, 2, 3], 0.0, 1, "0 < t"),
    ([1, 2, 3], float("nan"), 1, "0 < t"),
    ([1, 2], 0.3, 1, "2 counts for 3"),
])
def test_plan_from_counts_rejects(data, counts, t, k, match):
    dom = data[2].__class__("numerical", m=3)
    with pytest.raises(ValueError, match=match):
        plan_from_counts(np.array(counts), dom, t, k)


@pytest.mark.parametrize("t,k", [(0.35, 5), (0.3, 6), (0.2, 5)])
def test_a_plan_made_for_other_parameters_is_refused(data, t, k):
    """The plan records its t and k: it guarantees t-closeness and k for those alone."""
    qis, codes, dom = data
    sa_plan = plan_from_counts(np.bincount(codes, minlength=dom.m), dom, 0.3, 5, lookahead=2)
    assert (sa_plan.t, sa_plan.k, sa_plan.lookahead) == (0.3, 5, 2)
    with pytest.raises(ValueError, match=r"made for t = 0.3, k = 5, not t = %r, k = %r" % (t, k)):
        anonymize(qis, codes, dom, t, k, sa_plan=sa_plan)
