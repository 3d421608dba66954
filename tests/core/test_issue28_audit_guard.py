"""The default's guard against t-Mondrian on tables of many rows over few QI tuples (issue 28
audit).  The guard ran on tables of at most GUARD_ROWS rows only; above it the searched cut can
end above t-Mondrian, most of all where rows repeat few tuples (a 400-row table of 331 tuples,
each row 150 times, 60,000 rows, two SAs: 'refine' AIL 0.177 against 'mondrian''s 0.143).  The
guard now also covers tables of at most GUARD_ROWS distinct QI tuples.  Checked here on tables
of the seeded corpus of test_default_vs_mondrian with every row repeated 3 times, GUARD_ROWS
lowered to their tuple counts, so that they are over it in rows (of the corpus's 72 tables so
repeated, the search alone ends above t-Mondrian on the one-SA table 12)."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from sabre_pg.core import multi_refine
from sabre_pg.core.multi_refine import ail_of
from sabre_pg.core.multi_sa import anonymize_multi
from sabre_pg.core.sabre import QuasiIdentifier, anonymize
from tests.core.test_default_vs_mondrian import corpus

REPEAT = 3


def repeated(table):
    qis, codes, domains, ts, k = table
    qis = [QuasiIdentifier(q.name, np.tile(q.values, REPEAT), q.hierarchy) for q in qis]
    return qis, np.tile(codes, (REPEAT, 1)), domains, ts, k


def tuples(qis) -> int:
    return len(np.unique(np.column_stack([q.values for q in qis]), axis=0))


def ail(table, method):
    qis, codes, domains, ts, k = table
    r = anonymize(qis, codes[:, 0], domains[0], ts[0], k, method=method) if codes.shape[1] == 1 else \
        anonymize_multi(qis, codes, domains, ts, k, method=method)
    return ail_of(qis, r.ec)


def test_the_guard_covers_a_table_of_few_tuples(monkeypatch):
    big = repeated(corpus((1,))[12])
    mondrian = ail(big, "mondrian")
    monkeypatch.setattr(multi_refine, "PARALLEL_GUARD_ROWS", -1)         # (no guard in a thread either)
    monkeypatch.setattr(multi_refine, "GUARD_ROWS", -1)                  # the search alone
    assert ail(big, "refine") > mondrian * 1.01
    monkeypatch.setattr(multi_refine, "GUARD_ROWS", tuples(big[0]))
    assert len(big[1]) > multi_refine.GUARD_ROWS
    assert ail(big, "refine") == mondrian


def test_several_sas_run_the_guard_by_tuples(monkeypatch):
    """The several-SA path hands the guard its keys too: t-Mondrian runs beside the search when
    the tuples are within GUARD_ROWS, not when both rows and tuples are over it."""
    qis, codes, domains, ts, k = big = repeated(corpus((2, 3))[0])
    assert codes.shape[1] > 1
    monkeypatch.setattr(multi_refine, "PARALLEL_GUARD_ROWS", -1)         # (no guard in a thread either)
    calls = []
    real = multi_refine._mondrian
    monkeypatch.setattr(multi_refine, "_mondrian", lambda *a: calls.append(1) or real(*a))
    for guard, runs in ((tuples(qis), True), (tuples(qis) - 1, False)):
        monkeypatch.setattr(multi_refine, "GUARD_ROWS", guard)
        calls.clear()
        default = ail(big, "refine")
        assert bool(calls) == runs and len(codes) > guard
        assert not runs or default <= ail(big, "mondrian") + 1e-12


def test_above_the_guard_t_mondrian_runs_in_a_thread_beside_the_search(monkeypatch):
    """Over GUARD_ROWS rows and tuples, up to PARALLEL_GUARD_ROWS rows, t-Mondrian runs in a
    second thread while the search runs, and the lower AIL is kept: the table the search alone
    loses is t-Mondrian's again, and the result does not depend on which thread ends first."""
    big = repeated(corpus((1,))[12])
    mondrian = ail(big, "mondrian")
    monkeypatch.setattr(multi_refine, "GUARD_ROWS", -1)
    monkeypatch.setattr(multi_refine, "PARALLEL_GUARD_ROWS", -1)
    alone = ail(big, "refine")
    assert alone > mondrian * 1.01
    monkeypatch.setattr(multi_refine, "PARALLEL_GUARD_ROWS", len(big[1]))
    threads = []
    real = multi_refine._mondrian
    monkeypatch.setattr(multi_refine, "_mondrian", lambda *a: threads.append(threading.current_thread().name)
                        or real(*a))
    assert ail(big, "refine") == mondrian
    assert threads and threads[0].startswith("sabre-guard")
    monkeypatch.setattr(multi_refine, "PARALLEL_GUARD_ROWS", len(big[1]) - 1)    # over it: the search alone
    assert ail(big, "refine") == alone


def test_a_part_of_a_larger_table_runs_no_guard_thread(monkeypatch):
    """``parallel_guard=False`` (a part of a partitioned run, whose memory the parts bound):
    over GUARD_ROWS rows and tuples the search runs alone, no t-Mondrian beside it, even under
    PARALLEL_GUARD_ROWS; at most GUARD_ROWS the guard still runs (after the search)."""
    big = repeated(corpus((1,))[12])
    qis, codes, domains, ts, k = big
    monkeypatch.setattr(multi_refine, "GUARD_ROWS", -1)
    monkeypatch.setattr(multi_refine, "PARALLEL_GUARD_ROWS", len(codes))
    calls = []
    real = multi_refine.mondrian
    monkeypatch.setattr(multi_refine, "mondrian", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    ec = anonymize(qis, codes[:, 0], domains[0], ts[0], k, method="refine", parallel_guard=False).ec
    assert not calls and ail_of(qis, ec) > ail(big, "mondrian") * 1.01      # the search's own classes
    assert ail_of(qis, anonymize(qis, codes[:, 0], domains[0], ts[0], k, method="refine").ec) == \
        ail(big, "mondrian") and calls                                       # the whole table: guarded
    calls.clear()
    monkeypatch.setattr(multi_refine, "GUARD_ROWS", len(codes))
    anonymize(qis, codes[:, 0], domains[0], ts[0], k, method="refine", parallel_guard=False)
    assert calls


def test_a_cancel_stops_both_threads_of_the_guard(monkeypatch):
    """The waiting thread ticks (a cancel raises there); the search and t-Mondrian stop at their
    next checkpoint and the error propagates (core/checkpoint.map_checked)."""
    from sabre_pg.core.checkpoint import checking

    big = repeated(corpus((1,))[12])
    monkeypatch.setattr(multi_refine, "GUARD_ROWS", -1)
    monkeypatch.setattr(multi_refine, "PARALLEL_GUARD_ROWS", len(big[1]))
    ticks = []

    def tick():
        ticks.append(1)
        if len(ticks) >= 1:     # the waiting thread ticks at once: the first one cancels
            raise KeyboardInterrupt("canceled")
    before = threading.active_count()
    with pytest.raises(KeyboardInterrupt), checking(tick):
        ail(big, "refine")
    deadline = time.monotonic() + 10
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() == before
