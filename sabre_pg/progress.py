"""The client's view of the server's progress events (docs/progress.md).

:class:`ProgressDisplay` is a callback for ``sabre_pg.anonymize(..., progress=...)``: on a
terminal a tqdm bar over the phases (``pip install 'sabre-pg[progress]'``; plain lines when
tqdm is missing), elsewhere one plain line per phase as it starts and ends, e.g.
``[ 3/14] read ...`` and ``[ 3/14] read done in 0.412 s``.
"""
from __future__ import annotations

import sys


def plain_line(event: dict) -> str:
    step = "[%*d/%d]" % (len(str(event["steps"])), event["step"], event["steps"])
    if event["event"] == "start":
        return f"{step} {event['phase']} ..."
    return f"{step} {event['phase']} done in {event.get('seconds', 0.0):.3f} s"


class ProgressDisplay:
    """Progress events as a bar (``bar=True``, default: when ``stream`` is a terminal) or lines."""

    def __init__(self, stream=None, bar: bool | None = None):
        self.stream = stream or sys.stderr
        if bar is None:
            bar = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.bar = None
        if bar:
            try:
                from tqdm import tqdm
            except ModuleNotFoundError:
                print("(a progress bar needs tqdm: pip install 'sabre-pg[progress]')", file=self.stream)
            else:
                self.bar = tqdm(total=None, file=self.stream, unit="phase", desc="sabre-pg", leave=True)

    def __call__(self, event: dict) -> None:
        if self.bar is None:
            print(plain_line(event), file=self.stream, flush=True)
            return
        self.bar.total = event["steps"]
        self.bar.n = event["step"] - (event["event"] == "start")
        self.bar.set_description("sabre-pg %s" % event["phase"])
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.n = self.bar.total or self.bar.n
            self.bar.set_description("sabre-pg done")
            self.bar.close()
