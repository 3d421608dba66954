"""Unusual but valid input (issue 29): every case publishes correct classes, or fails with a
documented SQLSTATE, a message naming the column, and a HINT -- never 38000, a 22P02 from
internal JSON, or an XX error.

Correct classes: every source row once, every class within t and k by the exact verifier,
every numerical range the min and max of its class's source values *as they are* (compared as
text, so an interval '400 days' must not come back as '1 year 1 mon 10 days'), every
categorical label the class's single value (the empty string included) or the flat root.
"""
from __future__ import annotations

import random

import psycopg
import pytest
from psycopg import sql

from sabre_pg import installer
from sabre_pg.core.hierarchy import flat_root_label
from tests.db.helpers import anonymize, expect_error, scalar, verify

METHODS = ["refine", "ak", "knn", "mondrian"]
ROWS = 48
T, K = 0.6, 3
SOURCE = "unusual"

# id: (SQL type, expression of the value for row i = 1..ROWS)
QI_CASES = {
    "empty-string": ("text", "(ARRAY['', 'x', 'y', ''])[1 + i % 4]"),
    "bigint-beyond-2^63-range": ("bigint", "(CASE WHEN i % 2 = 0 THEN 5000000000000000000 "
                                 "ELSE -5000000000000000000 END) + i * 1000003"),
    "bigint-extremes": ("bigint", "CASE WHEN i % 2 = 0 THEN 9223372036854775807 - i "
                        "ELSE -9223372036854775808 + i END"),
    "float8-overflowing-span": ("float8", "(CASE WHEN i % 2 = 0 THEN 9e307 ELSE -9e307 END) * (1 + i / 1000.0)"),
    "float8-max-and-subnormal": ("float8", "CASE WHEN i % 3 = 0 THEN 1.7976931348623157e308 "
                                 "WHEN i % 3 = 1 THEN -1.7e308 ELSE i * 4.9e-324 END"),
    "real-extremes": ("real", "CASE WHEN i % 2 = 0 THEN 3.4e38 ELSE -3.4e38 END"),
    "interval-unjustified": ("interval", "(ARRAY['400 days', '30 days', '1 mon', '1 year 1 mon 10 days', "
                             "'36 hours', '1 day 12 hours'])[1 + i % 6]::interval + i * interval '1 second'"),
    "numeric-beyond-float8": ("numeric", "(CASE WHEN i % 3 = 0 THEN 1e400 WHEN i % 3 = 1 THEN -1e400 "
                              "ELSE 1e-400 END) * i"),
    "numeric-huge-precision": ("numeric", "1 + i * 1e-60"),
    "smallint-extremes": ("smallint", "CASE WHEN i % 2 = 0 THEN 32767 - i ELSE -32768 + i END"),
    "int-extremes": ("int", "CASE WHEN i % 2 = 0 THEN 2147483647 - i ELSE -2147483648 + i END"),
    "timestamp-far": ("timestamp", "'294270-01-01'::timestamp - i * interval '1 day 1 microsecond'"),
    "timestamptz-microseconds": ("timestamptz", "'2020-01-01 00:00:00.000001+00'::timestamptz "
                                 "+ i * interval '1 hour 1 microsecond'"),
    "timetz-zone": ("timetz", "'10:00:00+05'::timetz + i * interval '1 minute'"),
    "date-far": ("date", "'5874000-01-01'::date - i"),
    "long-strings": ("text", "repeat('x', 3000) || (i % 5)"),
    "unicode": ("text", "(ARRAY['é', '日本', '🙂', 'Ω', 'e\u0301'])[1 + i % 5]"),
    "null-ish-strings": ("text", "(ARRAY['NULL', 'null', '', '\\N', ' ', '*', '(any)'])[1 + i % 7]"),
    "single-value-int": ("int", "7"),
    "single-value-text": ("text", "''"),
}

