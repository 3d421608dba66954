"""Issue 25, findings 2 and 6: refresh and schedule act only on the caller's own runs, and no
lock a role without rights on an output can hold blocks a run.

Roles as in tests/db/test_security.py (the DBA is the superuser connection; ``sec_alice`` and
``sec_bob`` are analysts; ``sec_owner`` owns data) plus ``sec_nobody``, a LOGIN role with no
sabre rights at all.  The plants record who ran them in sequences (``nextval``/``setval`` are
not rolled back, so a call that ran and then failed still leaves its trace) and try a write
only a superuser may make (``COPY ... TO`` a server file).
"""
from __future__ import annotations

import os
import tempfile
import time
import uuid

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from tests.db.helpers import scalar
from tests.db.test_security import roles  # noqa: F401  (the fixture)

OLD_LOCK_CLASS = 0x5AB2E      # the advisory lock key class of sabre 0.2.0 (publish.LOCK_CLASS)


def _plant_source(conn, schema, rows=1200):
    """``schema``.data and the view ``schema``.src over it, whose filter calls the schema
    owner's ``schema``.spy(): it counts its calls in ``schema``.calls, stores the oid of the
    role it ran as in ``schema``.ran_as, and tries a superuser-only write to ``target``."""
    conn.execute(f"CREATE TABLE {schema}.data (id int PRIMARY KEY, age int, zip int, income int)")
    conn.execute(f"INSERT INTO {schema}.data SELECT g, 20 + (g * 13) % 45, (g * 7) % 31, (g * 104729) % 17 "
                 f"FROM generate_series(1, {rows}) g")
    conn.execute(f"CREATE SEQUENCE {schema}.calls")
    conn.execute(f"CREATE SEQUENCE {schema}.ran_as MINVALUE 0")
    conn.execute(f"GRANT USAGE ON SEQUENCE {schema}.calls, {schema}.ran_as TO PUBLIC")
    conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO PUBLIC")
    conn.execute(f"""CREATE FUNCTION {schema}.spy(target text) RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
        BEGIN
            PERFORM pg_catalog.nextval('{schema}.calls');
            PERFORM pg_catalog.setval('{schema}.ran_as', (SELECT oid FROM pg_catalog.pg_roles
                                                          WHERE rolname = current_user)::bigint);
            BEGIN
                EXECUTE pg_catalog.format('COPY (SELECT current_user) TO %L', target);
            EXCEPTION WHEN insufficient_privilege THEN NULL;
            END;
            RETURN true;
        END $$""")
    target = os.path.join(tempfile.gettempdir(), "sabre-test-%s-%s" % (schema, uuid.uuid4().hex))
    conn.execute(f"CREATE VIEW {schema}.src AS SELECT * FROM {schema}.data WHERE {schema}.spy('{target}')")
    return target


def _calls(conn, schema):
    """(times spy ran, the role it last ran as or None)."""
    n, called = conn.execute(f"SELECT last_value, is_called FROM {schema}.calls").fetchone()
    who = conn.execute(f"SELECT r.rolname FROM {schema}.ran_as s LEFT JOIN pg_roles r ON r.oid = s.last_value::oid "
                       f"WHERE s.is_called").fetchone()
    return (n if called else 0), (who[0] if who else None)


def _expect(conn, call, sqlstate, *words):
    with pytest.raises(psycopg.Error) as e:
        conn.execute(call)
    assert e.value.sqlstate == sqlstate, (e.value.sqlstate, str(e.value))
    for w in words:
        assert w in str(e.value) + " " + (e.value.diag.message_hint or ""), (w, str(e.value), e.value.diag.message_hint)
    return e.value


