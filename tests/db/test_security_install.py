"""Issue 13, installer and embedded cluster: the installer adopts nothing it does not own,
``check`` reports tampering, the embedded cluster authenticates every connection."""
from __future__ import annotations

import os
import time
import stat

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from sabre_pg import cli, installer
from sabre_pg.cluster import hba_allows_trust

ROLE = "sabre_sec_install_analyst"


@pytest.fixture
def analyst(pg_conn, pg_connect):
    """A plain LOGIN role that may create schemas in the test database (as the issue's
    analysts may somewhere); its connection."""
    pg_conn.execute(f"DROP ROLE IF EXISTS {ROLE}")
    pg_conn.execute(f"CREATE ROLE {ROLE} LOGIN")
    pg_conn.execute(f"GRANT CREATE ON DATABASE {pg_conn.info.dbname} TO {ROLE}")
    yield pg_connect(user=ROLE)
    pg_conn.execute(f"DROP OWNED BY {ROLE} CASCADE")
    pg_conn.execute(f"DROP ROLE {ROLE}")


def tables_in(conn, schema) -> list[str]:
    return [r[0] for r in conn.execute(
        "SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s ORDER BY 1", (schema,))]


# ---------------------------------------------------------------------------------------
# install refuses what it does not own
# ---------------------------------------------------------------------------------------
def test_install_refuses_a_schema_an_analyst_created(pg_conn, analyst):
    analyst.execute("CREATE SCHEMA planted")
    analyst.execute("CREATE TABLE planted.modules (name text PRIMARY KEY, source text, is_package bool)")
    with pytest.raises(installer.InstallError) as exc:
        installer.install(pg_conn, "planted")
    assert f"owned by role {ROLE!r}" in str(exc.value)
    assert tables_in(pg_conn, "planted") == ["modules", "modules_pkey"]  # nothing added or adopted
    assert pg_conn.execute("SELECT count(*) FROM planted.modules").fetchone()[0] == 0


def test_install_refuses_a_schema_others_may_create_in(pg_conn, analyst):
    pg_conn.execute(f"GRANT CREATE ON SCHEMA sabre TO {ROLE}")
    with pytest.raises(installer.InstallError, match=f"grants CREATE to {ROLE}"):
        installer.upgrade(pg_conn, "sabre")
    pg_conn.execute("CREATE SCHEMA open_schema")
    pg_conn.execute("GRANT CREATE ON SCHEMA open_schema TO PUBLIC")
    with pytest.raises(installer.InstallError, match="grants CREATE to PUBLIC"):
        installer.install(pg_conn, "open_schema")
    assert tables_in(pg_conn, "open_schema") == []


@pytest.mark.parametrize("plant, what", [
    ("CREATE TABLE sabre.extra (x int)", "table sabre.extra"),
    ("CREATE SEQUENCE sabre.extra_seq", "sequence sabre.extra_seq"),
    ("CREATE VIEW sabre.outputs2 AS SELECT 1 AS x", "view sabre.outputs2"),
    ("CREATE FUNCTION sabre.helper() RETURNS int LANGUAGE sql AS 'SELECT 1'", "function sabre.helper()"),
    ("CREATE TYPE sabre.mood AS ENUM ('a')", "type sabre.mood"),
])
def test_upgrade_refuses_objects_of_another_owner(pg_conn, analyst, plant, what):
    pg_conn.execute(plant)
    kind, name = what.split(" ", 1)
    pg_conn.execute(f"ALTER {kind} {name} OWNER TO {ROLE}")
    before = pg_conn.execute("SELECT value FROM sabre.meta WHERE key = 'build_id'").fetchone()[0]
    with pytest.raises(installer.InstallError) as exc:
        installer.upgrade(pg_conn, "sabre")
    assert f"{what} (owner {ROLE})" in str(exc.value)
    assert pg_conn.execute("SELECT value FROM sabre.meta WHERE key = 'build_id'").fetchone()[0] == before


def test_upgrade_refuses_a_catalog_table_given_away(pg_conn, analyst):
    pg_conn.execute(f"ALTER TABLE sabre.modules OWNER TO {ROLE}")
    with pytest.raises(installer.InstallError, match=f"table sabre.modules \\(owner {ROLE}\\)"):
        installer.upgrade(pg_conn, "sabre")


