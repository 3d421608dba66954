"""End-to-end tests of the SQL API: sabre_anonymize, sabre_verify and the run catalog.

Every test gets a fresh database with sabre installed (``pg_conn``, see tests/conftest.py).
Data: the CENSUS-like generator (20k rows) and Adult loaded through the CLI
(``python -m sabre_pg.cli load``) with its ARX hierarchies (``shared_dir``).

The output contract checked here (see sql/20_api.sql):
``<output>``: ec_id bigint, ``<qi>_lo``/``<qi>_hi`` in the source type per numerical QI,
``<qi>`` text (a hierarchy node) per categorical QI, the SA unchanged, the ``keep`` columns;
``<output>_classes``: ec_id, size, emd + the generalized columns; side table
``<output>_keys`` (key, bucket, hilbert_key, ec_id), with a btree on (bucket, hilbert_key) for 'ak' and 'knn';
one ``sabre.runs`` row per successful run.
"""
from __future__ import annotations

import re
import subprocess
import sys
import threading

import pytest
from psycopg import sql

from sabre_pg import datasets as ds
from tests.db.helpers import (CENSUS_ROWS, anonymize, checksum, columns, count, expect_error, ident,
                              make_census, relations, run_row, scalar, verify)

METHODS = ["ak", "knn"]
CENSUS_QIS = ds.CENSUS_QIS
ADULT_QIS = ["age", "sex", "race", "marital-status", "education", "native-country", "workclass"]
EPS = 1e-9


# --------------------------------------------------------------------------- helpers

def load_adult(conn, dsn, shared_dir) -> None:
    adult = shared_dir / "adult"
    subprocess.run([sys.executable, "-m", "sabre_pg.cli", "load", str(adult / "adult.csv"),
                    "--hierarchies", str(adult), "--table", "adult", "--dsn", dsn],
                   check=True, capture_output=True, text=True)


# --------------------------------------------------------------------------- the full contract