# ------------------------------------------------------------------ finding 2: refresh
def test_superuser_refresh_of_an_analysts_output_runs_nothing_of_it(roles):
    dba, alice = roles["dba"], roles["sec_alice"]
    target = _plant_source(alice, "alice")
    alice.execute("SELECT * FROM sabre_anonymize('alice.src', ARRAY['age','zip'], 'income', 0.4, 4, "
                  "output => 'alice.out', options => '{\"key\": \"id\"}')").fetchall()
    calls, who = _calls(dba, "alice")
    assert calls > 0 and who == "sec_alice"          # the analyst's own run ran her function as her
    for call in ("SELECT * FROM sabre_refresh('alice.out')",
                 "SELECT * FROM sabre.sabre_refresh('\"alice\".\"out\"')",
                 "SELECT sabre_schedule_refresh('alice.out'::regclass, '*/5 * * * *')"):
        e = _expect(dba, call, "42501", "sec_alice", "SET ROLE")
        assert "own runs" in str(e)
    assert _calls(dba, "alice") == (calls, "sec_alice")   # spy never ran (as the DBA or anyone)
    assert not os.path.exists(target)
    assert scalar(dba, "SELECT count(*) FROM sabre.runs") == 1
    # a member of the analyst's role sees her runs, and is refused the same way
    dba.execute("GRANT sec_alice TO sec_bob")
    _expect(roles["sec_bob"], "SELECT * FROM sabre_refresh('alice.out')", "42501", "SET ROLE")
    # the analyst refreshes her own output: her function runs as her, the new rows are in
    alice.execute("INSERT INTO alice.data SELECT g, 30, g % 31, g % 17 FROM generate_series(1201, 1300) g")
    assert alice.execute("SELECT rows FROM sabre_refresh('alice.out')").fetchone()[0] == 1300
    assert _calls(dba, "alice")[1] == "sec_alice"
    # what the HINT says works: the DBA as the run's owner
    dba.execute("SET ROLE sec_alice")
    try:
        assert dba.execute("SELECT rows FROM sabre_refresh('alice.out')").fetchone()[0] == 1300
    finally:
        dba.execute("RESET ROLE")
    assert _calls(dba, "alice")[1] == "sec_alice"
    assert not os.path.exists(target)
    assert {r for (r,) in dba.execute("SELECT DISTINCT run_by FROM sabre.runs")} == {"sec_alice"}


def test_refresh_rechecks_that_the_owner_can_still_read_the_source(roles):
    """A data owner's view (an IMMUTABLE function in its filter, which counts its calls) read
    by an analyst who has since lost SELECT on it: the refresh fails with sabre's own 42501
    before any query reaches the view; a dropped source gets 42P01."""
    dba, alice, owner = roles["dba"], roles["sec_alice"], roles["sec_owner"]
    owner.execute("CREATE SEQUENCE owner_data.planned")
    owner.execute("GRANT USAGE ON SEQUENCE owner_data.planned TO PUBLIC")
    owner.execute("CREATE FUNCTION owner_data.stamp(n int) RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS "
                  "$$ BEGIN PERFORM pg_catalog.nextval('owner_data.planned'); RETURN n > 0; END $$")
    owner.execute("CREATE VIEW owner_data.shared AS SELECT * FROM owner_data.patients WHERE owner_data.stamp(1)")
    owner.execute("GRANT USAGE ON SCHEMA owner_data TO sec_alice")
    owner.execute("GRANT SELECT ON owner_data.shared TO sec_alice")
    alice.execute("SELECT * FROM sabre_anonymize('owner_data.shared', ARRAY['age','zip'], 'salary', 0.4, 4, "
                  "output => 'alice.shared_out', options => '{\"key\": \"id\"}')").fetchall()
    planned = scalar(dba, "SELECT last_value FROM owner_data.planned")
    owner.execute("REVOKE SELECT ON owner_data.shared FROM sec_alice")
    _expect(alice, "SELECT * FROM sabre_refresh('alice.shared_out')", "42501", "can no longer read the source",
            "owner_data.shared")
    assert scalar(dba, "SELECT last_value FROM owner_data.planned") == planned     # nothing was planned
    owner.execute("DROP VIEW owner_data.shared")
    _expect(alice, "SELECT * FROM sabre_refresh('alice.shared_out')", "42P01", "no longer exists")


