"""Partitioned runs (docs/scale-out.md): options.partitions in one call, the client's parallel
parts, and their errors.  Every output is checked by sabre_verify (the independent exact EMD
against the whole relation, which holds every source row exactly once)."""
from __future__ import annotations

import json

import pytest
from psycopg import sql

from sabre_pg import api
from tests.db.helpers import anonymize, checksum, expect_error, ident, make_census, relations, run_row, scalar, \
    verify

ROWS = 4000
QIS = ["age", "education", "sex", "marital"]
T, K = 0.3, 5


@pytest.fixture
def census(pg_conn):
    hier = make_census(pg_conn, rows=ROWS)
    return {q: hier[q] for q in QIS if q in hier}


def check_partitioned(conn, output, sensitive, t, k, res, hierarchy=None):
    """t-close and k-anonymous by sabre_verify, every source row exactly once, classes agree."""
    checked = verify(conn, output, sensitive, t, k, hierarchy)
    assert checked["violations"] == 0 and checked["min_class_size"] >= k
    assert checked["max_emd"] <= t and checked["classes"] == res["classes"]
    assert res["rows"] == ROWS == scalar(conn, sql.SQL("SELECT count(*) FROM {}").format(ident(output)))
    keys = ident(output + "_keys")
    # the side table maps each source id to one class, and each class has its rows
    assert scalar(conn, sql.SQL("SELECT count(DISTINCT k.key) FROM {} k JOIN public.census s ON s.id = k.key")
                  .format(keys)) == ROWS
    assert scalar(conn, sql.SQL(
        "SELECT count(*) FROM (SELECT ec_id, count(*) FROM {} GROUP BY 1 EXCEPT SELECT ec_id, count(*) FROM {} "
        "GROUP BY 1) x").format(ident(output), keys)) == 0
    # the classes table carries each class's EMD to the whole table
    assert scalar(conn, sql.SQL("SELECT max(emd) FROM {}").format(ident(output + "_classes"))) == \
        pytest.approx(checked["max_emd"], abs=1e-12)
    assert not [r for r in relations(conn) if r[1].startswith("sabre_part_")]


def test_one_call_in_parts(pg_conn, census):
    before = checksum(pg_conn, ident("public.census"))
    opts = {"hierarchies": census, "partitions": 4}
    parts = pg_conn.execute(
        "SELECT rows, emd, budget, predicate, part_rows FROM sabre_partitions('public.census', %s, 'salary', %s, %s, "
        "'ak', 'public.census_parts', %s::jsonb, stage_rows => true)", (QIS, T, K, json.dumps(opts))).fetchall()
    assert len(parts) == 4 and sum(p[0] for p in parts) == ROWS
    assert all(0 <= p[1] <= T / 2 and 0 < p[2] <= 1 and p[0] >= K for p in parts)
    # the predicates cover every row exactly once
    assert scalar(pg_conn, "SELECT count(*) FROM public.census WHERE (%s) <> 1" % " + ".join(
        "(%s)::int" % p[3] for p in parts)) == 0
    # each part's rows table holds exactly its rows, with the source's columns, for its owner only
    for p in parts:
        assert scalar(pg_conn, "SELECT count(*) FROM (SELECT * FROM %s EXCEPT ALL SELECT * FROM public.census "
                      "WHERE %s) x" % (p[4], p[3])) == 0 and scalar(pg_conn, "SELECT count(*) FROM %s" % p[4]) == p[0]
        assert scalar(pg_conn, "SELECT count(*) FROM pg_class c, aclexplode(c.relacl) a WHERE c.oid = %s::regclass "
                      "AND a.grantee <> c.relowner", (p[4],)) == 0
        pg_conn.execute("DROP TABLE " + p[4])
    res = anonymize(pg_conn, "public.census", QIS, "salary", T, K, "ak", "public.census_parts", opts)
    check_partitioned(pg_conn, "public.census_parts", "salary", T, K, res)
    run = run_row(pg_conn, res["run_id"])
    assert run["options"]["partitions"] == 4 and run["classes"] == res["classes"]
    assert checksum(pg_conn, ident("public.census")) == before


def test_categorical_sa_in_parts(pg_conn, census):
    res = anonymize(pg_conn, "public.census", ["age", "education"], "marital", 0.25, K, "ak",
                    "public.census_mparts", {"hierarchies": {"marital": census["marital"]}, "partitions": 3})
    check_partitioned(pg_conn, "public.census_mparts", "marital", 0.25, K, res, census["marital"])


