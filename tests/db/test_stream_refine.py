"""Streams with the searched cuts (issue #28, docs/streams.md "Engines"): a new stream records
the 'window' engine and publishes with it, a stream recorded with 'refine' keeps it; rollback, cancel and another session leave every
row published exactly once and verify clean; a stream keeps the engine it was created with --
one whose registry row has none (created before engines were recorded, or migrated from 0.2)
runs SABRE with its method, as before."""
from __future__ import annotations

import threading
import time

import numpy as np
import psycopg
import pytest

from sabre_pg.core import window as W
from sabre_pg.core.sabre import QuasiIdentifier
from tests.db.helpers import scalar
from tests.db.test_stream import add_rows, advance, assert_clean, make_source, status, verify


def create(conn, name="ref_w", method=None, qis=("age", "sex", "zip"), window_size=400, step=100, t=0.3, k=4):
    """A stream with sabre_stream_create's defaults (method only when given)."""
    extra, args = ("", []) if method is None else (", method => %s", [method])
    conn.execute("SELECT * FROM sabre_stream_create(name => %s, source => 'admissions'::regclass, arrival => 'id', "
                 "quasi_identifiers => %s::text[], sensitive => 'diagnosis', t => %s, k => %s, window_size => %s, "
                 "step => %s" + extra + ")", [name, list(qis), t, k, window_size, step] + args)


def registered(conn, name):
    return conn.execute("SELECT method, engine FROM sabre.streams WHERE name = %s", (name,)).fetchone()


def published_log(conn, output="admissions_sabre_w"):
    return conn.execute("SELECT advance_no, case_no, rows, classes FROM %s_log ORDER BY advance_no" % output).fetchall()


def core_log(conn, partition, rows, window_size=400, step=100, t=0.3, k=4, defer=False):
    """The same stream run in memory by the core (numerical QIs age, zip; SA diagnosis)."""
    data = np.array(conn.execute("SELECT age, zip, diagnosis FROM admissions WHERE id <= %s ORDER BY id",
                                 (rows,)).fetchall(), dtype=np.float64)
    qis = [QuasiIdentifier("age", data[:, 0]), QuasiIdentifier("zip", data[:, 1])]
    run = W.StreamRun(qis, data[:, 2], window_size, step, t, k, partition=partition, defer=defer)
    return [(a, x.case, x.rows, x.classes) for a, x in run.run()]


def test_new_stream_records_and_runs_the_window_engine(pg_conn):
    """Created with the defaults: method 'refine', engine 'window'; the advances publish exactly
    the classes the core's window engine makes on the same rows, and verify is clean."""
    make_source(pg_conn, 1000)
    create(pg_conn, qis=("age", "zip"))
    assert registered(pg_conn, "ref_w") == ("refine", "window")
    got = advance(pg_conn, "ref_w")
    assert len(got) == 6
    assert published_log(pg_conn) == core_log(pg_conn, W.sabre_partition("refine"), 1000, defer=True)
    v = verify(pg_conn, "ref_w")
    assert_clean(v, 600)
    assert v["min_class_size"] >= 4 and v["max_emd"] <= 0.3


def test_a_refine_engine_stream_keeps_the_refine_engine(pg_conn):
    """A stream created while 'refine' was the default engine (its registry row says so) still
    partitions the unpublished rows with the searched cuts at every DIRECT."""
    make_source(pg_conn, 1000)
    create(pg_conn, qis=("age", "zip"))
    pg_conn.execute("UPDATE sabre.streams SET engine = 'refine' WHERE name = 'ref_w'")
    advance(pg_conn, "ref_w")
    got = published_log(pg_conn)
    assert got == core_log(pg_conn, W.refine_partition(), 1000)
    assert got != core_log(pg_conn, W.sabre_partition("refine"), 1000, defer=True)
    assert_clean(verify(pg_conn, "ref_w"), 600)


