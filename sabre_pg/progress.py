"""The client's view of progress (docs/progress.md): the server's events, and the benchmarks' steps.

:class:`ProgressDisplay` is a callback for ``sabre_pg.anonymize(..., progress=...)``: on a
terminal a tqdm bar over the run's steps (``pip install 'sabre-pg[progress]'``; plain lines
when tqdm is missing), elsewhere one plain line per phase as it starts and ends, e.g.
``[ 3/13] read ...`` and ``[ 3/13] read done in 0.412 s``.  :func:`steps` is the same for a
count of steps the client runs itself (``sabre-pg bench``): a bar on a terminal, one line per
step otherwise, so a log never gets a bar's carriage returns.

Steps never go back: the server numbers them so (``sabre_pg.core.stopwatch``), and the bar
only moves forward.  A terminal that reports 0 columns (a pty nobody sized) gets a bar of
:data:`FALLBACK_COLUMNS`.
"""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager

FALLBACK_COLUMNS = 80


def plain_line(event: dict) -> str:
    step = "[%*d/%d]" % (len(str(event["steps"])), event["step"], event["steps"])
    phase = event["phase"] if not event.get("within") else "%s: %s" % (event["within"], event["phase"])
    if event["event"] == "start":
        return f"{step} {phase} ..."
    return f"{step} {phase} done in {event.get('seconds', 0.0):.3f} s"


def is_terminal(stream) -> bool:
    return hasattr(stream, "isatty") and stream.isatty()


def columns(stream) -> int | None:
    """The bar's width: None (tqdm follows the terminal) unless the terminal reports no width."""
    try:
        width = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return None
    return width if width > 0 else FALLBACK_COLUMNS


def _tqdm(stream, **kw):
    """A tqdm bar on ``stream`` (None, after saying so, when tqdm is missing)."""
    try:
        from tqdm import tqdm
    except ModuleNotFoundError:
        print("(a progress bar needs tqdm: pip install 'sabre-pg[progress]')", file=stream)
        return None
    width = columns(stream)
    return tqdm(file=stream, leave=True, **kw, **({"ncols": width} if width else {}))


class ProgressDisplay:
    """Progress events as a bar (``bar=True``, default: when ``stream`` is a terminal) or lines."""

    def __init__(self, stream=None, bar: bool | None = None):
        self.stream = stream or sys.stderr
        if bar is None:
            bar = is_terminal(self.stream)
        self.bar = _tqdm(self.stream, total=None, unit="step", desc="sabre-pg") if bar else None

    def __call__(self, event: dict) -> None:
        if self.bar is None:
            print(plain_line(event), file=self.stream, flush=True)
            return
        top = not event.get("within")
        done = event["step"] - (not (top and event["event"] == "end"))
        self.bar.total = max(event["steps"], self.bar.total or 0)
        self.bar.n = max(self.bar.n, done)                 # never back
        self.bar.set_description("sabre-pg %s" % (event["phase"] if top else "%s: %s" % (event["within"],
                                                                                          event["phase"])))
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.n = self.bar.total or self.bar.n
            self.bar.set_description("sabre-pg done")
            self.bar.close()


@contextmanager
def steps(total: int, desc: str, unit: str = "step", stream=None, bar: bool | None = None):
    """``with steps(n, "sabre-pg bench") as step: ... step("what ran")``: a bar on a terminal,
    else one line per step (``[ 3/40] sabre-pg bench: what ran``)."""
    stream = stream or sys.stderr
    shown = _tqdm(stream, total=total, desc=desc, unit=unit) if (is_terminal(stream) if bar is None else bar) \
        else None
    done = [0]

    def step(what: str = "") -> None:
        done[0] += 1
        if shown is None:
            print("[%*d/%d] %s%s" % (len(str(total)), done[0], total, desc, ": " + what if what else ""),
                  file=stream, flush=True)
            return
        if what:
            shown.set_postfix_str(what[:50], refresh=False)
        shown.update(1)

    try:
        yield step
    finally:
        if shown is not None:
            shown.close()
