"""Shared fixtures.

Database fixtures (started lazily, only when a test asks for one):

``sabre_cluster``  session (one per pytest-xdist worker): a throwaway :class:`LocalCluster` under /tmp (fsync off,
                   its own free port, pg_cron preloaded when installed, with its database
                   ``cluster.dbname`` created empty), stopped and deleted at the end.
``pg_conn``        a psycopg connection (autocommit) to a fresh database of its own,
                   with sabre installed in schema ``sabre`` and
                   ``search_path = public, sabre`` (also set on the database, so
                   further connections get it). Fresh databases are cloned from a
                   template that has sabre installed once per session.
``pg_module_conn`` module: the same, one database shared by a module's tests (for tests
                   that change nothing in it, e.g. calls that must fail).
``pg_dsn``         the conninfo of ``pg_conn``'s database.
``pg_connect``     ``pg_connect(**overrides)`` opens more connections to that database
                   (e.g. ``user="analyst"``), closed after the test.
``pg_role_dsn``    ``pg_role_dsn(role)``: the conninfo of that database as ``role``, a LOGIN
                   role, which gets the session's test password for it (the cluster
                   authenticates every role but its superuser by password; pg_connect
                   does this for ``user=``).

``unstarted_cluster`` a throwaway :class:`LocalCluster` of its own, not initialised yet.

``shared_dir``     session: Path of ``../shared/data`` (adult, li2007); fails if missing.
"""
from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo
from pytest_postgresql import factories
from pytest_postgresql.janitor import DatabaseJanitor

from sabre_pg import installer
from sabre_pg.cluster import LocalCluster, first_free_port

REPO_DIR = Path(__file__).resolve().parents[1]
SHARED_DATA_DIR = REPO_DIR.parent / "shared" / "data"
SABRE_SCHEMA = "sabre"
# pytest-xdist runs each worker (gw0, gw1, ...) as a process of its own, with its own session:
# each worker starts its own throwaway cluster (its own data directory, socket directory and
# port), so tests on different workers share no database, role or setting.
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
_WORKER_INDEX = int(XDIST_WORKER[2:]) if XDIST_WORKER.startswith("gw") and XDIST_WORKER[2:].isdigit() else 0
# Away from the embedded cluster's 54329. Per process (parallel runs do not race for one port)
# and per worker: worker i scans its own block of 1500 ports (sessions from [0, 700), unstarted
# clusters from [700, 1400)), so two workers starting at once never pick the same free port.
TEST_PORT_BASE = 55400 + 1500 * (_WORKER_INDEX % 6) + os.getpid() % 500
TEST_ROLE_PASSWORD = secrets.token_urlsafe(16)  # what pg_role_dsn gives the roles tests log in as


# Modules holding a test of a minute or more (`--durations`), handed out right after the podman
# build so that no worker ends the run alone on one of them. A name not found is ignored.
HEAVY_MODULES = ["tests/core/test_redistribute.py", "tests/db/test_bench.py", "tests/db/test_anonymize.py",
                 "tests/db/test_security.py", "tests/db/test_multi_sa.py"]


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist, the order in which whole modules are handed out (./dev.sh test:
    ``--dist loadscope --no-loadscope-reorder``): first the module with the podman image build
    (minutes, mostly waiting), so that it overlaps everything else; then the slowest modules
    first, so that the short ones fill in at the end. A serial run keeps the file order."""
    if not XDIST_WORKER:   # collection runs on the workers; the controller hands out what they collected
        return
    modules: dict[str, list] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::", 1)[0], []).append(item)

    def cost(path: str) -> tuple:
        tests = modules[path]
        first = any(item.get_closest_marker("podman") for item in tests)
        heavy = HEAVY_MODULES.index(path) if path in HEAVY_MODULES else len(HEAVY_MODULES)
        # a test of tests/db runs on the cluster (~0.5-5 s), a pure-Python test mostly ms
        weight = len(tests) * (10 if path.startswith("tests/db/") else 1)
        return (not first, heavy, -weight)

    items[:] = [item for path in sorted(modules, key=cost)
                for item in sorted(modules[path], key=lambda item: not item.get_closest_marker("podman"))]


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not (SHARED_DATA_DIR / "adult").is_dir() or not (SHARED_DATA_DIR / "li2007").is_dir():
        pytest.fail(
            f"test data not found at {SHARED_DATA_DIR}: the shared data directory (adult/, li2007/) "
            "must sit at ../shared/data beside the repository, as it does in CI"
        )
    return SHARED_DATA_DIR


@contextmanager
def _throwaway_cluster(prefix: str, port_base: int):
    """A LocalCluster under /tmp (fsync off, a free port), stopped and deleted at the end."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    cluster = LocalCluster(root, first_free_port(port_base), fsync=False)
    try:
        yield cluster
    finally:
        try:
            cluster.stop()
        finally:
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def sabre_cluster():
    with _throwaway_cluster("sabre-pg-test-", TEST_PORT_BASE) as cluster:
        cluster.start(ensure_database=False)
        # pg_cron (preloaded when installed, sabre_pg.cluster.cron_settings) runs its jobs in
        # the cluster's own database: it must exist; test_stream installs sabre there
        with psycopg.connect(cluster.dsn("postgres"), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(cluster.dbname)))
        yield cluster