# the SA's column: id: (SQL type, expression)
SA_CASES = {
    "empty-string": ("text", "(ARRAY['', 'a', 'b'])[1 + i % 3]"),
    "null-ish-strings": ("text", "(ARRAY['NULL', '', '*', '(any)'])[1 + i % 4]"),
    "unicode-and-long": ("text", "(ARRAY['日本', repeat('z', 3000), '🙂'])[1 + i % 3]"),
    "float8-extremes": ("float8", "CASE WHEN i % 3 = 0 THEN 1.7e308 WHEN i % 3 = 1 THEN -1.7e308 ELSE 4.9e-324 END"),
    "numeric-beyond-float8": ("numeric", "(CASE WHEN i % 3 = 0 THEN 1e400 WHEN i % 3 = 1 THEN -1e400 ELSE 1e-400 END)"),
    "bigint-extremes": ("bigint", "CASE WHEN i % 2 = 0 THEN 9223372036854775807 ELSE -9223372036854775808 END"),
    "interval": ("interval", "(ARRAY['400 days', '1 year 1 mon 10 days', '1 day'])[1 + i % 3]::interval"),
    "single-value": ("text", "''"),
}

# non-finite values: a documented 22023 naming the column, with a HINT
NONFINITE = {      # id: (SQL type, expression, the value the message names)
    "float8-nan": ("float8", "CASE WHEN i = 3 THEN 'NaN' ELSE i::text END::float8", "NaN"),
    "float8-infinity": ("float8", "CASE WHEN i = 3 THEN '-Infinity' ELSE i::text END::float8", "-Infinity"),
    "real-infinity": ("real", "CASE WHEN i = 3 THEN 'Infinity' ELSE i::text END::real", "Infinity"),
    "numeric-nan": ("numeric", "CASE WHEN i = 3 THEN 'NaN' ELSE i::text END::numeric", "NaN"),
    "numeric-infinity": ("numeric", "CASE WHEN i = 3 THEN 'Infinity' ELSE i::text END::numeric", "Infinity"),
    "timestamp-infinity": ("timestamp", "CASE WHEN i = 3 THEN 'infinity'::timestamp "
                           "ELSE '2020-01-01'::timestamp + i * interval '1 day' END", "infinity"),
    "timestamptz-minus-infinity": ("timestamptz", "CASE WHEN i = 3 THEN '-infinity'::timestamptz "
                                   "ELSE '2020-01-01'::timestamptz + i * interval '1 day' END", "-infinity"),
    "date-infinity": ("date", "CASE WHEN i = 3 THEN 'infinity'::date ELSE '2020-01-01'::date + i END", "infinity"),
}


@pytest.fixture(scope="module")
def db(sabre_cluster):
    """One database for the module, sabre installed once (a fresh database per case would cost
    more than the case): each test recreates the source table and replaces the output ``out``."""
    name = "sabre_unusual_input"
    with psycopg.connect(sabre_cluster.dsn("postgres"), autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    conn = psycopg.connect(sabre_cluster.dsn(name), autocommit=True)
    installer.install(conn, "sabre")
    conn.execute("SET search_path = public, sabre")
    yield conn
    conn.close()
    with psycopg.connect(sabre_cluster.dsn("postgres"), autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))


def make_source(conn, qi=("int", "i % 50"), sa=("int", "i % 4"), rows=ROWS, table=SOURCE):
    """``table``: id (primary key), q, age (int), sa."""
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(sql.Identifier(table)))
    conn.execute(sql.SQL(
        "CREATE TABLE {} AS SELECT i AS id, ({})::{} AS q, (i * 7) % 50 AS age, ({})::{} AS sa "
        "FROM generate_series(1, {}) AS i").format(
            sql.Identifier(table), sql.SQL(qi[1]), sql.SQL(qi[0]), sql.SQL(sa[1]), sql.SQL(sa[0]), sql.Literal(rows)))
    conn.execute(sql.SQL("ALTER TABLE {} ADD PRIMARY KEY (id)").format(sql.Identifier(table)))


def run(conn, qis, sensitive, method, output="out", t=T, k=K, options=None):
    return anonymize(conn, SOURCE, qis, sensitive, t, k, method, output, options)


