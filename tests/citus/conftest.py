"""A real Citus cluster for the tests of this folder: a coordinator and 2 workers.

``citus_cluster`` (session) installs Citus 13.2.2 from ``../shared/citus/install.sh`` (root,
idempotent, about 1 s) and starts three throwaway :class:`LocalCluster` nodes under /tmp, each on
a free port of 127.0.0.1, as the ``postgres`` OS user, with fsync off. Each node preloads
``citus`` (first, then ``pg_cron`` when the cluster code preloads it), has ``wal_level =
logical`` and ``citus.enable_statistics_collection = off``, and its database ``sabre``
(``cluster.dbname``) has ``CREATE EXTENSION citus``. The coordinator registers itself
(``citus_set_coordinator_host``) and both workers (``citus_add_node``).

Citus opens its own connections between the nodes (to 127.0.0.1:<port>, as the role running the
query); so on this test cluster TCP connections from 127.0.0.1 are trusted (``pg_hba.conf``),
while the Unix socket keeps the LocalCluster's peer/scram lines.

Anything that keeps the cluster from starting fails the session (``pytest.fail``), never skips:
these tests run in CI, where ``../shared/citus`` is present. The nodes are stopped and their
directories deleted at the end.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import psycopg
import pytest
from psycopg import sql

from sabre_pg.cluster import LocalCluster, cron_settings, first_free_port

REPO_DIR = Path(__file__).resolve().parents[2]
CITUS_DIR = REPO_DIR.parent / "shared" / "citus"
CITUS_PORT_BASE = 56400 + os.getpid() % 500  # away from tests/conftest.py's 55400+ and 56400+1000
WORKERS = 2

NODE_SETTINGS = {
    "shared_buffers": "'32MB'",            # three nodes share a small machine
    "max_connections": "100",              # Citus opens connections between the nodes
    "wal_level": "logical",                # shard moves need it
    "max_wal_senders": "10",
    "citus.enable_statistics_collection": "off",
}
HBA_TRUST_TCP = "host    all       all           127.0.0.1/32   trust\n"


def _install_citus() -> str:
    script = CITUS_DIR / "install.sh"
    if not script.is_file():
        pytest.fail(f"Citus build not found: {script} (../shared/citus must sit beside the repository, as in CI)")
    cmd = [str(script)] if os.geteuid() == 0 else ["sudo", "-n", str(script)]
    proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        pytest.fail(f"Citus could not be installed ({' '.join(cmd)}, exit {proc.returncode}):\n"
                    f"{proc.stdout}{proc.stderr}")
    return proc.stdout.strip()


def _preload(dbname: str) -> str:
    """'citus', or 'citus,pg_cron' when the cluster code preloads pg_cron: citus must be first."""
    libs = ["citus"]
    if cron_settings(dbname):
        libs.append("pg_cron")
    return "'%s'" % ",".join(libs)


def start_node(node: LocalCluster) -> None:
    """Start (or restart) a node, then trust TCP from 127.0.0.1: after start(), which rewrites a
    pg_hba.conf that has trust lines (LocalCluster._secure_auth)."""
    node.start(ensure_database=False)
    hba = node.pgdata / "pg_hba.conf"
    hba.write_text(HBA_TRUST_TCP + hba.read_text())
    node._run("pg_ctl", "reload", "-D", str(node.pgdata))


def _start_node(root: Path, name: str, port_base: int) -> LocalCluster:
    node = LocalCluster(root / name, first_free_port(port_base), fsync=False)
    node.init()
    with open(node.pgdata / "postgresql.conf", "a") as f:
        f.write("\n# sabre-pg Citus test node (tests/citus/conftest.py)\n")
        for key, value in {**NODE_SETTINGS, "shared_preload_libraries": _preload(node.dbname)}.items():
            f.write(f"{key} = {value}\n")
    start_node(node)
    with psycopg.connect(node.dsn("postgres"), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(node.dbname)))
    with psycopg.connect(node.dsn(), autocommit=True) as conn:
        conn.execute("CREATE EXTENSION citus")
    return node


@pytest.fixture(scope="session")
def citus_cluster():
    """SimpleNamespace(coordinator, workers, dsn, worker_dsns, citus_so, start_node): ``dsn`` is
    the coordinator's database ``sabre`` over TCP as the superuser (its password file);
    ``start_node(node)`` starts a stopped node again."""
    citus_so = _install_citus()
    root = Path(tempfile.mkdtemp(prefix="sabre-pg-citus-"))
    os.chmod(root, 0o755)  # the nodes run as postgres
    nodes: list[LocalCluster] = []
    try:
        port = CITUS_PORT_BASE
        try:
            for name in ["coordinator"] + [f"worker{i}" for i in range(1, WORKERS + 1)]:
                nodes.append(_start_node(root, name, port))
                port = nodes[-1].port + 1
            coordinator, workers = nodes[0], nodes[1:]
            with psycopg.connect(coordinator.dsn(), autocommit=True) as conn:
                conn.execute("SELECT pg_catalog.citus_set_coordinator_host('127.0.0.1', %s)", (coordinator.port,))
                for w in workers:
                    conn.execute("SELECT pg_catalog.citus_add_node('127.0.0.1', %s)", (w.port,))
                active = conn.execute("SELECT count(*) FROM pg_catalog.citus_get_active_worker_nodes()").fetchone()[0]
            if active != WORKERS:
                raise RuntimeError(f"{active} active workers, expected {WORKERS}")
        except Exception as e:  # noqa: BLE001 -- any failure to start is fatal for these tests
            logs = "".join(f"\n--- {n.log_file} (tail)\n" + "".join(n.log_file.read_text(errors="replace")
                                                                     .splitlines(True)[-15:])
                           for n in nodes if n.log_file.exists())
            pytest.fail(f"the Citus test cluster did not start: {type(e).__name__}: {e}{logs}")
        yield SimpleNamespace(coordinator=coordinator, workers=workers, citus_so=citus_so, start_node=start_node,
                              dsn=coordinator.dsn(tcp=True), worker_dsns=[w.dsn(tcp=True) for w in workers])
    finally:
        for node in reversed(nodes):
            try:
                node.stop()
            except Exception:  # noqa: BLE001 -- stop the others anyway
                pass
        shutil.rmtree(root, ignore_errors=True)


def _distributed_census(dsn: str, table: str, rows: int, local_copy: str | None = None) -> None:
    """sabre installed on every node; public.<table> (sabre-pg gen, ``rows`` rows) distributed by
    id in 4 shards, its local rows on the coordinator removed (the shell holds none, so nothing
    on the coordinator describes the rows); ``local_copy``: a plain table of the same rows first."""
    from sabre_pg import cli

    assert cli.main(["install", "--dsn", dsn]) == 0
    assert cli.main(["gen", "--dsn", dsn, "--rows", str(rows), "--replace", "--table", table]) == 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        if local_copy:
            conn.execute(f"CREATE TABLE public.{local_copy} AS TABLE public.{table}")
        conn.execute(f"SELECT pg_catalog.create_distributed_table('public.{table}', 'id', shard_count => 4)")
        conn.execute(f"SELECT pg_catalog.truncate_local_data_after_distributing_table('public.{table}')")


@pytest.fixture(scope="session")
def distributed_census(citus_cluster):
    """``distributed_census(table, rows, local_copy=None)``: see :func:`_distributed_census`."""
    return lambda table, rows, local_copy=None: _distributed_census(citus_cluster.dsn, table, rows, local_copy)


@contextmanager
def _analyst_role(conn, name: str):
    """A LOGIN role ``name`` with USAGE on schema sabre (Citus propagates both to the workers);
    what it owns and the role itself are dropped at the end."""
    conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
    try:
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA sabre TO {}").format(sql.Identifier(name)))
        yield name
    finally:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


@pytest.fixture(scope="session")
def analyst_role():
    """``with analyst_role(conn, name):`` see :func:`_analyst_role`."""
    return _analyst_role
