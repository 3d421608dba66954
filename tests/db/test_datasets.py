"""Database tests for sabre_pg.datasets: the CENSUS generator and the ARX loader.

Uses ``pg_conn`` (fresh database with sabre installed, see tests/conftest.py) and
``shared_dir`` (../shared/data; fails, never skips, when missing).

Tests that register hierarchies need ``sabre.sabre_define_hierarchy`` (defined by
the core SQL); they fail with an explicit message when it is not installed.
"""
from __future__ import annotations


import pytest
from psycopg import sql

from sabre_pg import datasets as ds
from tests.db.helpers import checksum

CARDINALITIES = {"age": 79, "sex": 2, "education": 17, "marital": 6, "race": 9,
                 "workclass": 10, "birthplace": 83, "salary": 50}

ADULT_COLUMNS = ["sex", "age", "race", "marital-status", "education", "native-country",
                 "workclass", "occupation", "salary-class"]


def require_define_hierarchy(conn):
    """HIERARCHY-DEPENDENT: these asserts need sabre.sabre_define_hierarchy from the core SQL."""
    if not ds.has_define_hierarchy(conn, "sabre"):
        pytest.fail("sabre.sabre_define_hierarchy(name, csv, delimiter) is not installed in the "
                    "sabre schema: the core SQL must define it before hierarchies can be registered")


def registered(conn, name: str) -> bool:
    """Whether hierarchy ``name`` is stored in sabre.hierarchies."""
    return conn.execute("SELECT EXISTS (SELECT 1 FROM sabre.hierarchies WHERE name = %s)",
                        (name,)).fetchone()[0]


def stored_leaves(conn, name: str) -> list[str]:
    """The leaves of a registered hierarchy, in pre-order."""
    return [r[0] for r in conn.execute(
        "SELECT path[1] FROM sabre.hierarchy_rows WHERE hierarchy = %s ORDER BY ord", (name,))]


# --------------------------------------------------------------------------- census

def test_census_deterministic_by_seed(pg_conn):
    a = ds.generate_census(pg_conn, table="census_a", rows=10_000, seed=7, hierarchies=False)
    ds.generate_census(pg_conn, table="census_b", rows=10_000, seed=7, hierarchies=False)
    ds.generate_census(pg_conn, table="census_c", rows=10_000, seed=8, hierarchies=False)
    assert a["rows"] == 10_000 and a["table"] == "census_a" and a["hierarchies"] == {}
    assert checksum(pg_conn, "census_a") == checksum(pg_conn, "census_b")
    assert checksum(pg_conn, "census_a") != checksum(pg_conn, "census_c")
    # a longer table with the same seed extends the shorter one (row i depends on i only)
    ds.generate_census(pg_conn, table="census_d", rows=12_000, seed=7, hierarchies=False)
    diff = pg_conn.execute("SELECT count(*) FROM census_a a JOIN census_d d USING (id) "
                           "WHERE (a.*)::text <> (d.*)::text").fetchone()[0]
    assert diff == 0