def check_published(conn, output, qis, sensitive, t=T, k=K, table=SOURCE):
    """The output holds every source row once, is t-close and k-anonymous by the exact
    verifier, and each QI is generalized exactly from the source's own values."""
    out, classes, keys, src = (sql.Identifier(output), sql.Identifier(output + "_classes"),
                               sql.Identifier(output + "_keys"), sql.Identifier(table))
    assert scalar(conn, sql.SQL("SELECT count(*) FROM {}").format(out)) == \
        scalar(conn, sql.SQL("SELECT count(*) FROM {}").format(src))
    v = verify(conn, output, sensitive, t, k)
    assert v["violations"] == 0, v
    # the SA's values are published unchanged (as a multiset, compared as text)
    same = sql.SQL("SELECT pg_catalog.array_agg(x.sa::text ORDER BY x.sa::text) FROM {} AS x")
    assert scalar(conn, same.format(out) if sensitive == "sa" else sql.SQL(
        "SELECT pg_catalog.array_agg(x.{s}::text ORDER BY x.{s}::text) FROM {o} AS x").format(
            s=sql.Identifier(sensitive), o=out)) == scalar(conn, sql.SQL(
                "SELECT pg_catalog.array_agg(x.{s}::text ORDER BY x.{s}::text) FROM {t} AS x").format(
                    s=sql.Identifier(sensitive), t=src))
    members = sql.SQL("{} AS k JOIN {} AS s ON s.id = k.key").format(keys, src)
    for q in qis:
        typ = scalar(conn, "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = %s::regclass "
                     "AND attname = %s", (table, q))
        if typ == "text":
            values = [r[0] for r in conn.execute(sql.SQL("SELECT DISTINCT {} FROM {}").format(sql.Identifier(q), src))]
            root = flat_root_label(values)
            wrong = [r for r in conn.execute(sql.SQL(
                "SELECT c.ec_id, c.{q}, pg_catalog.array_agg(DISTINCT s.{q}) FROM {c} AS c JOIN {m} "
                "ON k.ec_id = c.ec_id GROUP BY 1, 2").format(q=sql.Identifier(q), c=classes, m=members))
                if r[1] != (r[2][0] if len(r[2]) == 1 else root)]
            assert wrong == [], wrong[:3]
            continue
        lo, hi = sql.Identifier(q + "_lo"), sql.Identifier(q + "_hi")
        # every row inside its class's range, in the source type
        outside = scalar(conn, sql.SQL("SELECT count(*) FROM {m} JOIN {c} AS c ON c.ec_id = k.ec_id "
                                       "WHERE NOT (s.{q} >= c.{lo} AND s.{q} <= c.{hi})").format(
            m=members, c=classes, q=sql.Identifier(q), lo=lo, hi=hi))
        assert outside == 0
        # each bound is the min / max of its class and one of its source values, as text
        wrong = conn.execute(sql.SQL(
            "SELECT c.ec_id, c.{lo}::text, c.{hi}::text, g.lo::text, g.hi::text FROM {c} AS c JOIN "
            "(SELECT k.ec_id, min(s.{q}) AS lo, max(s.{q}) AS hi, pg_catalog.array_agg(s.{q}::text) AS texts "
            "FROM {m} GROUP BY 1) AS g ON g.ec_id = c.ec_id WHERE c.{lo} IS DISTINCT FROM g.lo "
            "OR c.{hi} IS DISTINCT FROM g.hi OR NOT (c.{lo}::text = ANY (g.texts)) "
            "OR NOT (c.{hi}::text = ANY (g.texts)) LIMIT 3").format(
                c=classes, m=members, q=sql.Identifier(q), lo=lo, hi=hi)).fetchall()
        assert wrong == [], wrong


def assert_documented_error(exc: psycopg.Error, *parts):
    """A documented SQLSTATE (never 38000, 22P02 from internal JSON, or XX), the parts in the
    message, a HINT."""
    state, msg = exc.sqlstate, exc.diag.message_primary or ""
    assert state not in ("38000", "22P02") and not state.startswith("XX"), (state, msg)
    for p in parts:
        assert p in msg, (p, msg)
    assert exc.diag.message_hint, "no HINT: %s" % msg


# --------------------------------------------------------------------------- QIs

@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("case", list(QI_CASES))
def test_unusual_qi_values_publish_exact_classes(db, case, method):
    make_source(db, qi=QI_CASES[case])
    r = run(db, ["q", "age"], "sa", method)
    assert r["rows"] == ROWS and r["ail"] == r["ail"]          # a finite AIL (not NaN)
    check_published(db, "out", ["q", "age"], "sa")


