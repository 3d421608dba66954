"""A worker lost *between* two statements of a run on a Citus distributed source.

A statement PL/Python executes opens a subtransaction, which on a Citus coordinator sends
SAVEPOINT to every worker of the distributed transaction; a worker lost while the run computed
in Python, after one statement's RELEASE SAVEPOINT and before the next SAVEPOINT, made that
SAVEPOINT fail before PL/Python could handle it: the session ended with FATAL "unexpected state
SUBBEGIN" (about 1 run in 4 of the stop-during-the-parts tests). A run on a distributed source
now has the wrapper's PL/pgSQL execute its statements (plpython/shared/driven.py): no SAVEPOINT
is sent, and the next statement that needs the lost worker fails. These tests hold the run
between two of its distributed statements, with a lock on a coordinator table it writes late
(its catalog row in ``sabre.runs``, after the swap) or early (its run token, before its first
distributed statement), stop the second worker while the run waits, then let the lock go: the
caller gets sabre's 08006 with a HINT, the old output is intact, nothing is left on any node,
and the session goes on working.
"""
from __future__ import annotations

import json
import threading
import time

import psycopg
import pytest

from tests.citus.helpers import assert_old_output_intact, distributed_table, leftovers

ROWS = 1600
RUN = ("SELECT run_id, rows, classes FROM sabre.sabre_anonymize(source => 'public.wl'::regclass, "
       "quasi_identifiers => ARRAY['age', 'sex', 'education'], sensitive => 'salary', t => 0.3, k => %s, "
       "output => %s, options => %s::jsonb)")


@pytest.fixture(scope="module")
def wl(citus_cluster):
    yield from distributed_table(citus_cluster.dsn, "wl", ROWS, 4)


def _opts(design):
    return json.dumps({"keep": ["id"], "citus_design": design})


def _held(citus_cluster, table: str, call):
    """``call()`` while ``table`` (a coordinator table) is locked against writes; once the run
    waits for that lock, the second worker is stopped, then the lock released. Returns the error
    ``call()`` raised; the worker is started again."""
    worker = citus_cluster.workers[1]
    outcome = {}

    def run():
        try:
            call()
        except psycopg.Error as e:
            outcome["error"] = e

    with psycopg.connect(citus_cluster.dsn) as lock:
        lock.execute(f"LOCK TABLE {table} IN EXCLUSIVE MODE")
        runner = threading.Thread(target=run)
        runner.start()
        try:
            with psycopg.connect(citus_cluster.dsn, autocommit=True) as watch:
                for _ in range(1500):
                    waiting = watch.execute(
                        "SELECT count(*) FROM pg_catalog.pg_stat_activity WHERE wait_event_type = 'Lock' "
                        "AND query LIKE '%%sabre_anonymize%%' AND pid <> pg_catalog.pg_backend_pid()").fetchone()[0]
                    if waiting or not runner.is_alive():
                        break
                    time.sleep(0.02)
            assert waiting, "the run never waited for the lock on %s: %r" % (table, outcome)
            worker.stop()
        finally:
            lock.rollback()
            runner.join()
            citus_cluster.start_node(worker)
    assert "error" in outcome, "the run succeeded with a worker stopped"
    return outcome["error"]


@pytest.mark.parametrize("design", ["qi_local", "shard_local"])
@pytest.mark.parametrize("where", ["sabre.runs", "sabre.run_tokens"])
def test_a_worker_lost_between_statements_fails_the_run_cleanly(wl, citus_cluster, design, where):
    conn = wl
    output = "public.wl_%s" % design
    run_id, rows, classes = conn.execute(RUN, (5, output, _opts(design))).fetchone()
    e = _held(citus_cluster, where, lambda: conn.execute(RUN, (7, output, _opts(design))))
    assert e.sqlstate == "08006", (e.sqlstate, str(e))
    assert "could not reach a node" in e.diag.message_primary, str(e)
    assert "previous output" in e.diag.message_hint
    assert "Traceback" not in str(e) and "plpy" not in str(e)
    # the session goes on (no FATAL), and so does PL/Python in it
    assert conn.execute("SELECT 1").fetchone() == (1,)
    assert conn.execute("SELECT classes FROM sabre.sabre_verify(%s::regclass, 'salary', 0.3::float8, 5)",
                        (output,)).fetchone() == (classes,)
    assert_old_output_intact(conn, output, run_id, classes, rows)
    assert leftovers(citus_cluster) == 0
    # and the next run of the session works
    again = conn.execute(RUN, (5, output, _opts(design))).fetchone()
    assert again[1] == ROWS and again[0] > run_id


def test_an_error_inside_a_driven_run_is_reported_as_sabre_reports_it(wl):
    """A sabre error raised by the run's job (not by a statement) keeps its SQLSTATE, message
    and HINT, without PL/Python's prefix or traceback."""
    conn = wl
    with pytest.raises(psycopg.Error) as ei:
        conn.execute(RUN, (ROWS + 1, "public.wl_big_k", _opts("qi_local")))
    e = ei.value
    assert e.sqlstate == "22023", (e.sqlstate, str(e))
    assert not e.diag.message_primary.startswith(("plpy", "spiexceptions")) and "Traceback" not in str(e)
    assert conn.execute("SELECT pg_catalog.to_regclass('public.wl_big_k')").fetchone() == (None,)
