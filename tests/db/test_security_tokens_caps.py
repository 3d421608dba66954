"""Issue 25, findings 4 and 7: run records cannot be forged in another role's name, and
nothing an analyst passes makes the server work without bound.

Roles as in test_security.py: sec_mallory (an analyst, the attacker), sec_alice and sec_bob
(analysts, victims), sec_owner (the data owner, here an attacker too: it names the source's
relations and columns).  The plants differ from the issue's (a source renamed to contain a
token): a whole forged marker in a column name and in a table name, tokens carried across
transactions, roles, SET ROLE, SECURITY DEFINER and expiry.
"""
from __future__ import annotations

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from sabre_pg import cli
from sabre_pg.core import limits
from tests.db.test_security import roles  # noqa: F401  (the fixture)

FACTS = Jsonb({"quasi_identifiers": ["q"], "sensitive": "s", "t": 1, "k": 1, "method": "ak", "options": {},
               "seconds": 0})
RECORD = ("SELECT sabre.run_record(%s, %s::oid::regclass, ARRAY[%s::oid::regclass], %s::oid::regclass, %s)")


def _marker(run_id, token) -> str:
    return " (sabre-pg run %d, identity %s)" % (run_id, token)


def _name_with_marker(run_id, token) -> str:
    """A whole marker as an identifier, cut to 59 bytes (so that emd_<name> fits PostgreSQL's
    63): a marker of 0.2.0 with a one-digit run id fits whole."""
    return _marker(run_id, token)[1:60]


def _own_table(conn, name, run_id, token):
    """A table of the connection's role whose COMMENT carries the run's marker; its oid."""
    conn.execute(f"CREATE TABLE {name} (q int, s int)")
    conn.execute(f"COMMENT ON TABLE {name} IS " + sql.Literal("forged" + _marker(run_id, token)).as_string(conn))
    return conn.execute("SELECT %s::regclass::oid", (name,)).fetchone()[0]


def _runs(dba):
    return dba.execute("SELECT run_id, run_by, t, k FROM sabre.runs ORDER BY run_id").fetchall()


# ------------------------------------------------------------------ tokens are bound
def test_a_token_from_another_transaction_is_refused(roles):
    """A token begun (and committed) in one transaction records nothing in the next, even on
    the caller's own table carrying its marker."""
    mallory, dba = roles["sec_mallory"], roles["dba"]
    run_id, token = mallory.execute("SELECT * FROM sabre.run_begin()").fetchone()   # autocommit
    oid = _own_table(mallory, "mallory.t", run_id, token)
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="not begun by run_begin in this transaction"):
        mallory.execute(RECORD, (run_id, oid, oid, oid, FACTS))
    assert _runs(dba) == []


def test_a_token_begun_as_one_role_is_refused_for_another_roles_relations(roles):
    """SET ROLE within one transaction: the token is bound to the role that began it
    (CURRENT_USER), so relations of another role cannot be recorded under it."""
    dba = roles["dba"]
    with dba.transaction():
        dba.execute("SET LOCAL ROLE sec_alice")
        run_id, token = dba.execute("SELECT * FROM sabre.run_begin()").fetchone()
        dba.execute("SET LOCAL ROLE sec_bob")
        oid = _own_table(dba, "bob.t", run_id, token)
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="not owned by sec_alice"):
            with dba.transaction():                       # a savepoint
                dba.execute(RECORD, (run_id, oid, oid, oid, FACTS))
        dba.execute("RESET ROLE")
        assert dba.execute("SELECT role FROM sabre.run_tokens WHERE run_id = %s", (run_id,)).fetchone() \
            == ("sec_alice",)
    assert _runs(dba) == []


