"""The Python API: sabre's SQL functions from notebooks and pipelines (docs/python-api.md).

A thin layer: every call is one of the SQL functions (``sabre_anonymize``, ``sabre_verify``,
``sabre_estimate``) or a read of what they wrote (``sabre.runs``, ``<output>``,
``<output>_classes``); nothing is computed here.  Results come back as pandas DataFrames and,
given SQLAlchemy, the output as a reflected ``sqlalchemy.Table``.

``bind``, the first argument of every function, is any of:

* a SQLAlchemy 2 ``Engine`` or ``Connection`` using the psycopg 3 driver
  (``postgresql+psycopg://...``): an engine's work is committed; a connection's takes part in
  its transaction when one is open, else is committed (as psycopg's ``transaction()`` does);
* a psycopg 3 ``Connection`` (no SQLAlchemy import): the same rule;
* a DSN (libpq conninfo or ``postgresql://`` URL): a connection is opened and closed per call.

Errors are :class:`sabre_pg.errors.SabreError`; the server's carry ``sqlstate``, ``hint`` and
``detail`` (:class:`sabre_pg.errors.DatabaseError` and its subclasses by SQLSTATE).
"""
from __future__ import annotations

import html
import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sabre_pg.core.stopwatch import parse_progress
from sabre_pg.errors import SabreError, from_database, require

DEFAULT_SCHEMA = "sabre"
CHUNK_ROWS = 50_000
WHAT = "sabre_pg's Python API"


def _pandas():
    return require("pandas", "api", WHAT)


def _is_sqlalchemy(bind) -> bool:
    return type(bind).__module__.split(".")[0] == "sqlalchemy"


@contextmanager
def _errors():
    """PostgreSQL errors (from psycopg or SQLAlchemy) as :class:`DatabaseError`."""
    try:
        yield
    except SabreError:
        raise
    except Exception as e:
        error = from_database(e)
        if error is None:
            raise
        raise error from e


@contextmanager
def _session(bind):
    """A psycopg connection for ``bind``, inside the transaction the module doc describes."""
    if isinstance(bind, str):
        import psycopg

        with psycopg.connect(bind) as conn:      # commits on success, rolls back on error, closes
            yield conn
    elif _is_sqlalchemy(bind):
        if hasattr(bind, "raw_connection"):      # an Engine
            with bind.begin() as conn:
                yield conn.connection.driver_connection
        elif bind.in_transaction():
            yield bind.connection.driver_connection
        else:
            with bind.begin():
                yield bind.connection.driver_connection
    elif hasattr(bind, "transaction") and hasattr(bind, "add_notice_handler"):
        with bind.transaction():
            yield bind
    else:
        raise SabreError(f"cannot connect with a {type(bind).__name__}: pass a SQLAlchemy engine or "
                         "connection (postgresql+psycopg://), a psycopg connection, or a DSN")


def _function(schema: str, name: str):
    from psycopg import sql

    return sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(name))


def _relation_name(relation) -> str:
    """A relation given as text (resolved by the server as you would), a Run, or a SQLAlchemy
    Table, as text."""
    if isinstance(relation, Run):
        return relation.output_name
    if isinstance(relation, str):
        return relation
    if _is_sqlalchemy(relation) and hasattr(relation, "name"):
        from psycopg import sql

        parts = [relation.schema, relation.name] if relation.schema else [relation.name]
        return sql.Identifier(*parts).as_string(None)
    raise SabreError(f"cannot name a relation with a {type(relation).__name__}: pass its name, a Run "
                     "or a sqlalchemy.Table")


def _rows(bind, statement, params=None) -> tuple[list[str], list[tuple]]:
    """(column names, rows) of one statement."""
    with _errors(), _session(bind) as conn:
        cursor = conn.execute(statement, params)
        return [d.name for d in cursor.description], cursor.fetchall()


def _query(bind, statement, params=None):
    """The rows of one statement as a DataFrame."""
    pd = _pandas()
    columns, rows = _rows(bind, statement, params)
    return pd.DataFrame.from_records(rows, columns=columns, coerce_float=True)


