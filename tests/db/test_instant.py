"""sabre_instant (S-INSTANT) against the data it publishes (docs/instant.md).

The census-like table has fewer rows than ANALYZE's sample, so its statistics are exact and
the runs deterministic; the stale-statistics tests change the table after ANALYZE (with
autovacuum off for it) so that the prediction is wrong and only the validation stands.
"""
from __future__ import annotations

import json

import psycopg
import pytest

from tests.db.helpers import expect_error, make_census, scalar

QIS = ["age", "sex", "education", "marital"]


def instant(conn, k, l=None, sensitive=None, max_suppressed=0.0, output=None, qis=QIS, **options) -> dict:
    with conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        return cur.execute(
            "SELECT output::text AS output, output::oid AS output_oid, levels, scans, candidates_tried, "
            "predicted_probability, suppressed, lm, classes, seconds FROM sabre_instant(source => 'census', "
            "quasi_identifiers => %s::text[], k => %s, l => %s, sensitive => %s, max_suppressed => %s, "
            "output => %s, options => %s::jsonb)",
            (qis, k, l, sensitive, max_suppressed, output, json.dumps(options))).fetchone()


def verify(conn, output, k, l=None, sensitive=None) -> dict:
    with conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        return cur.execute("SELECT * FROM sabre_verify(%s::regclass, %s, NULL, %s, NULL, %s)",
                           (output, sensitive, k, l)).fetchone()


@pytest.fixture
def census(pg_conn):
    hierarchies = make_census(pg_conn)
    pg_conn.execute("ALTER TABLE census SET (autovacuum_enabled = false)")
    pg_conn.execute("ANALYZE census")
    return {"hierarchies": {c: hierarchies[c] for c in ("sex", "marital")}}


