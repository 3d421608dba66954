"""The installer: install/upgrade/uninstall through the connection, the PL/Python import hook."""
from __future__ import annotations

import psycopg
import pytest

import sabre_pg
from sabre_pg import cli, installer


def meta(conn, schema="sabre") -> dict:
    return installer.installed_meta(conn, schema)


def schema_exists(conn, schema) -> bool:
    return conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone() is not None


@pytest.fixture
def probe_modules(monkeypatch):
    """Ship extra modules next to the real ones: sets[name] = source (a package when the
    name ends in '/')."""
    extra: dict[str, str] = {}
    real = installer.collect_modules

    def collect(schema="sabre"):
        rows = real(schema)
        for name, src in extra.items():
            rows.append((name.rstrip("/"), src, name.endswith("/")))
        return rows

    monkeypatch.setattr(installer, "collect_modules", collect)
    return extra


def test_install_is_idempotent_and_records_version(pg_conn):
    first = meta(pg_conn)
    assert first["version"] == sabre_pg.__version__
    assert first["source_hash"] == installer.source_hash("sabre")
    assert installer.is_current(pg_conn, "sabre")
    res = installer.install(pg_conn, "sabre")
    again = meta(pg_conn)
    assert res["build_id"] == again["build_id"] != first["build_id"]
    assert again["version"] == sabre_pg.__version__
    assert pg_conn.execute("SELECT sabre_version()").fetchone()[0] == sabre_pg.__version__
    names = {r[0] for r in pg_conn.execute("SELECT name FROM sabre.modules")}
    assert {"sabre_pg", "sabre_pg.core", "sabre_plpy", installer.LOADER_MODULE} <= names


def test_non_autocommit_connection_left_idle(pg_connect):
    conn = pg_connect(autocommit=False)
    installer.install(conn, "sabre_tx")
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE  # committed
    assert meta(pg_connect(), "sabre_tx")["version"] == sabre_pg.__version__
    assert installer.check(conn, "sabre_tx")["ok"] is True
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_inside_callers_transaction_nothing_is_committed(pg_conn, pg_connect):
    conn = pg_connect(autocommit=False)
    conn.execute("SELECT 1")  # the caller's transaction is open
    installer.install(conn, "sabre_rb")
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
    conn.rollback()
    assert not schema_exists(pg_conn, "sabre_rb")


def test_selftest_runs_in_backend(pg_conn):
    report = pg_conn.execute("SELECT sabre_selftest()").fetchone()[0]
    assert report["ok"] is True
    assert report["emd_li2007"] == pytest.approx(0.375)
    assert report["sabre_pg"] == sabre_pg.__version__
    assert report["numpy"]


def test_upgrade_reloads_modules_in_running_backend(pg_conn, pg_connect, probe_modules):
    probe_modules["sabre_plpy._probe/"] = "from .inner import VALUE\n"
    probe_modules["sabre_plpy._probe.inner"] = "VALUE = 1\n"
    installer.install(pg_conn, "sabre")
    pg_conn.execute(
        "CREATE FUNCTION public.probe() RETURNS int LANGUAGE plpython3u AS $fn$\n"
        + installer.bootstrap("sabre")
        + "from sabre_plpy._probe import VALUE\nreturn VALUE\n$fn$"
    )
    assert pg_conn.execute("SELECT probe()").fetchone()[0] == 1
    assert pg_conn.execute("SELECT probe()").fetchone()[0] == 1  # cached path

    before = meta(pg_conn)["build_id"]
    probe_modules["sabre_plpy._probe.inner"] = "VALUE = 2\n"
    installer.upgrade(pg_connect(), "sabre")  # another session upgrades
    assert meta(pg_conn)["build_id"] != before
    assert pg_conn.execute("SELECT probe()").fetchone()[0] == 2


def test_python_tracebacks_show_shipped_source(pg_conn, probe_modules):
    probe_modules["sabre_plpy._boom"] = "def go():\n    raise ValueError('boom from module')\n"
    installer.install(pg_conn, "sabre")
    pg_conn.execute(
        "CREATE FUNCTION public.boom() RETURNS text LANGUAGE plpython3u AS $fn$\n"
        + installer.bootstrap("sabre")
        + "import traceback\nfrom sabre_plpy import _boom\n"
        + "try:\n    _boom.go()\nexcept ValueError:\n    return traceback.format_exc()\n$fn$"
    )
    tb = pg_conn.execute("SELECT boom()").fetchone()[0]
    assert 'File "sabre.modules/sabre_plpy/_boom.py", line 2, in go' in tb
    assert "raise ValueError('boom from module')" in tb
    # PL/Python's own error report (the CONTEXT) still carries the message.
    pg_conn.execute(
        "CREATE FUNCTION public.boom2() RETURNS int LANGUAGE plpython3u AS $fn$\n"
        + installer.bootstrap("sabre") + "from sabre_plpy import _boom\nreturn _boom.go()\n$fn$"
    )
    with pytest.raises(psycopg.Error, match="boom from module"):
        pg_conn.execute("SELECT boom2()")


