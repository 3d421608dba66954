"""sabre_estimate's method (issue #28): the default is sabre_anonymize's ('refine'), whose row
gives bounds on the classes that hold for the run, says which method it is about, and never
claims stability; 'ak' is SABRE's plan, exact and stable when the statistics cover the
table; an unknown method is refused."""
from __future__ import annotations

import psycopg
import pytest

from tests.db.helpers import anonymize, expect_error, make_census

QIS = ["age", "sex", "education"]
K = 6


@pytest.fixture
def census(pg_conn):
    hierarchies = make_census(pg_conn, rows=3000)
    pg_conn.execute("ANALYZE census")
    return hierarchies


def rows(conn, t, method=None, k=K):
    extra, args = ("", []) if method is None else (", method => %s", [method])
    with conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        return cur.execute("SELECT * FROM sabre_estimate(source => 'census'::regclass, quasi_identifiers => %s::text[], "
                           "sensitive => 'salary', t => %s::float8[], k => %s" + extra + ")",
                           [QIS, t, k] + args).fetchall()


@pytest.mark.parametrize("method", [None, "refine", "mondrian"])
def test_partitioning_methods_get_bounds_that_hold(pg_conn, census, method):
    got = rows(pg_conn, [0.2, 0.35], method)
    assert [r["method"] for r in got] == [method or "refine"] * 2
    for r in got:
        assert r["classes"] is None and r["buckets"] is None and r["stable"] is False and r["feasible"]
        assert r["classes_min"] == 1 and r["classes_max"] <= 3000 // K
        assert "bounds" in r["hint"] and "method => 'ak'" in r["hint"]
        run = anonymize(pg_conn, "census", QIS, "salary", r["t"], K, method or "refine", "census_out",
                        {"replace": True})
        assert r["classes_min"] <= run["classes"] <= r["classes_max"]


def test_ak_is_sabre_plan_exact_when_statistics_cover_the_table(pg_conn, census):
    got = rows(pg_conn, [0.2, 0.35], "ak")                   # 3000 rows: the sample is the table
    for r in got:
        run = anonymize(pg_conn, "census", QIS, "salary", r["t"], K, "ak", "census_ak", {"replace": True})
        assert r["method"] == "ak" and r["stable"] is True and r["classes"] == run["classes"]
        assert r["classes_min"] == r["classes_max"] == r["classes"]


def test_unknown_method_and_k_beyond_the_rows(pg_conn, census):
    expect_error(pg_conn, lambda c: rows(c, [0.3], "tmondrian"), "22023", "unknown method")
    r = rows(pg_conn, [0.3], "refine", k=5000)[0]
    assert r["feasible"] is False and r["classes"] == 0 and "exceeds" in r["hint"]


def test_stable_holds_on_a_sampled_table_and_covering_statistics_are_exact(pg_conn):
    """12,000 rows: with statistics target 5 ANALYZE samples 1,500 of them, and an estimate it
    calls stable is within 10% of the run; with target 40 the sample is the table, and the
    estimate is the run's class count, stable, with no spread."""
    make_census(pg_conn, table="census", rows=12_000, seed=3)
    ts = [0.15, 0.25, 0.35, 0.45]
    made = {t: anonymize(pg_conn, "census", QIS, "salary", t, K, "ak", "census_ak", {"replace": True})["classes"]
            for t in ts}
    pg_conn.execute("ALTER TABLE census ALTER COLUMN salary SET STATISTICS 5")
    for _ in range(3):
        pg_conn.execute("ANALYZE census")
        for r in rows(pg_conn, ts, "ak"):
            assert r["sample_rows"] == 1500
            if r["stable"]:
                assert abs(r["classes"] - made[r["t"]]) <= 0.1 * made[r["t"]], r
            else:
                assert "Unstable estimate" in r["hint"] and "SET STATISTICS 40" in r["hint"]
    pg_conn.execute("ALTER TABLE census ALTER COLUMN salary SET STATISTICS 40")
    pg_conn.execute("ANALYZE census")
    for r in rows(pg_conn, ts, "ak"):
        assert r["stable"] is True and r["classes"] == made[r["t"]] == r["classes_min"] == r["classes_max"]