def test_k_anonymous_output_as_good_as_the_optimum_in_few_scans(pg_conn, census):
    optimum = instant(pg_conn, 10, output="census_optimum", search="exhaustive", **census)
    run = instant(pg_conn, 10, **census)
    assert run["output"] == "census_instant" and len(run["levels"]) == 4
    assert run["scans"] <= 2 and run["candidates_tried"] >= run["scans"]
    assert optimum["scans"] > 10 * run["scans"]
    assert optimum["lm"] - 1e-12 <= run["lm"] <= optimum["lm"] * 1.05 and 0 <= optimum["lm"] <= 1
    if run["levels"] == optimum["levels"]:          # a batch reports each node's own LM
        assert run["lm"] == pytest.approx(optimum["lm"])
    assert run["suppressed"] == 0 and 0 <= run["predicted_probability"] <= 1
    for r in (run, optimum):
        checked = verify(pg_conn, r["output"], 10)
        assert checked["violations"] == 0 and checked["classes"] == r["classes"]
        assert checked["min_class_size"] >= 10 and checked["max_emd"] is None
        assert scalar(pg_conn, "SELECT count(*) FROM %s" % r["output"]) == 20_000
    # the generalized columns: ranges for numerical QIs, hierarchy labels for the others
    columns = [r[0] for r in pg_conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = 'census_instant'::regclass AND attnum > 0 ORDER BY attnum")]
    assert columns == ["ec_id", "age_lo", "age_hi", "sex", "education_lo", "education_hi", "marital"]
    assert scalar(pg_conn, "SELECT count(*) FROM census_instant i WHERE age_lo > age_hi") == 0
    recorded = pg_conn.execute(
        "SELECT method, k, rows, classes, options->'instant'->>'scans', output_oid FROM sabre.runs "
        "WHERE output_oid = %s", (run["output_oid"],)).fetchone()
    assert recorded[:4] == ("instant", 10, 20_000, run["classes"]) and int(recorded[4]) == run["scans"]
    assert scalar(pg_conn, "SELECT count(*) FROM sabre.outputs WHERE output = 'census_instant'::regclass") == 1


def test_l_diverse_and_suppression(pg_conn, census):
    run = instant(pg_conn, 10, l=4, sensitive="salary", **census)
    checked = verify(pg_conn, "census_instant", 10, 4, "salary")
    assert checked["violations"] == 0 and checked["classes"] == run["classes"]
    strict = instant(pg_conn, 50, output="census_strict", **census)
    loose = instant(pg_conn, 50, max_suppressed=0.02, output="census_loose", **census)
    assert 0 < loose["suppressed"] <= 400 and loose["lm"] <= strict["lm"]
    assert scalar(pg_conn, "SELECT count(*) FROM census_loose") == 20_000 - loose["suppressed"]
    assert verify(pg_conn, "census_loose", 50)["violations"] == 0


@pytest.mark.parametrize("change", [
    "DELETE FROM census WHERE id % 20 <> 0",                             # 1,000 rows left
    "UPDATE census SET age = 17 + (id % 3) * 30, marital = 'Widowed' WHERE id % 4 <> 0",
])
def test_stale_statistics_never_give_a_violating_output(pg_conn, census, change):
    pg_conn.execute(change)
    run = instant(pg_conn, 25, l=3, sensitive="salary", max_suppressed=0.01, **census)
    rows = scalar(pg_conn, "SELECT count(*) FROM census")
    assert run["suppressed"] <= 0.01 * rows
    assert scalar(pg_conn, "SELECT count(*) FROM census_instant") == rows - run["suppressed"]
    assert verify(pg_conn, "census_instant", 25, 3, "salary")["violations"] == 0


def test_errors(pg_conn, census):
    expect_error(pg_conn, lambda c: instant(c, 10), "42704", 'quasi-identifier "sex"', "no hierarchy")
    expect_error(pg_conn, lambda c: instant(c, 30_000, **census), "22023", "not even the top of the lattice")
    expect_error(pg_conn, lambda c: instant(c, 10, l=2, **census), "22023", "l needs a sensitive attribute")
    expect_error(pg_conn, lambda c: instant(c, 10, max_suppressed=1.5, **census), "22023", "max_suppressed")
    expect_error(pg_conn, lambda c: instant(c, 10, statistics="extended", **census), "55000",
                 "no extended statistics")
    pg_conn.execute("CREATE TABLE fresh AS SELECT * FROM census")
    expect_error(pg_conn, lambda c: c.execute(
        "SELECT * FROM sabre_instant('fresh', ARRAY['age', 'education'], 10)"), "55000", "has no statistics")


def test_extended_statistics_are_created_and_used(pg_conn, census):
    run = instant(pg_conn, 10, output="census_mcv", statistics="create", **census)
    assert scalar(pg_conn, "SELECT count(*) FROM pg_statistic_ext WHERE stxrelid = 'census'::regclass") == 1
    assert verify(pg_conn, "census_mcv", 10)["violations"] == 0 and run["scans"] <= 2


def test_created_statistics_rerun_sends_no_notice(pg_conn, census):
    """A second run with statistics = 'create' finds the statistics object in place, silently
    (its CREATE STATISTICS IF NOT EXISTS once sent 'already exists, skipping')."""
    notices = []
    pg_conn.add_notice_handler(lambda d: notices.append(d.message_primary))
    for output in ("census_mcv_1", "census_mcv_2"):
        instant(pg_conn, 8, output=output, statistics="create", **census)
    assert scalar(pg_conn, "SELECT count(*) FROM pg_statistic_ext WHERE stxrelid = 'census'::regclass") == 1
    assert notices == []


def test_verify_l_and_k_alone(pg_conn):
    pg_conn.execute("CREATE TABLE classes (ec_id int, sa text)")
    pg_conn.execute("INSERT INTO classes VALUES (1, 'a'), (1, 'b'), (1, 'c'), (2, 'a'), (2, 'a'), (2, 'b'), (3, 'z')")
    assert verify(pg_conn, "classes", 2)["violations"] == 1                      # class 3: one row
    assert verify(pg_conn, "classes", 1, 2, "sa")["violations"] == 1             # class 3: one value
    assert verify(pg_conn, "classes", 1, 3, "sa")["violations"] == 2
    row = pg_conn.execute("SELECT * FROM sabre_verify('classes', 'sa', t => NULL)").fetchone()
    assert row == (3, 0, None, 1)
    row = pg_conn.execute("SELECT * FROM sabre_verify('classes', NULL, t => NULL, k => 2)").fetchone()
    assert row == (3, 1, None, 1)
