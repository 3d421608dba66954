"""sabre_estimate when pg_stats comes from ANALYZE's sample (docs/estimate.md, "Sampled
statistics"): the spread over resampled frequencies, ``stable`` and the hint.

ANALYZE draws its sample at random, which a test cannot repeat.  So the sampled case is made
deterministic: ANALYZE with the SA's statistics target at 50 (its 50 values all become most
common values), then the MCV frequencies in ``pg_statistic`` are replaced by those of a
15,000-row sample drawn with a fixed seed (what ANALYZE would have stored from such a sample).
The statistics then claim a sample of 300 x 50 = 15,000 of the 20,000 rows, as a real one does.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from tests.db.helpers import anonymize, make_census, run_row
from tests.db.test_estimate import K, estimate

QIS = ["age", "sex", "education"]
TARGET = 50                        # 300 x 50 = 15,000 sampled rows of 20,000
SAMPLE_SEED = 2                    # a sample whose point estimate misses the near-tie at t = 0.1, 0.15
NEAR_TIE = [0.1, 0.15]


def simulate_sample(conn, table: str, column: str, rows: int, seed: int) -> None:
    """Replace the column's MCV frequencies in pg_statistic by those of a simple random
    sample of ``rows`` rows (fixed seed); the MCV list must hold every value of the column."""
    counts = dict(conn.execute(f"SELECT {column}, count(*) FROM {table} GROUP BY 1").fetchall())
    values = sorted(counts)
    drawn = np.random.default_rng(seed).multivariate_hypergeometric([counts[v] for v in values], rows)
    frequency = dict(zip(values, (drawn / rows).tolist()))
    mcv = conn.execute("SELECT most_common_vals::text::int[] FROM pg_stats WHERE tablename = %s AND attname = %s",
                       (table, column)).fetchone()[0]
    assert sorted(mcv) == values                    # the MCV list is complete
    kinds = conn.execute("SELECT s.stakind1, s.stakind2, s.stakind3, s.stakind4, s.stakind5 FROM pg_statistic s "
                         "JOIN pg_attribute a ON a.attrelid = s.starelid AND a.attnum = s.staattnum "
                         "WHERE s.starelid = %s::regclass AND a.attname = %s", (table, column)).fetchone()
    slot = kinds.index(1) + 1                       # STATISTIC_KIND_MCV
    conn.execute(f"UPDATE pg_statistic s SET stanumbers{slot} = %s::float4[] FROM pg_attribute a "
                 "WHERE a.attrelid = s.starelid AND a.attnum = s.staattnum AND s.starelid = %s::regclass "
                 "AND a.attname = %s", ([frequency[v] for v in mcv], table, column))


@pytest.fixture
def census(pg_conn):
    hierarchies = make_census(pg_conn)
    pg_conn.execute("ANALYZE census")
    return hierarchies


def actual(conn, t, options) -> tuple:
    run = anonymize(conn, "census", QIS, "salary", t, K, options=options)
    return run_row(conn, run["run_id"])["buckets"], run["classes"]


def test_complete_statistics_have_no_spread(pg_conn, census):
    """The sample is the table (20,000 rows <= 30,000): min = max = the run's, stable."""
    options = {"hierarchies": {"sex": census["sex"]}}
    for r in estimate(pg_conn, "census", QIS, "salary", [0.15, 0.35], options=options):
        buckets, classes = actual(pg_conn, r["t"], options)
        assert r["buckets_min"] == r["buckets_max"] == r["buckets"] == buckets
        assert r["classes_min"] == r["classes_max"] == r["classes"] == classes
        assert r["stable"] is True and r["hint"] is None
        assert r["sample_rows"] == 20000 and "the whole table" in r["source_of_stats"]


def test_sampled_near_tie_is_unstable_and_its_spread_holds_the_run(pg_conn, census):
    options = {"hierarchies": {"sex": census["sex"]}}
    pg_conn.execute("ALTER TABLE census ALTER COLUMN salary SET STATISTICS %d" % TARGET)
    pg_conn.execute("ANALYZE census (salary)")
    simulate_sample(pg_conn, "census", "salary", 300 * TARGET, SAMPLE_SEED)
    rows = estimate(pg_conn, "census", QIS, "salary", NEAR_TIE, options=options)
    missed = 0
    for r in rows:
        buckets, classes = actual(pg_conn, r["t"], options)
        assert r["sample_rows"] == 300 * TARGET and "frequencies sampled" in r["source_of_stats"]
        assert r["buckets_min"] <= buckets <= r["buckets_max"], (r, buckets)
        assert r["classes_min"] <= classes <= r["classes_max"], (r, classes)
        assert r["buckets_min"] <= r["buckets"] <= r["buckets_max"] and r["buckets_min"] < r["buckets_max"]
        # the classes reported: the likeliest within 10% over point and resamples, inside their range
        assert r["classes_min"] <= r["classes"] <= r["classes_max"]
        assert r["ec_size"] == pytest.approx(20000 / r["classes"])
        assert r["stable"] is False
        target = math.ceil(20000 / 300)
        assert "Unstable estimate" in r["hint"] and "SET STATISTICS %d" % target in r["hint"], r["hint"]
        missed += r["buckets"] != buckets
    assert missed                                   # the point estimate alone misses the run here

    # what the hint says: a target whose sample covers the table makes the estimate exact
    pg_conn.execute("ALTER TABLE census ALTER COLUMN salary SET STATISTICS %d" % math.ceil(20000 / 300))
    pg_conn.execute("ANALYZE census (salary)")
    for r in estimate(pg_conn, "census", QIS, "salary", NEAR_TIE, options=options):
        buckets, classes = actual(pg_conn, r["t"], options)
        assert (r["buckets_min"], r["buckets"], r["buckets_max"]) == (buckets,) * 3
        assert (r["classes_min"], r["classes"], r["classes_max"]) == (classes,) * 3
        assert r["stable"] is True and r["sample_rows"] == 20000
