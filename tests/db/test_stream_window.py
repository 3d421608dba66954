"""The 'window' engine in the database (issue #28, docs/streams.md "Engines"): a new stream
partitions a window only when none of its rows is published (D = 0), publishes the classes
holding expiring rows and then, advance by advance, the classes of that partition whose rows
expire (case 3, generated from the last DIRECT's window); verify is clean, every class within t
of its generating window, and the output is the core's."""
from __future__ import annotations

from sabre_pg.core import window as W
from tests.db.test_stream import add_rows, advance, assert_clean, create, make_source, verify
from tests.db.test_stream_refine import core_log, published_log


def test_window_engine_cases_and_generating_windows(pg_conn):
    make_source(pg_conn, 1600, shift_at=700)
    create(pg_conn, window_size=400, step=100, t=0.1, k=4)
    assert pg_conn.execute("SELECT engine FROM sabre.streams WHERE name = 'adm_w'").fetchone()[0] == "window"
    rows = advance(pg_conn)
    assert [r["case_no"] for r in rows if r["case_no"] == 2] and len(rows) == 12
    direct = [r["advance_no"] for r in rows if r["case_no"] == 2]
    assert direct[:3] == [1, 5, 9]
    assert all(r["d"] == 0 for r in rows if r["case_no"] == 2)
    for r in rows:
        if r["case_no"] != 3:
            continue
        last = max(a for a in direct if a < r["advance_no"])
        windows = pg_conn.execute("SELECT DISTINCT window_first FROM admissions_sabre_w WHERE advance_no = %s",
                                  (r["advance_no"],)).fetchall()
        assert windows == [((last - 1) * 100 + 1,)]
    v = verify(pg_conn)
    assert_clean(v, 1200)
    assert v["max_emd"] <= 0.1 and v["min_class_size"] >= 4


def test_window_engine_resumes_across_calls_as_the_core_runs_it(pg_conn):
    """Advances split over calls (rows arriving in between) publish what the core publishes in
    one run over the same rows."""
    make_source(pg_conn, 700)
    create(pg_conn, qis=("age", "zip"))
    advance(pg_conn, max_advances=1)
    advance(pg_conn)
    add_rows(pg_conn, 300)
    advance(pg_conn)
    assert published_log(pg_conn) == core_log(pg_conn, W.sabre_partition("refine"), 1000, defer=True)
    assert_clean(verify(pg_conn), 600)
