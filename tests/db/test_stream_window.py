"""The 'window' engine in the database (issue #28, docs/streams.md "Engines"): a new stream
partitions a window only when none of its rows is published (D = 0), publishes the classes
holding expiring rows and then, advance by advance, the classes of that partition whose rows
expire (case 3, generated from the last DIRECT's window); verify is clean, every class within t
of its generating window, and the output is the core's."""
from __future__ import annotations

import json

import pytest

from sabre_pg.core import window as W
from tests.db.helpers import scalar
from tests.db.test_stream import add_rows, advance, assert_clean, create, make_source, verify
from tests.db.test_stream_refine import core_log, published_log


def test_window_engine_cases_and_generating_windows(pg_conn):
    make_source(pg_conn, 1600, shift_at=700)
    create(pg_conn, window_size=400, step=100, t=0.1, k=4)
    assert pg_conn.execute("SELECT engine FROM sabre.streams WHERE name = 'adm_w'").fetchone()[0] == "window"
    rows = advance(pg_conn)
    assert [r["case_no"] for r in rows if r["case_no"] == 2] and len(rows) == 12
    direct = [r["advance_no"] for r in rows if r["case_no"] == 2]
    assert direct[:3] == [1, 5, 9]
    assert all(r["d"] == 0 for r in rows if r["case_no"] == 2)
    for r in rows:
        if r["case_no"] != 3:
            continue
        last = max(a for a in direct if a < r["advance_no"])
        windows = pg_conn.execute("SELECT DISTINCT window_first FROM admissions_sabre_w WHERE advance_no = %s",
                                  (r["advance_no"],)).fetchall()
        assert windows == [((last - 1) * 100 + 1,)]
    v = verify(pg_conn)
    assert_clean(v, 1200)
    assert v["max_emd"] <= 0.1 and v["min_class_size"] >= 4


def test_window_engine_resumes_across_calls_as_the_core_runs_it(pg_conn):
    """Advances split over calls (rows arriving in between) publish what the core publishes in
    one run over the same rows."""
    make_source(pg_conn, 700)
    create(pg_conn, qis=("age", "zip"))
    advance(pg_conn, max_advances=1)
    advance(pg_conn)
    add_rows(pg_conn, 300)
    advance(pg_conn)
    assert published_log(pg_conn) == core_log(pg_conn, W.sabre_partition("refine"), 1000, defer=True)
    assert_clean(verify(pg_conn), 600)


@pytest.mark.parametrize("hierarchy", [False, True])
def test_case_3_reads_only_what_it_publishes_and_publishes_the_source_values(pg_conn, hierarchy):
    """A text SA (flat, or under a hierarchy) and options.keep: the advances of case 3 read only
    the rows they publish, every class's SA values and kept column are exactly its rows' in the
    source, and its generalization holds its rows' QIs."""
    options = {"keep": ["note"]}
    if hierarchy:
        pg_conn.execute("SELECT * FROM sabre_define_hierarchy('dx_h', $$a1;a;*\na2;a;*\nb1;b;*\nb2;b;*$$)")
        options["hierarchies"] = {"dx": "dx_h"}
    pg_conn.execute("CREATE TABLE visits (id int PRIMARY KEY, age int NOT NULL, zip int NOT NULL, dx text NOT NULL, "
                    "note text)")
    pg_conn.execute("INSERT INTO visits SELECT g, 20 + (g * 13) % 53, (g * 17) % 31, "
                    "(ARRAY['a1','a2','b1','b2'])[1 + (g * 7) % 4], 'n' || g FROM generate_series(1, 1200) g")
    create(pg_conn, name="v_w", source="visits", qis=("age", "zip"), sensitive="dx", window_size=400, step=100,
           t=0.3, k=3, options=json.dumps(options))
    cases = [r["case_no"] for r in advance(pg_conn, "v_w")]
    assert 3 in cases and cases[0] == 2
    for a, b in (("visits_sabre_w", "keyed"), ("keyed", "visits_sabre_w")):
        assert scalar(pg_conn, "WITH keyed AS (SELECT k.ec_id, v.dx, v.note FROM visits_sabre_w_keys k JOIN visits v "
                               "ON v.id = k.key) SELECT count(*) FROM (SELECT ec_id, dx, note FROM %s EXCEPT ALL "
                               "SELECT ec_id, dx, note FROM %s) x" % (a, b)) == 0
    assert scalar(pg_conn, "SELECT count(*) FROM visits_sabre_w_keys k JOIN visits v ON v.id = k.key "
                           "JOIN visits_sabre_w_classes c USING (ec_id) WHERE NOT (v.age BETWEEN c.age_lo AND "
                           "c.age_hi AND v.zip BETWEEN c.zip_lo AND c.zip_hi)") == 0     # each row in its box
    assert_clean(verify(pg_conn, "v_w"), 800)
