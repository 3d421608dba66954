"""Progress without a server: stopwatch events, their text form, the server's reporter (fake
plpy) and the client's display."""
from __future__ import annotations

import io

import pytest

from sabre_pg.core import stopwatch
from sabre_pg.core.stopwatch import STEPS, Stopwatch, observed, parse_progress, progress_message
from sabre_pg.progress import ProgressDisplay, plain_line
from tests.client.fake_plpy import FakePlpy, sabre_plpy


def test_phases_report_start_and_end_only_when_observed():
    events = []
    sw = Stopwatch()
    with sw.phase("read"):
        pass
    with observed(events.append):
        with sw.phase("summary"):
            with sw.phase("bucketize"):
                pass
        with pytest.raises(RuntimeError), sw.phase("swap"):
            raise RuntimeError
    assert [(e["phase"], e["event"]) for e in events] == [
        ("summary", "start"), ("bucketize", "start"), ("bucketize", "end"), ("summary", "end"), ("swap", "start")]
    assert [e["step"] for e in events] == [1, 1, 1, 1, 2] and [e["steps"] for e in events] == [1, 1, 1, 1, 2]
    assert events[1]["within"] == "summary" and "within" not in events[0] and "within" not in events[3]
    assert events[2]["seconds"] >= 0 and not stopwatch.observing()


def test_message_round_trip():
    event = {"phase": "read", "event": "start", "step": 3, "steps": STEPS}
    assert parse_progress(progress_message(event)) == event
    assert parse_progress("some other notice") is None
    assert parse_progress("sabre.progress: not json") is None


def test_reporter_sets_application_name_and_notices():
    progress = sabre_plpy("shared.progress")
    plpy = FakePlpy({"current_setting": [{"progress": "on", "name": "etl"}]})
    plpy.notices = []
    plpy.notice = plpy.notices.append
    with progress.reporting(plpy, "anonymize"):
        with progress.reporting(plpy, "inner"):     # nested entry points: the outer one reports
            with Stopwatch().phase("read"):
                pass
    names = [p[0] for sql, p in plpy.executed if "set_config('application_name'" in sql]
    assert names == ["sabre-pg anonymize: read 1/1", "sabre-pg anonymize: read done 1/1", "etl"]
    assert [parse_progress(n)["event"] for n in plpy.notices] == ["start", "end"]
    assert sum("current_setting" in sql for sql, _ in plpy.executed) == 1


def test_reporter_reads_nothing_without_phases():
    progress = sabre_plpy("shared.progress")
    plpy = FakePlpy()
    with progress.reporting(plpy, "verify"):
        pass
    assert plpy.executed == []


def test_display_lines_and_bar():
    out = io.StringIO()
    display = ProgressDisplay(out)                  # not a terminal: lines
    display({"phase": "read", "event": "start", "step": 3, "steps": 14})
    display({"phase": "read", "event": "end", "step": 3, "steps": 14, "seconds": 0.5})
    display.close()
    assert out.getvalue().splitlines() == ["[ 3/14] read ...", "[ 3/14] read done in 0.500 s"]
    assert plain_line({"phase": "swap", "event": "start", "step": 14, "steps": 14}) == "[14/14] swap ..."
    out = io.StringIO()
    bar = ProgressDisplay(out, bar=True)
    bar({"phase": "read", "event": "end", "step": 3, "steps": 14, "seconds": 0.5})
    assert bar.bar.n == 3 and bar.bar.total == 14
    bar.close()
    assert "sabre-pg done" in out.getvalue() and "14/14" in out.getvalue()