def test_parallel_client_replaces_atomically(pg_conn, pg_dsn, census):
    first = anonymize(pg_conn, "public.census", QIS, "salary", T, K, "ak", "public.census_par", {"hierarchies": census})
    parts_seen = []
    run = api.anonymize_partitioned(pg_dsn, "public.census", QIS, "salary", T, K, output="public.census_par",
                                    hierarchies=census, partitions=3, parallel=2, schema="sabre",
                                    on_part=parts_seen.append)
    assert sorted(p["part"] for p in parts_seen) == [0, 1, 2]
    assert run.run_id != first["run_id"] and run.output_name == "public.census_par"
    assert scalar(pg_conn, "SELECT to_regclass('public.census_par')::oid") != first["output_oid"]
    check_partitioned(pg_conn, "public.census_par", "salary", T, K,
                      {"rows": run.rows, "classes": run.n_classes})
    # a publish that fails leaves the previous output as it was
    expect_error(pg_conn, lambda c: c.execute(
        "SELECT * FROM sabre_publish_parts('public.census', %s, 'salary', %s, %s, 'ak', 'public.census_par', "
        "'{}'::jsonb, ARRAY['public.census'])", (QIS, T, K)), "22023", "not the output of one of your recorded")


@pytest.mark.parametrize("options, sqlstate, message", [
    ({"partitions": 0}, "22023", "options.partitions must be an integer"),
    ({"partitions": "4"}, "22023", "options.partitions must be an integer"),
    ({"partitions": 2, "hierarchies": {"sex": "census_sex"}}, "22023", "needs a numerical quasi-identifier"),
])
def test_bad_partitions(pg_conn, census, options, sqlstate, message):
    qis = ["sex"] if "hierarchies" in options else QIS
    opts = {"hierarchies": census, **options} if "hierarchies" not in options else options
    expect_error(pg_conn, lambda c: anonymize(c, "public.census", qis, "salary", T, K, "ak", "public.census_bad",
                                              opts), sqlstate, message)


def test_plan_and_several_sa_errors(pg_conn, census):
    expect_error(pg_conn, lambda c: c.execute(
        "SELECT * FROM sabre_partitions('public.census', %s, 'salary', %s, %s)", (QIS, T, K)),
        "22023", "needs options.partitions")
    expect_error(pg_conn, lambda c: c.execute(
        "SELECT * FROM sabre_anonymize('public.census'::regclass, %s, ARRAY['salary', 'workclass'], "
        "ARRAY[0.3, 0.4]::float8[], 5, 'ak', 'public.census_bad', %s::jsonb)",
        (QIS, json.dumps({"hierarchies": census, "partitions": 2}))), "22023", "one sensitive attribute")


def test_publish_refuses_missing_part(pg_conn, census):
    opts = {"hierarchies": census, "partitions": 2}
    before = relations(pg_conn)
    parts = pg_conn.execute(
        "SELECT predicate, budget, part_output, part_options FROM sabre_partitions('public.census', %s, 'salary', "
        "%s, %s, 'ak', 'public.census_half', %s::jsonb)", (QIS, T, K, json.dumps(opts))).fetchall()
    assert relations(pg_conn) == before          # a plan without stage_rows makes no tables
    predicate, budget, part_output, part_options = parts[0]
    pg_conn.execute("CREATE TEMP VIEW half AS SELECT * FROM public.census WHERE " + predicate)
    pg_conn.execute("SELECT * FROM sabre_anonymize('pg_temp.half'::regclass, %s, 'salary', %s, %s, 'ak', %s, "
                    "%s::jsonb)", (QIS, budget, K, part_output, json.dumps(part_options)))
    expect_error(pg_conn, lambda c: c.execute(
        "SELECT * FROM sabre_publish_parts('public.census', %s, 'salary', %s, %s, 'ak', 'public.census_half', "
        "%s::jsonb, ARRAY[%s])", (QIS, T, K, json.dumps(opts), part_output)), "40001", "do not hold the source's rows")
    assert scalar(pg_conn, "SELECT to_regclass('public.census_half')") is None


def test_split_takes_off_median_cut(pg_conn):
    """The median cut (x < 5) leaves both sides 0.35 from the table (> t/2), an off-median one
    (x < 3) passes: the split cuts there (before, the table stayed one part)."""
    # 10 rows per x in 0..9; SA s = 1 in half of x = 0..2's rows, in all of x = 3, 4's, else 0
    pg_conn.execute("CREATE TABLE public.offmed AS SELECT g AS id, g / 10 AS x, CASE WHEN g / 10 < 3 "
                    "THEN g % 2 WHEN g / 10 < 5 THEN 1 ELSE 0 END AS s FROM generate_series(0, 99) g")
    pg_conn.execute("ALTER TABLE public.offmed ADD PRIMARY KEY (id)")
    parts = pg_conn.execute(
        "SELECT rows, emd, predicate FROM sabre_partitions('public.offmed', ARRAY['x'], 's', 0.32, 5, 'ak', "
        "'public.offmed_out', '{\"partitions\": 2}'::jsonb)").fetchall()
    assert sorted(p[0] for p in parts) == [30, 70]
    q = scalar(pg_conn, "SELECT avg(s) FROM public.offmed")
    for rows, emd, predicate in parts:
        # each side's EMD to the table, independently: with two SA values, |p - q|
        n, p = pg_conn.execute("SELECT count(*), avg(s) FROM public.offmed WHERE " + predicate).fetchone()
        assert n == rows and abs(float(p) - float(q)) <= 0.32 / 2 and emd == pytest.approx(abs(float(p - q)))
    lower = next(p[2] for p in parts if p[0] == 30)            # the cut is at x < 3
    assert scalar(pg_conn, "SELECT count(*) FROM public.offmed WHERE (x < 3) = (%s)" % lower) == 100
    assert scalar(pg_conn, "SELECT count(*) FROM public.offmed WHERE (%s) <> 1" % " + ".join(
        "(%s)::int" % p[2] for p in parts)) == 0