def test_a_security_definer_function_begins_runs_as_its_owner(roles):
    """A token begun inside bob's SECURITY DEFINER function is bob's: alice, who called it,
    cannot record her own table under it.  A run made through SET ROLE is the set role's."""
    dba, alice, bob = roles["dba"], roles["sec_alice"], roles["sec_bob"]
    bob.execute("CREATE FUNCTION bob.begin_for(OUT run_id bigint, OUT token text) SECURITY DEFINER "
                "LANGUAGE sql SET search_path = pg_catalog AS $$ SELECT * FROM sabre.run_begin() $$")
    dba.execute("GRANT USAGE ON SCHEMA bob TO sec_alice")
    alice.autocommit = False
    run_id, token = alice.execute("SELECT * FROM bob.begin_for()").fetchone()
    oid = _own_table(alice, "alice.t", run_id, token)
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="not owned by sec_bob"):
        alice.execute(RECORD, (run_id, oid, oid, oid, FACTS))
    alice.rollback()
    dba.execute("CREATE TABLE public.src (id int PRIMARY KEY, q int, s int)")
    dba.execute("INSERT INTO public.src SELECT g, g % 40, g % 5 FROM generate_series(1, 400) g")
    dba.execute("GRANT SELECT ON public.src TO sec_alice")
    with dba.transaction():
        dba.execute("SET LOCAL ROLE sec_alice")
        dba.execute("SELECT * FROM sabre.sabre_anonymize('public.src', ARRAY['q'], 's', 0.5, 4, "
                    "output => 'alice.out')").fetchall()
    assert [r[1] for r in _runs(dba)] == ["sec_alice"]
    assert dba.execute("SELECT count(*) FROM sabre.run_tokens").fetchone()[0] == 0


def test_an_expired_token_is_refused_and_deleted(roles):
    dba = roles["dba"]
    with dba.transaction():
        dba.execute("SET LOCAL ROLE sec_mallory")
        run_id, token = dba.execute("SELECT * FROM sabre.run_begin()").fetchone()
        oid = _own_table(dba, "mallory.t", run_id, token)
        dba.execute("RESET ROLE")
        expires = dba.execute("SELECT expires_at - issued_at FROM sabre.run_tokens WHERE run_id = %s",
                              (run_id,)).fetchone()[0]
        assert expires.total_seconds() == limits.RUN_TOKEN_TTL_SECONDS
        dba.execute("UPDATE sabre.run_tokens SET expires_at = clock_timestamp() - interval '1 second' "
                    "WHERE run_id = %s", (run_id,))
        dba.execute("SET LOCAL ROLE sec_mallory")
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="expired"):
            with dba.transaction():
                dba.execute(RECORD, (run_id, oid, oid, oid, FACTS))
        dba.execute("SELECT * FROM sabre.run_begin()")     # sweeps the expired token
        dba.execute("RESET ROLE")
        assert dba.execute("SELECT count(*) FROM sabre.run_tokens WHERE run_id = %s", (run_id,)).fetchone()[0] == 0
    assert _runs(dba) == []


def test_unused_tokens_are_cleaned_up_and_flooding_is_refused(roles):
    mallory, dba = roles["sec_mallory"], roles["dba"]
    for _ in range(30):                       # each in its own transaction, never used
        mallory.execute("SELECT * FROM sabre.run_begin()")
    assert dba.execute("SELECT count(*) FROM sabre.run_tokens").fetchone()[0] == 1
    mallory.autocommit = False
    cap = limits.RUN_TOKENS_PER_TRANSACTION
    mallory.execute("SELECT sabre.run_begin() FROM generate_series(1, %s)", (cap,)).fetchall()
    with pytest.raises(psycopg.errors.ProgramLimitExceeded) as e:
        mallory.execute("SELECT sabre.run_begin() FROM generate_series(1, 1000)").fetchall()
    assert e.value.diag.message_hint
    mallory.rollback()
    mallory.autocommit = True
    mallory.execute("SELECT * FROM sabre.run_begin()")
    assert dba.execute("SELECT count(*) FROM sabre.run_tokens").fetchone()[0] == 1
    # a caller cannot choose a token's columns, nor read another role's
    mallory.execute("INSERT INTO sabre.run_tokens (run_id, token, role) VALUES (1, 'x', 'sec_alice')")
    assert dba.execute("SELECT count(*) FROM sabre.run_tokens WHERE role = 'sec_alice' OR token = 'x' "
                       "OR run_id = 1").fetchone()[0] == 0


# ------------------------------------------------------------------ names cannot carry an identity
def _owner_token(dba, owner):
    """The data owner (here also a sabre user) begins a run in a transaction it keeps open."""
    dba.execute("GRANT USAGE ON SCHEMA sabre TO sec_owner")
    owner.autocommit = False
    return owner.execute("SELECT * FROM sabre.run_begin()").fetchone()


def _owner_source(dba, table, columns):
    dba.execute(f"CREATE TABLE owner_data.{table} (id int PRIMARY KEY, age int, zip int, {columns})")
    dba.execute(f"ALTER TABLE owner_data.{table} OWNER TO sec_owner")
    dba.execute(f"GRANT SELECT ON owner_data.{table} TO sec_alice")
    dba.execute("GRANT USAGE ON SCHEMA owner_data TO sec_alice")


