"""Progress of a run: NOTICEs under sabre.progress, the phase in pg_stat_activity, and the
``sabre-pg anonymize`` command (docs/progress.md)."""
from __future__ import annotations

import re
import subprocess
import sys
import threading
import time

from sabre_pg.core.stopwatch import STEPS, parse_progress
from tests.db.helpers import anonymize, make_census

ROWS = 2000


def test_notices_only_when_asked(pg_conn):
    make_census(pg_conn, rows=ROWS)
    seen = []
    pg_conn.add_notice_handler(lambda d: seen.append(d.message_primary))
    anonymize(pg_conn, "census", ["age", "sex"], "salary", 0.3, 4)
    assert not [m for m in seen if parse_progress(m)]
    pg_conn.execute("SET sabre.progress = on")
    anonymize(pg_conn, "census", ["age", "sex"], "salary", 0.3, 4)
    events = [parse_progress(m) for m in seen if parse_progress(m)]
    assert events[0] == {"phase": "validate", "event": "start", "step": 1, "steps": STEPS, "what": "anonymize"}
    assert events[-1]["phase"] == "swap" and events[-1]["event"] == "end"
    # nested phases (the engine's inside summary) start and end in order
    opened = []
    for e in events:
        if e["event"] == "start":
            opened.append(e["phase"])
        else:
            assert opened.pop() == e["phase"]
    assert not opened
    # application_name is restored when the call returns
    assert pg_conn.execute("SHOW application_name").fetchone()[0] == pg_conn.info.parameter_status(
        "application_name")


def test_phase_visible_in_pg_stat_activity(pg_conn, pg_connect):
    """A run waiting at its swap for a reader of the previous output shows the phase in
    pg_stat_activity to another session; afterwards its application_name is its own again."""
    make_census(pg_conn, rows=ROWS)
    anonymize(pg_conn, "census", ["age"], "salary", 0.3, 4)
    reader = pg_connect(autocommit=False)
    reader.execute("SELECT count(*) FROM census_sabre")        # holds its lock until commit
    runner = pg_connect(application_name="etl-job")
    pid = runner.info.backend_pid
    done = {}

    def run():
        done["row"] = anonymize(runner, "census", ["age"], "salary", 0.3, 4, options={"lock_timeout": "120s"})

    thread = threading.Thread(target=run)
    thread.start()
    try:
        name, deadline = None, time.monotonic() + 120
        while time.monotonic() < deadline:
            name, wait = pg_conn.execute("SELECT application_name, wait_event_type FROM pg_stat_activity "
                                         "WHERE pid = %s", (pid,)).fetchone()
            if name.startswith("sabre-pg anonymize: swap") and wait == "Lock":
                break
            time.sleep(0.02)
        assert re.fullmatch(r"sabre-pg anonymize: swap \d+/%d" % STEPS, name), name
    finally:
        reader.commit()
        thread.join(180)
    assert done["row"]["rows"] == ROWS
    assert pg_conn.execute("SELECT application_name FROM pg_stat_activity WHERE pid = %s",
                           (pid,)).fetchone()[0] == "etl-job"


def test_cli_anonymize_plain_lines_then_verify(pg_conn, pg_dsn):
    hierarchies = make_census(pg_conn, rows=ROWS)
    cmd = [sys.executable, "-m", "sabre_pg.cli", "anonymize", "census", "--dsn", pg_dsn,
           "--qi", "age", "sex", "marital", "--sensitive", "salary", "-t", "0.3", "-k", "5",
           "--hierarchy", f"marital={hierarchies['marital']}", "--option", "seed=7",
           "--option", "keep=[\"id\"]", "--output", "census_cli"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stderr.splitlines()       # not a terminal: one plain line per phase event
    assert lines[0] == "[ 1/%d] validate ..." % STEPS
    assert re.fullmatch(r"\[\s*\d+/%d\] swap done in \d+\.\d{3} s" % STEPS, lines[-1])
    assert re.search(r"^output\s+public\.census_cli$", res.stdout, re.M)
    assert re.search(r"^verify: \d+ classes, 0 violations, .* -> OK$", res.stdout, re.M)
    options = pg_conn.execute("SELECT options FROM sabre.runs ORDER BY run_id DESC LIMIT 1").fetchone()[0]
    assert options == {"seed": 7, "keep": ["id"], "hierarchies": {"marital": hierarchies["marital"]}}


def test_cli_anonymize_error_has_sqlstate_and_hint(pg_conn, pg_dsn):
    make_census(pg_conn, rows=ROWS)
    res = subprocess.run([sys.executable, "-m", "sabre_pg.cli", "anonymize", "census", "--dsn", pg_dsn,
                          "--qi", "age", "--sensitive", "salary", "-t", "2", "--progress", "none"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert "SQLSTATE: 22023" in res.stderr and "HINT:" in res.stderr
