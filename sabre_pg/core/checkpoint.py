"""Cancellation checkpoints of the engine's long loops.

PostgreSQL cancels a statement (``pg_cancel_backend``, ``statement_timeout``) by setting a
flag that the backend acts on at its next ``CHECK_FOR_INTERRUPTS``; PL/Python runs none while
Python code runs, so a long loop in the engine would run to its end before the cancel took
effect.  Every loop of the engine whose length depends on the input calls :func:`checkpoint`
once per round (a cut-search round, a bucket, a merge pass, a lattice node, a chunk of a
long vectorized computation).  Outside :func:`checking` it does nothing (the engine stays
pure numpy and runs alike in tests, benchmarks and the CLI); inside, it calls the block's
``tick``, which may raise to stop the run.  The PL/Python entry points pass a rate-limited
tick that runs a trivial SPI statement, so a pending cancel ends the call there
(``plpython/shared/interrupts.py``; docs/security.md, "Bounded and cancellable").

A tick must be cheap when it has nothing to do (it is called up to millions of times per
run): the database's checks the time first and touches the server at most every few tenths
of a second.

Threads (method 'refine' with ``threads`` > 1): only the thread that installed the tick calls
it (a database call from another thread would corrupt the backend).  That thread waits for
its workers with :func:`map_checked`, ticking while it waits; when the tick raises, the tasks
not started are cancelled and the running ones raise :class:`Stopped` at their next
checkpoint, so the pool ends at once and the tick's error propagates.
"""
from __future__ import annotations

import threading
from concurrent.futures import FIRST_EXCEPTION, wait
from contextlib import contextmanager
from typing import Callable

Tick = Callable[[], None]
WAIT = 0.05                     # seconds a thread waiting for its workers sleeps between ticks
_ticks: list = []               # (thread id, tick), innermost last
_worker = threading.local()     # .stop: the Event of the map_checked task this thread runs


class Stopped(Exception):
    """A worker thread's run stopped because its caller's tick raised."""


@contextmanager
def checking(tick: Tick):
    """Inside the block, :func:`checkpoint` calls ``tick()`` (the innermost block's) in this thread."""
    entry = (threading.get_ident(), tick)
    _ticks.append(entry)
    try:
        yield
    finally:
        _ticks.remove(entry)


def checkpoint() -> None:
    """One round of a long loop is done: let the caller stop the run (its tick may raise)."""
    if _ticks:
        owner, tick = _ticks[-1]
        if owner == threading.get_ident():
            tick()
            return
    stop = getattr(_worker, "stop", None)
    if stop is not None and stop.is_set():
        raise Stopped("the run was stopped")


def map_checked(pool, fn, *iterables) -> list:
    """``list(pool.map(fn, *iterables))``, the waiting thread calling :func:`checkpoint` meanwhile;
    if it raises, the tasks are stopped (module docstring) before the error propagates."""
    stop = threading.Event()

    def task(*args):
        _worker.stop = stop
        try:
            return fn(*args)
        finally:
            _worker.stop = None

    futures = [pool.submit(task, *args) for args in zip(*iterables)]
    try:
        pending = set(futures)
        while pending:
            checkpoint()
            _, pending = wait(pending, timeout=WAIT, return_when=FIRST_EXCEPTION)
            if any(f.done() and f.exception() is not None for f in futures):
                break
    except BaseException:
        stop.set()
        for f in futures:
            f.cancel()
        raise
    return [f.result() for f in futures]


def checked(items):
    """``items`` with a :func:`checkpoint` before each one (for a loop over many items)."""
    for item in items:
        checkpoint()
        yield item