def test_empty_string_class_reads_back_as_empty_string(db):
    """A class holding only '' publishes '', one holding '' and 'x' the root."""
    make_source(db, qi=("text", "CASE WHEN i <= 24 THEN '' ELSE 'x' END"), sa=("int", "i % 3"))
    run(db, ["q"], "sa", "ak", k=3, t=1)
    labels = {r[0] for r in db.execute("SELECT q FROM out_classes")}
    assert labels == {"", "x"}
    check_published(db, "out", ["q"], "sa", t=1)


def test_interval_bounds_are_the_source_values(db):
    """'400 days' comes back as '400 days', not justified to '1 year 1 mon 10 days'."""
    make_source(db, qi=("interval", "(i * 100 || ' days')::interval"), sa=("int", "i % 2"))
    run(db, ["q"], "sa", "ak", k=2, t=1)
    texts = {r[0] for r in db.execute("SELECT q_lo::text FROM out_classes UNION SELECT q_hi::text FROM out_classes")}
    assert "400 days" in texts or any(t.endswith("00 days") for t in texts)
    assert not any("mon" in t or "year" in t for t in texts), texts


def test_bigint_bounds_are_exact(db):
    """Bounds beyond 2^53 are not rounded through float8."""
    make_source(db, qi=("bigint", "CASE WHEN i % 2 = 0 THEN 9223372036854775807 - i "
                             "ELSE -9223372036854775807 + i END"))
    run(db, ["q"], "sa", "ak")
    lo, hi = db.execute("SELECT min(q_lo), max(q_hi) FROM out_classes").fetchone()
    assert (lo, hi) == (-9223372036854775806, 9223372036854775805)


@pytest.mark.parametrize("method", METHODS)
def test_duplicates_only_table(db, method):
    """Every row the same QI and SA: one class or several, all exact."""
    make_source(db, qi=("int", "5"), sa=("text", "'same'"))
    db.execute("UPDATE unusual SET age = 1")
    run(db, ["q", "age"], "sa", method)
    check_published(db, "out", ["q", "age"], "sa")


# --------------------------------------------------------------------------- SAs

@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("case", list(SA_CASES))
def test_unusual_sa_values_publish_exact_classes(db, case, method):
    make_source(db, qi=("int", "i % 50"), sa=SA_CASES[case])
    run(db, ["q", "age"], "sa", method)
    check_published(db, "out", ["q", "age"], "sa")


@pytest.mark.parametrize("method", METHODS)
def test_several_sas_with_unusual_values(db, method):
    make_source(db, qi=("bigint", "(CASE WHEN i % 2 = 0 THEN 5000000000000000000 "
                             "ELSE -5000000000000000000 END) + i"), sa=SA_CASES["empty-string"])
    db.execute("ALTER TABLE unusual ADD COLUMN sa2 float8")
    db.execute("UPDATE unusual SET sa2 = CASE WHEN id % 2 = 0 THEN 1.7e308 ELSE -1.7e308 END")
    with db.cursor(row_factory=psycopg.rows.dict_row) as cur:
        r = cur.execute("SELECT * FROM sabre_anonymize(%s::regclass, %s::text[], %s::text[], %s::float8[], %s, %s, "
                        "'out')", (SOURCE, ["q", "age"], ["sa", "sa2"], [T, T], K, method)).fetchone()
    assert r["rows"] == ROWS
    with db.cursor(row_factory=psycopg.rows.dict_row) as cur:
        v = cur.execute("SELECT * FROM sabre_verify('out'::regclass, %s::text[], %s::float8[], %s)",
                        (["sa", "sa2"], [T, T], K)).fetchone()
    assert v["violations"] == 0, v
    check_published(db, "out", ["q", "age"], "sa")


