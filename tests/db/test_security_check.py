"""Issue 25, finding 8: ``sabre-pg check`` compares the whole sabre schema's catalog state
with a reference install, reports every difference by name and then does not run the
self-test. Finding 9's capturable search_path, and event triggers running a non-superuser's
code, are reported as warnings.

Every plant here differs from the issue's own (a rule on ``sabre.runs``, an operator
``sabre.=``, a dropped CHECK, a changed default, ``DISABLE TRIGGER ALL``), and each is one
that ``check`` of 0.2.0 (1b03906) did not report: it ran the self-test after each.
"""
from __future__ import annotations

import pytest

from sabre_pg import cli, installer

ROLE = "sabre_sec_check_analyst"
NOT_RUN = "not run: the installation departs from the package (see tampered)"


@pytest.fixture
def analyst(pg_conn):
    """A plain LOGIN role with the README's analyst rights."""
    pg_conn.execute(f"DROP ROLE IF EXISTS {ROLE}")
    pg_conn.execute(f"CREATE ROLE {ROLE} LOGIN")
    pg_conn.execute(f"GRANT USAGE ON SCHEMA sabre TO {ROLE}")
    yield ROLE
    pg_conn.execute(f"DROP OWNED BY {ROLE} CASCADE")
    pg_conn.execute(f"DROP ROLE {ROLE}")


def tampered_after(conn, *statements: str) -> set[str]:
    """Run ``statements`` as the DBA, then check: it must find something, skip the self-test
    and fail. Returns what it found."""
    for statement in statements:
        conn.execute(statement)
    report = installer.check(conn, "sabre")
    assert report["tampered"], "check found nothing"
    assert report["selftest"] is None and report["selftest_error"] == NOT_RUN
    assert report["ok"] is False
    return set(report["tampered"])


def one(conn, query: str) -> tuple:
    row = conn.execute(query).fetchone()
    assert row is not None, query
    return row


# ---------------------------------------------------------------------------------------
# a clean install and an upgrade are no departure
# ---------------------------------------------------------------------------------------
def test_clean_install_and_upgrade_report_nothing(pg_conn):
    installer.install(pg_conn, "sabre_fresh")
    for _ in range(2):  # the install, then the same install again (an upgrade)
        for schema in ("sabre", "sabre_fresh"):
            report = installer.check(pg_conn, schema)
            assert report["tampered"] == [] and report["warnings"] == [], report
            assert report["ok"] is True and report["selftest"]["ok"] is True
        installer.upgrade(pg_conn, "sabre_fresh")
        installer.upgrade(pg_conn, "sabre")
    assert pg_conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'sabre_check_%'").fetchone()[0] == 0


# ---------------------------------------------------------------------------------------
# the kinds of tampering, with other plants
# ---------------------------------------------------------------------------------------
def test_a_rule_copying_stream_state_out(pg_conn, pg_dsn, capsys):
    found = tampered_after(
        pg_conn,
        "CREATE TABLE public.loot (LIKE sabre.streams)",
        "GRANT SELECT ON public.loot TO PUBLIC",
        "CREATE RULE keep_a_copy AS ON INSERT TO sabre.streams DO ALSO INSERT INTO public.loot SELECT NEW.*")
    assert found == {"rule streams.keep_a_copy is not part of sabre-pg"}
    assert cli.main(["check", "--dsn", pg_dsn]) == 1
    out = capsys.readouterr().out
    assert "rule streams.keep_a_copy is not part of sabre-pg" in out and NOT_RUN in out


def test_a_rule_rewriting_hierarchy_updates(pg_conn):
    found = tampered_after(pg_conn, "CREATE RULE no_updates AS ON UPDATE TO sabre.hierarchies DO INSTEAD NOTHING")
    assert found == {"rule hierarchies.no_updates is not part of sabre-pg"}


def test_an_operator_in_the_schema(pg_conn):
    found = tampered_after(
        pg_conn, "CREATE OPERATOR sabre.< (LEFTARG = text, RIGHTARG = text, FUNCTION = pg_catalog.text_gt)")
    assert found == {"operator <(text,text) is not part of sabre-pg"}


def test_a_dropped_not_null(pg_conn):
    found = tampered_after(pg_conn, "ALTER TABLE sabre.runs ALTER COLUMN run_by DROP NOT NULL")
    assert found == {"column runs.run_by: not_null differs from the package's"}


def test_a_dropped_foreign_key(pg_conn):
    table, name = one(pg_conn, "SELECT conrelid::regclass::text, conname FROM pg_constraint "
                               "WHERE connamespace = 'sabre'::regnamespace AND contype = 'f' ORDER BY 1, 2 LIMIT 1")
    found = tampered_after(pg_conn, f"ALTER TABLE {table} DROP CONSTRAINT {name}")
    assert found == {f"constraint {table.split('.')[-1]}.{name} is missing"}