def test_upgrade_of_an_intact_install_still_works(pg_conn):
    installer.upgrade(pg_conn, "sabre")
    installer.upgrade(pg_conn, "sabre")
    assert installer.check(pg_conn, "sabre")["tampered"] == []


# ---------------------------------------------------------------------------------------
# check reports tampering
# ---------------------------------------------------------------------------------------
def new_findings(conn, tamper) -> set[str]:
    """What ``check`` reports after ``tamper(conn)`` and did not before."""
    before = set(installer.tampering(conn, "sabre"))
    tamper(conn)
    return set(installer.tampering(conn, "sabre")) - before


def test_check_reports_a_replaced_module(pg_conn):
    found = new_findings(pg_conn, lambda c: c.execute(
        "UPDATE sabre.modules SET source = source || E'\\nimport os' WHERE name = 'sabre_pg.core.emd'"))
    assert found == {"module sabre_pg.core.emd: source differs from the package's"}


def test_check_reports_extra_and_missing_module_rows(pg_conn):
    def tamper(c):
        c.execute("INSERT INTO sabre.modules VALUES ('sabre_plpy.evil', 'x = 1', false)")
        c.execute("DELETE FROM sabre.modules WHERE name = 'sabre_plpy._installed'")
        c.execute("UPDATE sabre.modules SET is_package = NOT is_package WHERE name = 'sabre_pg.core'")
    found = new_findings(pg_conn, tamper)
    assert {f for f in found if f.startswith("module")} == {
        "module sabre_plpy.evil is not shipped by sabre-pg " + installer.sabre_pg.__version__,
        "module sabre_plpy._installed is missing",
        "module sabre_pg.core: is_package differs from the package's",
    }


def test_check_reports_meta_changes(pg_conn):
    found = new_findings(pg_conn, lambda c: c.execute(
        "UPDATE sabre.meta SET value = 'forged' WHERE key = 'source_hash'"))
    assert len(found) == 1 and next(iter(found)).startswith("meta: source_hash 'forged' is not this package's")


def test_check_reports_a_changed_owner(pg_conn, analyst):
    found = new_findings(pg_conn, lambda c: c.execute(f"ALTER TABLE sabre.hierarchies OWNER TO {ROLE}"))
    assert "relation hierarchies is not owned by the schema owner" in found
    found = new_findings(pg_conn, lambda c: c.execute(f"ALTER SCHEMA sabre OWNER TO {ROLE}"))
    assert any(f.startswith(f"schema sabre is owned by {ROLE!r}, which is not a superuser") for f in found)


def test_check_reports_an_added_grant(pg_conn, analyst):
    found = new_findings(pg_conn, lambda c: c.execute(f"GRANT UPDATE ON sabre.modules TO {ROLE}"))
    assert found == {f"relation modules: privileges the SQL does not grant: {ROLE}=UPDATE"}
    found = new_findings(pg_conn, lambda c: c.execute(f"GRANT CREATE ON SCHEMA sabre TO {ROLE}"))
    assert found == {f"schema: privileges the SQL does not grant: {ROLE}=CREATE"}
    # what the README tells the DBA to grant is not tampering
    assert new_findings(pg_conn, lambda c: c.execute(f"GRANT USAGE ON SCHEMA sabre TO {ROLE}")) == set()
    assert new_findings(pg_conn, lambda c: c.execute(
        f"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA sabre TO {ROLE}")) == set()
    assert new_findings(pg_conn, lambda c: c.execute(
        f"GRANT INSERT, UPDATE, DELETE ON sabre.hierarchies, sabre.hierarchy_rows TO {ROLE}")) == set()
    found = new_findings(pg_conn, lambda c: c.execute(f"GRANT DELETE ON sabre.runs TO {ROLE}"))
    assert found == {f"relation runs: privileges the SQL does not grant: {ROLE}=DELETE"}


def test_check_reports_a_revoked_grant(pg_conn):
    found = new_findings(pg_conn, lambda c: c.execute("REVOKE SELECT ON sabre.meta FROM PUBLIC"))
    assert found == {"relation meta: privileges the SQL grants are missing: PUBLIC=SELECT"}


def test_check_reports_a_function_without_its_search_path(pg_conn):
    found = new_findings(pg_conn, lambda c: c.execute("ALTER FUNCTION sabre.sabre_selftest() RESET ALL"))
    assert found == {"function sabre_selftest() does not pin search_path = pg_catalog, pg_temp",
                     "function sabre_selftest(): config differs from the package's"}