def test_census_shape_and_cardinalities(pg_conn):
    ds.generate_census(pg_conn, table="census", rows=10_000, seed=1, hierarchies=False)
    got = pg_conn.execute(
        "SELECT " + ", ".join(f"count(DISTINCT {c})" for c in CARDINALITIES) + " FROM census"
    ).fetchone()
    assert dict(zip(CARDINALITIES, got)) == CARDINALITIES
    n, lo, hi, nids = pg_conn.execute(
        "SELECT count(*), min(id), max(id), count(DISTINCT id) FROM census").fetchone()
    assert (n, lo, hi, nids) == (10_000, 1, 10_000, 10_000)
    ranges = pg_conn.execute("SELECT min(age), max(age), min(education), max(education), "
                             "min(salary), max(salary) FROM census").fetchone()
    assert ranges == (17, 95, 1, 17, 1, 50)
    # every categorical value is a leaf of its hierarchy
    for col in ds.CENSUS_CATEGORICAL:
        values = {r[0] for r in pg_conn.execute(
            sql.SQL("SELECT DISTINCT {} FROM census").format(sql.Identifier(col)))}
        assert values == set(ds.census_values(col)), col
    types = dict(pg_conn.execute(
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
        "WHERE attrelid = 'census'::regclass AND attnum > 0 AND NOT attisdropped").fetchall())
    assert types == {"id": "bigint", "age": "integer", "sex": "text", "education": "integer",
                     "marital": "text", "race": "text", "workclass": "text",
                     "birthplace": "text", "salary": "integer"}
    pk = pg_conn.execute("SELECT pg_get_constraintdef(oid) FROM pg_constraint "
                         "WHERE conrelid = 'census'::regclass AND contype = 'p'").fetchone()
    assert pk == ("PRIMARY KEY (id)",)
    analyzed = pg_conn.execute("SELECT count(*) FROM pg_stats WHERE schemaname = 'public' "
                               "AND tablename = 'census'").fetchone()[0]
    assert analyzed == 9


def test_census_correlations(pg_conn):
    ds.generate_census(pg_conn, table="census", rows=20_000, seed=3, hierarchies=False)
    q = pg_conn.execute
    low, mid, high = q("SELECT avg(salary) FILTER (WHERE education <= 6), "
                       "avg(salary) FILTER (WHERE education BETWEEN 9 AND 10), "
                       "avg(salary) FILTER (WHERE education >= 13) FROM census").fetchone()
    assert low + 2 < mid and mid + 2 < high, (low, mid, high)
    young, prime = q("SELECT avg(salary) FILTER (WHERE age < 25), "
                     "avg(salary) FILTER (WHERE age BETWEEN 40 AND 60) FROM census").fetchone()
    assert young + 5 < prime, (young, prime)
    male, female = q("SELECT avg(salary) FILTER (WHERE sex = 'Male'), "
                     "avg(salary) FILTER (WHERE sex = 'Female') FROM census").fetchone()
    assert female + 1 < male, (male, female)
    never, selfinc = q("SELECT avg(salary) FILTER (WHERE workclass = 'Never-worked'), "
                       "avg(salary) FILTER (WHERE workclass = 'Self-emp-inc') FROM census").fetchone()
    assert never + 5 < selfinc, (never, selfinc)
    single_young, single_old, widowed_old, widowed_young = q(
        "SELECT avg((marital = 'Never-married')::int) FILTER (WHERE age < 25), "
        "avg((marital = 'Never-married')::int) FILTER (WHERE age >= 50), "
        "avg((marital = 'Widowed')::int) FILTER (WHERE age >= 65), "
        "avg((marital = 'Widowed')::int) FILTER (WHERE age < 35) FROM census").fetchone()
    assert single_young > 0.6 > 0.2 > single_old
    assert widowed_old > 0.15 > 0.05 > widowed_young
    # the sensitive attribute is spread over its domain, not piled on one value
    top = q("SELECT max(c)::float / sum(c) FROM (SELECT count(*) c FROM census "
            "GROUP BY salary) s").fetchone()[0]
    assert top < 0.1


def test_census_100k_rows(pg_conn):
    """100k rows in one set-based statement (its speed is measured by benchmarks, not here)."""
    res = ds.generate_census(pg_conn, table="census_100k", rows=100_000, seed=1,
                             hierarchies=False)
    assert res["rows"] == 100_000
    assert pg_conn.execute("SELECT count(*) FROM census_100k").fetchone()[0] == 100_000


def test_census_refuses_to_overwrite(pg_conn):
    ds.generate_census(pg_conn, table="census", rows=10_000, hierarchies=False)
    before = checksum(pg_conn, "census")
    with pytest.raises(ValueError, match="already exists"):
        ds.generate_census(pg_conn, table="census", rows=10_000, seed=2, hierarchies=False)
    assert checksum(pg_conn, "census") == before
    ds.generate_census(pg_conn, table="census", rows=10_000, seed=2, hierarchies=False,
                       replace=True)
    assert checksum(pg_conn, "census") != before