def test_uninstall_keeps_user_tables(pg_conn):
    pg_conn.execute("CREATE TABLE public.keep_me AS SELECT 1 AS x")
    res = installer.uninstall(pg_conn, "sabre")
    assert res["dropped_outputs"] == [] and res["dropped_dependents"] == []
    assert not schema_exists(pg_conn, "sabre")
    assert pg_conn.execute("SELECT x FROM public.keep_me").fetchone()[0] == 1
    installer.install(pg_conn, "sabre")  # and it comes back
    assert pg_conn.execute("SELECT (sabre.sabre_selftest())->>'ok'").fetchone()[0] == "true"


def _stand_in_recorded_relations(conn, names):
    """Replace <schema>.recorded_relations() by one returning ``names``: the contract purge
    relies on (the catalog decides which relations still carry a run's identity)."""
    values = ", ".join(f"(1::bigint, '{n}'::regclass)" for n in names)
    conn.execute(
        "CREATE OR REPLACE FUNCTION sabre.recorded_relations() "
        'RETURNS TABLE (run_id bigint, relation regclass, relkind "char") LANGUAGE sql AS $$ '
        f"SELECT v.run_id, v.relation, c.relkind FROM (VALUES {values}) v(run_id, relation) "
        "JOIN pg_class c ON c.oid = v.relation $$")


def test_purge_drops_only_what_recorded_relations_returns(pg_conn):
    pg_conn.execute("CREATE TABLE public.out_a AS SELECT 1 AS x")
    pg_conn.execute('CREATE TABLE public."Out B" AS SELECT 1 AS x')
    pg_conn.execute("CREATE VIEW public.out_v AS SELECT x FROM public.out_a")  # recorded too
    pg_conn.execute("CREATE TABLE public.unrelated AS SELECT 1 AS x")
    _stand_in_recorded_relations(pg_conn, ["public.out_a", 'public."Out B"', "public.out_v"])
    res = installer.uninstall(pg_conn, "sabre", purge=True)
    assert res["dropped_outputs"] == ['public."Out B"', "public.out_a", "public.out_v"]
    for name in ("public.out_a", 'public."Out B"', "public.out_v"):
        assert pg_conn.execute("SELECT to_regclass(%s)", (name,)).fetchone()[0] is None
    assert pg_conn.execute("SELECT x FROM public.unrelated").fetchone()[0] == 1
    assert not schema_exists(pg_conn, "sabre")


def test_purge_refuses_a_dependent_view_unless_cascade(pg_conn):
    pg_conn.execute("CREATE TABLE public.out_a AS SELECT 1 AS x")
    pg_conn.execute("CREATE VIEW public.someones_view AS SELECT x FROM public.out_a")
    pg_conn.execute("CREATE VIEW public.view_on_view AS SELECT x FROM public.someones_view")
    _stand_in_recorded_relations(pg_conn, ["public.out_a"])
    with pytest.raises(installer.InstallError, match="view public.someones_view; view public.view_on_view"):
        installer.uninstall(pg_conn, "sabre", purge=True)
    assert schema_exists(pg_conn, "sabre")
    assert pg_conn.execute("SELECT x FROM public.view_on_view").fetchone()[0] == 1
    res = installer.uninstall(pg_conn, "sabre", purge=True, cascade=True)
    assert res["dropped_outputs"] == ["public.out_a"]
    assert res["dropped_dependents"] == ["view public.someones_view", "view public.view_on_view"]
    assert pg_conn.execute("SELECT to_regclass('public.view_on_view')").fetchone()[0] is None


def test_purge_without_recorded_relations_refuses(pg_conn):
    pg_conn.execute("DROP FUNCTION sabre.recorded_relations() CASCADE")  # and the outputs view
    with pytest.raises(installer.InstallError, match="recorded_relations"):
        installer.uninstall(pg_conn, "sabre", purge=True)
    assert schema_exists(pg_conn, "sabre")


