"""Bad input to the SQL API: every bad call fails with a precise SQLSTATE, a message, a HINT,
and leaves nothing behind (no relation created or dropped, no run recorded, the source and
the stored hierarchies unchanged).

SQLSTATEs are the ones plpython/shared/common.py defines:
22023 invalid_parameter_value, 22004 null_value_not_allowed, 22P04 bad_copy_file_format,
42P01 undefined_table, 42703 undefined_column, 42704 undefined_object, 42701 duplicate_column,
42P07 duplicate_table, 42602 invalid_name.
"""
from __future__ import annotations

import math

import psycopg
import pytest
from psycopg import sql

from sabre_pg import datasets as ds
from tests.db.helpers import anonymize, expect_error, state

ROWS = 2000
QIS = ["age", "sex", "education"]


# --------------------------------------------------------------------------- helpers

def call_anonymize(conn, source="public.census", qis=QIS, sensitive="salary", t=0.35, k=6, method="ak",
                   output=None, options=None, source_type="regclass"):
    return anonymize(conn, source, qis, sensitive, t, k, method, output, options, source_type)


@pytest.fixture
def db(pg_conn):
    """pg_conn with public.census (2000 rows) and its hierarchies census_<column>."""
    ds.generate_census(pg_conn, table="census", rows=ROWS, seed=1)
    return pg_conn


@pytest.fixture(scope="module")
def census_db(pg_module_conn):
    """Like ``db``, shared by the module's tests whose calls must fail (and so change nothing)."""
    ds.generate_census(pg_module_conn, table="census", rows=ROWS, seed=1)
    return pg_module_conn


# --------------------------------------------------------------------------- sabre_anonymize arguments

CASES = [
    # id, kwargs of call_anonymize, SQLSTATE, message parts
    ("source-missing", dict(source="public.nope", source_type="text"), "42P01", ["public.nope"]),
    ("source-null", dict(source=None, source_type="text"), "22023", ["source"]),
    ("qi-missing", dict(qis=["age", "nope"]), "42703", ['"nope"']),
    ("sa-missing", dict(sensitive="nope"), "42703", ['"nope"']),
    ("qi-case-sensitive", dict(qis=["Age"]), "42703", ['"Age"']),
    ("sa-among-qis", dict(qis=["age", "salary"]), "22023", ['"salary"']),
    ("qis-empty", dict(qis=[]), "22023", ["quasi_identifiers"]),
    ("qis-null", dict(qis=None), "22023", ["quasi_identifiers"]),
    ("qi-duplicate", dict(qis=["age", "sex", "age"]), "42701", ['"age"']),
    ("t-zero", dict(t=0), "22023", ["t must"]),
    ("t-negative", dict(t=-0.1), "22023", ["t must"]),
    ("t-above-one", dict(t=1.5), "22023", ["t must"]),
    ("t-nan", dict(t=math.nan), "22023", ["t must"]),
    ("t-null", dict(t=None), "22004", ["t must"]),
    ("k-zero", dict(k=0), "22023", ["k must"]),
    ("k-negative", dict(k=-3), "22023", ["k must"]),
    ("k-above-rows", dict(k=ROWS + 1), "22023", [str(ROWS + 1), str(ROWS)]),
    ("method-unknown", dict(method="xyz"), "22023", ["xyz"]),
    ("takeout-unknown", dict(options={"takeout": "zigzag"}), "22023", ["zigzag"]),
    ("nulls-option-unknown", dict(options={"nulls": "ignore"}), "22023", ["ignore"]),
    ("search-option-unknown", dict(method="refine", options={"search": "quick"}), "22023", ["quick"]),
    ("threads-option-zero", dict(method="refine", options={"threads": 0}), "22023", ["threads", "1 to 64"]),
    ("threads-option-text", dict(method="refine", options={"threads": "2"}), "22023", ["threads"]),
    ("option-unknown", dict(options={"bogus": 1}), "22023", ["bogus"]),
    ("options-not-object", dict(options=[1, 2]), "22023", ["options"]),
    ("hierarchy-unknown", dict(options={"hierarchies": {"sex": "nope_h"}}), "42704", ["nope_h"]),
    ("hierarchy-for-other-column", dict(options={"hierarchies": {"race": "census_race"}}), "22023", ['"race"']),
    ("key-missing", dict(options={"key": "nope"}), "42703", ['"nope"']),
    ("key-not-unique", dict(options={"key": "sex"}), "22023", ['"sex"']),
    ("keep-missing", dict(options={"keep": ["nope"]}), "42703", ['"nope"']),
    ("keep-clashes", dict(options={"keep": ["age"]}), "42701", ['"age"']),
    ("weights-unknown-qi", dict(options={"weights": {"race": 1}}), "22023", ["weights"]),
    ("weights-negative", dict(options={"weights": {"age": -1}}), "22023", ["weights"]),
    ("output-is-source", dict(output="public.census"), "42P07", ["census"]),
    ("output-is-source-unqualified", dict(output="census"), "42P07", ["census"]),
    ("output-too-many-parts", dict(output="a.b.c.d"), "42602", ["a.b.c.d"]),
    ("output-three-parts", dict(output="a.b.c"), "42602", ["a.b.c"]),
    ("output-unbalanced-quote", dict(output='public."abc'), "42602", ["abc"]),
    ("output-schema-missing", dict(output="nope_schema.x"), "3F000", ["nope_schema"]),
    ("lookahead-negative", dict(options={"lookahead": -1}), "22023", ["lookahead"]),
    ("lookahead-not-integer", dict(options={"lookahead": 1.5}), "22023", ["lookahead"]),
    ("seed-not-integer", dict(options={"seed": "x"}), "22023", ["seed"]),
    ("replace-not-boolean", dict(options={"replace": "yes"}), "22023", ["replace"]),
    ("keep-not-list", dict(options={"keep": "id"}), "22023", ["keep"]),
    ("qi-null-element", dict(qis=["age", None]), "22023", ["NULL"]),
    ("weights-all-zero", dict(options={"weights": {"age": 0, "sex": 0, "education": 0}}), "22023", ["weights"]),
]