def test_a_dropped_unique_constraint(pg_conn):
    table, name = one(pg_conn, "SELECT conrelid::regclass::text, conname FROM pg_constraint "
                               "WHERE connamespace = 'sabre'::regnamespace AND contype = 'u' ORDER BY 1, 2 LIMIT 1")
    found = tampered_after(pg_conn, f"ALTER TABLE {table} DROP CONSTRAINT {name}")
    relname = table.split(".")[-1]
    # the constraint, and the index that enforced it
    assert found == {f"constraint {relname}.{name} is missing", f"index {name} is missing"}


def test_a_changed_default(pg_conn):
    found = tampered_after(pg_conn, "ALTER TABLE sabre.hierarchies ALTER COLUMN owner SET DEFAULT 'postgres'")
    assert found == {"column hierarchies.owner: default differs from the package's"}


def fk_trigger(conn) -> tuple[str, str, str]:
    """(table, name, constraint as check names it) of an internal trigger of one of sabre's
    foreign keys: sabre's tables have no other triggers."""
    return one(conn, "SELECT t.tgrelid::regclass::text, t.tgname, c.relname || '.' || k.conname "
                     "FROM pg_trigger t JOIN pg_constraint k ON k.oid = t.tgconstraint "
                     "JOIN pg_class c ON c.oid = k.conrelid "
                     "WHERE k.connamespace = 'sabre'::regnamespace AND k.contype = 'f' ORDER BY 3, 2 LIMIT 1")


def test_one_disabled_trigger(pg_conn):
    table, trigger, constraint = fk_trigger(pg_conn)
    found = tampered_after(pg_conn, f'ALTER TABLE {table} DISABLE TRIGGER "{trigger}"')
    assert found == {f"constraint {constraint}: internal_triggers differs from the package's"}


def test_a_trigger_enabled_only_for_replicas(pg_conn):
    table, trigger, constraint = fk_trigger(pg_conn)
    found = tampered_after(pg_conn, f'ALTER TABLE {table} ENABLE REPLICA TRIGGER "{trigger}"')
    assert found == {f"constraint {constraint}: internal_triggers differs from the package's"}


def test_a_planted_user_trigger(pg_conn):
    found = tampered_after(
        pg_conn,
        "CREATE FUNCTION public.touch() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$",
        "CREATE TRIGGER touch BEFORE INSERT ON sabre.hierarchy_rows FOR EACH ROW EXECUTE FUNCTION public.touch()")
    assert found == {"trigger hierarchy_rows.touch is not part of sabre-pg"}


# ---------------------------------------------------------------------------------------
# privileges, functions, ownership, casts and other objects
# ---------------------------------------------------------------------------------------
def test_default_privileges_in_the_schema(pg_conn):
    found = tampered_after(pg_conn, "ALTER DEFAULT PRIVILEGES IN SCHEMA sabre GRANT SELECT ON TABLES TO PUBLIC")
    assert found == {"schema: default_privileges differs from the package's"}


def test_changed_function_flags(pg_conn):
    found = tampered_after(pg_conn, "ALTER FUNCTION sabre.sabre_version() LEAKPROOF PARALLEL SAFE COST 1")
    assert found == {"function sabre_version(): leakproof differs from the package's",
                     "function sabre_version(): parallel differs from the package's",
                     "function sabre_version(): cost differs from the package's"}


def test_a_changed_argument_default(pg_conn):
    definition = one(pg_conn, "SELECT pg_get_functiondef('sabre.sabre_define_hierarchy(text, text, text)'"
                              "::regprocedure)")[0]
    assert "DEFAULT ';'::text" in definition
    found = tampered_after(pg_conn, definition.replace("DEFAULT ';'::text", "DEFAULT ','::text", 1))
    assert found == {"function sabre_define_hierarchy(text,text,text): arguments differs from the package's"}


def test_an_object_given_to_another_role(pg_conn, analyst):
    found = tampered_after(pg_conn, 'CREATE COLLATION sabre.planted_c FROM "C"',
                           f"ALTER COLLATION sabre.planted_c OWNER TO {analyst}")
    assert found == {"collation planted_c is not owned by the schema owner",
                     "collation planted_c is not part of sabre-pg"}


def test_a_cast_on_a_schema_type(pg_conn):
    found = tampered_after(pg_conn, "CREATE CAST (sabre.hierarchies AS text) WITH INOUT AS IMPLICIT")
    assert found == {"cast (sabre.hierarchies AS text) is not part of sabre-pg"}


