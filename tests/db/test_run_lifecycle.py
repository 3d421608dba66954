"""A run belongs to the caller's transaction (docs/anonymize.md, "What it creates"): the
caller's ROLLBACK after a successful run leaves nothing behind, and rolling back a rerun keeps
the previous output.  The output name's length limit: the name and its longest derived name
(<output>_classes_pkey) must fit PostgreSQL's 63 bytes, so 50 bytes pass and 51 fail."""
from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

from tests.db.helpers import (anonymize, checksum, expect_error, make_census, relation_exists, run_row,
                              scalar, state)

QIS = ["age", "sex", "education"]
MAX_OUTPUT_BYTES = 63 - len("_classes_pkey")


@pytest.fixture
def census(pg_conn):
    make_census(pg_conn, rows=2000)
    return pg_conn


def run(conn, output, **options):
    return anonymize(conn, "public.census", QIS, "salary", 0.35, 5, "ak", output, dict(options, keep=["id"]))


def published(conn, output):
    """What a reader of the output sees: oids and contents of the three relations."""
    names = [output, output + "_classes", output + "_keys"]
    return ([scalar(conn, "SELECT to_regclass(%s)::oid", (n,)) for n in names],
            checksum(conn, output), checksum(conn, output + "_classes", key="ec_id"),
            checksum(conn, output + "_keys", key="key"))


def test_callers_rollback_leaves_nothing(census):
    before = state(census)
    with census.transaction() as tx:
        res = run(census, "public.census_anon")
        assert relation_exists(census, "public.census_anon_keys")
        assert run_row(census, res["run_id"])["status"] == "done"
        raise psycopg.Rollback(tx)
    assert state(census) == before                  # relations, runs, hierarchies, the source
    for name in ("census_anon", "census_anon_classes", "census_anon_keys"):
        assert not relation_exists(census, "public." + name)
    assert run_row(census, res["run_id"]) is None
    assert scalar(census, "SELECT count(*) FROM sabre.outputs") == 0


def test_callers_rollback_of_a_rerun_keeps_the_previous_output(census):
    first = run(census, "public.census_anon")
    before, before_state = published(census, "public.census_anon"), state(census)
    with census.transaction() as tx:
        second = run(census, "public.census_anon", seed=2, takeout="random")
        assert published(census, "public.census_anon") != before
        raise psycopg.Rollback(tx)
    assert published(census, "public.census_anon") == before
    assert state(census) == before_state
    assert run_row(census, second["run_id"]) is None
    assert scalar(census, "SELECT run_id FROM sabre.outputs WHERE output = 'public.census_anon'::regclass") \
        == first["run_id"]


@pytest.mark.parametrize("name", [
    pytest.param("n" * MAX_OUTPUT_BYTES, id="ascii"),
    pytest.param("é" * (MAX_OUTPUT_BYTES // 2), id="two-byte-characters"),
])
def test_output_name_at_the_length_limit(census, name):
    assert len(name.encode()) == MAX_OUTPUT_BYTES
    res = run(census, sql.Identifier("public", name).as_string(census))
    assert res["rows"] == 2000
    tables = [sql.Identifier("public", name + suffix).as_string(census) for suffix in ("", "_classes", "_keys")]
    assert all(relation_exists(census, t) for t in tables)
    oids = [scalar(census, "SELECT to_regclass(%s)::oid", (r,)) for r in run_row(census, res["run_id"])["relations"]]
    assert oids == [scalar(census, "SELECT to_regclass(%s)::oid", (t,)) for t in tables]
    # the longest derived name fits: the classes' primary key is named after them in full
    assert scalar(census, "SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                          "WHERE i.indrelid = %s::regclass AND i.indisprimary AND c.relname = %s",
                  (tables[1], name + "_classes_pkey")) == 1


@pytest.mark.parametrize("name", [
    pytest.param("n" * (MAX_OUTPUT_BYTES + 1), id="ascii"),
    pytest.param("é" * (MAX_OUTPUT_BYTES // 2) + "n", id="two-byte-characters"),
])
def test_output_name_one_byte_over_the_limit(census, name):
    assert len(name.encode()) == MAX_OUTPUT_BYTES + 1
    e = expect_error(census, lambda c: run(c, sql.Identifier("public", name).as_string(c)),
                     "42622", "too long")
    assert str(MAX_OUTPUT_BYTES) in e.diag.message_hint
