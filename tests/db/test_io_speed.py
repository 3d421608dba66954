"""The I/O phases made cheaper (issue 26, "Moving rows") publish exactly what they did before:
for a given seed, a method whose engine is unchanged gives the same output, classes and side
table.  The hashes below were taken with the code before the change (main at 3d281cd) on the
same generated census table; rows are hashed in a fixed order (a class's rows are written in
a random order on purpose, so the physical order is not compared).

The side table's btree is now built for 'ak' and 'knn' only; the rows it holds are the same.
"""
from __future__ import annotations

from psycopg import sql

from tests.db.helpers import anonymize, ident, make_census, scalar

ROWS = 3000
QIS = ["age", "education", "sex", "marital", "race"]
T, K = 0.3, 5

# method -> (output, classes, side table) hashes, before the change
BEFORE = {
    "ak": ("fc95063d62d99b19db9e5d594b215b4f", "ab521ec968679488da1438a851163257", "f5a4a08a12c506f5b427cedc256ce016"),
    "mondrian": ("9cc1d1722dfe3df4bed96ef8a727cb31", "eab37ce4e2e94d0827a5d156e50a7252",
                 "d9a3d2c90f51d98c42f66ee297f2ac03"),
}


def content_hash(conn, relation: str, columns: str = "*") -> str:
    """md5 of the relation's rows as text, in text order (independent of physical order)."""
    return scalar(conn, sql.SQL("SELECT md5(coalesce(string_agg(r, E'\\n' ORDER BY r), '')) FROM "
                                "(SELECT x::text AS r FROM (SELECT {} FROM {}) AS x) AS y").format(
                                    sql.SQL(columns), ident(relation)))


def hashes(conn, output: str) -> tuple:
    """(output, classes, side table) of a run; the side table's hilbert_key and bucket are the
    engine's, compared as well."""
    return (content_hash(conn, output), content_hash(conn, output + "_classes"),
            content_hash(conn, output + "_keys"))


def run_all(conn) -> dict:
    make_census(conn, rows=ROWS)
    out = {}
    for method in BEFORE:
        name = "public.io_%s" % method
        anonymize(conn, "public.census", QIS, "salary", T, K, method, name, {"seed": 7})
        out[method] = hashes(conn, name)
    return out


def test_outputs_identical_to_before(pg_conn):
    got = run_all(pg_conn)
    assert got == BEFORE


def test_flat_hierarchies(pg_conn):
    """Every categorical QI without a named hierarchy is a flat hierarchy of its distinct values
    (NULLs excluded): the classes' labels are those values or '*' (validate's scans, profiled
    for issue 26)."""
    make_census(pg_conn, rows=ROWS)
    pg_conn.execute("ALTER TABLE public.census ALTER race DROP NOT NULL")
    pg_conn.execute("UPDATE public.census SET race = NULL WHERE id % 97 = 0")
    anonymize(pg_conn, "public.census", QIS, "salary", T, K, "ak", "public.io_flat", {"nulls": "drop"})
    for q in ("sex", "marital", "race"):
        labels = {r[0] for r in pg_conn.execute(sql.SQL("SELECT DISTINCT {} FROM public.io_flat_classes").format(
            sql.Identifier(q)))}
        values = {r[0] for r in pg_conn.execute(sql.SQL("SELECT DISTINCT {}::text FROM public.census WHERE {} "
                                                        "IS NOT NULL").format(sql.Identifier(q), sql.Identifier(q)))}
        assert labels <= values | {"*"} and None not in labels
