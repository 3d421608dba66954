"""The output's SA values are the source's, class by class: the output built from the classes
sends each SA as one array of values or codes, grouped by class, that every class unnests its
slice of (``publish.output_from_classes_query``; issue 26, "Moving rows").  For each kind of SA
value (integers, floats, dates, text under a flat or a named hierarchy), with few and many
distinct values, with one SA and with two, and in a partitioned run (its parts' class ids from
an offset): the multiset of (class, SA value) of the output equals that of the source's rows
through the side table, both ways.  (The pre-swap check recomputes sizes and EMDs from the
output, not which value each row carries.)"""
from __future__ import annotations

import json

import pytest
from psycopg import sql

from tests.db.helpers import anonymize, ident, scalar

ROWS = 1200


def make_source(conn, distinct: int):
    """``public.src``: two numerical QIs, and SAs of ``distinct`` values in several types."""
    conn.execute("DROP TABLE IF EXISTS public.src")
    conn.execute(
        "CREATE TABLE public.src AS SELECT g AS id, (g * 7919) %% 97 AS a, (g * 104729) %% 89 AS b, "
        "((g * 31) %% %(d)s) * 3 - 50 AS v_int, ((g * 17) %% %(d)s) / 8.0 AS v_float, "
        "date '2020-01-01' + ((g * 13) %% %(d)s) AS v_date, 'x' || ((g * 11) %% %(d)s) AS v_text "
        "FROM generate_series(1, %(n)s) g" % {"d": distinct, "n": ROWS})
    conn.execute("ALTER TABLE public.src ALTER COLUMN v_float TYPE float8")
    conn.execute("ALTER TABLE public.src ADD PRIMARY KEY (id)")


@pytest.fixture
def conn(pg_module_conn):
    """The module's database, left as found: the source and every output dropped after each test."""
    yield pg_module_conn
    outputs = [r[0] for r in pg_module_conn.execute(
        "SELECT c.oid::regclass::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'public' AND c.relkind = 'r' AND c.relname LIKE 'o\\_%'").fetchall()]
    for name in outputs + ["public.src"]:
        pg_module_conn.execute("DROP TABLE IF EXISTS %s CASCADE" % name)


def mismatches(conn, output: str, columns) -> int:
    """Rows of (class, SA values) in the output and not in the source through the side table,
    or the other way round (EXCEPT ALL both ways: multisets)."""
    cols = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    src_cols = sql.SQL(", ").join(sql.SQL("s.") + sql.Identifier(c) for c in columns)
    out, keys = ident(output), ident(output + "_keys")
    src = sql.SQL("SELECT k.ec_id, {} FROM public.src s JOIN {} k ON k.key = s.id").format(src_cols, keys)
    pub = sql.SQL("SELECT ec_id, {} FROM {}").format(cols, out)
    q = sql.SQL("SELECT (SELECT count(*) FROM ({} EXCEPT ALL {}) a) + (SELECT count(*) FROM ({} EXCEPT ALL {}) b)").format(
        src, pub, pub, src)
    return scalar(conn, q)


@pytest.mark.parametrize("sa, distinct", [("v_int", 40), ("v_float", 40), ("v_date", 40), ("v_text", 40),
                                         ("v_int", 300), ("v_text", 300)])
def test_one_sa_values_are_the_sources(conn, distinct, sa):
    make_source(conn, distinct)
    out = "public.o_%s_%d" % (sa, distinct)
    r = anonymize(conn, "public.src", ["a", "b"], sa, 0.6, 3, "refine", out, {"seed": 1})
    assert r["rows"] == ROWS and r["classes"] > 3
    assert scalar(conn, sql.SQL("SELECT count(*) FROM {}").format(ident(out))) == ROWS
    assert mismatches(conn, out, [sa]) == 0


def test_a_text_sa_under_a_named_hierarchy(conn):
    make_source(conn, 40)
    rows = "\n".join("x%d;g%d;*" % (i, i // 5) for i in range(40))
    conn.execute("SELECT * FROM sabre_define_hierarchy('vt_h', %s)", (rows,))
    out = "public.o_named"
    anonymize(conn, "public.src", ["a", "b"], "v_text", 0.6, 3, "ak", out, {"hierarchies": {"v_text": "vt_h"}})
    assert mismatches(conn, out, ["v_text"]) == 0
    conn.execute("DROP TABLE %s CASCADE" % out)
    conn.execute("SELECT sabre_drop_hierarchy('vt_h')")


@pytest.mark.parametrize("second", ["v_text", "v_big"], ids=["two small", "one with many values"])
def test_two_sas_values_are_the_sources(conn, second):
    make_source(conn, 40)
    conn.execute("ALTER TABLE public.src ADD COLUMN v_big int")
    conn.execute("UPDATE public.src SET v_big = (id * 37) % 700")
    out = "public.o_two_%s" % second
    with conn.cursor() as cur:
        cur.execute("SELECT * FROM sabre_anonymize(source => 'public.src'::regclass, quasi_identifiers => "
                    "ARRAY['a', 'b'], sensitive => ARRAY['v_int', %s], t => ARRAY[0.7, 0.7]::float8[], k => 3, "
                    "output => %s, options => %s::jsonb)", (second, out, json.dumps({"seed": 2})))
    assert mismatches(conn, out, ["v_int", second]) == 0


def test_a_partitioned_run_values_are_the_sources(conn):
    """Each part expands its own classes (ids from its offset) from its own arrays."""
    make_source(conn, 40)
    out = "public.o_parts"
    r = anonymize(conn, "public.src", ["a", "b"], "v_float", 0.6, 3, "refine", out, {"partitions": 3, "seed": 3})
    assert r["rows"] == ROWS
    assert mismatches(conn, out, ["v_float"]) == 0
