"""Phase timing shared by the engine, the PL/Python entry points and the benchmarks.

``PHASES`` is the one list of phase names, in pipeline order: the engine's (``sabre``),
then the database run's (``plpython/batch/anonymize.py``).  Reports show phases in this order;
a name not listed here is a bug caught by :meth:`Stopwatch.phase`.

Progress: inside :func:`observed`, every phase a stopwatch times is reported to the observer
as it starts and ends (an event: ``phase``, ``event`` 'start' or 'end', ``step``, ``steps``,
``seconds`` at the end, and ``within`` for a phase nested in another), so whatever runs phases
reports progress without code of its own.  Steps are the run's top-level phases: the entry
point declares them with :func:`plan` (e.g. :func:`anonymize_plan`), each top-level phase moves
to its next place in the plan, and a nested phase (the SA plan's ``bucketize`` inside
``summary``) or a repeated one reports the current step: ``step`` never goes back, and ends at
``steps``.  :func:`progress_message` / :func:`parse_progress` are the one text form of an event
(the server's NOTICE, read by the client: docs/progress.md).
"""
from __future__ import annotations

import json
import time
from contextlib import contextmanager

ENGINE_PHASES = ("bucketize", "redistribute", "hilbert", "takeout", "partition", "refine", "generalize",
                 "metrics")
PUBLISH_PHASES = ("write_keys", "build_classes", "build_output", "check", "swap")
PHASES = ("validate", "summary", "read") + ENGINE_PHASES + PUBLISH_PHASES + ("number", "advance", "total")
METHOD_PHASE = {"refine": "refine", "ak": "takeout", "knn": "takeout", "mondrian": "partition"}
PARTITIONED_PLAN = ("validate", "summary", "read", "partition", "check", "build_output", "swap")
PROGRESS_PREFIX = "sabre.progress: "
_observers: list = []
_progress: list = []                 # the outermost observation's step state (one dict, or none)


def anonymize_plan(method: str | None = "refine", partitioned: bool = False) -> tuple:
    """The top-level phases of a ``sabre_anonymize`` run, in order: 13 for each method (one
    SA or several), 7 for a partitioned run (docs/progress.md)."""
    if partitioned:
        return PARTITIONED_PLAN
    return ("validate", "summary", "read", "redistribute", "hilbert", METHOD_PHASE.get(method, "takeout"),
            "generalize", "metrics") + PUBLISH_PHASES


STEPS = len(anonymize_plan())        # the steps of a sabre_anonymize run (one SA or several)


@contextmanager
def observed(observer):
    """Report every phase started or ended inside the block to ``observer(event)``."""
    outermost = not _observers
    _observers.append(observer)
    if outermost:
        _progress.append({"plan": None, "done": 0, "depth": 0, "top": None})
    try:
        yield
    finally:
        _observers.remove(observer)
        if outermost:
            _progress.clear()


def observing() -> bool:
    return bool(_observers)


def plan(steps) -> None:
    """Declare the top-level phases the observed run will time, in order (repeats allowed: a
    stream's advances); a later call replaces the plan (a stream learns its advances once it
    has numbered the new rows).  Without a plan each new top-level phase is one more step."""
    if _progress:
        _progress[0]["plan"] = list(steps)


def _step(state: dict, name: str) -> None:
    """Move to ``name``'s next place in the plan (a top-level phase starts); stay when it has
    none ahead (a repeat), so the step never goes back."""
    planned = state["plan"]
    if planned is None:
        state["seen"] = seen = state.get("seen", set())
        if name not in seen:
            seen.add(name)
            state["done"] += 1
        return
    if name in planned[state["done"]:]:
        state["done"] = planned.index(name, state["done"]) + 1


def _report(name: str, event: str, seconds: float | None = None) -> None:
    if not _observers:
        return
    state = _progress[0]
    if event == "start":
        if state["depth"] == 0:
            _step(state, name)
            state["top"] = name
        state["depth"] += 1
    else:
        state["depth"] -= 1
    step = max(state["done"], 1)
    steps = max(len(state["plan"]) if state["plan"] is not None else state["done"], step)
    report = {"phase": name, "event": event, "step": step, "steps": steps}
    if state["depth"] > (event == "start"):
        report["within"] = state["top"]
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