# ------------------------------------------------------------------ finding 2: pg_cron
@pytest.fixture
def cron_db(sabre_cluster, pg_role_dsn):
    """The cluster's pg_cron database with sabre, an analyst ``sec_cron_ana`` (USAGE on sabre
    and cron) and her planted source; yields (superuser connection, analyst connection)."""
    from sabre_pg import installer
    role = "sec_cron_ana"
    dba = psycopg.connect(sabre_cluster.dsn(sabre_cluster.dbname), autocommit=True)
    try:
        if not scalar(dba, "SELECT current_setting('cron.database_name', true) = current_database()"):
            pytest.skip("pg_cron is not installed (Debian: postgresql-15-cron)")
        installer.install(dba, "sabre")
        dba.execute("CREATE EXTENSION IF NOT EXISTS pg_cron")
        dba.execute(f"DROP ROLE IF EXISTS {role}")
        dba.execute(f"CREATE ROLE {role} LOGIN")
        dba.execute(f"CREATE SCHEMA cron_ana AUTHORIZATION {role}")
        dba.execute(f"GRANT USAGE ON SCHEMA sabre, cron TO {role}")
        dba.execute(f"ALTER ROLE {role} SET search_path = public, sabre")
        dba.execute("SET search_path = public, sabre")
        ana = psycopg.connect(make_conninfo(pg_role_dsn(role), dbname=sabre_cluster.dbname), autocommit=True)
        try:
            yield dba, ana
        finally:
            ana.close()
            dba.execute("RESET ROLE")
            dba.execute(f"SELECT cron.unschedule(jobid) FROM cron.job WHERE username = '{role}' "
                        "OR command LIKE '%cron_ana%'")
            dba.execute("DROP SCHEMA cron_ana CASCADE")
            dba.execute(f"DELETE FROM sabre.runs WHERE run_by = '{role}'")
            dba.execute(f"DELETE FROM sabre.output_locks WHERE owner = '{role}'")
            dba.execute(f"DROP OWNED BY {role}")
            dba.execute(f"DROP ROLE {role}")
    finally:
        dba.close()


def test_scheduled_refresh_runs_as_the_runs_owner(cron_db):
    """The DBA cannot schedule an analyst's refresh as itself; scheduled as the analyst (the
    HINT's SET ROLE), the pg_cron job is hers (cron.job.username) and runs her function as her."""
    dba, ana = cron_db
    target = _plant_source(ana, "cron_ana", rows=600)
    ana.execute("SELECT * FROM sabre_anonymize('cron_ana.src', ARRAY['age','zip'], 'income', 0.4, 4, "
                "output => 'cron_ana.out', options => '{\"key\": \"id\"}')").fetchall()
    calls = _calls(dba, "cron_ana")[0]
    jobs = "SELECT jobid, username, command FROM cron.job WHERE command LIKE '%cron_ana%'"
    _expect(dba, "SELECT sabre_schedule_refresh('cron_ana.out'::regclass, '* * * * *')", "42501", "SET ROLE",
            "sec_cron_ana")
    assert dba.execute(jobs).fetchall() == []
    dba.execute("SET ROLE sec_cron_ana")
    job = scalar(dba, "SELECT sabre_schedule_refresh('cron_ana.out'::regclass, '* * * * *')")
    dba.execute("RESET ROLE")
    assert dba.execute(jobs).fetchall() == [
        (job, "sec_cron_ana", 'SELECT * FROM "sabre"."sabre_refresh"(\'cron_ana."out"\')')]
    assert _calls(dba, "cron_ana")[0] == calls                 # scheduling runs nothing of the run
    runs = "SELECT count(*) FROM sabre.runs WHERE run_by = 'sec_cron_ana'"
    deadline = time.monotonic() + 80
    while time.monotonic() < deadline and scalar(dba, runs) < 2:
        time.sleep(2)
    details = dba.execute("SELECT status, return_message FROM cron.job_run_details WHERE jobid = %s",
                          (job,)).fetchall()
    assert scalar(dba, runs) >= 2, details
    assert _calls(dba, "cron_ana")[1] == "sec_cron_ana"       # the job ran her function as her
    assert not os.path.exists(target)