def test_a_column_name_holding_a_forged_marker_gives_no_run_in_the_victims_name(roles):
    """The data owner names an SA column with a whole marker of a run it began, in a
    transaction it keeps open; alice's several-SA output's COMMENT then holds it (t = .. on
    <column>).  Recording that output under the owner's token is refused."""
    dba, owner, alice = roles["dba"], roles["sec_owner"], roles["sec_alice"]
    run_id, token = _owner_token(dba, owner)
    column = _name_with_marker(run_id, token)
    _owner_source(dba, "visits", '"%s" int, salary int' % column)
    dba.execute("INSERT INTO owner_data.visits SELECT g, 20 + g % 50, g % 97, g % 5, g % 7 "
                "FROM generate_series(1, 1500) g")
    alice.execute("SELECT * FROM sabre.sabre_anonymize('owner_data.visits', ARRAY['age', 'zip'], "
                  "ARRAY['salary', %s], ARRAY[0.5, 0.5], 4, output => 'alice.v')", (column,)).fetchall()
    oid, src = alice.execute("SELECT 'alice.v'::regclass::oid, 'owner_data.visits'::regclass::oid").fetchone()
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        owner.execute(RECORD, (run_id, oid, oid, src, FACTS))
    owner.rollback()
    assert [(r[1], r[2], r[3]) for r in _runs(dba)] == [("sec_alice", 0.5, 4)]


def test_a_forged_run_on_a_stream_output_cannot_make_purge_drop_it(roles, pg_dsn):
    """The source's name ends with a whole forged marker; alice's stream output's COMMENT
    holds it.  The owner's run_record is refused, and uninstall --purge leaves every relation
    of alice's stream in place."""
    dba, owner, alice = roles["dba"], roles["sec_owner"], roles["sec_alice"]
    run_id, token = _owner_token(dba, owner)
    table = _name_with_marker(run_id, token)
    qtable = 'owner_data."%s"' % table
    _owner_source(dba, '"%s"' % table, "diagnosis int")
    dba.execute(f"INSERT INTO {qtable} SELECT g, 20 + g % 50, g % 97, g % 9 FROM generate_series(1, 300) g")
    alice.execute("SELECT * FROM sabre.sabre_stream_create(name => 'w', source => %s::regclass, arrival => 'id', "
                  "quasi_identifiers => ARRAY['age', 'zip'], sensitive => 'diagnosis', t => 0.5, k => 4, "
                  "window_size => 200, step => 100, output => 'alice.w')", (qtable,)).fetchall()
    oid, src = alice.execute("SELECT 'alice.w'::regclass::oid, %s::regclass::oid", (qtable,)).fetchone()
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        owner.execute(RECORD, (run_id, oid, oid, src, FACTS))
    owner.rollback()
    assert _runs(dba) == []
    assert cli.main(["uninstall", "--dsn", pg_dsn, "--purge"]) == 0
    left = dba.execute("SELECT count(*) FROM pg_class WHERE relnamespace = 'alice'::regnamespace "
                       "AND relname IN ('w', 'w_classes', 'w_keys')").fetchone()[0]
    assert left == 3


def test_only_the_marker_ending_a_comment_identifies_a_run(roles):
    """recorded_relations (what reruns replace and purge drops) takes a relation as a run's
    only when the run's marker ENDS its COMMENT: another run's marker anywhere before it (as
    any name written into the description could bring) identifies nothing."""
    dba, alice = roles["dba"], roles["sec_alice"]
    alice.execute("CREATE TABLE alice.src (id int PRIMARY KEY, age int, salary int)")
    alice.execute("INSERT INTO alice.src SELECT g, 20 + g % 50, g % 7 FROM generate_series(1, 600) g")
    alice.execute("SELECT * FROM sabre.sabre_anonymize('alice.src', ARRAY['age'], 'salary', 0.5, 4, "
                  "output => 'alice.p')").fetchall()
    (mine,) = alice.execute("SELECT run_id FROM sabre.runs").fetchone()
    forged_id, forged_token = 424242, "f" * 32
    # a row only the catalog's owner could write, standing for a forged record of alice's output
    dba.execute("INSERT INTO sabre.runs (run_id, source, source_oid, output_name, output_oid, relations, "
                "relation_oids, identity, quasi_identifiers, sensitive, t, k, method, options, status, "
                "started_at, run_by) SELECT %s, 'x', 0, 'alice.p', 'alice.p'::regclass, '{}', "
                "ARRAY['alice.p'::regclass::oid], %s, '{q}', 's', 1, 1, 'ak', '{}', 'done', now(), 'sec_alice'",
                (forged_id, forged_token))
    comment = alice.execute("SELECT obj_description('alice.p'::regclass, 'pg_class')").fetchone()[0]
    planted = "from owner_data.\"x" + _marker(forged_id, forged_token) + "\" " + comment
    alice.execute("COMMENT ON TABLE alice.p IS " + sql.Literal(planted).as_string(alice))
    assert dba.execute("SELECT run_id FROM sabre.recorded_relations() WHERE relation = 'alice.p'::regclass") \
        .fetchall() == [(mine,)]
    alice.execute("COMMENT ON TABLE alice.p IS " + sql.Literal(comment + _marker(forged_id, forged_token) + " ")
                  .as_string(alice))                     # neither marker ends it now
    assert dba.execute("SELECT run_id FROM sabre.recorded_relations() WHERE relation = 'alice.p'::regclass") \
        .fetchall() == []


