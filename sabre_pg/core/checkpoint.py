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
(``plpython/interrupts.py``; docs/security.md, "Bounded and cancellable").

A tick must be cheap when it has nothing to do (it is called up to millions of times per
run): the database's checks the time first and touches the server at most every few tenths
of a second.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable

Tick = Callable[[], None]
_ticks: list = []


@contextmanager
def checking(tick: Tick):
    """Inside the block, :func:`checkpoint` calls ``tick()`` (the innermost block's)."""
    _ticks.append(tick)
    try:
        yield
    finally:
        _ticks.remove(tick)


def checkpoint() -> None:
    """One round of a long loop is done: let the caller stop the run (its tick may raise)."""
    if _ticks:
        _ticks[-1]()


def checked(items):
    """``items`` with a :func:`checkpoint` before each one (for a loop over many items)."""
    for item in items:
        checkpoint()
        yield item