@pytest.mark.parametrize("kwargs,sqlstate,parts", [pytest.param(kw, s, p, id=i) for i, kw, s, p in CASES])
def test_bad_argument(census_db, kwargs, sqlstate, parts):
    expect_error(census_db, lambda c: call_anonymize(c, **kwargs), sqlstate, *parts)


def suggested(hint: str) -> list[str]:
    """The names a HINT suggests ("..., nearest first: a, b (5 of 9). ...")."""
    listed = hint.split("nearest first: ", 1)[1]
    listed = listed.split(" (", 1)[0].split(". ", 1)[0].rstrip(".")
    return listed.split(", ")


@pytest.mark.parametrize("kwargs,sqlstate,first", [
    pytest.param(dict(options={"hierarchies": {"marital": "census_marial"}}, qis=["age", "marital"]), "42704",
                 "census_marital", id="hierarchy"),
    pytest.param(dict(qis=["age", "educaton"]), "42703", "education", id="column"),
    pytest.param(dict(sensitive="salery"), "42703", "salary", id="sensitive"),
    pytest.param(dict(options={"keep": ["ids"]}), "42703", "id", id="keep"),
    pytest.param(dict(options={"lookahed": 2}), "22023", "lookahead", id="option"),
])
def test_hints_suggest_a_handful_of_names_nearest_first(db, kwargs, sqlstate, first):
    """An unknown name's HINT lists at most 5 candidates, the nearest first (the hierarchy HINT
    once listed 20 names alphabetically, the column HINT up to 30 in table order)."""
    for n in range(3):                                   # more hierarchies than the HINT shows
        db.execute("SELECT sabre_define_hierarchy(%s, %s)", ("zz_extra_%d" % n, "a;*\nb;*"))
    hint = expect_error(db, lambda c: call_anonymize(c, **kwargs), sqlstate).diag.message_hint
    names = suggested(hint)
    assert names[0] == first and 1 <= len(names) <= 5, hint


def test_verify_column_hint_suggests_the_nearest(db):
    call_anonymize(db, output="census_anon")
    hint = expect_error(db, lambda c: c.execute("SELECT * FROM sabre_verify('census_anon', 'salery', 0.3, 1)"),
                        "42703", "salery").diag.message_hint
    assert suggested(hint)[0] == "salary" and len(suggested(hint)) <= 5, hint


def test_unknown_method_hint_suggests_the_nearest(db):
    hint = expect_error(db, lambda c: call_anonymize(c, method="knm"), "22023", "knm").diag.message_hint
    assert hint.startswith("Did you mean 'knn'? ") and "'mondrian'" in hint


def test_source_missing_regclass_overload_is_postgres_error(db):
    # through the regclass overload the cast itself fails (PostgreSQL's own error, no HINT)
    before = state(db)
    with pytest.raises(psycopg.errors.UndefinedTable):
        call_anonymize(db, source="public.nope")
    assert state(db) == before


