"""Phase timing shared by the engine, the PL/Python entry points and the benchmarks.

``PHASES`` is the one list of phase names, in pipeline order: the engine's (``sabre``),
then the database run's (``plpython/anonymize.py``).  Reports show phases in this order;
a name not listed here is a bug caught by :meth:`Stopwatch.phase`.
"""
from __future__ import annotations

import time
from contextlib import contextmanager

ENGINE_PHASES = ("bucketize", "redistribute", "hilbert", "takeout", "partition", "refine", "generalize",
                 "metrics")
PHASES = ("validate", "summary", "read") + ENGINE_PHASES + (
    "write_keys", "build_classes", "build_output", "check", "swap", "total")


class Stopwatch:
    """Seconds per named phase; ``with sw.phase("read"): ...`` adds the block's time."""

    def __init__(self):
        self.start = time.perf_counter()
        self.phases: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str):
        if name not in PHASES:
            raise ValueError("unknown phase %r (known: %s)" % (name, ", ".join(PHASES)))
        tic = time.perf_counter()
        try:
            yield self
        finally:
            self.add(name, time.perf_counter() - tic)

    def add(self, name: str, seconds: float) -> None:
        self.phases[name] = self.phases.get(name, 0.0) + seconds

    def merge(self, phases: dict) -> None:
        """Add another stopwatch's phases (e.g. the engine's), ``total`` excluded."""
        for name, seconds in phases.items():
            if name != "total":
                self.add(name, seconds)

    def total(self) -> float:
        return time.perf_counter() - self.start

    def report(self, digits: int = 6) -> dict:
        """Phases in ``PHASES`` order with ``total`` last, rounded."""
        out = {p: round(self.phases[p], digits) for p in PHASES if p in self.phases and p != "total"}
        out["total"] = round(self.total(), digits)
        return out