@contextmanager
def _progress(conn, callback):
    """Turn the server's progress NOTICEs into ``callback(event)`` calls while the block runs."""
    if callback is None:
        yield
        return

    def handler(diagnostic):
        event = parse_progress(diagnostic.message_primary or "")
        if event is not None:
            callback(event)

    conn.add_notice_handler(handler)
    previous = conn.execute("SELECT pg_catalog.current_setting('sabre.progress', true)").fetchone()[0]
    conn.execute("SELECT pg_catalog.set_config('sabre.progress', 'on', true)")
    try:
        yield
    finally:
        conn.remove_notice_handler(handler)
        if not conn.closed and conn.info.transaction_status.name == "INTRANS":
            conn.execute("SELECT pg_catalog.set_config('sabre.progress', %s, true)", (previous or "",))


@dataclass(repr=False)
class Run:
    """One sabre_anonymize run: what it returned and where its output is.

    ``output`` is the output as a reflected ``sqlalchemy.Table`` when the run was bound to
    SQLAlchemy, else its qualified name (``output_name``); :meth:`classes` and
    :meth:`to_pandas` read ``<output>_classes`` and ``<output>`` through the same bind.
    """
    run_id: int
    output_name: str                   # qualified and quoted as the server prints it
    output_schema: str
    output_table: str
    rows: int
    n_classes: int
    min_class_size: int
    max_emd: float
    ail: float
    seconds: float
    source: str
    sensitive: str
    t: float
    k: int
    method: str
    bind: Any = field(default=None, compare=False)
    schema: str = DEFAULT_SCHEMA
    output: Any = None
    labels_name: str | None = None     # <output>_labels when options.labels asked for it

    def _relation(self, suffix: str = "") -> str:
        from psycopg import sql

        return sql.Identifier(self.output_schema, self.output_table + suffix).as_string(None)

    def classes(self):
        """``<output>_classes`` (one row per equivalence class) as a DataFrame, by ec_id."""
        from psycopg import sql

        return _query(self.bind, sql.SQL("SELECT * FROM {} ORDER BY ec_id").format(
            sql.SQL(self._relation("_classes"))))

    def labels(self):
        """``<output>_labels`` (options.labels) as a DataFrame."""
        if self.labels_name is None:
            raise SabreError(f"run {self.run_id} has no label view: pass options={{'labels': True}}")
        return self.to_pandas(relation=self.labels_name)

    def to_pandas(self, chunksize: int | None = None, relation: str | None = None):
        """The output as one DataFrame, read through a server-side cursor ``CHUNK_ROWS`` rows at
        a time; with ``chunksize``, an iterator of DataFrames of that many rows instead."""
        chunks = _chunks(self.bind, relation or self._relation(), chunksize or CHUNK_ROWS)
        if chunksize:
            return chunks
        pd = _pandas()
        frames = list(chunks)
        return frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)

    def verify(self, k: int | None = None, t: float | None = None):
        """sabre_verify of the output with this run's t and k (or others)."""
        return verify(self.bind, self, self.sensitive, self.t if t is None else t, self.k if k is None else k,
                      schema=self.schema)

    def summary(self) -> dict:
        return {"run": self.run_id, "output": self.output_name, "source": self.source,
                "method": "SABRE-" + self.method.upper(), "t": self.t, "k": self.k, "rows": self.rows,
                "classes": self.n_classes, "smallest class": self.min_class_size,
                "max EMD": _significant(self.max_emd, 6), "AIL": _significant(self.ail, 6),
                "seconds": _significant(self.seconds, 4)}

    def __repr__(self) -> str:
        return (f"<sabre_pg.Run {self.run_id}: {self.output_name}, {self.rows} rows in {self.n_classes} "
                f"classes (smallest {self.min_class_size}), max EMD {_significant(self.max_emd, 4)} <= t {self.t:g}, "
                f"k {self.k}, AIL {_significant(self.ail, 4)}, {_significant(self.seconds, 3)} s>")

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><th style='text-align:left'>{html.escape(k)}</th><td style='text-align:left'>"
                       f"{html.escape(str(v))}</td></tr>" for k, v in self.summary().items())
        return f"<table><caption>sabre_pg.Run</caption>{rows}</table>"


def _significant(value: float | None, digits: int) -> float | None:
    """``value`` to ``digits`` significant digits (3.59e-05 stays 3.59e-05, where ``round``
    to a number of decimals gives 0.0), keeping None (a partitioned run records no AIL)."""
    return None if value is None else float("%.*g" % (digits, value))