# --------------------------------------------------------------------------- the source's data

@pytest.mark.parametrize("column,kind", [("age", "qi"), ("sex", "qi"), ("salary", "sa")])
def test_nulls_are_an_error_then_dropped(db, column, kind):
    db.execute(sql.SQL("ALTER TABLE census ALTER {} DROP NOT NULL").format(sql.Identifier(column)))
    db.execute(sql.SQL("UPDATE census SET {} = NULL WHERE id % 100 = 0").format(sql.Identifier(column)))
    # the message names the column and the number of NULL rows
    expect_error(db, lambda c: call_anonymize(c, output="census_anon"), "22004",
                 '"%s"' % column, "20")
    res = call_anonymize(db, output="census_anon", options={"nulls": "drop"})
    assert res["rows"] == ROWS - 20
    assert db.execute("SELECT count(*) FROM census_anon").fetchone()[0] == ROWS - 20


def test_nulls_in_two_columns_are_both_named(db):
    db.execute("ALTER TABLE census ALTER age DROP NOT NULL, ALTER salary DROP NOT NULL")
    db.execute("UPDATE census SET age = NULL WHERE id % 100 = 0")
    db.execute("UPDATE census SET salary = NULL WHERE id % 250 = 0")
    expect_error(db, call_anonymize, "22004", '"age"', "20", '"salary"', "8")


def test_empty_table(db):
    db.execute("CREATE TABLE empty (id int PRIMARY KEY, age int, sex text, education int, salary int)")
    expect_error(db, lambda c: call_anonymize(c, source="public.empty"), "22023", "no rows", source="empty")


def test_only_null_rows_with_drop(db):
    db.execute("CREATE TABLE allnull (id int PRIMARY KEY, age int, sex text, education int, salary int)")
    db.execute("INSERT INTO allnull SELECT i, NULL, 'x', 1, 1 FROM generate_series(1, 10) i")
    expect_error(db, lambda c: call_anonymize(c, source="public.allnull", k=1, options={"nulls": "drop"}),
                 "22023", "no rows", source="allnull")


def test_view_without_key(db):
    db.execute("CREATE VIEW v AS SELECT * FROM census")
    expect_error(db, lambda c: call_anonymize(c, source="public.v"), "22023", "identify rows")


def test_null_key(db):
    db.execute("CREATE TABLE nk AS SELECT CASE WHEN id % 500 = 0 THEN NULL ELSE id END AS id, age, sex, "
               "education, salary FROM census")
    expect_error(db, lambda c: call_anonymize(c, source="public.nk", options={"key": "id"}),
                 "22004", '"id"', source=None)


def test_value_missing_from_hierarchy(db):
    db.execute("SELECT sabre_define_hierarchy('sex_partial', 'Male;Person;*')")
    e = expect_error(db, lambda c: call_anonymize(c, options={"hierarchies": {"sex": "sex_partial"}}),
                     "22023", '"sex"', "sex_partial", "Female")
    assert "Male" not in e.diag.message_primary


def test_sa_value_missing_from_hierarchy(db):
    db.execute("SELECT sabre_define_hierarchy('sal_partial', %s)",
               ("\n".join("%d;low;*" % v for v in range(1, 21)),))
    expect_error(db, lambda c: call_anonymize(c, options={"hierarchies": {"salary": "sal_partial"}}),
                 "22023", '"salary"', "sal_partial", "21")


@pytest.mark.parametrize("expr,sqltype", [
    ("CASE WHEN i = 5 THEN 'infinity'::date WHEN i = 9 THEN '-infinity'::date "
     "ELSE date '2000-01-01' + i END", "date"),
    ("CASE WHEN i = 5 THEN 'infinity'::timestamp ELSE timestamp '2000-01-01' + i * interval '1 hour' END",
     "timestamp"),
    ("CASE WHEN i = 5 THEN 'NaN'::numeric ELSE i / 3.0 END", "numeric"),
], ids=["date", "timestamp", "numeric"])
def test_infinite_or_nan_numerical_qi(db, expr, sqltype):
    db.execute("CREATE TABLE inf AS SELECT i AS id, (%s)::%s AS d, i %% 7 AS salary "
               "FROM generate_series(1, 300) i" % (expr, sqltype))
    db.execute("ALTER TABLE inf ADD PRIMARY KEY (id)")
    expect_error(db, lambda c: call_anonymize(c, source="public.inf", qis=["d"], k=2),
                 "22023", "non-finite", '"d"', source="inf")
    # the same table with finite values in rows 5 and 9 is anonymized
    db.execute("UPDATE inf SET d = (SELECT max(d) FROM inf WHERE id NOT IN (5, 9)) WHERE id IN (5, 9)")
    assert call_anonymize(db, source="public.inf", qis=["d"], k=2)["rows"] == 300