@pytest.fixture
def unstarted_cluster():
    """A throwaway LocalCluster of its own, not yet initialised (for the cluster's own tests)."""
    with _throwaway_cluster("sabre-pg-new-", TEST_PORT_BASE + 700) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def _sabre_server(sabre_cluster):
    """The base pytest-postgresql's noproc fixture attaches to (``depends_on``)."""
    return SimpleNamespace(
        host=str(sabre_cluster.socket_dir), port=sabre_cluster.port, user=sabre_cluster.superuser,
        password=sabre_cluster.password, options="", maintenance_dbname="postgres", template_dbname=None,
    )


def _install_sabre(host, port, user, dbname, password=None, **_):
    """pytest-postgresql loader: install sabre into the template database."""
    with psycopg.connect(host=host, port=port, user=user, dbname=dbname, password=password) as conn:
        installer.install(conn, SABRE_SCHEMA)


postgresql_sabre_proc = factories.postgresql_noproc(
    dbname="sabre_test", load=[_install_sabre], depends_on="_sabre_server"
)
postgresql_sabre = factories.postgresql("postgresql_sabre_proc")


def _with_search_path(conn: psycopg.Connection) -> psycopg.Connection:
    """Autocommit, ``search_path = public, sabre`` in this session and on the database."""
    conn.autocommit = True
    conn.execute(sql.SQL("ALTER DATABASE {} SET search_path = public, {}").format(
        sql.Identifier(conn.info.dbname), sql.Identifier(SABRE_SCHEMA)))
    conn.execute(sql.SQL("SET search_path = public, {}").format(sql.Identifier(SABRE_SCHEMA)))
    return conn


@pytest.fixture
def pg_conn(postgresql_sabre) -> psycopg.Connection:
    return _with_search_path(postgresql_sabre)


@pytest.fixture(scope="module")
def pg_module_conn(postgresql_sabre_proc):
    """Like ``pg_conn``, but one database for the whole module (cloned from the same template),
    for tests that leave it as they found it, e.g. calls that must fail (and roll back): a
    fresh database and its tables per test cost seconds on a loaded machine."""
    proc = postgresql_sabre_proc
    janitor = DatabaseJanitor(user=proc.user, host=proc.host, port=proc.port, password=proc.password,
                              dbname=f"sabre_module_{secrets.token_hex(4)}", template_dbname=proc.template_dbname,
                              maintenance_dbname=proc.maintenance_dbname)
    with janitor, psycopg.connect(dbname=janitor.dbname, user=proc.user, password=proc.password,
                                  host=proc.host, port=proc.port, options=proc.options) as conn:
        yield _with_search_path(conn)


@pytest.fixture
def pg_dsn(pg_conn) -> str:
    return pg_conn.info.dsn


@pytest.fixture
def pg_role_dsn(pg_conn, pg_dsn):
    def role_dsn(role: str) -> str:
        if role == pg_conn.info.user:
            return pg_dsn
        pg_conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(
            sql.Identifier(role), sql.Literal(TEST_ROLE_PASSWORD)))
        return make_conninfo(pg_dsn, user=role, password=TEST_ROLE_PASSWORD)

    return role_dsn


@pytest.fixture
def pg_connect(pg_dsn, pg_role_dsn):
    opened: list[psycopg.Connection] = []

    def connect(autocommit: bool = True, **overrides) -> psycopg.Connection:
        dsn = pg_role_dsn(overrides["user"]) if "user" in overrides and "password" not in overrides else pg_dsn
        conn = psycopg.connect(make_conninfo(dsn, **overrides), autocommit=autocommit)
        opened.append(conn)
        return conn

    yield connect
    for conn in opened:
        conn.close()