# ------------------------------------------------------------------ finding 6: locks
@pytest.fixture
def nobody(roles, pg_conn, pg_connect):
    """``sec_nobody``: LOGIN, no rights on sabre or on any output."""
    pg_conn.execute("DROP ROLE IF EXISTS sec_nobody")
    pg_conn.execute("CREATE ROLE sec_nobody LOGIN")
    conn = pg_connect(user="sec_nobody")
    yield conn
    conn.close()
    pg_conn.execute("DROP OWNED BY sec_nobody")
    pg_conn.execute("DROP ROLE sec_nobody")


OUTPUTS = ('"alice"."c"', '"bob"."c"', '"public"."census_sabre"', '"public"."census_instant"', "alice.c",
           "public.census_sabre")


def _hold_every_old_key(conn):
    """Session advisory locks on sabre 0.2.0's keys of the outputs the test writes, and a
    spread of keys around them (both key forms)."""
    conn.execute("SELECT pg_advisory_lock(%s, hashtext(o)) FROM unnest(%s::text[]) o", (OLD_LOCK_CLASS, list(OUTPUTS)))
    conn.execute("SELECT pg_advisory_lock(c, k) FROM generate_series(%s - 1, %s + 1) c, "
                 "generate_series(-100, 100) k", (OLD_LOCK_CLASS, OLD_LOCK_CLASS))
    conn.execute("SELECT pg_advisory_lock(k) FROM generate_series(-50, 50) k")
    held = scalar(conn, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()")
    assert held >= len(OUTPUTS) + 3 * 201


def test_advisory_locks_of_a_role_without_rights_block_no_run(roles, nobody):
    dba, alice = roles["dba"], roles["sec_alice"]
    dba.execute("CREATE TABLE public.census (id int PRIMARY KEY, age int, sex text, zip int, salary int)")
    dba.execute("INSERT INTO public.census SELECT g, 18 + (g * 7919) % 60, CASE WHEN g % 2 = 0 THEN 'F' ELSE 'M' END, "
                "(g * 31) % 41, (g * 104729) % 23 FROM generate_series(1, 2500) g")
    dba.execute("GRANT SELECT ON public.census TO sec_alice")
    _hold_every_old_key(nobody)
    run = ("SELECT rows FROM sabre_anonymize('public.census', ARRAY['age','zip'], 'salary', 0.4, 4, "
           "output => 'alice.c')")
    assert alice.execute(run).fetchone()[0] == 2500           # a first run
    assert alice.execute(run).fetchone()[0] == 2500           # a rerun (replace + swap)
    assert alice.execute("SELECT rows FROM sabre_refresh('alice.c')").fetchone()[0] == 2500
    assert dba.execute("SELECT rows FROM sabre_anonymize('public.census', ARRAY['age','sex'], 'salary', 0.4, 4)"
                       ).fetchone()[0] == 2500
    dba.execute("SELECT * FROM sabre_instant('public.census'::regclass, ARRAY['age','zip'], 4, "
                "output => 'public.census_instant', options => '{\"analyze\": true}')").fetchall()
    assert scalar(dba, "SELECT count(*) FROM public.census_instant") > 0


def test_the_output_lock_rows_are_each_roles_own(roles, nobody):
    """Nobody takes another role's output lock through sabre.output_locks: a role without
    USAGE cannot reach it, an analyst cannot insert, see, lock or LOCK TABLE another role's
    rows, and its own row for the same output name blocks no one else."""
    dba, alice, bob = roles["dba"], roles["sec_alice"], roles["sec_bob"]
    dba.execute("CREATE TABLE public.census (id int PRIMARY KEY, age int, zip int, salary int)")
    dba.execute("INSERT INTO public.census SELECT g, 18 + g % 60, g % 41, g % 23 FROM generate_series(1, 1500) g")
    dba.execute("GRANT SELECT ON public.census TO sec_alice")
    run = ("SELECT rows FROM sabre_anonymize('public.census', ARRAY['age','zip'], 'salary', 0.4, 4, "
           "output => 'alice.c')")
    alice.execute(run).fetchall()
    assert alice.execute("SELECT owner, relname FROM sabre.output_locks").fetchall() == [("sec_alice", "c")]
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        nobody.execute("SELECT * FROM sabre.output_locks FOR UPDATE")
    assert bob.execute("SELECT count(*) FROM sabre.output_locks").fetchone()[0] == 0
    for stmt in ("INSERT INTO sabre.output_locks (owner, nsp, relname) VALUES ('sec_alice', 'alice'::regnamespace, 'c')",
                 "UPDATE sabre.output_locks SET owner = 'sec_alice'",
                 "DELETE FROM sabre.output_locks",
                 "LOCK TABLE sabre.output_locks IN SHARE MODE NOWAIT",
                 "LOCK TABLE sabre.output_locks IN ACCESS EXCLUSIVE MODE NOWAIT"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege), bob.transaction():
            bob.execute(stmt)
    bob.autocommit = False
    bob.execute("INSERT INTO sabre.output_locks (owner, nsp, relname) VALUES ('sec_bob', 'alice'::regnamespace, 'c')")
    bob.execute("SELECT * FROM sabre.output_locks FOR UPDATE").fetchall()
    bob.execute("LOCK TABLE sabre.output_locks IN ROW EXCLUSIVE MODE")   # what INSERT may take: conflicts with no run
    try:
        assert alice.execute(run).fetchone()[0] == 1500
    finally:
        bob.rollback()
        bob.autocommit = True


@pytest.mark.parametrize("first_run", [True, False])
def test_concurrent_runs_of_one_role_to_one_output_still_fail_fast(roles, nobody, pg_connect, first_run):
    """While a role without rights holds every old advisory key, the contract stays: the second
    of two concurrent runs to one output fails at once with 55P03 -- when the first creates the
    output (its lock row is new and uncommitted) and when it replaces it.  Another role's run to
    its own output meanwhile is not blocked."""
    dba, alice, bob = roles["dba"], roles["sec_alice"], roles["sec_bob"]
    _hold_every_old_key(nobody)
    dba.execute("CREATE TABLE public.census (id int PRIMARY KEY, age int, zip int, salary int)")
    dba.execute("INSERT INTO public.census SELECT g, 18 + g % 60, g % 41, g % 23 FROM generate_series(1, 1500) g")
    dba.execute("GRANT SELECT ON public.census TO sec_alice, sec_bob")
    run = ("SELECT run_id FROM sabre_anonymize('public.census', ARRAY['age','zip'], 'salary', 0.4, 4, "
           "output => '%s')")
    if not first_run:
        alice.execute(run % "alice.c").fetchall()
    first = pg_connect(user="sec_alice", autocommit=False)
    first.execute(run % "alice.c").fetchall()
    # (a second run that waited for the first would end in this timeout, 57014, not 55P03)
    second = pg_connect(user="sec_alice", options="-c statement_timeout=60s")
    e = _expect(second, run % "alice.c", "55P03", "another sabre_anonymize run is writing the output", "Wait")
    assert e.diag.message_hint
    assert bob.execute(run % "bob.c").fetchall()     # another role, its own output: not blocked
    first.commit()
    assert second.execute(run % "alice.c").fetchall()
    assert scalar(dba, "SELECT count(*) FROM sabre.outputs WHERE run_by = 'sec_alice'") == 1
