"""Phase timing shared by the engine, the PL/Python entry points and the benchmarks.

``PHASES`` is the one list of phase names, in pipeline order: the engine's (``sabre``),
then the database run's (``plpython/anonymize.py``).  Reports show phases in this order;
a name not listed here is a bug caught by :meth:`Stopwatch.phase`.

Progress: inside :func:`observed`, every phase a stopwatch times is reported to the observer
as it starts and ends (an event: ``phase``, ``event`` 'start' or 'end', ``step`` its 1-based
position in ``PHASES``, ``steps``, and ``seconds`` at the end), so whatever runs phases reports
progress without code of its own.  :func:`progress_message` / :func:`parse_progress` are the
one text form of an event (the server's NOTICE, read by the client: docs/progress.md).
"""
from __future__ import annotations

import json
import time
from contextlib import contextmanager

ENGINE_PHASES = ("bucketize", "redistribute", "hilbert", "takeout", "partition", "refine", "generalize",
                 "metrics")
PHASES = ("validate", "summary", "read") + ENGINE_PHASES + (
    "write_keys", "build_classes", "build_output", "check", "swap", "total")
STEPS = len(PHASES) - 1              # every phase but total
PROGRESS_PREFIX = "sabre.progress: "
_observers: list = []


@contextmanager
def observed(observer):
    """Report every phase started or ended inside the block to ``observer(event)``."""
    _observers.append(observer)
    try:
        yield
    finally:
        _observers.remove(observer)


def observing() -> bool:
    return bool(_observers)


def _report(name: str, event: str, seconds: float | None = None) -> None:
    if _observers:
        report = {"phase": name, "event": event, "step": PHASES.index(name) + 1, "steps": STEPS}
        if seconds is not None:
            report["seconds"] = round(seconds, 6)
        for observer in list(_observers):
            observer(report)


def progress_message(event: dict) -> str:
    """An event as one line of text (``sabre.progress: {json}``)."""
    return PROGRESS_PREFIX + json.dumps(event, sort_keys=True)


def parse_progress(text: str) -> dict | None:
    """The event a :func:`progress_message` carries, or None for any other text."""
    if not text.startswith(PROGRESS_PREFIX):
        return None
    try:
        event = json.loads(text[len(PROGRESS_PREFIX):])
    except ValueError:
        return None
    return event if isinstance(event, dict) and "phase" in event else None


class Stopwatch:
    """Seconds per named phase; ``with sw.phase("read"): ...`` adds the block's time."""

    def __init__(self):
        self.start = time.perf_counter()
        self.phases: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str):
        if name not in PHASES:
            raise ValueError("unknown phase %r (known: %s)" % (name, ", ".join(PHASES)))
        _report(name, "start")
        tic = time.perf_counter()
        try:
            yield self
        finally:
            elapsed = time.perf_counter() - tic
            self.add(name, elapsed)
        _report(name, "end", elapsed)

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