def _chunks(bind, relation: str, size: int) -> Iterator:
    """DataFrames of ``size`` rows of ``relation`` (text), from a server-side cursor; at least
    one (empty, with the columns, for an empty relation)."""
    pd = _pandas()
    from psycopg import sql

    with _errors(), _session(bind) as conn, conn.cursor(name="sabre_pg_read") as cur:
        cur.itersize = size
        cur.execute(sql.SQL("SELECT * FROM {}").format(sql.SQL(relation)))
        columns = [d.name for d in cur.description]
        first = True
        while True:
            rows = cur.fetchmany(size)
            if rows or first:
                yield pd.DataFrame.from_records(rows, columns=columns, coerce_float=True)
            first = False
            if len(rows) < size:
                return


def anonymize(bind, source, quasi_identifiers: Sequence[str], sensitive: str, t: float, k: int = 1,
              method: str = "refine", output: str | None = None, hierarchies: dict[str, str] | None = None,
              options: dict | None = None, *, schema: str = DEFAULT_SCHEMA,
              progress: Callable[[dict], None] | None = None) -> Run:
    """``sabre_anonymize``: a t-close, k-anonymous copy of ``source`` (docs/anonymize.md).

    ``source`` is a name resolved with the session's search_path, or a ``sqlalchemy.Table``;
    ``hierarchies`` ({column: hierarchy}) is merged into ``options['hierarchies']``;
    ``progress`` gets each phase event the server reports (docs/progress.md).
    """
    opts = dict(options or {})
    if hierarchies:
        opts["hierarchies"] = {**opts.get("hierarchies", {}), **hierarchies}
    source_name = _relation_name(source)
    statement = _function(schema, "sabre_anonymize")
    from psycopg import sql

    query = sql.SQL(
        "SELECT r.run_id, r.rows, r.classes, r.min_class_size, r.max_emd, r.ail, r.seconds, "
        "r.output::pg_catalog.oid FROM {}(source => %(source)s::text, quasi_identifiers => %(qis)s::text[], "
        "sensitive => %(sa)s, t => %(t)s::float8, k => %(k)s::int, method => %(method)s, "
        "output => %(output)s::text, options => %(options)s::jsonb) AS r").format(statement)
    params = {"source": source_name, "qis": list(quasi_identifiers), "sa": sensitive, "t": t, "k": k,
              "method": method, "output": output, "options": json.dumps(opts)}
    with _errors(), _session(bind) as conn, _progress(conn, progress):
        row = conn.execute(query, params).fetchone()
        name = _output_name(conn, row[7])
    return _run(bind, name, row, source_name, sensitive, t, k, method, opts, schema)


def _output_name(conn, oid) -> tuple:
    """(qualified name, schema, table) of a run's output, after the call (whose own snapshot
    predates the output it created)."""
    return conn.execute(
        "SELECT pg_catalog.format('%%I.%%I', n.nspname, c.relname), n.nspname, c.relname "
        "FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
        "ON n.oid OPERATOR(pg_catalog.=) c.relnamespace WHERE c.oid OPERATOR(pg_catalog.=) %s",
        (oid,)).fetchone()


def _run(bind, name, row, source_name, sensitive, t, k, method, opts, schema) -> Run:
    """The Run of a finished call's row (run_id, rows, classes, min_class_size, max_emd, ail, seconds)."""
    run = Run(row[0], *name, *row[1:7], source=source_name, sensitive=sensitive, t=t, k=k, method=method,
              bind=bind, schema=schema)
    run.output = reflect(bind, run.output_schema, run.output_table) if _is_sqlalchemy(bind) else run.output_name
    if opts.get("labels"):
        run.labels_name = run._relation("_labels")
    return run