def test_census_other_schema_and_quoted_name(pg_conn):
    pg_conn.execute('CREATE SCHEMA "Data Sets"')
    res = ds.generate_census(pg_conn, table="Census-X", schema="Data Sets", rows=10_000,
                             hierarchies=False)
    assert res["schema"] == "Data Sets"
    assert pg_conn.execute('SELECT count(*) FROM "Data Sets"."Census-X"').fetchone()[0] == 10_000


def test_census_missing_define_hierarchy_is_a_clear_error(pg_conn):
    with pytest.raises(RuntimeError, match="sabre_define_hierarchy"):
        ds.generate_census(pg_conn, table="census", rows=10_000, sabre_schema="no_such_schema")
    assert pg_conn.execute("SELECT to_regclass('public.census')").fetchone()[0] is None


def test_census_hierarchies_registered(pg_conn):
    # HIERARCHY-DEPENDENT (needs sabre.sabre_define_hierarchy)
    require_define_hierarchy(pg_conn)
    res = ds.generate_census(pg_conn, table="census", rows=10_000, seed=1)
    expected = {c: f"census_{c}" for c in ("sex", "marital", "race", "workclass", "birthplace")}
    assert res["hierarchies"] == expected
    for column, name in expected.items():
        assert registered(pg_conn, name), name
        assert stored_leaves(pg_conn, name) == ds.census_values(column), name
    assert not registered(pg_conn, "census_age"), "numerical columns get no hierarchy"


# --------------------------------------------------------------------------- ARX loader

def test_load_adult(pg_conn, shared_dir):
    res = ds.load_arx(pg_conn, shared_dir / "adult" / "adult.csv", hierarchies=False)
    assert res["table"] == "adult" and res["rows"] == 30_162 and res["hierarchies"] == {}
    assert list(res["columns"]) == ADULT_COLUMNS
    assert res["columns"]["age"] == "integer"
    assert all(t == "text" for c, t in res["columns"].items() if c != "age")
    assert pg_conn.execute("SELECT count(*), min(id), max(id) FROM adult").fetchone() == (
        30_162, 1, 30_162)
    # quoted names with dashes work; the first row is the file's first data line
    first = pg_conn.execute('SELECT sex, age, "marital-status", "native-country", "salary-class" '
                            "FROM adult WHERE id = 1").fetchone()
    assert first == ("Male", 39, "Never-married", "United-States", "<=50K")
    assert pg_conn.execute('SELECT count(DISTINCT "marital-status") FROM adult').fetchone()[0] == 7
    # no carriage returns leaked from the CRLF file
    assert pg_conn.execute("SELECT count(*) FROM adult WHERE \"salary-class\" LIKE '%' || chr(13)"
                           ).fetchone()[0] == 0
    pk = pg_conn.execute("SELECT pg_get_constraintdef(oid) FROM pg_constraint "
                         "WHERE conrelid = 'adult'::regclass AND contype = 'p'").fetchone()
    assert pk == ("PRIMARY KEY (id)",)


def test_load_adult_hierarchies(pg_conn, shared_dir):
    # HIERARCHY-DEPENDENT (needs sabre.sabre_define_hierarchy)
    require_define_hierarchy(pg_conn)
    res = ds.load_arx(pg_conn, shared_dir / "adult" / "adult.csv")
    assert res["rows"] == 30_162
    assert res["hierarchies"] == {c: f"adult_{c}" for c in ADULT_COLUMNS}
    assert len(res["hierarchies"]) == 9
    for name in res["hierarchies"].values():
        assert registered(pg_conn, name), name