def test_uninstall_refuses_views_on_the_catalog_unless_cascade(pg_conn, pg_dsn, capsys):
    pg_conn.execute("CREATE VIEW public.my_runs AS SELECT run_id FROM sabre.runs")
    pg_conn.execute("CREATE TABLE public.uses_hierarchy (h text REFERENCES sabre.hierarchies (name))")
    with pytest.raises(installer.InstallError) as exc:
        installer.uninstall(pg_conn, "sabre")
    assert "view public.my_runs" in str(exc.value) and "--cascade" in str(exc.value)
    assert "table constraint uses_hierarchy_h_fkey on public.uses_hierarchy" in str(exc.value)
    assert schema_exists(pg_conn, "sabre")

    assert cli.main(["uninstall", "--dsn", pg_dsn]) == 1
    assert "view public.my_runs" in capsys.readouterr().err
    assert cli.main(["uninstall", "--dsn", pg_dsn, "--cascade"]) == 0
    assert "dropped dependents: " in capsys.readouterr().out
    assert not schema_exists(pg_conn, "sabre")
    assert pg_conn.execute("SELECT to_regclass('public.my_runs')").fetchone()[0] is None
    assert pg_conn.execute("SELECT count(*) FROM public.uses_hierarchy").fetchone()[0] == 0  # table kept


@pytest.fixture
def analyst(pg_conn):
    """A LOGIN role without superuser (roles are cluster-wide: dropped afterwards)."""
    pg_conn.execute("DROP ROLE IF EXISTS sabre_test_analyst")
    pg_conn.execute("CREATE ROLE sabre_test_analyst NOLOGIN")
    pg_conn.execute("ALTER ROLE sabre_test_analyst LOGIN")
    yield "sabre_test_analyst"
    pg_conn.execute("DROP OWNED BY sabre_test_analyst")
    pg_conn.execute("DROP ROLE sabre_test_analyst")


def test_non_superuser_cannot_install(pg_conn, pg_connect, pg_role_dsn, analyst, capsys):
    conn = pg_connect(user=analyst)
    with pytest.raises(installer.PrivilegeError) as exc:
        installer.install(conn, "sabre_denied")
    msg = str(exc.value)
    assert "SUPERUSER" in msg and "plpython3u" in msg and analyst in msg
    assert not schema_exists(pg_conn, "sabre_denied")

    rc = cli.main(["install", "--dsn", pg_role_dsn(analyst), "--schema", "sabre_denied"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "SUPERUSER" in err and "Traceback" not in err
    assert not schema_exists(pg_conn, "sabre_denied")


def test_analyst_with_schema_usage_can_run_functions(pg_conn, pg_connect, analyst):
    pg_conn.execute(f"GRANT USAGE ON SCHEMA sabre TO {analyst}")
    conn = pg_connect(user=analyst)
    assert conn.execute("SELECT sabre.sabre_selftest()").fetchone()[0]["ok"] is True
    assert conn.execute("SELECT sabre.sabre_version()").fetchone()[0] == sabre_pg.__version__


def test_invalid_schema_name_rejected(pg_conn):
    with pytest.raises(installer.InstallError, match="invalid schema name"):
        installer.install(pg_conn, 'bad"name')


def test_check_report(pg_conn):
    report = installer.check(pg_conn, "sabre")
    assert report["tampered"] == []
    assert report["ok"] is True, report
    assert report["server_version"].startswith("15")
    assert report["plpython3u_installed"] and report["superuser"] and report["up_to_date"]
    assert report["installed_version"] == report["package_version"] == sabre_pg.__version__
    assert report["backend_numpy"] and report["backend_python"]
    assert report["selftest"]["emd_li2007"] == pytest.approx(0.375)

    missing = installer.check(pg_conn, "not_installed")
    assert missing["ok"] is False and missing["installed_version"] is None and missing["selftest"] is None


def test_cli_check_and_install(pg_dsn, capsys):
    assert cli.main(["install", "--dsn", pg_dsn, "--schema", "sabre_cli"]) == 0
    assert "installed in schema sabre_cli" in capsys.readouterr().out
    assert cli.main(["check", "--dsn", pg_dsn, "--schema", "sabre_cli"]) == 0
    out = capsys.readouterr().out
    assert "selftest" in out and "True" in out
    assert cli.main(["uninstall", "--dsn", pg_dsn, "--schema", "sabre_cli"]) == 0


def test_cli_database_error_has_sqlstate(pg_dsn, capsys):
    rc = cli.main(["check", "--dsn", pg_dsn + " dbname=no_such_database_here"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "no_such_database_here" in err and "Traceback" not in err


def test_embedded_cluster_settings(pg_conn):
    """The tests run on the project's own embedded cluster (through its cluster manager): it
    listens on 127.0.0.1 only and uses the minimal WAL level with no WAL senders."""
    from sabre_pg.cluster import SERVER_SETTINGS
    assert SERVER_SETTINGS["wal_level"] == "minimal"
    got = dict(pg_conn.execute(
        "SELECT name, setting FROM pg_settings WHERE name IN "
        "('wal_level', 'max_wal_senders', 'listen_addresses', 'shared_buffers')").fetchall())
    assert got["wal_level"] == "minimal" and got["max_wal_senders"] == "0"
    assert got["listen_addresses"] == "127.0.0.1"