def test_extra_objects_of_other_kinds(pg_conn):
    found = tampered_after(
        pg_conn,
        "CREATE STATISTICS sabre.planted_stats ON name, owner FROM sabre.hierarchies",
        "CREATE TEXT SEARCH CONFIGURATION sabre.planted_ts (COPY = pg_catalog.simple)",
        "CREATE OPERATOR CLASS sabre.planted_ops FOR TYPE text USING hash AS OPERATOR 1 pg_catalog.=, "
        "FUNCTION 1 pg_catalog.hashtext(text)")
    assert found == {"statistics object planted_stats is not part of sabre-pg",
                     "text search configuration planted_ts is not part of sabre-pg",
                     "operator class planted_ops USING hash is not part of sabre-pg",
                     "operator family planted_ops USING hash is not part of sabre-pg"}


def test_a_comment_on_a_column(pg_conn):
    found = tampered_after(pg_conn, "COMMENT ON COLUMN sabre.runs.run_id IS 'see public.loot'")
    assert found == {"column runs.run_id: comment differs from the package's"}


# ---------------------------------------------------------------------------------------
# warnings: capturable search_path (finding 9), event triggers running others' code
# ---------------------------------------------------------------------------------------
def test_search_path_with_a_writable_schema_anywhere_is_a_warning(pg_conn, analyst):
    pg_conn.execute("CREATE SCHEMA open_ns")
    pg_conn.execute("GRANT CREATE ON SCHEMA open_ns TO PUBLIC")
    pg_conn.execute(f"ALTER ROLE {analyst} SET search_path = open_ns, sabre")
    report = installer.check(pg_conn, "sabre")
    assert report["tampered"] == [] and report["ok"] is True  # a warning, not a failure
    assert len(report["warnings"]) == 1
    warning = report["warnings"][0]
    assert f"search_path of role {analyst} lists schema open_ns with sabre" in warning
    assert "PUBLIC may create in open_ns" in warning and "HINT:" in warning
    # after sabre it still captures a better-matching overload: still a warning
    pg_conn.execute(f"ALTER ROLE {analyst} SET search_path = sabre, open_ns")
    assert len(installer.check(pg_conn, "sabre")["warnings"]) == 1
    # the recommended path: the role's own schema and sabre
    pg_conn.execute(f"CREATE SCHEMA {analyst} AUTHORIZATION {analyst}")
    pg_conn.execute(f"ALTER ROLE {analyst} SET search_path = \"$user\", sabre")
    assert installer.check(pg_conn, "sabre")["warnings"] == []
    pg_conn.execute(f"DROP SCHEMA {analyst}")


def test_database_search_path_with_public_open_to_all_is_a_warning(pg_conn):
    """The issue's finding 9 as databases made before PostgreSQL 15 have it: PUBLIC may create
    in public, and the database's search_path (the README's) is public, sabre."""
    pg_conn.execute("GRANT CREATE ON SCHEMA public TO PUBLIC")
    report = installer.check(pg_conn, "sabre")
    assert report["tampered"] == [] and report["ok"] is True
    assert [w.split(":")[0] for w in report["warnings"]] == [
        f"search_path of every role in database {pg_conn.info.dbname} lists schema public with sabre, "
        "and PUBLIC may create in public"]


def test_event_trigger_running_a_non_superusers_function(pg_conn, analyst):
    """Warned about, and check's reference install does not fire it."""
    pg_conn.execute("CREATE SEQUENCE public.fired")
    pg_conn.execute("GRANT USAGE ON SEQUENCE public.fired TO PUBLIC")
    pg_conn.execute("CREATE FUNCTION public.on_ddl() RETURNS event_trigger LANGUAGE plpgsql AS "
                    "$$ BEGIN PERFORM pg_catalog.nextval('public.fired'); END $$")
    pg_conn.execute(f"ALTER FUNCTION public.on_ddl() OWNER TO {analyst}")
    pg_conn.execute("CREATE EVENT TRIGGER on_ddl ON ddl_command_start EXECUTE FUNCTION public.on_ddl()")
    report = installer.check(pg_conn, "sabre")
    assert report["tampered"] == [] and report["ok"] is True
    dba = pg_conn.execute("SELECT current_user").fetchone()[0]
    assert any(w.startswith(f"event trigger on_ddl (owner '{dba}') runs public.on_ddl() (owner '{analyst}'): "
                            "the function's owner is not a superuser")
               for w in report["warnings"]), report["warnings"]
    assert pg_conn.execute("SELECT is_called FROM public.fired").fetchone()[0] is False
    pg_conn.execute("DROP EVENT TRIGGER on_ddl")
