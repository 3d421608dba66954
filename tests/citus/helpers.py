"""What several Citus test files check the same way: where a relation is placed, what a run left
on the nodes, and a worker stopped while a run is on the workers (its old output intact)."""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import psycopg
import pytest


def placement(conn, relation):
    """(partition method, distribution column, colocation id) of ``relation`` in pg_dist_partition."""
    return conn.execute("SELECT partmethod::text, pg_catalog.column_to_column_name(logicalrelid, partkey), "
                        "colocationid FROM pg_catalog.pg_dist_partition WHERE logicalrelid = %s::regclass",
                        (relation,)).fetchone()


def leftovers(citus_cluster) -> int:
    """Relations of a run under a temporary name (staging, staged, driver) on any node."""
    n = 0
    for dsn in [citus_cluster.dsn] + citus_cluster.worker_dsns:
        with psycopg.connect(dsn) as node:
            n += node.execute("SELECT count(*) FROM pg_catalog.pg_class WHERE relname LIKE 'sabre_tmp%'").fetchone()[0]
    return n


def fails_with_a_worker_stopped(citus_cluster, call) -> psycopg.Error:
    """The error ``call()`` raises when the second worker is stopped once a shard or part runs on
    the first (``sabre_citus_shard`` active there); the worker is started again afterwards."""
    worker, watch = citus_cluster.workers[1], citus_cluster.workers[0]
    started = threading.Event()

    def stop_when_started():
        with psycopg.connect(watch.dsn(tcp=True), autocommit=True) as w:
            for _ in range(600):
                if w.execute("SELECT count(*) FROM pg_catalog.pg_stat_activity WHERE query LIKE "
                             "'%sabre_citus_shard%' AND pid <> pg_catalog.pg_backend_pid()").fetchone()[0]:
                    started.set()
                    worker.stop()
                    return
                time.sleep(0.02)

    stopper = threading.Thread(target=stop_when_started)
    stopper.start()
    try:
        with pytest.raises(psycopg.Error) as ei:
            call()
    finally:
        stopper.join()
        citus_cluster.start_node(worker)
    assert started.is_set()
    return ei.value


def assert_old_output_intact(conn, output: str, run_id: int, classes: int, rows: int) -> None:
    """``output`` still the one of ``run_id``: every row once, its classes t-close (t = 0.3, k = 5),
    its comment naming the run."""
    assert conn.execute(f"SELECT count(*), count(DISTINCT id) FROM {output}").fetchone() == (rows, rows)
    assert conn.execute(f"SELECT classes, violations FROM sabre.sabre_verify('{output}'::regclass, 'salary', "
                        "0.3::float8, 5)").fetchone() == (classes, 0)
    assert f"sabre-pg run {run_id}," in conn.execute(
        f"SELECT pg_catalog.obj_description('{output}'::regclass, 'pg_class')").fetchone()[0]


def coordinator_received(conn, call) -> int:
    """Bytes the connection's backend (the coordinator's) received from the workers over its TCP
    sockets while ``call()`` ran (sabre_pg/bench/netio.py: /proc/<pid>/io rchar misses them)."""
    from sabre_pg.bench.netio import SocketBytes

    pid = conn.execute("SELECT pg_catalog.pg_backend_pid()").fetchone()[0]
    ports = [p for (p,) in conn.execute("SELECT nodeport FROM pg_catalog.pg_dist_node WHERE groupid <> 0")]
    with SocketBytes(pid, ports) as sockets:
        call()
    assert sockets.result() is not None, "ss cannot see the coordinator backend's sockets"
    return sockets.result()["received"]


def distributed_table(dsn: str, table: str, rows: int, shards: int):
    """For a module fixture (``yield from``): sabre on every node, public.<table> (sabre-pg gen,
    seeded) distributed by id in ``shards`` shards; yields an autocommit connection to the
    coordinator, and drops the table after."""
    from sabre_pg import cli

    assert cli.main(["install", "--dsn", dsn]) == 0
    assert cli.main(["gen", "--dsn", dsn, "--table", table, "--rows", str(rows), "--replace"]) == 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"SELECT pg_catalog.create_distributed_table('public.{table}', 'id', shard_count => %s)",
                     (shards,))
        yield conn
        conn.execute(f"DROP TABLE IF EXISTS public.{table} CASCADE")


@contextmanager
def analyst_on_every_node(dba, analyst_role, name: str, schema: str, source: str):
    """The security suite's analyst ``name`` (conftest's ``analyst_role``) with USAGE on sabre on
    every node (sabre's schema is each node's own), SELECT on ``source`` and her own ``schema``;
    both dropped or revoked after."""
    with analyst_role(dba, name):
        dba.execute(f"CREATE SCHEMA {schema} AUTHORIZATION {name}")
        dba.execute(f"SELECT pg_catalog.run_command_on_workers($$GRANT USAGE ON SCHEMA sabre TO {name}$$)")
        dba.execute(f"GRANT SELECT ON {source} TO {name}")
        try:
            yield name
        finally:
            dba.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            dba.execute(f"SELECT pg_catalog.run_command_on_workers($$REVOKE USAGE ON SCHEMA sabre FROM {name}$$)")