def test_estimate_with_empty_string_and_extreme_values(db):
    """sabre_estimate reads pg_stats: '' and extreme values are valid there too."""
    make_source(db, qi=QI_CASES["float8-overflowing-span"], sa=SA_CASES["empty-string"], rows=400)
    db.execute("ANALYZE unusual")
    with db.cursor(row_factory=psycopg.rows.dict_row) as cur:
        for method in ("ak", "refine"):        # SABRE's plan; the default method's bounds
            rows = cur.execute("SELECT * FROM sabre_estimate(%s::regclass, %s::text[], %s, %s::float8[], %s, "
                               "method => %s)", (SOURCE, ["q", "age"], "sa", [0.3, 0.6], K, method)).fetchall()
            assert len(rows) == 2 and all(r["classes_max"] >= 1 and r["method"] == method for r in rows), rows
            assert method != "ak" or all(r["classes"] >= 1 for r in rows), rows


# --------------------------------------------------------------------------- non-finite values

@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("case", list(NONFINITE))
@pytest.mark.parametrize("role", ["qi", "sa"])
def test_non_finite_values_are_a_documented_error(db, case, method, role):
    typ, expr, value = NONFINITE[case]
    if role == "qi":
        make_source(db, qi=(typ, expr))
        call = lambda c: run(c, ["q", "age"], "sa", method)     # noqa: E731
    else:
        make_source(db, sa=(typ, expr))
        call = lambda c: run(c, ["age"], "sa", method)          # noqa: E731
    column = "q" if role == "qi" else "sa"
    expect_error(db, call, "22023", "non-finite", '"%s" (1 rows: %s)' % (column, value), source=SOURCE)


# --------------------------------------------------------------------------- hierarchies

AMBIGUOUS = {
    "internal-labelled-as-leaf": ("a;a;*\nb;a;*", "'a'"),
    "internal-labelled-as-other-leaf": ("a;X;*\nb;X;*\nX;Y;*", "'X'"),
    "one-label-two-internal-nodes": ("a;X;R;*\nb;Y;X;*", "'X'"),
    "root-labelled-as-leaf": ("a;*\n*;*", "'*'"),
}


@pytest.mark.parametrize("case", list(AMBIGUOUS))
def test_ambiguous_hierarchy_is_refused_at_define(db, case):
    text, label = AMBIGUOUS[case]
    e = expect_error(db, lambda c: c.execute("SELECT * FROM sabre_define_hierarchy('amb_h', %s)", (text,)),
                     "22P04", "label %s" % label, source=None)
    assert "labelled like a leaf" in e.diag.message_hint
    assert scalar(db, "SELECT count(*) FROM sabre.hierarchies WHERE name = 'amb_h'") == 0


def test_chain_of_one_label_over_the_same_leaves_is_accepted(db):
    db.execute("SELECT * FROM sabre_define_hierarchy('chain_h', %s)", ("Other;Other;*\na;A;*\nb;A;*",))
    make_source(db, qi=("text", "(ARRAY['a', 'b', 'Other'])[1 + i % 3]"))
    run(db, ["q", "age"], "sa", "ak", options={"hierarchies": {"q": "chain_h"}})
    labels = {r[0] for r in db.execute("SELECT q FROM out_classes")}
    assert labels <= {"a", "b", "Other", "A", "*"}


@pytest.mark.parametrize("method", METHODS)
def test_ambiguous_hierarchy_stored_earlier_is_refused_at_load(db, method):
    """A hierarchy stored before the check (written straight into the catalog) is refused when
    a run loads it: 22P04 naming it, with a HINT to redefine it."""
    make_source(db, qi=("text", "(ARRAY['a', 'b'])[1 + i % 2]"))
    db.execute("DELETE FROM sabre.hierarchies WHERE name = 'old_h'")
    db.execute("INSERT INTO sabre.hierarchies (name, height, leaves, root) VALUES ('old_h', 2, 2, '*')")
    db.execute("INSERT INTO sabre.hierarchy_rows (hierarchy, ord, path) VALUES "
                    "('old_h', 0, ARRAY['a', 'a', '*']), ('old_h', 1, ARRAY['b', 'a', '*'])")
    e = expect_error(db, lambda c: run(c, ["q", "age"], "sa", method, options={"hierarchies": {"q": "old_h"}}),
                     "22P04", "'old_h'", "label 'a'", source=SOURCE)
    assert "sabre_define_hierarchy" in e.diag.message_hint


# --------------------------------------------------------------------------- sabre_verify's comparison

