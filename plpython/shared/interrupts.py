"""The entry points' cancellation tick (``sabre_pg.core.checkpoint``).

PostgreSQL acts on a cancel (``pg_cancel_backend``, ``statement_timeout``) at its next
``CHECK_FOR_INTERRUPTS``, which PL/Python reaches only inside a database call.  The tick runs
a prepared ``SELECT 1`` at most every :data:`INTERVAL` seconds (checked with
``time.monotonic``, so the engine's many checkpoints cost a clock read each): a pending
cancel raises there as the query-canceled error (SQLSTATE 57014), which unwinds the engine
and leaves the entry point as it came (``errors.reported`` never wraps it).  With the
engine calling a checkpoint at least every few tenths of a second, a cancel ends any sabre
call within about half a second (docs/security.md, "Bounded and cancellable").
"""
from __future__ import annotations

import time

INTERVAL = 0.1                      # seconds between two database calls of the tick


class Interrupts:
    """``tick()``: a database call (a pending cancel raises 57014 there) at most every ``interval`` s."""

    def __init__(self, plpy, interval: float = INTERVAL):
        self.plpy, self.interval = plpy, interval
        self.plan = None
        self.due = time.monotonic() + interval

    def __call__(self) -> None:
        now = time.monotonic()
        if now < self.due:
            return
        if self.plan is None:
            self.plan = self.plpy.prepare("SELECT 1")
        self.plpy.execute(self.plan)
        self.due = time.monotonic() + self.interval