# ------------------------------------------------------------------ caps
def _arx(leaves: int, height: int, label: str = "") -> str:
    """ARX text: leaf i's ancestor on level j is i >> j (labels may repeat across levels)."""
    return "\n".join(";".join([f"L{i}{label}"] + [f"{i >> j:x}" for j in range(1, height)] + ["*"])
                      for i in range(leaves))


OVER_CAP_HIERARCHIES = {
    "height": lambda: _arx(4, limits.HIERARCHY_HEIGHT + 2),
    "leaves": lambda: _arx(limits.HIERARCHY_LEAVES + 1, 1),
    "labels": lambda: _arx(limits.HIERARCHY_CELLS // 10 + 1, 10),
    "bytes": lambda: _arx(3, 2, "x" * (limits.HIERARCHY_TEXT_BYTES // 3 + 1)),
}


@pytest.mark.parametrize("over", list(OVER_CAP_HIERARCHIES))
def test_an_over_cap_hierarchy_is_refused_and_leaves_nothing(pg_conn, over):
    with pytest.raises(psycopg.errors.ProgramLimitExceeded, match=over) as e:
        pg_conn.execute("SELECT * FROM sabre_define_hierarchy('big', %s)", (OVER_CAP_HIERARCHIES[over](),))
    assert "the cap of" in e.value.diag.message_primary and e.value.diag.message_hint
    assert pg_conn.execute("SELECT count(*) FROM sabre.hierarchies").fetchone()[0] == 0
    assert pg_conn.execute("SELECT count(*) FROM sabre.hierarchy_rows").fetchone()[0] == 0


def test_a_hierarchy_written_into_the_catalog_directly_is_capped_when_used(roles):
    """A role with INSERT on the catalog may bypass sabre_define_hierarchy; a run loading
    its hierarchy still enforces the caps (here: the height)."""
    dba, mallory = roles["dba"], roles["sec_mallory"]
    dba.execute("GRANT INSERT, UPDATE, DELETE ON sabre.hierarchies, sabre.hierarchy_rows TO sec_mallory")
    height = limits.HIERARCHY_HEIGHT + 8
    mallory.execute("INSERT INTO sabre.hierarchies (name, height, leaves, root) VALUES ('tall', %s, 5, '*')",
                    (height,))
    mallory.execute("INSERT INTO sabre.hierarchy_rows SELECT 'tall', g - 1, ARRAY[g::text] || "
                    "array_fill('a' || g, ARRAY[%s - 1]) || '*'::text FROM generate_series(1, 5) g", (height,))
    mallory.execute("CREATE TABLE mallory.d (id int PRIMARY KEY, age int, kind text)")
    mallory.execute("INSERT INTO mallory.d SELECT g, g % 30, (1 + g % 5)::text FROM generate_series(1, 500) g")
    mallory.execute("ANALYZE mallory.d")
    with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="height"):
        mallory.execute("SELECT * FROM sabre_estimate('mallory.d', ARRAY['age'], 'kind', 0.5, 4, "
                        "'{\"hierarchies\": {\"kind\": \"tall\"}}')")


def test_too_many_t_values_in_an_estimate(pg_conn):
    pg_conn.execute("CREATE TABLE public.e (id int PRIMARY KEY, age int, salary int)")
    pg_conn.execute("INSERT INTO public.e SELECT g, g % 60, g % 11 FROM generate_series(1, 1000) g")
    pg_conn.execute("ANALYZE public.e")
    n = limits.ESTIMATE_T_VALUES
    assert len(pg_conn.execute("SELECT * FROM sabre_estimate('public.e', ARRAY['age'], 'salary', "
                               "(SELECT array_agg(0.005 * g) FROM generate_series(1, %s) g))", (n,)).fetchall()) == n
    with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="t values"):
        pg_conn.execute("SELECT * FROM sabre_estimate('public.e', ARRAY['age'], 'salary', "
                        "(SELECT array_agg(0.0001 * g) FROM generate_series(1, 2000) g))")


def _wide(conn, columns: int):
    cols = ", ".join(f"c{i} int" for i in range(columns))
    conn.execute(f"CREATE TABLE public.wide (id int PRIMARY KEY, {cols})")
    conn.execute(f"INSERT INTO public.wide SELECT g, {', '.join(f'(g * {i + 7}) % 5' for i in range(columns))} "
                 "FROM generate_series(1, 200) g")


def test_too_many_sensitive_attributes_and_thresholds(pg_conn):
    n = limits.SENSITIVE_ATTRIBUTES + 1
    _wide(pg_conn, n + 1)
    sas, ts = [f"c{i}" for i in range(1, n + 1)], [0.9] * n
    pg_conn.execute("SET statement_timeout = '60s'")
    with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="sensitive attributes"):
        pg_conn.execute("SELECT * FROM sabre_anonymize('public.wide', ARRAY['c0'], %s::text[], %s::float8[], 2)",
                        (sas, ts))
    with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="sensitive attributes"):
        pg_conn.execute("SELECT * FROM sabre_verify('public.wide', %s::text[], %s::float8[], 2)", (sas, ts))
    assert pg_conn.execute("SELECT count(*) FROM sabre.runs").fetchone()[0] == 0
    assert pg_conn.execute("SELECT to_regclass('public.wide_sabre')").fetchone()[0] is None


