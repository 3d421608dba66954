"""Progress of long work, reported by the server as each phase starts and ends.

Every entry point runs inside :func:`reporting` (``errors.entry_point``), which observes the
phases its stopwatches time (``sabre_pg.core.stopwatch.observed``); an entry point times its
phases and reports progress with no code of its own.  On the first phase event it reads:

* ``sabre.progress`` (a custom setting, e.g. ``SET sabre.progress = on``): when on, each event
  is sent to the client as a NOTICE ``sabre.progress: {"phase": ..., "event": "start"|"end",
  "step": i, "steps": n, "seconds": ...}`` (``stopwatch.progress_message``);
* ``application_name``: always, while phases run, ``application_name`` reads
  ``sabre-pg <entry point>: <phase> <i>/<n>``, so a DBA sees the phase of a long run in
  ``pg_stat_activity`` from another session.  It is a transaction-local setting: restored when
  the entry point returns, and reverted with the transaction when it fails.

Entry points that time no phase (verify, estimate, ...) pay nothing: nothing is read.
"""
from __future__ import annotations

from contextlib import contextmanager

from sabre_pg.core import stopwatch

SETTING = "sabre.progress"
ON = ("on", "true", "yes", "1", "notice")


def label(what: str, event: dict) -> str:
    """The application_name shown while ``event`` is the latest (at most 63 bytes, ASCII)."""
    done = " done" if event["event"] == "end" else ""
    return ("sabre-pg %s: %s%s %d/%d" % (what, event["phase"], done, event["step"], event["steps"]))[:63]


class Reporter:
    """Observer of one entry point's phases (settings read lazily, on the first event)."""

    def __init__(self, plpy, what: str):
        self.plpy, self.what, self.state = plpy, what, None

    def _start(self):
        r = self.plpy.execute("SELECT pg_catalog.current_setting('%s', true) AS progress, "
                              "pg_catalog.current_setting('application_name') AS name" % SETTING)[0]
        self.state = {"notice": str(r["progress"] or "").strip().lower() in ON, "name": r["name"]}

    def __call__(self, event: dict):
        if self.state is None:
            self._start()
        self._set_name(label(self.what, event))
        if self.state["notice"]:
            self.plpy.notice(stopwatch.progress_message(dict(event, what=self.what)))

    def _set_name(self, name: str):
        self.plpy.execute(self.plpy.prepare("SELECT pg_catalog.set_config('application_name', $1, true)",
                                            ["text"]), [name])

    def finish(self):
        if self.state is not None:
            self._set_name(self.state["name"])


@contextmanager
def reporting(plpy, what: str):
    """Report the phases timed inside the block (the outermost entry point reports)."""
    if stopwatch.observing():
        yield
        return
    reporter = Reporter(plpy, what)
    with stopwatch.observed(reporter):
        yield
    reporter.finish()
