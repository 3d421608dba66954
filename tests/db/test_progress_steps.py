"""Progress steps of real calls (issue 29, docs/progress.md): the step never goes back and the
last event is ``steps/steps``; ``steps`` is what the run does: 13 for every method of
sabre_anonymize (one SA or several), 7 for a partitioned run, 2 + one per advance for a
stream advance call (announced once ``number`` has counted the rows that arrived)."""
from __future__ import annotations

import pytest

from sabre_pg.core.stopwatch import STEPS, parse_progress
from tests.db.helpers import anonymize, make_census
from tests.db.test_stream import add_rows, advance, create, make_source

ROWS = 2000


def events_of(conn, call) -> list[dict]:
    seen = []
    conn.add_notice_handler(lambda d: seen.append(parse_progress(d.message_primary or "")))
    conn.execute("SET sabre.progress = on")
    call()
    return [e for e in seen if e]


def assert_monotone(events, steps, known_after=0):
    """... and every event from the ``known_after``-th on announces ``steps``."""
    assert events, "no progress events"
    numbers = [e["step"] for e in events]
    assert numbers == sorted(numbers), [(e["phase"], e["event"], e["step"]) for e in events]
    assert {e["steps"] for e in events[known_after:]} == {steps}, [e["steps"] for e in events]
    assert events[-1]["step"] == steps and events[-1]["event"] == "end" and "within" not in events[-1]
    tops = [e["phase"] for e in events if e["event"] == "start" and "within" not in e]
    return tops


@pytest.mark.parametrize("method", ["refine", "ak", "knn", "mondrian"])
def test_anonymize_steps_for_every_method(pg_conn, method):
    make_census(pg_conn, rows=ROWS)
    events = events_of(pg_conn, lambda: anonymize(pg_conn, "census", ["age", "education"], "salary", 0.3, 4,
                                                  method=method))
    tops = assert_monotone(events, STEPS)
    assert STEPS == 13 and len(tops) == 13 and tops[0] == "validate" and tops[-1] == "swap", tops
    assert [e["within"] for e in events if e["phase"] == "bucketize"] == ["summary", "summary"]


def test_several_sas_and_partitioned_runs(pg_conn):
    make_census(pg_conn, rows=ROWS)
    multi = events_of(pg_conn, lambda: pg_conn.execute(
        "SELECT * FROM sabre_anonymize('census'::regclass, ARRAY['age','education'], ARRAY['salary','sex'], "
        "ARRAY[0.3, 0.3]::float8[], 4, 'ak')").fetchall())
    assert_monotone(multi, 13)
    parts = events_of(pg_conn, lambda: anonymize(pg_conn, "census", ["age", "education"], "salary", 0.3, 4,
                                                 options={"partitions": 2}, output="census_parts"))
    tops = assert_monotone(parts, 7)      # a repeated phase (the output's second check) keeps its step
    assert list(dict.fromkeys(tops)) == ["validate", "summary", "read", "partition", "check", "build_output",
                                         "swap"], tops


def test_stream_advance_steps(pg_conn):
    make_source(pg_conn, 450)
    create(pg_conn)
    add_rows(pg_conn, 250)                   # 700 rows: advances 1..3
    events = events_of(pg_conn, lambda: advance(pg_conn))
    # the advances are counted once the new rows are numbered: validate and number announce 2
    assert [e["steps"] for e in events[:4]] == [2] * 4
    tops = assert_monotone(events, 5, known_after=4)
    assert tops == ["validate", "number", "advance", "advance", "advance"], tops
    assert all(e["within"] == "advance" for e in events if e["phase"] in ("hilbert", "takeout", "generalize"))
    assert [e["steps"] for e in events_of(pg_conn, lambda: advance(pg_conn))] == [2] * 4   # nothing ready