def test_check_reports_a_replaced_body_and_security_definer(pg_conn):
    def tamper(c):
        c.execute("CREATE OR REPLACE FUNCTION sabre.sabre_version() RETURNS text LANGUAGE sql "
                  "SET search_path = pg_catalog, pg_temp AS $$ SELECT 'forged' $$")
        c.execute("ALTER FUNCTION sabre.sabre_selftest() SECURITY DEFINER")
    found = new_findings(pg_conn, tamper)
    assert "function sabre_version(): source differs from the package's" in found
    assert "function sabre_selftest(): security_definer differs from the package's" in found


def test_check_reports_planted_objects_and_disabled_row_security(pg_conn):
    def tamper(c):
        c.execute("CREATE FUNCTION sabre.planted() RETURNS int LANGUAGE sql AS 'SELECT 1'")
        c.execute("ALTER TABLE sabre.runs DISABLE ROW LEVEL SECURITY")
    found = new_findings(pg_conn, tamper)
    assert "function planted() is not part of sabre-pg" in found
    assert "relation runs: row_security differs from the package's" in found


def test_check_does_not_run_tampered_code(pg_conn, pg_dsn, capsys):
    """The self-test runs the installed modules: after tampering, check must not run them."""
    pg_conn.execute(
        "UPDATE sabre.modules SET source = source || E'\\nplpy.execute(\"CREATE TABLE public.pwned ()\")' "
        "WHERE name = 'sabre_pg.core.emd'")
    report = installer.check(pg_conn, "sabre")
    assert report["ok"] is False and report["selftest"] is None
    assert "not run" in report["selftest_error"]
    assert pg_conn.execute("SELECT to_regclass('public.pwned')").fetchone()[0] is None
    assert cli.main(["check", "--dsn", pg_dsn]) == 1
    assert "module sabre_pg.core.emd: source differs from the package's" in capsys.readouterr().out


def test_check_by_a_non_superuser_says_what_it_could_not_verify(pg_conn, analyst):
    pg_conn.execute(f"GRANT USAGE ON SCHEMA sabre TO {ROLE}")
    found = installer.tampering(analyst, "sabre")
    assert any(f.startswith("ownership and privileges not verified") for f in found)


def test_check_leaves_no_reference_schema_behind(pg_conn, pg_connect):
    conn = pg_connect(autocommit=False)
    conn.execute("SET search_path = public")
    conn.commit()
    installer.check(conn, "sabre")
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert conn.execute("SHOW search_path").fetchone()[0] == "public"
    assert pg_conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'sabre_check_%'").fetchone()[0] == 0


# ---------------------------------------------------------------------------------------
# the embedded cluster authenticates
# ---------------------------------------------------------------------------------------
def _tcp(cluster, **kw):
    return make_conninfo(host="127.0.0.1", port=cluster.port, user=cluster.superuser, dbname="postgres",
                         connect_timeout=10, **kw)


def test_embedded_cluster_tcp_needs_the_password(sabre_cluster, monkeypatch, tmp_path):
    monkeypatch.delenv("PGPASSWORD", raising=False)
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(_tcp(sabre_cluster, passfile=str(tmp_path / "none"))).close()
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(_tcp(sabre_cluster, password="guess", passfile=str(tmp_path / "none"))).close()
    with psycopg.connect(sabre_cluster.dsn("postgres", tcp=True)) as conn:
        assert conn.execute("SELECT current_user, inet_server_addr()::text").fetchone() == (
            sabre_cluster.superuser, "127.0.0.1/32")


def test_embedded_cluster_files(sabre_cluster):
    hba = (sabre_cluster.pgdata / "pg_hba.conf").read_text()
    assert "trust" not in hba and not hba_allows_trust(hba)
    st = sabre_cluster.passfile.stat()
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()
    for private in (sabre_cluster.root, sabre_cluster.socket_dir):
        assert stat.S_IMODE(private.stat().st_mode) == 0o700
    assert f"passfile={sabre_cluster.passfile}" in sabre_cluster.dsn()


def test_embedded_cluster_socket_authenticates_other_roles(pg_conn, sabre_cluster, analyst, tmp_path,
                                                           monkeypatch):
    """Over the socket only the superuser is let in by peer (from the invoking OS user);
    any other role needs its password."""
    monkeypatch.delenv("PGPASSWORD", raising=False)
    dsn = make_conninfo(host=str(sabre_cluster.socket_dir), port=sabre_cluster.port, user=ROLE,
                        dbname=pg_conn.info.dbname, passfile=str(tmp_path / "none"))
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(dsn).close()