def test_load_refuses_to_overwrite(pg_conn, shared_dir):
    csv_path = shared_dir / "adult" / "adult.csv"
    ds.load_arx(pg_conn, csv_path, table="a1", hierarchies=False)
    with pytest.raises(ValueError, match="already exists"):
        ds.load_arx(pg_conn, csv_path, table="a1", hierarchies=False)
    res = ds.load_arx(pg_conn, csv_path, table="a1", hierarchies=False, replace=True)
    assert res["rows"] == 30_162
    assert pg_conn.execute("SELECT count(*) FROM a1").fetchone()[0] == 30_162


def test_load_li2007(pg_conn, shared_dir):
    res = ds.load_arx(pg_conn, shared_dir / "li2007" / "test2.csv", table="Li2007",
                      hierarchies=False)
    assert res["rows"] == 9
    assert res["columns"] == {"ZIPCode": "integer", "Age": "integer", "Salary": "integer",
                              "Disease": "text"}
    assert pg_conn.execute('SELECT sum("Salary"), count(DISTINCT "Disease") FROM "Li2007"'
                           ).fetchone() == (63, 6)


def test_load_types_nulls_and_existing_id(pg_conn, tmp_path):
    f = tmp_path / "mixed.csv"
    f.write_text("id;zip;score;name;empty\n10;01234;1.5;a b;\n20;47677;2;\"x;y\";\n")
    res = ds.load_arx(pg_conn, f)
    assert res["columns"] == {"id": "integer", "zip": "text", "score": "numeric",
                              "name": "text", "empty": "text"}
    rows = pg_conn.execute("SELECT id, zip, score::text, name, empty FROM mixed ORDER BY id"
                           ).fetchall()
    assert rows == [(10, "01234", "1.5", "a b", None), (20, "47677", "2", "x;y", None)]


def test_load_hierarchy_dir_and_delimiter(pg_conn, tmp_path):
    # HIERARCHY-DEPENDENT (needs sabre.sabre_define_hierarchy)
    require_define_hierarchy(pg_conn)
    data = tmp_path / "data"
    hier = tmp_path / "hier"
    data.mkdir()
    hier.mkdir()
    (data / "t.csv").write_text("city,pop\nParis,2\nLyon,1\n")
    (hier / "t_hierarchy_city.csv").write_text("Paris,France,*\nLyon,France,*\n")
    res = ds.load_arx(pg_conn, data / "t.csv", hierarchy_dir=hier, table="towns", delimiter=",")
    assert res["hierarchies"] == {"city": "towns_city"}
    assert registered(pg_conn, "towns_city")
    assert stored_leaves(pg_conn, "towns_city") == ["Paris", "Lyon"]


def test_load_missing_define_hierarchy_is_a_clear_error(pg_conn, shared_dir):
    with pytest.raises(RuntimeError, match="sabre_define_hierarchy"):
        ds.load_arx(pg_conn, shared_dir / "adult" / "adult.csv", sabre_schema="no_such_schema")
    assert pg_conn.execute("SELECT to_regclass('public.adult')").fetchone()[0] is None


def test_cli_hooks(pg_conn, shared_dir, capsys):
    from argparse import Namespace

    res = ds.cli_gen(Namespace(table="cg", rows=10_000, seed=5, schema="public", replace=False,
                               no_hierarchies=True, sabre_schema="sabre"), pg_conn)
    assert res["rows"] == 10_000
    assert "cg" in capsys.readouterr().out
    res = ds.cli_load(Namespace(csv=str(shared_dir / "li2007" / "test2.csv"), hierarchies=None,
                                table="cl", delimiter=";", schema="public", replace=False,
                                no_hierarchies=True, sabre_schema="sabre"), pg_conn)
    assert res["rows"] == 9
    from sabre_pg.errors import SabreError

    with pytest.raises(SabreError, match="already exists"):
        ds.cli_gen(Namespace(table="cg", rows=10_000, seed=5, no_hierarchies=True), pg_conn)
