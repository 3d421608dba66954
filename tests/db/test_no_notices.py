"""No stray notices (issue 29): the internal statements of a call (``DROP ... IF EXISTS`` of
work tables, ``CREATE ... IF NOT EXISTS``) run with ``client_min_messages`` raised
(``common.quietly``), so a client sees no NOTICE it did not ask for: a stream's create and
advances, a batch run, its rerun and refresh, and the verifications send nothing."""
from __future__ import annotations

from tests.db.helpers import anonymize, verify
from tests.db.test_stream import add_rows, advance, create, make_source, verify as stream_verify


def collect(conn) -> list[str]:
    seen: list[str] = []
    conn.add_notice_handler(lambda d: seen.append("%s %s: %s" % (d.severity, d.sqlstate, d.message_primary)))
    return seen


def test_stream_create_advances_anonymize_refresh_verify_send_no_notice(pg_conn):
    make_source(pg_conn, 450)
    seen = collect(pg_conn)
    pg_conn.execute("SET client_min_messages = notice")

    create(pg_conn)
    assert advance(pg_conn) == []                        # 450 rows: no complete step yet
    add_rows(pg_conn, 250)
    assert advance(pg_conn, max_advances=1)
    assert advance(pg_conn)
    assert advance(pg_conn) == []                        # nothing new: still no notice
    v = stream_verify(pg_conn)
    assert v["violations"] == 0, v

    run = anonymize(pg_conn, "admissions", ["age", "sex", "zip"], "diagnosis", 0.3, 4, method="ak")
    anonymize(pg_conn, "admissions", ["age", "sex", "zip"], "diagnosis", 0.3, 4, method="ak")   # rerun: replace
    pg_conn.execute("SELECT * FROM sabre_refresh(%s)", ("public." + run["output"],)).fetchall()
    assert verify(pg_conn, run["output"], "diagnosis", 0.3, 4)["violations"] == 0
    pg_conn.execute("SELECT * FROM sabre_estimate('admissions', ARRAY['age','sex','zip'], 'diagnosis', 0.3, 4, "
                    "'{\"analyze\": true}')").fetchall()

    assert seen == []


def test_progress_notices_are_the_only_ones(pg_conn):
    make_source(pg_conn, 450)
    seen = collect(pg_conn)
    pg_conn.execute("SET sabre.progress = on")
    create(pg_conn)
    add_rows(pg_conn, 250)
    assert advance(pg_conn)
    assert seen and all(s.startswith("NOTICE 00000: sabre.progress: ") for s in seen), seen
