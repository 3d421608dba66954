"""core/checkpoint.py: the engine's loops call the installed tick, which may stop the run
(issue 25, "Bounded and cancellable"; the database side is tests/db/test_security_cancel.py)."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from sabre_pg.core import checkpoint as K
from sabre_pg.core import instant as I
from sabre_pg.core.emd import SADomain
from sabre_pg.core.refine import refine
from sabre_pg.core.sabre import QuasiIdentifier


class Stop(Exception):
    pass


class Counter:
    """A tick that raises Stop at its ``limit``-th call (never with limit None)."""

    def __init__(self, limit=None):
        self.calls, self.limit, self.threads = 0, limit, set()

    def __call__(self):
        self.calls += 1
        self.threads.add(threading.get_ident())
        if self.limit is not None and self.calls >= self.limit:
            raise Stop()


def table(n=20_000, seed=3):
    rng = np.random.default_rng(seed)
    qis = [QuasiIdentifier("a", rng.integers(0, 90, n).astype(np.float64)),
           QuasiIdentifier("b", rng.integers(0, 50, n).astype(np.float64))]
    return qis, rng.integers(0, 20, n), SADomain("numerical", m=20)


def test_outside_a_block_a_checkpoint_does_nothing_and_the_run_is_the_same():
    qis, codes, dom = table()
    plain = refine(qis, codes, dom, 0.2, 4)
    tick = Counter()
    with K.checking(tick):
        ticked = refine(qis, codes, dom, 0.2, 4)
    assert tick.calls > 10 and np.array_equal(plain, ticked)
    K.checkpoint()                      # no block: nothing to call


def test_a_tick_that_raises_stops_the_refine_run():
    qis, codes, dom = table()
    with pytest.raises(Stop), K.checking(Counter(limit=5)):
        refine(qis, codes, dom, 0.2, 4)


def test_threaded_refine_ticks_only_in_the_callers_thread_and_stops_its_workers():
    qis, codes, dom = table(n=60_000)
    tick = Counter()
    with K.checking(tick):
        refine(qis, codes, dom, 0.2, 4, threads=2)
    assert tick.threads == {threading.get_ident()}
    with pytest.raises(Stop), K.checking(Counter(limit=3)):
        refine(qis, codes, dom, 0.2, 4, threads=2)
    assert not K._ticks


def test_map_checked_stops_running_tasks_at_their_next_checkpoint():
    started = threading.Event()

    def task(i):
        started.set()
        while True:                     # runs until stopped
            K.checkpoint()

    calls = []

    def tick():
        calls.append(1)
        if started.is_set():
            raise Stop()

    with ThreadPoolExecutor(2) as pool:     # its end waits for the tasks: they stopped
        with pytest.raises(Stop), K.checking(tick):
            K.map_checked(pool, task, range(4))
    assert calls


def test_the_lattice_is_refused_before_it_is_made():
    assert I.lattice_size([16, 16, 16, 16]) == 83_521 <= I.MAX_LATTICE_NODES < I.lattice_size([17] * 4)
    with pytest.raises(I.LatticeTooLarge) as e:
        I.lattice_nodes([999, 999, 999])           # 10^9 nodes: refused at once, nothing made
    assert e.value.nodes == 1000 ** 3 and "more than the cap of 100,000" in str(e.value)
    assert len(I.lattice_nodes([2, 3])) == 12


def test_l_above_the_distinct_sensitive_values_fails_every_class_at_once():
    cond = I.Condition.build(2, 10 ** 6, np.full(5, 0.2))
    assert cond.h_inf == 0.0 and len(cond.h) == 1
    assert I.mu_probability(np.full(4, 0.25), 100, cond) == 0.0
