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


# --------------------------------------------------------------------------- exact generalization

def _lowest_common_ancestor(paths: list[list[str]]) -> str:
    """The lowest node shared by leaf-to-root paths of equal length (hierarchy rows)."""
    for level in zip(*paths):
        if len(set(level)) == 1:
            return level[0]
    raise AssertionError("paths without a common root: %s" % paths)


def check_exact_generalization(conn, output: str, source: str, key: str = "id",
                               hierarchies: dict[str, str] | None = None) -> dict[str, int]:
    """Every class of a run's ``<output>_classes`` is generalized exactly as documented, from the
    source rows the side table ``<output>_keys`` (source key -> ec_id) puts in it:
    a numerical QI's ``<qi>_lo``/``<qi>_hi`` are the min and max of the class's source values
    (compared in the source type); a categorical QI's label is the lowest common ancestor of
    the class's values in ``hierarchies[qi]``, or without one (the flat hierarchy) the value
    itself when the class holds one value and ``*`` otherwise.  ``output`` and ``source`` are
    'schema.name' (unquoted parts).  Returns {categorical qi: classes holding several values},
    so that callers can tell a meaningful check from a vacuous one."""
    hierarchies = hierarchies or {}
    schema, name = output.split(".", 1)
    classes, keys, src = (sql.Identifier(schema, name + "_classes"), sql.Identifier(schema, name + "_keys"),
                          ident(source))
    members = sql.SQL("{} k JOIN {} s ON s.{} = k.key").format(keys, src, sql.Identifier(key))
    assert count(conn, keys) == count(conn, src), "the side table must hold every source row once"
    class_columns = [c for c, _ in columns(conn, classes)][3:]          # after ec_id, size, emd
    numerical = [c[:-3] for c in class_columns if c.endswith("_lo")]
    categorical = [c for c in class_columns if not c.endswith(("_lo", "_hi"))]
    for q in numerical:
        wrong = conn.execute(sql.SQL(
            "SELECT c.ec_id, c.{lo}, c.{hi}, m.lo, m.hi FROM {classes} c FULL JOIN "
            "(SELECT k.ec_id, min(s.{q}) AS lo, max(s.{q}) AS hi FROM {members} GROUP BY k.ec_id) m "
            "USING (ec_id) WHERE c.{lo} IS DISTINCT FROM m.lo OR c.{hi} IS DISTINCT FROM m.hi "
            "ORDER BY 1 LIMIT 3").format(
                q=sql.Identifier(q), lo=sql.Identifier(q + "_lo"), hi=sql.Identifier(q + "_hi"),
                classes=classes, members=members)).fetchall()
        assert wrong == [], "%s: (ec_id, lo, hi, source min, source max) differ: %s" % (q, wrong)
    mixed = {}
    for q in categorical:
        paths = None
        if q in hierarchies:
            paths = {r[0][0]: list(r[0]) for r in conn.execute(
                "SELECT path FROM sabre.hierarchy_rows WHERE hierarchy = %s", (hierarchies[q],))}
        rows = conn.execute(sql.SQL(
            "SELECT c.ec_id, c.{q}, m.vals FROM {classes} c FULL JOIN (SELECT k.ec_id, "
            "array_agg(DISTINCT s.{q}::text) AS vals FROM {members} GROUP BY k.ec_id) m USING (ec_id)")
            .format(q=sql.Identifier(q), classes=classes, members=members)).fetchall()
        wrong = []
        for ec_id, label, values in rows:
            if label is None or values is None:
                wrong.append((ec_id, label, None, values))
            elif paths is not None:
                expected = _lowest_common_ancestor([paths[v] for v in values])
            else:
                expected = values[0] if len(values) == 1 else "*"
            if label != expected:
                wrong.append((ec_id, label, expected, values))
        assert wrong == [], "%s: (ec_id, label, lowest common ancestor, values) differ: %s" % (q, wrong[:3])
        mixed[q] = sum(1 for _, _, values in rows if len(values) > 1)
    return mixed