def test_cluster_of_an_older_version_is_secured_on_start(unstarted_cluster):
    old_cluster = unstarted_cluster
    """A cluster made with trust (and no password file) by an older version gets
    authentication on its next start: pg_hba.conf rewritten, a password set."""
    old_cluster.init()
    old_cluster.root.chmod(0o755)
    (old_cluster.pgdata / "pg_hba.conf").write_text(
        "local all all trust\nhost all all 127.0.0.1/32 trust\n")
    old_cluster.passfile.unlink()
    old_cluster.start(ensure_database=False)
    assert not hba_allows_trust((old_cluster.pgdata / "pg_hba.conf").read_text())
    assert stat.S_IMODE(old_cluster.passfile.stat().st_mode) == 0o600
    assert stat.S_IMODE(old_cluster.root.stat().st_mode) == 0o700
    with psycopg.connect(old_cluster.dsn("postgres", tcp=True)) as conn:
        assert conn.execute("SELECT current_user").fetchone()[0] == old_cluster.superuser
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(_tcp(old_cluster, password="guess")).close()


# ---------------------------------------------------------------------------------------
# purge drops only relations that still carry their run's identity
# ---------------------------------------------------------------------------------------
def test_purge_drops_only_outputs_that_still_carry_their_run_identity(pg_conn, pg_dsn, capsys):
    pg_conn.execute("CREATE TABLE public.census (id int PRIMARY KEY, age int, sex text, salary int)")
    pg_conn.execute("INSERT INTO public.census SELECT g, 18 + (g * 7919) % 60, "
                    "CASE WHEN g % 2 = 0 THEN 'F' ELSE 'M' END, (g * 104729) % 23 FROM generate_series(1, 600) g")
    for output in ("public.first", "public.second"):
        pg_conn.execute("SELECT * FROM sabre_anonymize('public.census', ARRAY['age','sex'], 'salary', 0.4, 4, "
                        "output => %s)", (output,)).fetchall()
    pg_conn.execute("COMMENT ON TABLE public.second IS 'adopted by its owner'")  # no longer the run's
    pg_conn.execute("DROP TABLE public.first_keys")
    pg_conn.execute("CREATE TABLE public.first_keys (precious int)")  # took a recorded name
    assert cli.main(["uninstall", "--dsn", pg_dsn, "--purge"]) == 0
    assert "dropped outputs: public.first, public.first_classes, public.second_classes, public.second_keys" \
        in capsys.readouterr().out
    left = [r[0] for r in pg_conn.execute(
        "SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace AND relkind = 'r' ORDER BY 1")]
    assert left == ["census", "first_keys", "second"]


def test_check_where_the_reference_cannot_be_built_says_so(pg_connect):
    conn = pg_connect(options="-c default_transaction_read_only=on")  # as on a standby
    found = installer.tampering(conn, "sabre")
    assert any(f.startswith("ownership and privileges not verified: the reference install failed: 25006")
               for f in found), found


def _eventually(accepts_without_password: bool, cluster, passfile) -> bool:
    """Whether a TCP connection without a password comes to be accepted (or refused), as
    wanted, within a bounded number of tries: a reload reaches the server asynchronously."""
    for _ in range(100):
        try:
            psycopg.connect(_tcp(cluster, passfile=passfile)).close()
            accepted = True
        except psycopg.OperationalError:
            accepted = False
        if accepted == accepts_without_password:
            return True
        time.sleep(0.05)
    return False


def test_running_cluster_with_trust_is_secured_by_start(unstarted_cluster, tmp_path, monkeypatch):
    monkeypatch.delenv("PGPASSWORD", raising=False)
    cluster = unstarted_cluster.start(ensure_database=False)
    none = str(tmp_path / "none")
    (cluster.pgdata / "pg_hba.conf").write_text("local all all trust\nhost all all 127.0.0.1/32 trust\n")
    cluster._run("pg_ctl", "reload", "-D", str(cluster.pgdata))
    assert _eventually(True, cluster, none)          # an older version's cluster, running
    cluster.start(ensure_database=False)              # rewrites pg_hba.conf and reloads
    assert _eventually(False, cluster, none)
    with psycopg.connect(cluster.dsn("postgres", tcp=True)) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
