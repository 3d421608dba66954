"""Partitioned runs driven by the client: parts anonymized in parallel backends (docs/scale-out.md).

The server splits the source (``sabre_partitions``: aggregates only, then each part's rows
copied into a table of their own by one scan), each part is one ``sabre_anonymize`` over
that table on its own connection -- ``parallel`` of
them at a time, so each backend holds one part -- and ``sabre_publish_parts`` checks the parts'
outputs against the whole table and swaps them in as one output.  Client connections, not
``dblink``: each part commits on its own connection, and a failure drops the parts made so far
(they are the caller's recorded outputs); the final output appears only in the publishing
transaction, atomically.  ``sabre_anonymize(options => '{"partitions": N}')`` is the same run in
one backend, one part after another.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

VIEW = "sabre_part_view"


def _connect(dsn: str):
    import psycopg

    return psycopg.connect(dsn, autocommit=True)


def plan(conn, source: str, quasi_identifiers, sensitive, t, k, method, output, options, schema) -> list[dict]:
    """The rows of ``sabre_partitions`` as dicts, in part order."""
    from psycopg import rows, sql

    with conn.cursor(row_factory=rows.dict_row) as cur:
        return cur.execute(sql.SQL(
            "SELECT p.* FROM {}.sabre_partitions(%s::pg_catalog.text::pg_catalog.regclass, %s::text[], %s, "
            "%s::float8, %s::int, %s, %s::text, %s::jsonb, stage_rows => true) AS p ORDER BY p.part").format(sql.Identifier(schema)),
            (source, list(quasi_identifiers), sensitive, t, k, method, output, json.dumps(options))).fetchall()


def anonymize_part(dsn: str, source_qname: str, part: dict, quasi_identifiers, sensitive, k, method,
                   schema) -> dict:
    """One part on its own connection: sabre_anonymize over the table of its rows (then
    dropped), or over a temporary view of the source's rows when it is the only part."""
    from psycopg import sql

    with _connect(dsn) as conn:
        source = part.get("part_rows")
        if not source:
            conn.execute(sql.SQL("CREATE TEMP VIEW {} AS SELECT * FROM {} WHERE {}").format(
                sql.Identifier(VIEW), sql.SQL(source_qname), sql.SQL(part["predicate"])))
        row = conn.execute(sql.SQL(
            "SELECT r.rows, r.classes, r.max_emd, r.seconds FROM {}.sabre_anonymize(%s::pg_catalog.regclass, "
            "%s::text[], %s, %s::float8, %s::int, %s, %s::text, %s::jsonb) AS r").format(sql.Identifier(schema)),
            (source or "pg_temp." + VIEW, list(quasi_identifiers), sensitive, part["budget"], k, method,
             part["part_output"], json.dumps(part["part_options"]))).fetchone()
        if source:
            conn.execute(sql.SQL("DROP TABLE {}").format(sql.SQL(source)))
    return {"part": part["part"], "rows": row[0], "classes": row[1], "max_emd": row[2], "seconds": row[3]}


def drop_parts(conn, parts: Sequence[dict]) -> None:
    """Drop the part outputs and rows tables a failed run made (sabre made them under its part names)."""
    from psycopg import sql

    for p in parts:
        if p.get("part_rows"):
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.SQL(p["part_rows"])))
        for suffix in ("", "_classes", "_keys"):
            # (part_output is quoted and qualified as the server prints it: "schema"."name")
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.SQL(p["part_output"][:-1] + suffix + '"')))


def run(dsn: str, source: str, quasi_identifiers: Sequence[str], sensitive: str, t: float, k: int, method: str,
        output: str | None, options: dict, parallel: int, schema: str,
        on_part: Callable[[dict], None] | None = None) -> tuple:
    """The partitioned run; the row of ``sabre_publish_parts`` (run_id, output oid, rows, classes,
    min_class_size, max_emd, ail, seconds)."""
    from psycopg import sql

    with _connect(dsn) as conn:
        parts = plan(conn, source, quasi_identifiers, sensitive, t, k, method, output, options, schema)
        source_qname = conn.execute("SELECT pg_catalog.format('%%I.%%I', n.nspname, c.relname) FROM pg_catalog.pg_class c "
                                    "JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace "
                                    "WHERE c.oid OPERATOR(pg_catalog.=) %s::pg_catalog.text::pg_catalog.regclass",
                                    (source,)).fetchone()[0]
        try:
            with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
                futures = [pool.submit(anonymize_part, dsn, source_qname, p, quasi_identifiers, sensitive, k,
                                       method, schema) for p in parts]
                try:
                    for f in futures:
                        done = f.result()
                        if on_part is not None:
                            on_part({**done, "parts": len(parts)})
                except BaseException:
                    for f in futures:
                        f.cancel()
                    raise
            return conn.execute(sql.SQL(
                "SELECT r.run_id, r.output::pg_catalog.oid, r.rows, r.classes, r.min_class_size, r.max_emd, r.ail, "
                "r.seconds FROM {}.sabre_publish_parts(%s::pg_catalog.text::pg_catalog.regclass, %s::text[], %s, "
                "%s::float8, %s::int, %s, %s::text, %s::jsonb, %s::text[]) AS r").format(sql.Identifier(schema)),
                (source, list(quasi_identifiers), sensitive, t, k, method, output, json.dumps(options),
                 [p["part_output"] for p in parts])).fetchone()
        except BaseException:
            drop_parts(conn, parts)
            raise