def test_streams_keep_their_engine(pg_conn):
    """'ak' records the 'sabre' engine; a registry row without an engine (a stream created
    before engines were recorded) runs SABRE with its method even when that is 'refine' --
    the classes of the old code, not those of the refine engine."""
    make_source(pg_conn, 1000)
    create(pg_conn, name="ak_w", method="ak", qis=("age", "zip"))
    assert registered(pg_conn, "ak_w") == ("ak", "sabre")
    assert scalar(pg_conn, "SELECT sabre_stream_drop('ak_w', purge => true)")
    create(pg_conn, name="old_w", method="refine", qis=("age", "zip"))
    pg_conn.execute("UPDATE sabre.streams SET engine = NULL WHERE name = 'old_w'")     # as before engines
    advance(pg_conn, "old_w")
    old = published_log(pg_conn)
    assert old == core_log(pg_conn, W.sabre_partition("refine"), 1000)
    assert old != core_log(pg_conn, W.refine_partition(), 1000)
    assert_clean(verify(pg_conn, "old_w"), 600)


def test_rollback_and_another_session(pg_conn, pg_connect):
    """A rolled-back advance leaves nothing; another session then advances from the committed
    state, and the first session after it: every expired row published once, verify clean."""
    make_source(pg_conn, 1100)
    create(pg_conn)
    mine, other = pg_connect(autocommit=False), pg_connect()
    assert [r["advance_no"] for r in advance(mine, "ref_w", max_advances=2)] == [1, 2]
    mine.commit()
    before = scalar(pg_conn, "SELECT count(*) FROM admissions_sabre_w")
    assert [r["advance_no"] for r in advance(mine, "ref_w", max_advances=2)] == [3, 4]
    mine.rollback()
    assert scalar(pg_conn, "SELECT count(*) FROM admissions_sabre_w") == before
    assert status(pg_conn, "ref_w")["advances"] == 2
    assert [r["advance_no"] for r in advance(other, "ref_w", max_advances=2)] == [3, 4]
    add_rows(other, 100)
    assert [r["advance_no"] for r in advance(mine, "ref_w")] == [5, 6, 7, 8]
    mine.commit()
    assert_clean(verify(pg_conn, "ref_w"), 800)


def test_cancel_mid_advance(pg_conn, pg_connect):
    """An advance blocked on the output is cancelled: nothing of it remains, the next call
    resumes and verify is clean."""
    make_source(pg_conn, 700)
    create(pg_conn)
    assert len(advance(pg_conn, "ref_w", max_advances=1)) == 1
    before = scalar(pg_conn, "SELECT count(*) FROM admissions_sabre_w")
    blocker = pg_connect(autocommit=False)
    blocker.execute("LOCK TABLE admissions_sabre_w IN ACCESS EXCLUSIVE MODE")
    worker = pg_connect()
    pid, errors = worker.info.backend_pid, []

    def run():
        try:
            advance(worker, "ref_w")
        except psycopg.Error as e:
            errors.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    for _ in range(200):
        if scalar(pg_conn, "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (pid,)):
            break
        time.sleep(0.05)
    assert scalar(pg_conn, "SELECT pg_cancel_backend(%s)", (pid,))
    thread.join(30)
    blocker.rollback()
    assert len(errors) == 1 and errors[0].sqlstate == "57014", errors
    assert scalar(pg_conn, "SELECT count(*) FROM admissions_sabre_w") == before
    assert status(pg_conn, "ref_w")["advances"] == 1
    assert [r["advance_no"] for r in advance(pg_conn, "ref_w")] == [2, 3]
    assert_clean(verify(pg_conn, "ref_w"), 300)


@pytest.mark.parametrize("method", ["ak", "refine"])
def test_categorical_qi_and_shifting_sa(pg_conn, method):
    """A categorical QI (sex) and an SA that shifts: both engines go through the three cases
    and stay within t of every generating window."""
    make_source(pg_conn, 1600, shift_at=700)
    create(pg_conn, method=method, window_size=800, step=100, t=0.05)
    cases = [r["case_no"] for r in advance(pg_conn, "ref_w")]
    assert 3 in cases and 1 in cases, cases
    v = verify(pg_conn, "ref_w")
    assert_clean(v, 800)
    assert v["max_emd"] <= 0.05
