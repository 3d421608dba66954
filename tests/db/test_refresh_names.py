"""sabre_refresh resolves the output's name as the caller would (docs/streams.md, "SQL").

``sabre_anonymize`` returns its output as a ``regclass``, printed unqualified when its schema is
on the caller's ``search_path``; passing that text back to ``sabre_refresh`` must refresh that
output, and a name must never resolve to a relation the caller's path would not find.
"""
from __future__ import annotations

import psycopg
import pytest


@pytest.fixture
def refreshed_schema(pg_conn):
    pg_conn.execute("CREATE SCHEMA IF NOT EXISTS rn_data")
    pg_conn.execute("DROP TABLE IF EXISTS rn_data.people CASCADE")
    pg_conn.execute("CREATE TABLE rn_data.people (id int PRIMARY KEY, age int NOT NULL, zip int NOT NULL, "
                    "salary int NOT NULL)")
    pg_conn.execute("INSERT INTO rn_data.people SELECT i, 20 + i % 50, 1000 + i % 37, (i * 7) % 23 "
                    "FROM generate_series(1, 600) i")
    return "rn_data"


def _anonymize(conn, source, output):
    return conn.execute(
        "SELECT output::text FROM sabre.sabre_anonymize(%s::regclass, ARRAY['age', 'zip'], 'salary', 0.4, 5, "
        "output => %s)", (source, output)).fetchone()[0]


def test_the_name_sabre_anonymize_returns_refreshes(pg_conn, refreshed_schema):
    pg_conn.execute("SET search_path = rn_data, public, sabre")
    returned = _anonymize(pg_conn, "rn_data.people", "rn_data.people_sabre")
    assert returned == "people_sabre"                                 # unqualified: rn_data is on the path
    first = pg_conn.execute("SELECT max(run_id) FROM sabre.runs").fetchone()[0]
    row = pg_conn.execute("SELECT run_id, output::text, rows FROM sabre.sabre_refresh(%s)", (returned,)).fetchone()
    assert row[0] > first and row[2] == 600
    # qualified and quoted forms, and an OID's text, keep working
    for name in ("rn_data.people_sabre", '"rn_data"."people_sabre"'):
        assert pg_conn.execute("SELECT rows FROM sabre.sabre_refresh(%s)", (name,)).fetchone()[0] == 600


def test_a_name_off_the_callers_path_is_not_found(pg_conn, refreshed_schema):
    pg_conn.execute("SET search_path = rn_data, public, sabre")
    _anonymize(pg_conn, "rn_data.people", "rn_data.people_sabre")
    pg_conn.execute("SET search_path = public, sabre")              # rn_data no longer on the path
    with pytest.raises(psycopg.errors.UndefinedTable) as e:
        pg_conn.execute("SELECT * FROM sabre.sabre_refresh('people_sabre')")
    assert e.value.diag.message_hint


def test_the_callers_path_decides_between_two_outputs_of_one_name(pg_conn, refreshed_schema):
    pg_conn.execute("CREATE SCHEMA IF NOT EXISTS rn_other")
    pg_conn.execute("DROP TABLE IF EXISTS rn_other.people CASCADE")
    pg_conn.execute("CREATE TABLE rn_other.people AS SELECT * FROM rn_data.people WHERE id <= 300")
    pg_conn.execute("ALTER TABLE rn_other.people ADD PRIMARY KEY (id)")
    _anonymize(pg_conn, "rn_data.people", "rn_data.people_sabre")
    _anonymize(pg_conn, "rn_other.people", "rn_other.people_sabre")
    pg_conn.execute("SET search_path = rn_other, rn_data, sabre")
    assert pg_conn.execute("SELECT rows FROM sabre.sabre_refresh('people_sabre')").fetchone()[0] == 300
    pg_conn.execute("SET search_path = rn_data, rn_other, sabre")
    assert pg_conn.execute("SELECT rows FROM sabre.sabre_refresh('people_sabre')").fetchone()[0] == 600
