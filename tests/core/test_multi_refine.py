"""'refine' and 'mondrian' with several SAs (core.multi_refine): property tests over 2-4 SAs of
mixed kinds (ordered, hierarchical, equal distance), every class checked on every SA by
exact_emd, by emd.py's formulas and by a transportation LP -- on the classes the methods
return, before any repair -- and the degenerate cases."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sabre_pg.core.emd import SADomain
from sabre_pg.core.multi_refine import partition
from sabre_pg.core.multi_sa import anonymize_multi, exact_class_emds
from sabre_pg.core.refine import refine
from sabre_pg.core.sabre import QuasiIdentifier, anonymize, encode_numerical
from sabre_pg.synthetic import census
from tests.core.test_refine import _canonical
from tests.core.test_multi_sa import independent_check, lp_emd, multi_tables, sa_distance


def check_classes(ec, codes, domains, ts, k, lp_classes=4):
    """Every class >= k rows and, on every SA, exact EMD <= t (exact_emd, in integers) and
    LP EMD <= t on the first classes."""
    ec = np.unique(ec, return_inverse=True)[1].reshape(-1)
    assert np.bincount(ec).min() >= min(k, len(ec))
    for i, d in enumerate(domains):
        exact = exact_class_emds(ec, codes[:, i], d)
        assert not exact.exceeds(ts[i]).any(), (i, float(exact.emd.max()), ts[i])
        q = np.bincount(codes[:, i], minlength=d.m) / len(codes)
        for c in range(min(lp_classes, int(ec.max()) + 1)):
            if d.m > 1:
                p = np.bincount(codes[ec == c, i], minlength=d.m) / np.count_nonzero(ec == c)
                assert lp_emd(p, q, sa_distance(d)) <= ts[i] + 1e-7


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(multi_tables(), st.sampled_from(["refine", "mondrian"]), st.sampled_from(["fast", "thorough"]))
def test_every_class_holds_on_every_sa_before_any_repair(table, method, search):
    """The classes of the cut search (with its rescue and merge passes) and of t-Mondrian,
    as returned, before anonymize_multi's exact check and repair."""
    qis, codes, domains, ts, k = table
    primary = int(np.argmin(ts))
    ec = partition(qis, codes, domains, ts, k, method, primary=primary, search=search)
    check_classes(ec, codes, domains, ts, k)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(multi_tables(), st.sampled_from(["refine", "mondrian"]))
def test_anonymize_multi_needs_no_repair(table, method):
    """anonymize_multi with a partitioning method: every class holds (the independent check
    of test_multi_sa), and its exact check merged nothing."""
    qis, codes, domains, ts, k = table
    result = anonymize_multi(qis, codes, domains, ts, k, method=method)
    independent_check(result, codes, domains, ts, k)
    assert result.merges == 0 and result.strategy == method


@pytest.fixture(scope="module")
def census_two():
    """4,000 census-like rows, SAs salary and a second ordered SA correlated with it."""
    qis, salary, domain = census(4000, seed=3)
    rng = np.random.default_rng(3)
    hours, distinct = encode_numerical(salary // 3 + rng.integers(0, 6, len(salary)))
    return qis, np.column_stack([salary, hours]), [domain, SADomain("numerical", m=len(distinct))]


def test_the_cut_search_checks_the_second_sa(census_two):
    """Without the second SA the search's classes break its t; with it, none does (the
    check of every SA is what holds it, not luck)."""
    qis, codes, domains = census_two
    ts = [0.3, 0.05]
    alone = refine(qis, codes[:, 0], domains[0], ts[0], 5)
    assert exact_class_emds(alone, codes[:, 1], domains[1]).exceeds(ts[1]).any()
    both = partition(qis, codes, domains, ts, 5, "refine")
    check_classes(both, codes, domains, ts, 5)
    assert len(np.unique(both)) > 1


def test_threads_give_the_same_classes(census_two, monkeypatch):
    """A table searched in threads gets the classes of one thread, every SA checked."""
    import sabre_pg.core.refine as R
    monkeypatch.setattr(R, "THREAD_ROWS", 1000)
    qis, codes, domains = census_two
    one = partition(qis, codes, domains, [0.2, 0.1], 5, "refine", threads=1)
    two = partition(qis, codes, domains, [0.2, 0.1], 5, "refine", threads=2)
    assert np.array_equal(_canonical(one), _canonical(two))
    check_classes(two, codes, domains, [0.2, 0.1], 5)


def test_one_sa_is_the_single_form(census_two):
    """One SA through anonymize_multi gives the single-SA 'refine' classes."""
    qis, codes, domains = census_two
    single = anonymize(qis, codes[:, 0], domains[0], 0.2, 5, method="refine")
    multi = anonymize_multi(qis, codes[:, :1], domains[:1], [0.2], 5, method="refine")
    assert np.array_equal(single.ec, multi.ec)


@pytest.mark.parametrize("method", ["refine", "mondrian", "ak", "knn"])
def test_constant_qis_give_one_valid_class_or_more(method):
    """QIs with one value: no cut is possible; the whole table (EMD 0 on every SA) is a valid
    answer and every method returns classes that hold."""
    rng = np.random.default_rng(5)
    n = 60
    qis = [QuasiIdentifier("a", np.full(n, 3.0)), QuasiIdentifier("b", np.zeros(n))]
    codes = np.column_stack([rng.integers(0, 7, n), rng.integers(0, 4, n)])
    domains = [SADomain("numerical", m=7), SADomain("numerical", m=4)]
    result = anonymize_multi(qis, codes, domains, [0.3, 0.3], 5, method=method)
    check_classes(result.ec, codes, domains, [0.3, 0.3], 5)
    if method in ("refine", "mondrian"):
        assert result.n_classes == 1


def test_partitioning_methods_refuse_the_ak_strategies(census_two):
    qis, codes, domains = census_two
    with pytest.raises(ValueError, match="strategy"):
        anonymize_multi(qis, codes, domains, [0.2, 0.2], 5, method="refine", strategy="fragments")