def check_output_contract(conn, *, source, output, qis, sensitive, t, k, method, hierarchies,
                          res, before_checksum, sa_hierarchy=None):
    """Every property of a successful run's output, classes, side table and catalog row."""
    src, out = ident(source), ident(output)
    schema, name = output.split(".", 1)
    classes = sql.Identifier(schema, name + "_classes")
    n_source = count(conn, src)
    src_types = dict(columns(conn, src))
    numerical = [q for q in qis if q not in hierarchies and src_types[q] in
                 ("integer", "bigint", "smallint", "numeric", "double precision", "real", "date")]
    categorical = [q for q in qis if q not in numerical]

    # the source is unchanged
    assert checksum(conn, src) == before_checksum

    # the returned row
    assert res["output_oid"] == scalar(conn, "SELECT %s::regclass::oid", (out.as_string(conn),))
    assert res["rows"] == n_source
    assert res["classes"] == scalar(conn, sql.SQL("SELECT count(DISTINCT ec_id) FROM {}").format(out))
    assert res["min_class_size"] >= k
    assert res["min_class_size"] == scalar(conn, sql.SQL(
        "SELECT min(n) FROM (SELECT count(*) AS n FROM {} GROUP BY ec_id) g").format(out))
    assert 0 <= res["max_emd"] <= t + EPS
    assert res["ail"] is not None and 0 <= res["ail"] <= 1 + EPS
    assert res["seconds"] > 0

    # sabre_verify recomputes everything from the relation alone
    v = verify(conn, out.as_string(conn), sensitive, t, k, sa_hierarchy)
    assert v["violations"] == 0
    assert v["classes"] == res["classes"]
    assert v["min_class_size"] == res["min_class_size"]
    assert v["max_emd"] == pytest.approx(res["max_emd"], abs=1e-9)

    # output columns: names and types ("id" is there when the run kept it)
    kept_id = "id" in dict(columns(conn, out))
    expected = [("ec_id", "bigint")]
    for q in qis:
        if q in numerical:
            expected += [(q + "_lo", src_types[q]), (q + "_hi", src_types[q])]
        else:
            expected.append((q, "text"))
    expected += [(sensitive, src_types[sensitive])] + ([("id", src_types["id"])] if kept_id else [])
    assert columns(conn, out) == expected
    gen_cols = [c for c, _ in expected[1:len(expected) - (2 if kept_id else 1)]]
    assert [c for c, _ in columns(conn, classes)] == ["ec_id", "size", "emd"] + gen_cols
    keys = run_row(conn, res["run_id"])["keys_table"]
    kt = sql.SQL(keys)

    # row count, every source key exactly once (in the output when kept, else in the side table)
    assert count(conn, out) == n_source
    assert scalar(conn, sql.SQL(
        "SELECT count(*) FROM {} s FULL JOIN (SELECT id, count(*) AS n FROM {} GROUP BY id) o "
        "USING (id) WHERE o.n IS DISTINCT FROM 1 OR s.id IS NULL").format(
            src, out if kept_id else sql.SQL("(SELECT key AS id FROM {}) AS k").format(kt))) == 0
    # per source row: its output row, or (not kept) its class through the side table
    per_row = out if kept_id else sql.SQL(
        "(SELECT k.key AS id, c.* FROM {} k JOIN {} c USING (ec_id))").format(kt, classes)

    # numerical: _lo <= _hi, and the source value lies in its class's range
    for q in numerical:
        lo, hi, col = sql.Identifier(q + "_lo"), sql.Identifier(q + "_hi"), sql.Identifier(q)
        assert count(conn, out, sql.SQL("{} IS NULL OR {} IS NULL OR {} > {}").format(lo, hi, lo, hi)) == 0
        assert scalar(conn, sql.SQL(
            "SELECT count(*) FROM {} o JOIN {} s USING (id) WHERE NOT (s.{} BETWEEN o.{} AND o.{})")
            .format(per_row, src, col, lo, hi)) == 0, q
    # categorical: labels are nodes of the hierarchy and ancestors-or-self of the source value
    for q in categorical:
        col = sql.Identifier(q)
        h = hierarchies[q]
        assert scalar(conn, sql.SQL(
            "SELECT count(*) FROM {} o WHERE NOT EXISTS (SELECT 1 FROM sabre.hierarchy_rows h "
            "WHERE h.hierarchy = %s AND o.{} = ANY (h.path))").format(out, col), (h,)) == 0, q
        assert scalar(conn, sql.SQL(
            "SELECT count(*) FROM {} o JOIN {} s USING (id) WHERE NOT EXISTS ("
            "SELECT 1 FROM sabre.hierarchy_rows h WHERE h.hierarchy = %s "
            "AND h.path[1] = s.{}::text AND o.{} = ANY (h.path))").format(per_row, src, col, col), (h,)) == 0, q
    # the SA is published unchanged: per row when the key is kept, and always as the exact
    # multiset of each class's source values (classes through the side table)
    sa = sql.Identifier(sensitive)
    if kept_id:
        assert scalar(conn, sql.SQL("SELECT count(*) FROM {} o JOIN {} s USING (id) "
                                    "WHERE o.{} IS DISTINCT FROM s.{}").format(out, src, sa, sa)) == 0
    assert scalar(conn, sql.SQL(
        "SELECT count(*) FROM (SELECT ec_id, {sa} AS v, count(*) AS n FROM {out} GROUP BY 1, 2) o "
        "FULL JOIN (SELECT k.ec_id, s.{sa} AS v, count(*) AS n FROM {kt} k JOIN {src} s ON s.id = k.key "
        "GROUP BY 1, 2) x ON x.ec_id = o.ec_id AND x.v = o.v WHERE x.n IS DISTINCT FROM o.n").format(
            sa=sa, out=out, kt=kt, src=src)) == 0

    # <output>_classes: one row per class, sizes = output counts, emd <= t, same generalization
    assert count(conn, classes) == res["classes"]
    assert scalar(conn, sql.SQL(
        "SELECT count(*) FROM {} c FULL JOIN (SELECT ec_id, count(*) AS n FROM {} GROUP BY ec_id) o "
        "USING (ec_id) WHERE c.size IS DISTINCT FROM o.n").format(classes, out)) == 0
    assert scalar(conn, sql.SQL("SELECT max(emd) FROM {}").format(classes)) <= t + EPS
    assert scalar(conn, sql.SQL("SELECT max(emd) FROM {}").format(classes)) == \
        pytest.approx(res["max_emd"], abs=1e-9)
    gl = sql.SQL(", ").join(sql.Identifier(c) for c in gen_cols)
    assert scalar(conn, sql.SQL(
        "SELECT count(*) FROM {} o JOIN {} c USING (ec_id) WHERE ({}) IS DISTINCT FROM ({})").format(
        out, classes,
        sql.SQL(", ").join(sql.SQL("o.{}").format(sql.Identifier(c)) for c in gen_cols),
        sql.SQL(", ").join(sql.SQL("c.{}").format(sql.Identifier(c)) for c in gen_cols))) == 0
    # one generalization per class
    assert scalar(conn, sql.SQL("SELECT count(*) FROM (SELECT DISTINCT ec_id, {} FROM {}) d").format(
        gl, out)) == res["classes"]

    # the run catalog
    r = run_row(conn, res["run_id"])
    assert r is not None and r["status"] == "done"
    assert r["output_oid"] == res["output_oid"]
    assert r["source_oid"] == scalar(conn, "SELECT %s::regclass::oid", (src.as_string(conn),))
    assert r["quasi_identifiers"] == qis and r["sensitive"] == sensitive
    assert r["t"] == t and r["k"] == k and r["method"] == method
    assert (r["rows"], r["classes"], r["min_class_size"]) == \
        (res["rows"], res["classes"], res["min_class_size"])
    assert r["max_emd"] == pytest.approx(res["max_emd"]) and r["ail"] == pytest.approx(res["ail"])
    # class-size metrics from <output>_classes: the extremes and discernibility = sum of size^2
    assert (r["min_class_size"], r["max_class_size"], r["discernibility"]) == conn.execute(
        sql.SQL("SELECT min(size), max(size), sum(size * size) FROM {}").format(classes)).fetchone()
    assert r["finished_at"] >= r["started_at"]
    assert isinstance(r["phases"], dict) and r["phases"]
    assert all(isinstance(v, (int, float)) and v >= 0 for v in r["phases"].values())
    assert scalar(conn, "SELECT count(*) FROM sabre.outputs WHERE output = %s::regclass",
                  (out.as_string(conn),)) == 1

    # the side table: every key once, consistent ECs, btree on (bucket, hilbert_key)
    assert keys == r["keys_table"] and keys is not None
    assert scalar(conn, "SELECT to_regclass(%s)::text", (keys,)) is not None
    assert [c for c, _ in columns(conn, kt)] == ["key", "bucket", "hilbert_key", "ec_id"]
    assert count(conn, kt) == n_source
    assert scalar(conn, sql.SQL("SELECT count(DISTINCT bucket) FROM {}").format(kt)) == r["buckets"]
    assert scalar(conn, sql.SQL(
        "SELECT count(*) FROM {} s FULL JOIN (SELECT key, count(*) AS n FROM {} GROUP BY key) k "
        "ON k.key = s.id WHERE k.n IS DISTINCT FROM 1 OR s.id IS NULL").format(src, kt)) == 0
    if kept_id:
        assert scalar(conn, sql.SQL("SELECT count(*) FROM {} k JOIN {} o ON o.id = k.key "
                                    "WHERE o.ec_id <> k.ec_id").format(kt, out)) == 0
    # the side table is for its owner only, whatever the schema's default privileges
    assert scalar(conn, "SELECT count(*) FROM pg_class c, aclexplode(c.relacl) a "
                        "WHERE c.oid = %s::regclass AND a.grantee <> c.relowner", (keys,)) == 0
    idx = conn.execute(
        "SELECT am.amname, array(SELECT a.attname::text FROM unnest(i.indkey::int2[]) WITH ORDINALITY "
        "AS x(attnum, ord) JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = x.attnum "
        "ORDER BY x.ord) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "JOIN pg_am am ON am.oid = c.relam WHERE i.indrelid = %s::regclass", (keys,)).fetchall()
    # the btree on (bucket, hilbert_key) for the Hilbert methods only (issue 26: a quarter of
    # write_keys, read by nothing); the rows are in that order either way
    assert (("btree", ["bucket", "hilbert_key"]) in [(a, list(c)) for a, c in idx]) == (method in ("ak", "knn"))
    # no temporary tables left behind
    assert not [r for r in relations(conn) if r[1].startswith("sabre_tmp_") and r[2] == "r"]


@pytest.mark.parametrize("method,keep", [("ak", ["id"]), ("ak", []), ("knn", []), ("mondrian", []),
                                        ("refine", ["id"])],
                         ids=["ak-keep-id", "ak", "knn", "mondrian", "refine-keep-id"])
def test_census_end_to_end(pg_conn, method, keep):
    """keep = []: the output is built from the classes alone; keep = ["id"]: with the source."""
    hier = make_census(pg_conn)
    before = checksum(pg_conn, ident("public.census"))
    t, k = 0.35, 6
    options = {"hierarchies": hier, "key": "id", "seed": 1, "keep": keep, "weights": {}}
    if method == "refine":
        options["search"] = "thorough"            # the option reaches the cut search
    res = anonymize(pg_conn, "public.census", CENSUS_QIS, "salary", t, k, method, "public.census_anon", options)
    check_output_contract(pg_conn, source="public.census", output="public.census_anon", qis=CENSUS_QIS,
                          sensitive="salary", t=t, k=k, method=method, hierarchies=hier, res=res,
                          before_checksum=before)
    # age and education are integer in the source and stay integer
    types = dict(columns(pg_conn, ident("public.census_anon")))
    assert types["age_lo"] == types["age_hi"] == types["education_lo"] == "integer"
    assert types["salary"] == "integer"


def test_refine_threads_in_the_server_give_the_classes_of_one(pg_conn):
    """'refine' searches the 20,000-row census in 2 threads of the backend (numpy outside the
    interpreter lock) and publishes exactly the classes of a search in the backend alone."""
    hier = make_census(pg_conn)
    classes = {}
    for threads in (1, 2):
        out = "public.census_threads_%d" % threads
        res = anonymize(pg_conn, "public.census", CENSUS_QIS, "salary", 0.25, 5, "refine", out,
                        {"hierarchies": hier, "key": "id", "threads": threads})
        assert res["max_emd"] <= 0.25 and res["min_class_size"] >= 5
        with pg_conn.cursor() as cur:
            cur.execute(sql.SQL("SELECT pg_catalog.array_agg(key ORDER BY key) FROM {} GROUP BY ec_id").format(
                ident(out + "_keys")))
            classes[threads] = {tuple(r[0]) for r in cur.fetchall()}
    assert len(classes[1]) > 100 and classes[1] == classes[2]


@pytest.mark.parametrize("method,keep", [("ak", []), ("knn", ["id"]), ("mondrian", [])],
                         ids=["ak", "knn-keep-id", "mondrian"])
def test_adult_end_to_end(pg_conn, pg_dsn, shared_dir, method, keep):
    load_adult(pg_conn, pg_dsn, shared_dir)
    n = count(pg_conn, ident("public.adult"))
    assert n == 30162
    hier = {q: "adult_" + q for q in ADULT_QIS if q != "age"}
    hier["occupation"] = "adult_occupation"
    before = checksum(pg_conn, ident("public.adult"))
    t, k = 0.4, 5
    res = anonymize(pg_conn, "public.adult", ADULT_QIS, "occupation", t, k, method, "public.adult_anon",
                    {"hierarchies": hier, "keep": keep, "seed": 3})
    check_output_contract(pg_conn, source="public.adult", output="public.adult_anon", qis=ADULT_QIS,
                          sensitive="occupation", t=t, k=k, method=method, hierarchies=hier, res=res,
                          before_checksum=before, sa_hierarchy="adult_occupation")
    assert dict(columns(pg_conn, ident("public.adult_anon")))["occupation"] == "text"
    # verified against the occupation hierarchy, a tighter t is reported as violated
    v = verify(pg_conn, "public.adult_anon", "occupation", max(res["max_emd"] / 2, 1e-6), 1,
               "adult_occupation")
    assert v["violations"] >= 1


# --------------------------------------------------------------------------- atomic rerun

def _wait_for_lock_wait(conn, pid, max_polls=2000):
    """Poll pg_stat_activity until backend ``pid`` waits on a heavyweight lock."""
    for _ in range(max_polls):
        if scalar(conn, "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)) == "Lock":
            return True
        threading.Event().wait(0.005)
    return False


def _normalized(rels):
    return {(s, re.sub(r"^sabre_tmp_\d+_", "sabre_tmp_N_", n), kind) for s, n, kind in rels}


def test_rerun_replaces_output_atomically(pg_conn, pg_connect):
    hier = make_census(pg_conn)
    qis = ["age", "sex", "education", "marital"]
    opts = {"hierarchies": {"sex": hier["sex"], "marital": hier["marital"]}, "keep": ["id"]}
    first = anonymize(pg_conn, "public.census", qis, "salary", 0.35, 6, "ak", "public.census_anon", opts)
    old_keys = run_row(pg_conn, first["run_id"])["keys_table"]
    assert old_keys == "public.census_anon_keys"
    old_keys_oid = scalar(pg_conn, "SELECT to_regclass(%s)::oid", (old_keys,))
    rels_before = relations(pg_conn)

    # 1. deterministic: a reader blocked on the output while the rerun's transaction is open
    #    sees the new output, complete, once the rerun commits.
    reader = pg_connect()
    observer = pg_connect()
    result: dict = {}

    def blocked_read():
        try:
            result["count"] = scalar(reader, "SELECT count(*) FROM public.census_anon")
        except Exception as e:  # noqa: BLE001 - reported below
            result["error"] = e

    with pg_conn.transaction():
        second = anonymize(pg_conn, "public.census", qis, "salary", 0.35, 6, "ak", "public.census_anon",
                           dict(opts, seed=2))
        th = threading.Thread(target=blocked_read)
        th.start()
        waited = _wait_for_lock_wait(observer, reader.info.backend_pid)
    th.join(60)
    assert not th.is_alive()
    assert waited, "the reader never blocked on the output during the rerun"
    assert "error" not in result, result.get("error")
    assert result["count"] == CENSUS_ROWS

    # 2. a reader looping (each count its own autocommit statement) during more reruns
    stop = threading.Event()
    counts: list[int] = []
    errors: list[Exception] = []
    started = threading.Event()

    def loop():
        while not stop.is_set():
            try:
                counts.append(scalar(reader, "SELECT count(*) FROM public.census_anon"))
            except Exception as e:  # noqa: BLE001
                errors.append(e)
            started.set()

    th = threading.Thread(target=loop)
    th.start()
    started.wait(30)
    runs = [second]
    try:
        for seed in (3, 4, 5):
            runs.append(anonymize(pg_conn, "public.census", qis, "salary", 0.35, 6, "ak",
                                  "public.census_anon", dict(opts, seed=seed)))
    finally:
        stop.set()
        th.join(60)
    assert not errors, errors[:3]
    assert counts and set(counts) == {CENSUS_ROWS}

    # the replaced runs' side tables are gone (the name <output>_keys now holds the last run's);
    # the relations are the same as after the first run
    for r in [first] + runs[:-1]:
        keys = run_row(pg_conn, r["run_id"])["keys_table"]
        assert keys == old_keys
    assert scalar(pg_conn, "SELECT count(*) FROM pg_class WHERE oid = %s", (old_keys_oid,)) == 0
    last_keys = run_row(pg_conn, runs[-1]["run_id"])["keys_table"]
    assert scalar(pg_conn, "SELECT to_regclass(%s)::oid", (last_keys,)) not in (None, old_keys_oid)
    assert count(pg_conn, sql.SQL(last_keys)) == CENSUS_ROWS
    # (index names are compared apart from the run number; see test_no_temporary_names_remain)
    assert _normalized(relations(pg_conn)) == _normalized(rels_before)
    # the catalog has every successful run; sabre.outputs shows the latest
    assert scalar(pg_conn, "SELECT count(*) FROM sabre.runs WHERE status = 'done'") == 5
    assert scalar(pg_conn, "SELECT run_id FROM sabre.outputs WHERE output = 'public.census_anon'::regclass") \
        == runs[-1]["run_id"]
    assert verify(pg_conn, "public.census_anon", "salary", 0.35, 6)["violations"] == 0


def test_rerun_leaves_the_callers_settings(pg_conn):
    """A rerun shortens deadlock_timeout while it drops its previous output (so autovacuum,
    if it is analyzing that output, yields at once) and restores it, as it does work_mem."""
    make_census(pg_conn)
    pg_conn.execute("SET deadlock_timeout = '1234ms'")
    pg_conn.execute("SET work_mem = '5MB'")
    for _ in range(2):                                   # the second run replaces the first
        anonymize(pg_conn, "public.census", ["age", "sex"], "salary", 0.3, 4, "ak", "public.settings_out")
    assert scalar(pg_conn, "SHOW deadlock_timeout") == "1234ms"
    assert scalar(pg_conn, "SHOW work_mem") == "5MB"


def test_no_temporary_names_remain(pg_conn):
    """Every relation a run leaves has its final name: <output>, <output>_classes, <output>_keys
    and their indexes; nothing is still called sabre_tmp_* (which would also change on each rerun)."""
    make_census(pg_conn, rows=2000)
    before = relations(pg_conn)
    anonymize(pg_conn, "public.census", ["age", "education"], "salary", 0.35, 6, "ak", "public.census_anon")
    new = relations(pg_conn) - before
    assert {n for _, n, kind in new if kind == "r"} == {"census_anon", "census_anon_classes", "census_anon_keys"}
    leftovers = sorted(n for _, n, _ in new if n.startswith("sabre_tmp_"))
    assert leftovers == [], "relations still named after the temporary tables: %s" % leftovers


# --------------------------------------------------------------------------- options and types

def test_flat_hierarchy_and_default_output_name(pg_conn):
    make_census(pg_conn, rows=5000)
    qis = ["age", "sex", "race", "workclass"]
    res = anonymize(pg_conn, "public.census", qis, "salary", 0.35, 6, options={"keep": ["id"]})
    # default output: <source>_sabre in the source's schema, plus <source>_sabre_classes
    assert res["output_oid"] == scalar(pg_conn, "SELECT 'public.census_sabre'::regclass::oid")
    assert scalar(pg_conn, "SELECT to_regclass('public.census_sabre_classes')::text") is not None
    assert res["rows"] == 5000
    for q in ("sex", "race", "workclass"):
        col = sql.Identifier(q)
        # without a hierarchy, a label is the value itself or '*'
        assert scalar(pg_conn, sql.SQL(
            "SELECT count(*) FROM census_sabre o JOIN census s USING (id) "
            "WHERE o.{} <> s.{} AND o.{} <> '*'").format(col, col, col)) == 0, q
    assert scalar(pg_conn, "SELECT count(*) FROM census_sabre WHERE race = '*'") > 0 or \
        scalar(pg_conn, "SELECT count(*) FROM census_sabre WHERE workclass = '*'") > 0
    assert verify(pg_conn, "public.census_sabre", "salary", 0.35, 6)["violations"] == 0


def test_default_method_is_refine_for_one_sa_and_for_the_array_form(pg_conn):
    """``method`` left out: 'refine' in both single-SA overloads (regclass and text) and in
    the several-SA overload (docs/anonymize.md); the runs record the method they ran."""
    make_census(pg_conn, rows=3000)
    calls = [("SELECT run_id, classes FROM sabre_anonymize('public.census'::regclass, ARRAY['age','sex'], "
              "'salary', 0.35, 6, output => 'by_oid')", "refine"),
             ("SELECT run_id, classes FROM sabre_anonymize('public.census', ARRAY['age','sex'], 'salary', 0.35, 6, "
              "output => 'by_name')", "refine"),
             ("SELECT run_id, classes FROM sabre_anonymize('public.census'::regclass, ARRAY['age','sex'], "
              "ARRAY['salary'], ARRAY[0.35], 6, output => 'by_array')", "refine")]
    for query, method in calls:
        run_id, classes = pg_conn.execute(query).fetchone()
        assert run_row(pg_conn, run_id)["method"] == method
        explicit = anonymize(pg_conn, "public.census", ["age", "sex"], "salary", 0.35, 6, method=method,
                             output="explicit")
        assert explicit["classes"] == classes


def test_date_timestamp_numeric_qis(pg_conn):
    pg_conn.execute("""
        CREATE TABLE people AS
        SELECT i AS id,
               date '1940-01-01' + (abs(hashint4(i)) % 25000) AS born,
               timestamp '2020-01-01 00:00:00'
                 + make_interval(secs => (abs(hashint4(i + 7)) % 30000000) + (i % 1000) / 1000.0) AS seen,
               ((abs(hashint4(i + 13)) % 100000) / 100.0)::numeric(8,2) AS score,
               CASE WHEN i % 2 = 0 THEN 'F' ELSE 'M' END AS sex,
               1 + abs(hashint4(i + 29)) % 40 AS salary
        FROM generate_series(1, 3000) AS i;
        ALTER TABLE people ADD PRIMARY KEY (id);""")
    before = checksum(pg_conn, ident("public.people"))
    qis = ["born", "seen", "score", "sex"]
    res = anonymize(pg_conn, "public.people", qis, "salary", 0.3, 5, "ak", "people_anon", {"keep": ["id"]})
    assert res["rows"] == 3000 and res["min_class_size"] >= 5
    types = dict(columns(pg_conn, ident("public.people_anon")))
    assert types["born_lo"] == types["born_hi"] == "date"
    assert types["seen_lo"] == types["seen_hi"] == "timestamp without time zone"
    assert types["score_lo"] == types["score_hi"] == "numeric(8,2)"
    assert types["sex"] == "text"
    for q in ("born", "seen", "score"):
        col, lo, hi = sql.Identifier(q), sql.Identifier(q + "_lo"), sql.Identifier(q + "_hi")
        assert scalar(pg_conn, sql.SQL(
            "SELECT count(*) FROM people_anon o JOIN people s USING (id) "
            "WHERE NOT (s.{} BETWEEN o.{} AND o.{}) OR o.{} > o.{}").format(col, lo, hi, lo, hi)) == 0, q
    assert verify(pg_conn, "people_anon", "salary", 0.3, 5)["violations"] == 0
    assert checksum(pg_conn, ident("public.people")) == before


SA_TYPES = [
    # (SQL type, expression over i giving ~20 distinct values, hierarchy needed)
    ("double precision", "(abs(hashint4(i)) % 20) / 7.0 + 0.1", False),
    ("real", "((abs(hashint4(i)) % 20) / 3.0)::real", False),
    ("date", "date '2001-02-03' + (abs(hashint4(i)) % 20) * 37", False),
    ("smallint", "(abs(hashint4(i)) % 20 - 10)::smallint", False),
    ("bigint", "4611686018427387904 + (abs(hashint4(i)) % 20)", False),
    ("numeric(9,3)", "((abs(hashint4(i)) % 20) / 7.0)::numeric(9,3)", False),
    ("timestamp without time zone", "timestamp '2020-01-01' + (abs(hashint4(i)) % 20) * interval '1.5 hours'", False),
    ("character varying(12)", "'d' || (abs(hashint4(i)) % 20)", True),
    ("character(4)", "'c' || (abs(hashint4(i)) % 20)", True),
    ("boolean", "abs(hashint4(i)) % 3 = 0", True),
    ("mood", "(ARRAY['low','mid','high']::mood[])[1 + abs(hashint4(i)) % 3]", True),
]


@pytest.mark.parametrize("sqltype,expr,categorical", SA_TYPES, ids=[t[0] for t in SA_TYPES])
def test_sensitive_published_unchanged_for_every_type(pg_conn, sqltype, expr, categorical):
    """The SA of every row comes out as exactly the source value, in the source type, whether
    the output is expanded from the classes (exact types) or joined with the source (others);
    a text key exercises the non-integer key path."""
    pg_conn.execute("CREATE TYPE mood AS ENUM ('low', 'mid', 'high')")
    pg_conn.execute(sql.SQL(
        "CREATE TABLE typed AS SELECT 'k-' || i AS id, 18 + abs(hashint4(i + 1)) % 60 AS age, "
        "CASE WHEN i % 2 = 0 THEN 'F' ELSE 'M' END AS sex, ({})::{} AS sa "
        "FROM generate_series(1, 2500) AS i").format(sql.SQL(expr), sql.SQL(sqltype)))
    pg_conn.execute("ALTER TABLE typed ADD PRIMARY KEY (id)")
    before = checksum(pg_conn, ident("public.typed"))
    opts = {}
    if categorical:
        vals = [r[0] for r in pg_conn.execute("SELECT DISTINCT sa::text FROM typed ORDER BY 1")]
        pg_conn.execute("SELECT sabre_define_hierarchy('sa_h', %s)", ("\n".join(v + ";*" for v in vals),))
        opts["hierarchies"] = {"sa": "sa_h"}
    t = 0.5 if categorical else 0.3
    res = anonymize(pg_conn, "public.typed", ["age", "sex"], "sa", t, 4, "ak", "typed_out", opts)
    assert res["rows"] == 2500 and res["min_class_size"] >= 4
    assert dict(columns(pg_conn, ident("public.typed_out")))["sa"] == sqltype
    kt = run_row(pg_conn, res["run_id"])["keys_table"]
    assert scalar(pg_conn, sql.SQL(
        "SELECT count(*) FROM (SELECT ec_id, sa, count(*) AS n FROM typed_out GROUP BY 1, 2) o "
        "FULL JOIN (SELECT k.ec_id, s.sa, count(*) AS n FROM {} k JOIN typed s ON s.id = k.key "
        "GROUP BY 1, 2) x ON x.ec_id = o.ec_id AND x.sa = o.sa WHERE x.n IS DISTINCT FROM o.n").format(
            sql.SQL(kt))) == 0
    assert verify(pg_conn, "typed_out", "sa", t, 4, "sa_h" if categorical else None)["violations"] == 0
    assert checksum(pg_conn, ident("public.typed")) == before


@pytest.mark.parametrize("key_expr,key_type", [
    ("i * 7 - 5000", "integer"),                                          # negative, sparse
    ("CASE WHEN i % 2 = 0 THEN -9223372036854775000 + i ELSE 9223372036854775000 - i END",
     "bigint"),                                                           # spans the whole bigint range
    ("(i - 1000)::smallint", "smallint"),
], ids=["int-sparse", "bigint-extremes", "smallint"])
def test_integer_keys_reach_the_side_table_exactly(pg_conn, key_expr, key_type):
    """Integer keys travel packed with the EC id when their range allows, else on their own:
    either way every key arrives exactly once, with its row's class."""
    pg_conn.execute("CREATE TABLE ik AS SELECT (%s)::%s AS id, 20 + abs(hashint4(i)) %% 50 AS age, "
                    "abs(hashint4(i + 3)) %% 12 AS salary FROM generate_series(1, 2000) i" % (key_expr, key_type))
    pg_conn.execute("ALTER TABLE ik ADD PRIMARY KEY (id)")
    res = anonymize(pg_conn, "public.ik", ["age"], "salary", 0.4, 4, "ak", "ik_out", {"keep": ["id"]})
    kt = sql.SQL(run_row(pg_conn, res["run_id"])["keys_table"])
    assert dict(columns(pg_conn, kt))["key"] == key_type
    assert scalar(pg_conn, sql.SQL(
        "SELECT count(*) FROM ik s FULL JOIN {} k ON k.key = s.id FULL JOIN ik_out o ON o.id = s.id "
        "WHERE s.id IS NULL OR k.key IS NULL OR o.id IS NULL OR o.ec_id <> k.ec_id").format(kt)) == 0


def test_flat_categorical_sa_from_the_summary(pg_conn):
    """A categorical SA without a named hierarchy gets the flat one, built from the values of
    the SA summary (the GROUP BY that bucketization runs on); the run records that phase."""
    pg_conn.execute("CREATE TABLE dx AS SELECT i AS id, 20 + abs(hashint4(i)) % 60 AS age, "
                    "(ARRAY['flu','cold','asthma','ulcer','gastritis','*'])[1 + abs(hashint4(i + 9)) % 6] AS diagnosis "
                    "FROM generate_series(1, 3000) i")
    pg_conn.execute("ALTER TABLE dx ADD PRIMARY KEY (id)")
    res = anonymize(pg_conn, "public.dx", ["age"], "diagnosis", 0.4, 5, "ak", "dx_out")
    assert res["rows"] == 3000 and res["min_class_size"] >= 5
    assert verify(pg_conn, "dx_out", "diagnosis", 0.4, 5)["violations"] == 0
    assert scalar(pg_conn, "SELECT count(DISTINCT diagnosis) FROM dx_out") == 6     # '*' is a value here
    phases = run_row(pg_conn, res["run_id"])["phases"]
    assert {"validate", "summary", "bucketize", "redistribute", "read", "takeout"} <= set(phases)


def test_bigint_qi_beyond_float_precision(pg_conn):
    """Ranges must contain the source values even where float8 cannot represent them (> 2^53)."""
    pg_conn.execute("""
        CREATE TABLE big AS SELECT i AS id, (4611686018427387904 + i * 3)::bigint AS b,
               1 + abs(hashint4(i)) % 30 AS salary FROM generate_series(1, 2000) AS i;
        ALTER TABLE big ADD PRIMARY KEY (id);""")
    res = anonymize(pg_conn, "public.big", ["b"], "salary", 0.4, 5, "ak", "big_out", {"keep": ["id"]})
    assert res["rows"] == 2000
    assert dict(columns(pg_conn, ident("public.big_out")))["b_lo"] == "bigint"
    outside = pg_conn.execute("SELECT s.b, o.b_lo, o.b_hi FROM big_out o JOIN big s USING (id) "
                              "WHERE NOT (s.b BETWEEN o.b_lo AND o.b_hi) ORDER BY s.id LIMIT 3").fetchall()
    assert outside == [], "source values outside their class's range: %s" % outside


def test_nan_and_infinity_in_numerical_qi(pg_conn):
    """NaN/Infinity in a float8 QI are refused (22023 with a HINT, nothing created); the same
    table with finite values in their place is published with ranges that contain every value
    (the replacements include extremes far from the other values)."""
    pg_conn.execute("""
        CREATE TABLE fl AS SELECT i AS id,
               CASE WHEN i % 100 = 0 THEN 'NaN'::float8 WHEN i % 101 = 0 THEN 'Infinity'::float8
                    WHEN i % 103 = 0 THEN '-Infinity'::float8 ELSE (abs(hashint4(i)) % 80)::float8 END AS f,
               1 + abs(hashint4(i + 1)) % 30 AS salary FROM generate_series(1, 2000) AS i;
        ALTER TABLE fl ADD PRIMARY KEY (id);""")
    call = lambda c: anonymize(c, "public.fl", ["f"], "salary", 0.4, 5, "ak", "fl_out", {"keep": ["id"]})  # noqa: E731
    expect_error(pg_conn, call, "22023", "non-finite", '"f"', source="fl")
    pg_conn.execute("UPDATE fl SET f = CASE WHEN f = 'NaN' THEN 40.5 WHEN f = 'Infinity' THEN 1e300 "
                    "ELSE -1e300 END WHERE f IN ('NaN', 'Infinity', '-Infinity')")
    res = call(pg_conn)
    assert res["rows"] == 2000 and res["min_class_size"] >= 5
    bad = pg_conn.execute("SELECT s.f, o.f_lo, o.f_hi FROM fl_out o JOIN fl s USING (id) "
                          "WHERE NOT (s.f BETWEEN o.f_lo AND o.f_hi) OR o.f_lo > o.f_hi LIMIT 3").fetchall()
    assert bad == [], "values outside their class ranges: %s" % bad
    assert scalar(pg_conn, "SELECT min(f_lo) = -1e300 AND max(f_hi) = 1e300 FROM fl_out")


def _assignment(conn, output):
    return conn.execute(sql.SQL("SELECT id, ec_id FROM {} ORDER BY id").format(ident(output))).fetchall()


@pytest.mark.parametrize("method", METHODS)
def test_seed_reproducible_weights_and_random_takeout(pg_conn, method):
    hier = make_census(pg_conn, rows=10_000)
    qis = ["age", "sex", "education", "marital"]
    base = {"hierarchies": {"sex": hier["sex"], "marital": hier["marital"]}, "keep": ["id"],
            "takeout": "random", "weights": {"age": 3, "education": 0.5}}
    outs = {}
    for name, seed in (("a", 7), ("b", 7), ("c", 8)):
        res = anonymize(pg_conn, "public.census", qis, "salary", 0.35, 6, method, "public.out_" + name,
                        dict(base, seed=seed))
        assert res["min_class_size"] >= 6 and res["max_emd"] <= 0.35 + EPS
        assert verify(pg_conn, "public.out_" + name, "salary", 0.35, 6)["violations"] == 0
        outs[name] = res
    # same seed -> same EC assignment and the same generalization
    assert _assignment(pg_conn, "public.out_a") == _assignment(pg_conn, "public.out_b")
    assert outs["a"]["classes"] == outs["b"]["classes"] and outs["a"]["ail"] == outs["b"]["ail"]
    assert scalar(pg_conn, "SELECT count(*) FROM (TABLE out_a EXCEPT TABLE out_b) d") == 0
    # random takeout with another seed -> another assignment
    assert _assignment(pg_conn, "public.out_a") != _assignment(pg_conn, "public.out_c")
    # options are recorded as given
    opts = scalar(pg_conn, "SELECT options FROM sabre.runs WHERE run_id = %s", (outs["a"]["run_id"],))
    assert opts["takeout"] == "random" and opts["seed"] == 7 and opts["weights"] == base["weights"]


def test_weights_weigh_the_information_loss(pg_conn):
    """options.weights weigh each QI's information loss in the reported AIL:
    AIL = avg over rows of sum_i w_i (hi_i - lo_i) / (max_i - min_i), weights normalized."""
    make_census(pg_conn, rows=10_000)
    qis = ["age", "education"]
    span = {q: scalar(pg_conn, sql.SQL("SELECT (max({c}) - min({c}))::float8 FROM census").format(
        c=sql.Identifier(q))) for q in qis}

    def expected_ail(table, w):
        total = sum(w.values())
        return scalar(pg_conn, sql.SQL("SELECT avg({})::float8 FROM {}").format(
            sql.SQL(" + ").join(sql.SQL("{}::float8 * ({} - {}) / {}").format(
                sql.Literal(w[q] / total), sql.Identifier(q + "_hi"), sql.Identifier(q + "_lo"),
                sql.Literal(span[q])) for q in qis),
            sql.Identifier(table)))

    for name, w in (("w_age", {"age": 1, "education": 0}), ("w_edu", {"age": 0, "education": 3}),
                    ("w_mix", {"age": 3, "education": 1}), ("w_none", None)):
        opts = {"keep": ["id"], "seed": 5}
        if w is not None:
            opts["weights"] = w
        res = anonymize(pg_conn, "public.census", qis, "salary", 0.35, 6, "ak", name, opts)
        assert verify(pg_conn, name, "salary", 0.35, 6)["violations"] == 0
        assert res["ail"] == pytest.approx(expected_ail(name, w or {"age": 1, "education": 1}), rel=1e-9), name
        assert run_row(pg_conn, res["run_id"])["ail"] == pytest.approx(res["ail"])


@pytest.mark.parametrize("method", METHODS)
def test_nulls_drop(pg_conn, method):
    make_census(pg_conn, rows=10_000)
    pg_conn.execute("""
        ALTER TABLE census ALTER age DROP NOT NULL, ALTER sex DROP NOT NULL, ALTER salary DROP NOT NULL;
        UPDATE census SET age = NULL WHERE id % 97 = 0;
        UPDATE census SET sex = NULL WHERE id % 89 = 0;
        UPDATE census SET salary = NULL WHERE id % 83 = 0;""")
    non_null = scalar(pg_conn, "SELECT count(*) FROM census WHERE age IS NOT NULL AND sex IS NOT NULL "
                               "AND salary IS NOT NULL")
    assert non_null < 10_000
    before = checksum(pg_conn, ident("public.census"))
    res = anonymize(pg_conn, "public.census", ["age", "sex", "education"], "salary", 0.35, 6, method,
                    "public.census_anon", {"nulls": "drop", "keep": ["id"]})
    assert res["rows"] == non_null
    assert count(pg_conn, ident("public.census_anon")) == non_null
    assert scalar(pg_conn, "SELECT count(*) FROM census_anon o JOIN census s USING (id) "
                           "WHERE s.age IS NULL OR s.sex IS NULL OR s.salary IS NULL") == 0
    assert scalar(pg_conn, "SELECT count(DISTINCT id) FROM census_anon") == non_null
    assert scalar(pg_conn, "SELECT count(*) FROM census_anon WHERE salary IS NULL OR sex IS NULL") == 0
    assert verify(pg_conn, "census_anon", "salary", 0.35, 6)["violations"] == 0
    keys = run_row(pg_conn, res["run_id"])["keys_table"]
    assert count(pg_conn, sql.SQL(keys)) == non_null
    assert checksum(pg_conn, ident("public.census")) == before


@pytest.mark.parametrize("method", METHODS)
def test_view_source_with_key(pg_conn, method):
    make_census(pg_conn, rows=10_000)
    pg_conn.execute("CREATE SCHEMA anon; CREATE VIEW v_census AS "
                    "SELECT id, age, sex, education, salary FROM census WHERE id % 2 = 0")
    res = anonymize(pg_conn, "public.v_census", ["age", "sex", "education"], "salary", 0.35, 6, method,
                    "anon.v_out", {"key": "id", "keep": ["id"]})
    assert res["rows"] == 5000
    assert res["output_oid"] == scalar(pg_conn, "SELECT 'anon.v_out'::regclass::oid")
    assert scalar(pg_conn, "SELECT to_regclass('anon.v_out_classes')::text") is not None
    assert scalar(pg_conn, "SELECT count(*) FROM v_census s FULL JOIN (SELECT id, count(*) AS n "
                           "FROM anon.v_out GROUP BY id) o USING (id) WHERE o.n IS DISTINCT FROM 1") == 0
    assert verify(pg_conn, "anon.v_out", "salary", 0.35, 6)["violations"] == 0
    r = run_row(pg_conn, res["run_id"])
    assert r["source"] == "public.v_census" and r["status"] == "done"
    assert count(pg_conn, sql.SQL(r["keys_table"])) == 5000


# --------------------------------------------------------------------------- identifiers

def test_identifiers_with_quotes_semicolons_spaces(pg_conn):
    tab, col = 'we"ird; tab', 'a"b; c'
    pg_conn.execute(sql.SQL(
        "CREATE TABLE {} AS SELECT i AS id, 18 + abs(hashint4(i)) % 60 AS {}, "
        "CASE WHEN i % 3 = 0 THEN 'x; DROP TABLE y' ELSE 'plain' END AS {}, "
        "1 + abs(hashint4(i + 5)) % 30 AS {} FROM generate_series(1, 2000) AS i").format(
        sql.Identifier("public", tab), sql.Identifier(col), sql.Identifier("se x"),
        sql.Identifier("sal'ary")))
    pg_conn.execute(sql.SQL("ALTER TABLE {} ADD PRIMARY KEY (id)").format(sql.Identifier("public", tab)))
    pg_conn.execute("CREATE TABLE y (z int)")    # would be dropped by an injected statement
    source = sql.Identifier("public", tab).as_string(pg_conn)
    before_rels = relations(pg_conn)
    before = checksum(pg_conn, sql.Identifier("public", tab))
    res = anonymize(pg_conn, source, [col, "se x"], "sal'ary", 0.4, 5, "ak", 'public."out; x"',
                    {"keep": ["id"]})
    assert res["rows"] == 2000
    out = sql.Identifier("public", "out; x")
    assert res["output_oid"] == scalar(pg_conn, "SELECT to_regclass(%s)::oid", (out.as_string(pg_conn),))
    assert [c for c, _ in columns(pg_conn, out)] == ["ec_id", col + "_lo", col + "_hi", "se x", "sal'ary", "id"]
    assert scalar(pg_conn, sql.SQL(
        "SELECT count(*) FROM {} o JOIN {} s USING (id) WHERE NOT (s.{} BETWEEN o.{} AND o.{})").format(
        out, sql.Identifier("public", tab), sql.Identifier(col), sql.Identifier(col + "_lo"),
        sql.Identifier(col + "_hi"))) == 0
    assert verify(pg_conn, out.as_string(pg_conn), "sal'ary", 0.4, 5)["violations"] == 0
    assert checksum(pg_conn, sql.Identifier("public", tab)) == before

    # exactly the expected relations appeared: the output, its classes, the side table,
    # and indexes (and TOAST) on those; nothing disappeared
    after_rels = relations(pg_conn)
    assert before_rels <= after_rels
    keys = run_row(pg_conn, res["run_id"])["keys_table"]
    assert keys == 'public."out; x_keys"'
    new = after_rels - before_rels
    new_tables = {(s, n) for s, n, kind in new if kind == "r"}
    assert new_tables == {("public", "out; x"), ("public", "out; x_classes"), ("public", "out; x_keys")}
    table_oids = {scalar(pg_conn, "SELECT c.oid FROM pg_class c JOIN pg_namespace ns ON ns.oid = "
                                  "c.relnamespace WHERE ns.nspname = %s AND c.relname = %s", t)
                  for t in new_tables}
    for s, n, kind in new - {(s, n, "r") for s, n in new_tables}:
        assert kind == "i", (s, n, kind)
        parent = scalar(pg_conn, "SELECT i.indrelid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                                 "JOIN pg_namespace ns ON ns.oid = c.relnamespace "
                                 "WHERE ns.nspname = %s AND c.relname = %s", (s, n))
        assert parent in table_oids, (s, n)
    assert scalar(pg_conn, "SELECT to_regclass('public.y')::text") is not None