def anonymize_partitioned(dsn: str, source: str, quasi_identifiers: Sequence[str], sensitive: str, t: float,
                          k: int = 1, method: str = "refine", output: str | None = None,
                          hierarchies: dict[str, str] | None = None, options: dict | None = None, *,
                          partitions: int, parallel: int = 2, schema: str = DEFAULT_SCHEMA,
                          on_part: Callable[[dict], None] | None = None) -> Run:
    """A partitioned run (docs/scale-out.md): ``partitions`` parts, ``parallel`` of them at a time
    on their own connections to ``dsn`` (a conninfo or URL), published as one output."""
    from sabre_pg import partitioned

    opts = {**(options or {}), "partitions": partitions}
    if hierarchies:
        opts["hierarchies"] = {**opts.get("hierarchies", {}), **hierarchies}
    with _errors():
        r = partitioned.run(dsn, source, quasi_identifiers, sensitive, t, k, method, output, opts, parallel,
                            schema, on_part)
    with _errors(), _session(dsn) as conn:
        name = _output_name(conn, r[1])
    return _run(dsn, name, (r[0],) + tuple(r[2:]), source, sensitive, t, k, method, opts, schema)


def reflect(bind, schema: str, table: str):
    """The relation ``schema.table`` as a ``sqlalchemy.Table`` reflected through ``bind``."""
    sa = require("sqlalchemy", "api", WHAT)
    with _errors():
        return sa.Table(table, sa.MetaData(), schema=schema, autoload_with=bind)


def _verify_call(bind, output, sensitive, t, k, hierarchy, schema):
    from psycopg import sql

    return bind, sql.SQL("SELECT * FROM {}(%s::pg_catalog.regclass, %s, %s::float8, %s::int, %s)").format(
        _function(schema, "sabre_verify")), (_relation_name(output), sensitive, t, k, hierarchy)


def verify(bind, output, sensitive: str, t: float, k: int = 1, hierarchy: str | None = None, *,
           schema: str = DEFAULT_SCHEMA):
    """``sabre_verify`` of ``output`` (a name, a Run or a sqlalchemy.Table): one row with
    classes, violations, max_emd, min_class_size (docs/verify.md)."""
    return _query(*_verify_call(bind, output, sensitive, t, k, hierarchy, schema))


def verify_summary(bind, output, sensitive: str, t: float, k: int = 1, hierarchy: str | None = None, *,
                   schema: str = DEFAULT_SCHEMA) -> dict:
    """:func:`verify`'s row as a dict (no pandas needed)."""
    columns, rows = _rows(*_verify_call(bind, output, sensitive, t, k, hierarchy, schema))
    return dict(zip(columns, rows[0]))


def estimate(bind, source, quasi_identifiers: Sequence[str], sensitive: str, t: float | Sequence[float],
             k: int = 1, options: dict | None = None, *, method: str = "refine", schema: str = DEFAULT_SCHEMA):
    """``sabre_estimate``: per t, for ``method`` 'ak' or 'knn' SABRE's plan (buckets, U,
    classes and class size), for 'refine' or 'mondrian' bounds on the classes; from pg_stats,
    without reading the table (docs/estimate.md); one row per t."""
    from psycopg import sql

    ts = [float(x) for x in t] if isinstance(t, (list, tuple)) else [float(t)]
    return _query(bind, sql.SQL(
        "SELECT * FROM {}(%s::pg_catalog.regclass, %s::text[], %s, %s::float8[], %s::int, %s::jsonb, %s)").format(
        _function(schema, "sabre_estimate")),
        (_relation_name(source), list(quasi_identifiers), sensitive, ts, k, json.dumps(options or {}), method))


def stream_advance(bind, name: str, max_advances: int | None = None, *, schema: str = DEFAULT_SCHEMA,
                   progress: Callable[[dict], None] | None = None) -> list[dict]:
    """``sabre_stream_advance``: every complete step that has arrived (at most ``max_advances``),
    one dict per advance (advance_no, case_no, d, rows, classes, max_emd, seconds; docs/streams.md);
    ``progress`` gets each phase event the server reports (docs/progress.md)."""
    from psycopg import sql

    query = sql.SQL("SELECT * FROM {}(%s, %s::int)").format(_function(schema, "sabre_stream_advance"))
    with _errors(), _session(bind) as conn, _progress(conn, progress):
        cur = conn.execute(query, (name, max_advances))
        columns = [c.name for c in cur.description]
        return [dict(zip(columns, row)) for row in cur.fetchall()]


def runs(bind, limit: int | None = None, *, schema: str = DEFAULT_SCHEMA):
    """``<schema>.runs``: your recorded runs (a superuser sees all), newest first."""
    from psycopg import sql

    return _query(bind, sql.SQL("SELECT * FROM {} ORDER BY run_id DESC LIMIT %s").format(
        _function(schema, "runs")), (limit,))