def test_verify_compares_t_as_written_exactly(db):
    """A class of EMD exactly 3/10 is within t = 0.3 and violates t = 0.2999999999 (no tolerance)."""
    db.execute("DROP TABLE IF EXISTS vt")
    db.execute("CREATE TABLE vt AS SELECT CASE WHEN i <= 10 THEN 0 ELSE 1 END AS ec_id, "
                    "CASE WHEN (i <= 8) OR (i > 10 AND i <= 12) THEN 'a' ELSE 'b' END AS sa "
                    "FROM generate_series(1, 20) AS i")
    assert verify(db, "vt", "sa", 0.3)["violations"] == 0
    assert verify(db, "vt", "sa", 0.2999999999)["violations"] == 2
    assert verify(db, "vt", "sa", 0.3000000001)["violations"] == 0


# --------------------------------------------------------------------------- randomized

VALUE_POOL = {
    "text": ["''", "'NULL'", "'*'", "'日本'", "repeat('w', 2000)", "' '", "'x'", "'(any)'"],
    "bigint": ["9223372036854775807", "-9223372036854775808", "0", "5000000000000000000", "-5000000000000000000", "1"],
    "float8": ["9e307", "-9e307", "4.9e-324", "0", "-0.0", "1.7976931348623157e308", "'NaN'", "'Infinity'"],
    "numeric": ["1e400", "-1e400", "1e-400", "0.000000000000000000000000000001", "123456789012345678901234567890", "'NaN'"],
    "interval": ["'400 days'", "'1 year 1 mon 10 days'", "'-3 days'", "'36 hours'", "'1 mon'"],
    "timestamp": ["'294270-01-01'", "'4713-01-01 BC'", "'2020-01-01 00:00:00.000001'", "'infinity'"],
    "smallint": ["32767", "-32768", "0"],
}


def _random_case(rng):
    typ = rng.choice(sorted(VALUE_POOL))
    pool = rng.sample(VALUE_POOL[typ], rng.randint(1, len(VALUE_POOL[typ])))
    expr = "(ARRAY[%s]::%s[])[1 + (i * %d) %% %d]" % (", ".join("(%s)::%s" % (v, typ) for v in pool), typ,
                                                       rng.randint(1, 97), len(pool))
    return typ, expr


@pytest.mark.parametrize("seed", range(8))
def test_randomized_unusual_values(db, seed):
    """Random columns drawn from the pools above, as QI and as SA, with a random method: every
    run publishes exact classes, or fails with a documented error naming the column, with a HINT."""
    rng = random.Random(seed)
    for _ in range(3):
        qi, sa = _random_case(rng), _random_case(rng)
        method, t, k = rng.choice(METHODS), rng.choice([0.4, 0.7, 1.0]), rng.choice([1, 2, 4])
        make_source(db, qi=qi, sa=sa, rows=rng.choice([8, 30, 60]))
        try:
            run(db, ["q", "age"], "sa", method, t=t, k=k)
        except psycopg.Error as e:
            assert_documented_error(e)
            assert e.sqlstate in ("22023", "22004"), (e.sqlstate, e.diag.message_primary, qi, sa)
            assert '"q"' in e.diag.message_primary or '"sa"' in e.diag.message_primary, e.diag.message_primary
            continue
        check_published(db, "out", ["q", "age"], "sa", t=t, k=k)


# --------------------------------------------------------------------------- streams