def test_too_many_quasi_identifiers(pg_conn):
    n = limits.QUASI_IDENTIFIERS + 1
    _wide(pg_conn, n + 1)
    pg_conn.execute("SET statement_timeout = '60s'")
    with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="quasi-identifiers"):
        pg_conn.execute("SELECT * FROM sabre_anonymize('public.wide', %s::text[], 'c0', 0.9, 2)",
                        ([f"c{i}" for i in range(1, n + 1)],))
    assert pg_conn.execute("SELECT to_regclass('public.wide_sabre')").fetchone()[0] is None


def test_workload_queries_and_cuboids_are_capped(pg_conn):
    _wide(pg_conn, 17)
    qis = [f"c{i}" for i in range(1, 17)]             # the most a run takes; C(16, 8) = 12,870 cuboids
    pg_conn.execute("SELECT * FROM sabre_anonymize('public.wide', %s::text[], 'c0', 0.9, 2, output => 'public.w')",
                    (qis,)).fetchall()
    pg_conn.execute("SET statement_timeout = '60s'")
    with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="queries"):
        pg_conn.execute("SELECT * FROM sabre_query_error_stats('public.w', 'public.wide', queries => %s)",
                        (limits.WORKLOAD_QUERIES + 1,))
    with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="max_cells"):
        pg_conn.execute("SELECT * FROM sabre_query_error_stats('public.w', 'public.wide', options => %s)",
                        (Jsonb({"max_cells": limits.WORKLOAD_MAX_CELLS + 1}),))
    with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="cuboids"):
        pg_conn.execute("SELECT * FROM sabre_kl_cuboids('public.w', 'public.wide', level => 8)")


def test_too_many_parts_to_publish(pg_conn):
    pg_conn.execute("CREATE TABLE public.pp (id int PRIMARY KEY, age int, salary int)")
    pg_conn.execute("INSERT INTO public.pp SELECT g, g % 60, g % 11 FROM generate_series(1, 300) g")
    with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="parts"):
        pg_conn.execute("SELECT * FROM sabre_publish_parts('public.pp', ARRAY['age'], 'salary', 0.5, 4, 'ak', "
                        "'public.pp_out', '{}', (SELECT array_agg('public.part' || g) FROM generate_series(1, %s) g))",
                        (limits.PARTS + 1,))
    assert pg_conn.execute("SELECT count(*) FROM sabre.runs").fetchone()[0] == 0
