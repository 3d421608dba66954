"""Helpers shared by the database tests (import as ``from tests.db.helpers import ...``).

Everything goes through the documented SQL API and the catalogs, never through sabre's
Python modules inside the backend:

``anonymize``        sabre_anonymize with named arguments, its row as a dict (+ ``output_oid``);
``verify``           sabre_verify, its row as a dict;
``scalar``, ``count``, ``columns``, ``ident``, ``relation_exists``, ``relations``;
``checksum``         md5 of a relation's rows in key order (the source must stay unchanged);
``class_sizes``      {ec_id: rows} of an output;
``run_row``          the sabre.runs row of a run;
``state``, ``expect_error``   what a failed call must leave alone, and the check that it did;
``make_census``      the CENSUS-like generator with its hierarchies.
"""
from __future__ import annotations

import json

import psycopg
import pytest
from psycopg import sql

from sabre_pg import datasets as ds

CENSUS_ROWS = 20_000


def anonymize(conn, source, qis, sensitive, t, k=1, method="ak", output=None, options=None,
              source_type="regclass") -> dict:
    """Call sabre_anonymize with named arguments; the returned row as a dict (+ output_oid)."""
    q = sql.SQL(
        "SELECT r.run_id, r.output::oid AS output_oid, r.output::text AS output, r.rows, r.classes, "
        "r.min_class_size, r.max_emd, r.ail, r.seconds FROM sabre_anonymize("
        "source => %s::{}, quasi_identifiers => %s::text[], sensitive => %s, t => %s::float8, "
        "k => %s::int, method => %s, output => %s::text, options => %s::jsonb) AS r"
    ).format(sql.SQL(source_type))
    with conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        rows = cur.execute(q, (source, qis, sensitive, t, k, method, output,
                               json.dumps(options if options is not None else {}))).fetchall()
    assert len(rows) == 1, rows
    return rows[0]


def verify(conn, output, sensitive, t, k=1, hierarchy=None) -> dict:
    with conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        return cur.execute("SELECT * FROM sabre_verify(%s::regclass, %s, %s::float8, %s::int, %s)",
                           (output, sensitive, t, k, hierarchy)).fetchone()


def scalar(conn, query, params=None):
    return conn.execute(query, params).fetchone()[0]


def ident(name: str) -> sql.Composable:
    """A possibly schema-qualified name given as 'schema.table' (unquoted parts)."""
    return sql.Identifier(*name.split(".", 1))


def _relation(rel: str | sql.Composable) -> sql.Composable:
    return ident(rel) if isinstance(rel, str) else rel


def checksum(conn, table: str | sql.Composable, key: str = "id") -> str:
    """md5 of every row of ``table`` (a Composable, or 'schema.table') in ``key`` order."""
    return scalar(conn, sql.SQL("SELECT md5(string_agg(t::text, ',' ORDER BY t.{})) FROM {} t")
                  .format(sql.Identifier(key), _relation(table)))


def count(conn, table: sql.Composable, where: sql.Composable = sql.SQL("true")) -> int:
    return scalar(conn, sql.SQL("SELECT count(*) FROM {} WHERE {}").format(_relation(table), where))


def columns(conn, rel: sql.Composable) -> list[tuple[str, str]]:
    """[(name, format_type)] of a relation in column order."""
    rel_text = _relation(rel).as_string(conn)
    return [tuple(r) for r in conn.execute(
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
        "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
        (rel_text,)).fetchall()]


def relation_exists(conn, name: str) -> bool:
    """Whether ``name`` (SQL syntax: quoted where needed) names a relation."""
    return scalar(conn, "SELECT to_regclass(%s) IS NOT NULL", (name,))


def relations(conn) -> set[tuple[str, str, str]]:
    """(schema, name, relkind) of every user relation."""
    return set(conn.execute(
        "SELECT n.nspname, c.relname, c.relkind::text FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast') "
        "AND n.nspname NOT LIKE 'pg_temp%%' AND n.nspname NOT LIKE 'pg_toast_temp%%'").fetchall())


def class_sizes(conn, output: str | sql.Composable) -> dict[int, int]:
    """{ec_id: number of rows} of an output relation."""
    return dict(conn.execute(sql.SQL("SELECT ec_id, count(*) FROM {} GROUP BY ec_id")
                             .format(_relation(output))).fetchall())


def run_row(conn, run_id) -> dict:
    with conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        return cur.execute("SELECT * FROM sabre.runs WHERE run_id = %s", (run_id,)).fetchone()


def make_census(conn, table="census", rows=CENSUS_ROWS, seed=1) -> dict:
    """The CENSUS-like table public.<table> (primary key id); {column: hierarchy name}."""
    return ds.generate_census(conn, table=table, rows=rows, seed=seed)["hierarchies"]


# --------------------------------------------------------------------------- failed calls

def state(conn, source="census") -> dict:
    """Everything a failed call must leave alone."""
    source_checksum = None
    if source is not None and relation_exists(conn, source):
        source_checksum = checksum(conn, sql.Identifier(source))
    return {
        "relations": relations(conn),
        "runs": scalar(conn, "SELECT count(*) FROM sabre.runs"),
        "hierarchies": scalar(
            conn, "SELECT coalesce(md5(string_agg(h::text, ',' ORDER BY name)), '') FROM "
                  "(SELECT name, height, leaves, root FROM sabre.hierarchies) h"),
        "hierarchy_rows": scalar(
            conn, "SELECT coalesce(md5(string_agg(r::text, ',' ORDER BY hierarchy, ord)), '') "
                  "FROM sabre.hierarchy_rows r"),
        "source": source_checksum,
    }


def expect_error(conn, fn, sqlstate, *message_parts, source="census"):
    """Run fn(conn); it must raise psycopg.Error with ``sqlstate``, a message containing every
    part, a non-empty HINT, and change nothing."""
    before = state(conn, source)
    with pytest.raises(psycopg.Error) as ei:
        fn(conn)
    e = ei.value
    msg = e.diag.message_primary or ""
    assert e.sqlstate == sqlstate, (e.sqlstate, msg)
    for part in message_parts:
        assert part in msg, (part, msg)
    assert e.diag.message_hint and e.diag.message_hint.strip(), "no HINT for: %s" % msg
    assert state(conn, source) == before
    return e
