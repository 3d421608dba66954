"""sabre_instant with expression statistics (options.statistics = 'create_expressions',
docs/instant.md "Expression statistics").

``pair``: y = x, both uniform over 0..63 (20,000 rows, fewer than ANALYZE's sample, so the
statistics are exact).  At k = 2000 the optimum is x and y in intervals of 8 (8 classes of
2,500 rows); independent marginals predict 64 classes of 312 rows there, so S-INSTANT on
marginals must settle for a coarser node, while the MCV list of the generalized expressions
(8 combinations at the chosen node, widths 8 and 8) predicts it right.
"""
from __future__ import annotations

import json

import psycopg
import pytest

from tests.db.helpers import expect_error, make_census, scalar

ROWS = 20_000


def instant(conn, source, qis, k, **options) -> dict:
    with conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        return cur.execute(
            "SELECT output::text AS output, output::oid AS output_oid, levels, scans, candidates_tried, "
            "predicted_probability, lm, classes FROM sabre_instant(source => %s::regclass, "
            "quasi_identifiers => %s::text[], k => %s, output => %s, options => %s::jsonb)",
            (source, qis, k, options.pop("output", None), json.dumps(options))).fetchone()


def statistics_objects(conn, table) -> int:
    return scalar(conn, "SELECT count(*) FROM pg_statistic_ext WHERE stxrelid = %s::regclass", (table,))


@pytest.fixture
def pair(pg_conn):
    pg_conn.execute("CREATE TABLE pair AS SELECT i AS id, i %% 64 AS x, i %% 64 AS y FROM generate_series(1, %d) i" % ROWS)
    pg_conn.execute("ALTER TABLE pair SET (autovacuum_enabled = false)")
    pg_conn.execute("ANALYZE pair")
    return "pair"


def test_expression_statistics_predict_the_correlated_optimum(pg_conn, pair):
    marginal = instant(pg_conn, pair, ["x", "y"], 2000, output="pair_m", statistics="marginals")
    made = instant(pg_conn, pair, ["x", "y"], 2000, output="pair_e", statistics="create_expressions")
    optimum = instant(pg_conn, pair, ["x", "y"], 2000, output="pair_o", search="exhaustive")
    assert optimum["levels"] == [3, 3] and optimum["classes"] == 8
    # the expressions' MCV list: the 8 diagonal combinations at widths 8 x 8, all the rows
    facts = pg_conn.execute("SELECT options->'instant'->'expression_statistics' FROM sabre.runs "
                            "WHERE output_oid = %s", (made["output_oid"],)).fetchone()[0]
    assert facts["level"] == [3, 3] and facts["items"] == 8 and facts["share"] == pytest.approx(1.0)
    assert facts["dropped"] and len(facts["expressions"]) == 2 and "floor" in facts["expressions"][0]
    # marginals predict 64 classes of 312 rows there: the node is not even a candidate
    assert marginal["levels"] != [3, 3] and marginal["lm"] > 2 * optimum["lm"]
    assert made["levels"] == [3, 3] and made["lm"] == pytest.approx(optimum["lm"])
    assert made["predicted_probability"] > 0.99 and made["scans"] == 1
    for r in (marginal, made):
        assert scalar(pg_conn, "SELECT count(*) FROM %s" % r["output"]) == ROWS
        assert scalar(pg_conn, "SELECT min(n) FROM (SELECT count(*) n FROM %s GROUP BY ec_id) c" % r["output"]) >= 2000
    assert statistics_objects(pg_conn, pair) == 0                 # created, read and dropped by the call


def test_categorical_hierarchy_expressions_and_a_chosen_level(pg_conn):
    census = make_census(pg_conn)
    pg_conn.execute("ANALYZE census")
    hierarchies = {c: census[c] for c in ("sex", "marital")}
    qis = ["age", "sex", "education", "marital"]
    run = instant(pg_conn, "census", qis, 25, statistics="create_expressions", hierarchies=hierarchies,
                  expression_level=[3, 0, 2, 1])
    facts = pg_conn.execute("SELECT options->'instant'->'expression_statistics' FROM sabre.runs "
                            "WHERE output_oid = %s", (run["output_oid"],)).fetchone()[0]
    assert facts["level"] == [3, 0, 2, 1] and "array_position" in facts["expressions"][1]
    assert 0 < facts["items"] <= 100 and facts["share"] > 0.9
    assert scalar(pg_conn, "SELECT min(n) FROM (SELECT count(*) n FROM census_instant GROUP BY ec_id) c") >= 25
    assert statistics_objects(pg_conn, "census") == 0
    small = instant(pg_conn, "census", qis, 25, output="census_small", statistics="create_expressions",
                    hierarchies=hierarchies, statistics_target=30)
    facts = pg_conn.execute("SELECT options->'instant'->'expression_statistics' FROM sabre.runs "
                            "WHERE output_oid = %s", (small["output_oid"],)).fetchone()[0]
    assert facts["statistics_target"] == 30 and facts["items"] <= 30 and facts["level"] != [3, 0, 2, 1]
    expect_error(pg_conn, lambda c: instant(c, "census", qis, 25, statistics="create_expressions",
                                            hierarchies=hierarchies, expression_level=[0, 5, 0, 0]),
                 "22023", "expression_level")
    expect_error(pg_conn, lambda c: instant(c, "census", qis, 25, hierarchies=hierarchies, statistics_target=50),
                 "22023", "statistics_target")


def test_nothing_left_behind_on_error_or_for_others(pg_conn, pg_connect, pair):
    # the statistics are made, then no node passes: the whole call is rolled back
    expect_error(pg_conn, lambda c: instant(c, pair, ["x", "y"], ROWS + 1, statistics="create_expressions"),
                 "22023", "not even the top of the lattice", source=pair)
    assert statistics_objects(pg_conn, pair) == 0
    pg_conn.execute("CREATE ROLE xstat_reader LOGIN")
    pg_conn.execute("GRANT SELECT ON pair TO xstat_reader")
    pg_conn.execute("GRANT USAGE ON SCHEMA sabre TO xstat_reader")
    pg_conn.execute("GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA sabre TO xstat_reader")
    other = pg_connect(user="xstat_reader")
    other.execute("SET search_path = public, sabre")
    expect_error(other, lambda c: instant(c, pair, ["x", "y"], 10, statistics="create_expressions"),
                 "42501", "only the owner", source=pair)
    assert statistics_objects(pg_conn, pair) == 0