STREAM_QIS = {
    "bigint-beyond-2^63-range": QI_CASES["bigint-beyond-2^63-range"],
    "float8-overflowing-span": QI_CASES["float8-overflowing-span"],
    "interval-unjustified": QI_CASES["interval-unjustified"],
    "empty-string": QI_CASES["empty-string"],
}


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("case", list(STREAM_QIS))
def test_stream_with_unusual_values(db, case, method):
    """A stream's advances publish such values too (the SA with the empty string); its
    verifier finds nothing wrong, and the published ranges are the source's own values."""
    name = "unusual_w_%s_%s" % (case.split("-")[0], method)
    source = name + "_src"
    make_source(db, qi=STREAM_QIS[case], sa=SA_CASES["empty-string"], rows=120, table=source)
    with db.cursor(row_factory=psycopg.rows.dict_row) as cur:
        cur.execute("SELECT * FROM sabre_stream_create(name => %s, source => %s::regclass, arrival => 'id', "
                    "quasi_identifiers => %s::text[], sensitive => 'sa', t => %s, k => %s, window_size => 60, "
                    "step => 30, method => %s, output => %s)", (name, source, ["q", "age"], T, K, method, name))
        advanced = cur.execute("SELECT * FROM sabre_stream_advance(%s)", (name,)).fetchall()
        v = cur.execute("SELECT * FROM sabre_stream_verify(%s)", (name,)).fetchone()
    assert advanced and v["violations"] == 0 and v["published_twice"] == 0, (advanced, v)
    if case != "empty-string":
        wrong = scalar(db, sql.SQL(
            "SELECT count(*) FROM {c} AS c WHERE NOT EXISTS (SELECT 1 FROM {k} AS k JOIN {s} AS s ON s.id = k.key "
            "WHERE k.ec_id = c.ec_id AND k.advance_no = c.advance_no AND s.q::text = c.q_lo::text) "
            "OR NOT EXISTS (SELECT 1 FROM {k} AS k JOIN {s} AS s ON s.id = k.key WHERE k.ec_id = c.ec_id "
            "AND k.advance_no = c.advance_no AND s.q::text = c.q_hi::text)").format(
                c=sql.Identifier(name + "_classes"), k=sql.Identifier(name + "_keys"), s=sql.Identifier(source)))
        assert wrong == 0


@pytest.mark.parametrize("case", ["numeric-beyond-float8", "float8-extremes", "empty-string", "interval"])
def test_estimate_with_unusual_sa(db, case):
    make_source(db, qi=("int", "i % 50"), sa=SA_CASES[case], rows=300)
    db.execute("ANALYZE unusual")
    for method in ("ak", "refine"):
        rows = db.execute("SELECT classes, classes_max FROM sabre_estimate(%s::regclass, %s::text[], 'sa', "
                          "%s::float8[], %s, method => %s)", (SOURCE, ["q", "age"], [0.3, 0.6], K, method)).fetchall()
        assert len(rows) == 2 and all(r[1] >= 1 and (method != "ak" or r[0] >= 1) for r in rows), rows


@pytest.mark.parametrize("case", ["float8-nan", "timestamp-infinity"])
def test_estimate_names_non_finite_values(db, case):
    typ, expr, value = NONFINITE[case]
    make_source(db, sa=(typ, expr), rows=50)
    db.execute("ANALYZE unusual")
    expect_error(db, lambda c: c.execute("SELECT * FROM sabre_estimate(%s::regclass, %s::text[], 'sa', %s::float8[], %s)",
                                         (SOURCE, ["q", "age"], [0.3], K)),
                 "22023", "non-finite", '"sa"', source=SOURCE)


@pytest.mark.parametrize("case", ["bigint-beyond-2^63-range", "float8-overflowing-span", "numeric-beyond-float8"])
def test_instant_refuses_ranges_it_cannot_bin_exactly(db, case):
    """sabre_instant bins in float8: such a QI is a documented 22023 pointing to sabre_anonymize."""
    make_source(db, qi=QI_CASES[case], rows=200)
    db.execute("ANALYZE unusual")
    e = expect_error(db, lambda c: c.execute("SELECT * FROM sabre_instant(%s::regclass, %s::text[], %s, output => 'inst')",
                                             (SOURCE, ["q", "age"], K)), "22023", '"q"', "sabre_instant", source=SOURCE)
    assert "sabre_anonymize" in e.diag.message_hint


@pytest.mark.parametrize("case", ["numeric-beyond-float8", "float8-overflowing-span", "bigint-beyond-2^63-range",
                                  "interval-unjustified", "empty-string"])
def test_labels_view_and_utility_with_unusual_values(db, case):
    make_source(db, qi=QI_CASES[case])
    run(db, ["q", "age"], "sa", "ak", options={"labels": True})
    assert scalar(db, "SELECT count(*) FROM out_labels") == ROWS
    ail = scalar(db, "SELECT ail FROM sabre_utility('out'::regclass, %s::regclass)", (SOURCE,))
    assert 0 <= ail <= 1