def test_source_changing_between_summary_and_scan(db):
    """The SA summary (GROUP BY) and the scan are two statements; if the source changes in
    between (READ COMMITTED), the frequencies differ and the run stops with 40001.  Here the
    source is a view whose SA shifts once a sequence has counted the summary's rows, so the
    scan sees other values than the summary did."""
    n = db.execute("SELECT count(*) FROM census").fetchone()[0]
    db.execute("CREATE SEQUENCE flip")
    # each full pass over the view sees the SA shifted by the parity of the pass
    db.execute("CREATE VIEW drifting AS SELECT id, age, salary + ((nextval('flip') - 1) / %d) %% 2 AS salary "
               "FROM census" % n)
    e = expect_error(db, lambda c: call_anonymize(c, source="public.drifting", qis=["age"], options={"key": "id"}),
                     "40001", "changed while sabre read it")
    assert "REPEATABLE READ" in e.diag.message_hint
    db.execute("CREATE OR REPLACE VIEW drifting AS SELECT id, age, salary::int8 AS salary FROM census")
    assert call_anonymize(db, source="public.drifting", qis=["age"], options={"key": "id"})


def test_unsupported_column_type(db):
    db.execute("CREATE TABLE js AS SELECT id, age, to_jsonb(sex) AS sex, education, salary FROM census")
    db.execute("ALTER TABLE js ADD PRIMARY KEY (id)")
    expect_error(db, lambda c: call_anonymize(c, source="public.js"), "42804", '"sex"', source="js")


# --------------------------------------------------------------------------- outputs that exist

@pytest.mark.parametrize("replace", [None, True, False])
@pytest.mark.parametrize("existing", ["other", "other_classes", "other_keys"])
def test_output_clashes_with_foreign_relation(db, existing, replace):
    db.execute(sql.SQL("CREATE TABLE {} (x int)").format(sql.Identifier(existing)))
    db.execute(sql.SQL("INSERT INTO {} VALUES (1)").format(sql.Identifier(existing)))
    opts = {} if replace is None else {"replace": replace}
    expect_error(db, lambda c: call_anonymize(c, output="public.other", options=opts), "42P07", existing)
    assert db.execute(sql.SQL("SELECT x FROM {}").format(sql.Identifier(existing))).fetchall() == [(1,)]


def test_output_clashes_with_view(db):
    db.execute("CREATE VIEW other AS SELECT 1 AS x")
    expect_error(db, lambda c: call_anonymize(c, output="other", options={"replace": True}), "42P07", "other")


def test_replace_false_on_sabre_output(db):
    call_anonymize(db, output="public.census_anon")
    e = expect_error(db, lambda c: call_anonymize(c, output="public.census_anon", options={"replace": False}),
                     "42P07", "census_anon")
    assert "replace" in e.diag.message_hint
    # replace (default true) then works
    call_anonymize(db, output="public.census_anon", options={"seed": 2})
    assert db.execute("SELECT count(*) FROM sabre.runs").fetchone()[0] == 2


def test_output_equal_to_source_of_other_sabre_run(db):
    # a table sabre made is an output, but when it is the source it is still refused
    call_anonymize(db, output="public.census_anon", options={"keep": ["id"]})
    db.execute("ALTER TABLE census_anon ADD PRIMARY KEY (id)")
    expect_error(db, lambda c: call_anonymize(
        c, source="public.census_anon", qis=["age_lo", "education_lo"], output="public.census_anon"),
        "42P07", "census_anon", source="census_anon")


