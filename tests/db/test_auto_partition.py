"""Automatic partitions (issue 26, docs/scale-out.md "Automatic partitions"): a plain
sabre_anonymize call over more rows than options.auto_partition_rows goes in parts by itself,
so no backend holds the whole table.  The threshold is forced small here (a few thousand rows)
instead of running a table of millions; every output is checked by sabre_verify (the
independent exact EMD against the whole output, which holds every source row exactly once)
and by the exact generalization check against the source."""
from __future__ import annotations

import json
import math

import pytest
from psycopg import sql

from tests.db.helpers import anonymize, check_exact_generalization, checksum, expect_error, ident, relations, \
    run_row, scalar, verify
from tests.db.test_partitioned import K, QIS, ROWS, T, census  # noqa: F401 (the census fixture)

LIMIT = 1200                 # auto_partition_rows: parts of at most this many rows


def check_every_row_once(conn, output, res, hierarchies):
    """t-close and k-anonymous by sabre_verify; each source row once in the side table, each
    class's output rows as many as its side-table keys, the generalization exact."""
    checked = verify(conn, output, "salary", T, K)
    assert checked["violations"] == 0 and checked["min_class_size"] >= K and checked["max_emd"] <= T
    assert checked["classes"] == res["classes"] and res["rows"] == ROWS
    assert scalar(conn, sql.SQL("SELECT count(*) FROM {}").format(ident(output))) == ROWS
    keys = ident(output + "_keys")
    assert scalar(conn, sql.SQL("SELECT count(DISTINCT k.key) FROM {} k JOIN public.census s ON s.id = k.key")
                  .format(keys)) == ROWS == scalar(conn, sql.SQL("SELECT count(*) FROM {}").format(keys))
    assert scalar(conn, sql.SQL(
        "SELECT count(*) FROM (SELECT ec_id, count(*) FROM {} GROUP BY 1 EXCEPT SELECT ec_id, count(*) FROM {} "
        "GROUP BY 1) x").format(ident(output), keys)) == 0
    check_exact_generalization(conn, output, "public.census", hierarchies=hierarchies)
    assert not [r for r in relations(conn) if r[1].startswith("sabre_part_")]


def test_plain_call_over_the_threshold_goes_in_parts(pg_conn, census):
    before = checksum(pg_conn, ident("public.census"))
    notices = []
    pg_conn.add_notice_handler(lambda d: notices.append(d.message_primary))
    opts = {"hierarchies": census, "auto_partition_rows": LIMIT}
    res = anonymize(pg_conn, "public.census", QIS, "salary", T, K, "refine", "public.census_auto", opts)
    assert notices == []                       # said in sabre.runs, not by a NOTICE
    check_every_row_once(pg_conn, "public.census_auto", res, census)
    run = run_row(pg_conn, res["run_id"])
    assert run["partitions"]["automatic"] is True and run["partitions"]["auto_partition_rows"] == LIMIT
    assert run["partitions"]["parts"] >= math.ceil(ROWS / LIMIT)
    # the options are recorded as given (a refresh decides again), the method is the caller's
    assert run["options"] == opts and run["method"] == "refine"
    assert "partition" in run["phases"] and run["rows"] == ROWS
    assert checksum(pg_conn, ident("public.census")) == before


def test_parts_are_cut_to_the_threshold(pg_conn, census):
    """Any method goes in parts, at least ceil(rows / threshold) of them (the split goes on
    past that while a part it can cut is larger than the threshold)."""
    opts = {"hierarchies": census, "auto_partition_rows": ROWS // 5}
    res = anonymize(pg_conn, "public.census", QIS, "salary", T, K, "ak", "public.census_auto5", opts)
    check_every_row_once(pg_conn, "public.census_auto5", res, census)
    parts = run_row(pg_conn, res["run_id"])["partitions"]["parts"]
    assert parts >= 5


def test_below_the_threshold_is_one_piece(pg_conn, census):
    """At or under the threshold (and with 0, never) the run is the plain one: no partitions
    recorded, and the same classes as with automatic partitions switched off."""
    outs = {}
    for name, rows in (("census_one", ROWS), ("census_never", 0)):
        res = anonymize(pg_conn, "public.census", QIS, "salary", T, K, "refine", "public." + name,
                        {"hierarchies": census, "auto_partition_rows": rows, "seed": 3})
        assert run_row(pg_conn, res["run_id"])["partitions"] is None
        outs[name] = pg_conn.execute(sql.SQL("SELECT md5(string_agg(x::text, ',' ORDER BY x::text)) FROM "
                                             "(SELECT ec_id, size, emd FROM {}) x").format(
                                                 ident("public.%s_classes" % name))).fetchone()[0]
    assert outs["census_one"] == outs["census_never"]


def test_explicit_partitions_are_recorded_as_not_automatic(pg_conn, census):
    res = anonymize(pg_conn, "public.census", QIS, "salary", T, K, "ak", "public.census_three",
                    {"hierarchies": census, "partitions": 3})
    run = run_row(pg_conn, res["run_id"])
    assert run["partitions"] == {"parts": 3, "automatic": False} and run["options"]["partitions"] == 3


def test_several_sas_stay_in_one_piece(pg_conn, census):
    """The several-SA overload has no partitioned mode: it runs whole, whatever the threshold."""
    with pg_conn.cursor() as cur:
        cur.execute("SELECT run_id FROM sabre_anonymize(source => 'public.census'::regclass, quasi_identifiers => "
                    "%s, sensitive => ARRAY['salary', 'race'], t => ARRAY[0.4, 0.4]::float8[], k => 5, "
                    "output => 'public.census_multi', options => %s::jsonb)",
                    (["age", "education"], json.dumps({"auto_partition_rows": LIMIT})))
        run = run_row(pg_conn, cur.fetchone()[0])
    assert run["partitions"] is None and run["rows"] == ROWS


@pytest.mark.parametrize("value", [-1, "1000", 1.5, True])
def test_bad_threshold(pg_conn, census, value):
    expect_error(pg_conn, lambda c: anonymize(c, "public.census", QIS, "salary", T, K, "refine",
                                            "public.census_bad", {"auto_partition_rows": value}),
                 "22023", "auto_partition_rows")


def test_progress_of_an_automatic_split_keeps_going_up(pg_conn, census):
    """docs/progress.md: 13 steps until summary decides to split, then a partitioned run's 7;
    the step never goes back and the last event is 7/7."""
    from sabre_pg.core.stopwatch import parse_progress

    seen = []
    pg_conn.add_notice_handler(lambda d: seen.append(parse_progress(d.message_primary or "")))
    pg_conn.execute("SET sabre.progress = on")
    anonymize(pg_conn, "public.census", QIS, "salary", T, K, "refine", "public.census_auto_progress",
              {"hierarchies": census, "auto_partition_rows": LIMIT})
    pg_conn.execute("RESET sabre.progress")
    events = [e for e in seen if e]
    steps = [e["step"] for e in events]
    assert steps == sorted(steps), [(e["phase"], e["event"], e["step"], e["steps"]) for e in events]
    assert events[-1]["step"] == events[-1]["steps"] == 7 and events[-1]["phase"] == "swap"
    assert {e["steps"] for e in events if e["step"] >= 3} == {7}