def test_publish_checks_keys_class_by_class(pg_conn, census):
    """A part's side table whose key moved to another class (row counts unchanged) is refused
    before the swap, and nothing is published."""
    opts = {"hierarchies": census, "partitions": 2}
    parts = pg_conn.execute(
        "SELECT part_output, part_options, budget, part_rows FROM sabre_partitions('public.census', %s, 'salary', "
        "%s, %s, 'ak', 'public.census_moved', %s::jsonb, stage_rows => true)", (QIS, T, K, json.dumps(opts))).fetchall()
    for part_output, part_options, budget, part_rows in parts:
        pg_conn.execute("SELECT * FROM sabre_anonymize(%s::regclass, %s, 'salary', %s, %s, 'ak', %s, %s::jsonb)",
                        (part_rows, QIS, budget, K, part_output, json.dumps(part_options)))
        pg_conn.execute("DROP TABLE " + part_rows)
    keys = parts[0][0][:-1] + '_keys"'
    pg_conn.execute("UPDATE %s SET ec_id = 1 - ec_id WHERE key = (SELECT min(key) FROM %s WHERE ec_id IN (0, 1))"
                    % (keys, keys))
    expect_error(pg_conn, lambda c: c.execute(
        "SELECT * FROM sabre_publish_parts('public.census', %s, 'salary', %s, %s, 'ak', 'public.census_moved', "
        "%s::jsonb, %s)", (QIS, T, K, json.dumps(opts), [p[0] for p in parts])), "40001", "do not match their outputs' classes")
    assert scalar(pg_conn, "SELECT to_regclass('public.census_moved')") is None


def test_one_call_in_parts_keeps_columns(pg_conn, census):
    """options.keep: each part's rows are joined from its rows table, written into the run's output."""
    opts = {"hierarchies": census, "partitions": 3, "keep": ["race"]}
    res = anonymize(pg_conn, "public.census", QIS, "salary", T, K, "ak", "public.census_kept", opts)
    check_partitioned(pg_conn, "public.census_kept", "salary", T, K, res)
    # every row's kept value is its source row's (the side table maps output rows to source keys per class)
    assert scalar(pg_conn, "SELECT count(*) FROM (SELECT ec_id, race, salary FROM public.census_kept EXCEPT ALL "
                  "SELECT k.ec_id, s.race, s.salary FROM public.census s JOIN public.census_kept_keys k ON k.key = s.id) x") == 0


def test_one_call_checks_in_chunks(pg_conn, census):
    """The output the parts wrote into is checked in chunks of blocks (here ~300 rows each, so
    classes straddle chunks): the same classes and EMDs as one chunk."""
    opts = {"hierarchies": census, "partitions": 3}
    whole = anonymize(pg_conn, "public.census", QIS, "salary", T, K, "ak", "public.census_whole", opts)
    pg_conn.execute("DO $$ import sabre_plpy.batch.partition as p; p.CHECK_ROWS = 300 $$ LANGUAGE plpython3u")
    try:
        res = anonymize(pg_conn, "public.census", QIS, "salary", T, K, "ak", "public.census_chunks", opts)
    finally:
        pg_conn.execute("DO $$ import sabre_plpy.batch.partition as p; p.CHECK_ROWS = 1 << 20 $$ LANGUAGE plpython3u")
    check_partitioned(pg_conn, "public.census_chunks", "salary", T, K, res)
    assert scalar(pg_conn, "SELECT pg_relation_size('public.census_chunks') / 8192") > 3
    assert (res["classes"], res["max_emd"]) == (whole["classes"], whole["max_emd"])
    assert pg_conn.execute("SELECT count(*), sum(size), sum(emd) FROM public.census_chunks_classes").fetchone() == \
        pg_conn.execute("SELECT count(*), sum(size), sum(emd) FROM public.census_whole_classes").fetchone()