@pytest.mark.parametrize("setup,kwargs", [
    pytest.param(None, dict(output="x" * 63), id="output-63-chars"),
    pytest.param(None, dict(output="x" * 58), id="output-58-chars"),
    pytest.param('CREATE TABLE "{0}" AS SELECT * FROM census; ALTER TABLE "{0}" ADD PRIMARY KEY (id)'
                 .format("y" * 60), dict(source='public."%s"' % ("y" * 60)), id="default-output-of-long-source"),
])
def test_long_output_names(db, setup, kwargs):
    """<output>_classes and <output>_keys must not collide after truncation to 63 bytes: the run
    either creates three distinct relations or refuses with a HINT and leaves nothing."""
    if setup:
        db.execute(setup)
    before = state(db)
    try:
        res = call_anonymize(db, **kwargs)
    except psycopg.Error as e:
        assert e.diag.message_hint, "no HINT for %s: %s" % (e.sqlstate, e.diag.message_primary)
        assert e.sqlstate in ("42622", "22023", "42602"), (e.sqlstate, e.diag.message_primary)
        assert state(db) == before
        return
    run = db.execute("SELECT relations FROM sabre.runs WHERE run_id = %s", (res["run_id"],)).fetchone()[0]
    oids = {db.execute("SELECT to_regclass(%s)::oid", (r,)).fetchone()[0] for r in run}
    assert len(run) == 3 and None not in oids and len(oids) == 3


# --------------------------------------------------------------------------- sabre_define_hierarchy

BAD_HIERARCHIES = [
    # id, csv, message parts
    ("ragged", "a;x;*\nb;*\n", ["row 2"]),
    ("two-roots", "a;x;*\nb;y;+\n", ["two roots", "row 2"]),
    ("leaf-two-parents", "a;x;*\nb;x;*\na;y;*\n", ["'a'", "3"]),
    ("node-two-parents", "a;x;p;*\nb;x;q;*\n", ["'x'", "two parents", "row 2"]),
    ("duplicate-leaf", "a;x;*\nb;x;*\nb;x;*\n", ["'b'", "3"]),
    ("empty-label", "a;;*\n", ["row 1"]),
]


@pytest.mark.parametrize("csv,parts", [pytest.param(c, p, id=i) for i, c, p in BAD_HIERARCHIES])
def test_malformed_hierarchy(db, csv, parts):
    e = expect_error(db, lambda c: c.execute("SELECT * FROM sabre_define_hierarchy('bad_h', %s)", (csv,)),
                     "22P04", *parts)
    assert "row" in e.diag.message_primary
    assert db.execute("SELECT count(*) FROM sabre.hierarchies WHERE name = 'bad_h'").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM sabre.hierarchy_rows WHERE hierarchy = 'bad_h'").fetchone()[0] == 0


def test_malformed_redefinition_keeps_the_old_hierarchy(db):
    db.execute("SELECT sabre_define_hierarchy('h', 'a;x;*\nb;x;*')")
    expect_error(db, lambda c: c.execute("SELECT sabre_define_hierarchy('h', 'a;x;*\nb;y;+')"),
                 "22P04", "row 2")
    assert db.execute("SELECT leaves, height, root FROM sabre.hierarchies WHERE name = 'h'").fetchone() == (2, 2, "*")


@pytest.mark.parametrize("name,csv,delimiter,part", [
    pytest.param("", "a;*", ";", "name", id="empty-name"),
    pytest.param(None, "a;*", ";", "name", id="null-name"),
    pytest.param("h", "", ";", "no rows", id="empty-csv"),
    pytest.param("h", None, ";", "no rows", id="null-csv"),
    pytest.param("h", "a;*", "", "delimiter", id="empty-delimiter"),
])
def test_define_hierarchy_bad_arguments(db, name, csv, delimiter, part):
    expect_error(db, lambda c: c.execute("SELECT sabre_define_hierarchy(%s, %s, %s)", (name, csv, delimiter)),
                 "22023", part)


# --------------------------------------------------------------------------- sabre_verify

@pytest.mark.parametrize("args,sqlstate,part", [
    pytest.param(("census", "salary", 0.0, 1, None), "22023", "t must", id="t-zero"),
    pytest.param(("census", "salary", 0.3, 0, None), "22023", "k must", id="k-zero"),
    pytest.param(("census", "salary", 0.3, 1, None), "42703", "ec_id", id="no-ec_id"),
    pytest.param(("census_anon", "nope", 0.3, 1, None), "42703", "nope", id="sa-missing"),
    pytest.param(("census_anon", "salary", 0.3, 1, "nope_h"), "42704", "nope_h", id="hierarchy-unknown"),
    pytest.param(("census_anon", "salary", 0.3, 1, "census_sex"), "22023", "census_sex", id="sa-not-in-hierarchy"),
])
def test_verify_bad_arguments(db, args, sqlstate, part):
    call_anonymize(db, output="census_anon")
    expect_error(db, lambda c: c.execute("SELECT * FROM sabre_verify(%s::regclass, %s, %s::float8, %s, %s)",
                                         args), sqlstate, part)
