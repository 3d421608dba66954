"""SABRE_W in the database (§5; docs/streams.md): a stream over an append-only table.

The stream numbers the source's rows 1, 2, … in arrival order (ties broken by the key) and
keeps that numbering in ``<output>_rows`` (insert-only).  ``<output>_state`` (one row) holds the
position and the state of the rows still inside windows: the rows published ahead of their
window (``ahead``; every row before the next window is published, Theorem 6) and S_G (its rows,
classes, EMDs and generating window); ``<output>_log`` logs the advances.  These three relations
belong to the stream's owner and to nobody else (issue #25): no constraint, lock or probe of
another role reaches them.  ``sabre.streams`` registers each stream (its definition and the
OIDs of its relations; ``stream_id`` is the OID of ``<output>_state``).  An advance
(:func:`advance`):

1. locks the stream's state row (``SELECT ... FOR UPDATE``; concurrent advances of one stream
   serialize, and only the owner can take that lock);
2. numbers the rows that arrived since, in one set-based INSERT (:func:`number_rows`;
   **late-row rule**: every row not yet numbered whose arrival is at or after the arrival of
   the current window's first row joins the next step, in (arrival, key) order; an older one is
   never published and ``verify`` reports it as late);
3. for each window whose step has arrived: slides the session's temporary table of the window
   by the rows that left and entered it (:func:`slide_window`) and reads it with the **same
   stages** as ``sabre_anonymize`` (``request``, ``scan``: the window is the relation the
   stages read, so its SA summary gives the window's own domain and normalization), runs
   :func:`sabre_pg.core.window.advance` (the three cases), and appends the published classes
   to ``<output>``, ``<output>_classes`` and ``<output>_keys`` with ``publish``'s builders;
4. updates the state and logs the advance in ``<output>_log``.

Everything happens in the caller's transaction: an error, a cancel or a crash leaves the state
of the previous call.  Every function runs with ``search_path = pg_catalog, pg_temp``.
"""
from __future__ import annotations

import dataclasses
import json
import secrets
import time
from contextlib import contextmanager, nullcontext
from decimal import Decimal

import numpy as np

from sabre_pg.core import stopwatch
from sabre_pg.core import window as W
from sabre_pg.core.checkpoint import checkpoint
from sabre_pg.core.emd import SADomain
from sabre_pg.core.exact_emd import ClassEMDs
from sabre_pg.core.hierarchy import Hierarchy
from sabre_pg.core.stopwatch import Stopwatch

from ..shared import citus
from ..shared import common as C
from ..shared import cron
from ..shared import errors as E
from ..stages import publish, request, scan

CALL_STEPS = ("validate", "number")             # an advance call's steps before its advances
STATE_SUFFIXES = ("_state", "_rows", "_log")   # the state relations, beside the output
OWN_ROLE = "(SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) CURRENT_USER)"
# <output>_state's one row: everything an advance changes (created with its defaults)
STATE_COLUMNS = (
    "advances int8 NOT NULL DEFAULT 0, numbered int8 NOT NULL DEFAULT 0, next_ec int8 NOT NULL DEFAULT 0, "
    "sg_first int8, sg_last int8, sg_emds float8[] NOT NULL DEFAULT '{}', sg_rows int8[] NOT NULL DEFAULT '{}', "
    "sg_classes int4[] NOT NULL DEFAULT '{}', ahead int8[] NOT NULL DEFAULT '{}', last_case int4, "
    "last_advance_at timestamptz, cron_job int8")
STATE_FIELDS = ("advances", "numbered", "next_ec", "sg_first", "sg_last", "sg_emds", "sg_rows", "sg_classes",
                "ahead", "last_case", "last_advance_at", "cron_job")
LOG_FIELDS = ("advance_no", "case_no", "d", "rows", "classes", "max_emd", "window_first", "window_last",
              "seconds", "phases", "advanced_at")
NOT_FOR_STREAMS = ("replace", "cascade", "lock_timeout", "refresh", "labels")
ARRIVAL_TYPES = C.INTEGER_TYPES + ("numeric", "date", "timestamp", "timestamptz")
EXTRA = (("advance_no", "int8"), ("window_first", "int8"), ("window_last", "int8"),
         ("published_at", "timestamptz"))
ROW_NO = "sabre_w row_no"           # the window table's own column: each row's number
# the session's window tables as its committed advances left them: {stream id: (advances,
# xmin of the state row written with them, window table oid, first row number, last)}
_HELD = {}
WINDOW_HINT = ("window_size (omega) and step (I) count rows; window_size must be a multiple of step, "
               "and step at least k, e.g. window_size => 20000, step => 5000.")


# ---------------------------------------------------------------------------- the stream
def load(plpy, name, lock=False) -> dict:
    """The caller's stream ``name``: its registry row (``sabre.streams``), the qualified names
    of its state relations (``state``, ``rows``, ``log``) and its state row; with ``lock``, that
    row locked (FOR UPDATE: concurrent advances serialize, the row read is the last committed
    advance's).  Only relations the caller owns that carry the stream's identity count: rows
    another role inserted, or a relation that took a state relation's name, are never read."""
    if name is None:
        raise E.null_not_allowed("name must not be NULL", "Pass the stream's name.")
    rows = plpy.execute(C.prepared(plpy, registered_sql("s.name OPERATOR(pg_catalog.=) $1"), ["text"]), [name])
    if not len(rows):
        raise E.SabreError(E.UNDEFINED_OBJECT, 'stream "%s" does not exist' % name,
                           "Create it with sabre_stream_create; SELECT name FROM sabre.streams lists yours.")
    s = dict(rows[0])
    found = plpy.execute(C.prepared(
        plpy, "SELECT o.n, pg_catalog.format('%I.%I', n.nspname, c.relname) AS qname FROM pg_catalog.unnest($1::pg_catalog.oid[]) "
        "WITH ORDINALITY AS o(oid, n) JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) o.oid "
        "JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace "
        "WHERE c.relkind OPERATOR(pg_catalog.=) 'r' AND c.relowner OPERATOR(pg_catalog.=) $2 "
        "AND " + carries_identity_sql("c.oid", "$3"),
        ["oid[]", "oid", "text"]), [s["state_oids"], s["owner"], identity_marker(s["identity"])])
    tables = {r["n"]: r["qname"] for r in found}
    if sorted(tables) != [1, 2, 3]:
        raise E.not_in_prerequisite_state(
            'the state relations of stream "%s" are missing or no longer carry its identity' % name,
            "Drop the stream (sabre_stream_drop) and create it again.")
    s["state"], s["rows"], s["log"] = tables[1], tables[2], tables[3]
    state = plpy.execute("SELECT st.*, st.xmin::pg_catalog.text AS state_xmin FROM %s AS st%s" % (
        s["state"], " FOR UPDATE" if lock else ""))
    if len(state) != 1:
        raise E.not_in_prerequisite_state('the state of stream "%s" is inconsistent' % name,
                                          "Drop the stream (sabre_stream_drop) and create it again.")
    s.update(state[0])
    return s


def registered_sql(where) -> str:
    """The caller's registered streams matching ``where`` (on ``s``, the registry) whose state
    relation exists and is theirs, newest first."""
    return ("SELECT s.* FROM %s AS s WHERE %s AND s.owner OPERATOR(pg_catalog.=) %s AND EXISTS (SELECT FROM "
            "pg_catalog.pg_class c WHERE c.oid::pg_catalog.int8 OPERATOR(pg_catalog.=) s.stream_id "
            "AND c.relowner OPERATOR(pg_catalog.=) s.owner) ORDER BY s.created_at DESC LIMIT 1" % (
                C.catalog("streams"), where, OWN_ROLE))


def refuse_distributed(plpy, src) -> None:
    """Streams do not run on a Citus distributed source (docs/scale-out.md)."""
    citus.refuse_distributed(plpy, src, "a sabre stream", "each advance joins the source with the stream's "
                             "state, local tables on the coordinator, which Citus does not join with a distributed "
                             "table, and its output is append-only, not distributed",
                             "Stream from a local table (for example the arrivals before they are distributed), "
                             "or anonymize the distributed table with sabre_anonymize and refresh it "
                             "(sabre_schedule_refresh).")


def stream_request(plpy, s) -> request.Request:
    """The stream's arguments checked again by the request stage (the source may have changed)."""
    return request.build(plpy, s["source_oid"], None, list(s["quasi_identifiers"]), s["sensitive"], s["t"],
                         s["k"], s["method"], C.qname(None, s["output_schema"], s["output_name"]),
                         s["options"])


def output_relations(plpy, s) -> list:
    """The stream's output relations by their recorded OIDs, each still carrying its identity:
    the marker ends its COMMENT (names come before it, so none can supply it)."""
    found = plpy.execute(C.prepared(
        plpy, "SELECT c.oid FROM pg_catalog.unnest($1::pg_catalog.oid[]) AS o(oid) JOIN pg_catalog.pg_class c "
        "ON c.oid OPERATOR(pg_catalog.=) o.oid WHERE " + carries_identity_sql("c.oid", "$2"), ["oid[]", "text"]),
        [s["relation_oids"], identity_marker(s["identity"])])
    return [r["oid"] for r in found]


# ---------------------------------------------------------------------------- create
@E.entry_point
def create(plpy, name, source, arrival, quasi_identifiers, sensitive, t, k, window_size, step,
           method, output, options):
    """sabre_stream_create: every check, the stream's row and its (empty) output relations."""
    if name is None or not str(name).strip():
        raise E.invalid_parameter("the stream needs a name", "For example name => 'admissions_w'.")
    src = C.resolve_relation(plpy, source)
    refuse_distributed(plpy, src)
    if output is None:
        output = C.qname(None, src["nspname"], src["relname"] + "_sabre_w")
    req = request.build(plpy, source, None, quasi_identifiers, sensitive, t, k, method, output, options)
    refused = [o for o in NOT_FOR_STREAMS if o in req.options.given]
    if refused:
        raise E.invalid_parameter("options.%s does not apply to streams" % refused[0],
                                  "A stream's output is append-only: it is never replaced.")
    try:
        omega, step = W.check_window(window_size, step, req.k)
    except ValueError as e:
        raise E.invalid_parameter(str(e), WINDOW_HINT)
    check_arrival(req, arrival)
    if len(plpy.execute(C.prepared(plpy, registered_sql("s.name OPERATOR(pg_catalog.=) $1"), ["text"]), [name])):
        raise E.SabreError("42710", 'stream "%s" already exists' % name,
                           "Choose another name, or drop it first with sabre_stream_drop.")
    for suffix in ("", "_classes", "_keys") + STATE_SUFFIXES:
        if plpy.execute(plpy.prepare("SELECT pg_catalog.to_regclass($1) AS r", ["text"]),
                        [req.output.qualified(suffix)])[0]["r"] is not None:
            raise E.duplicate_table("relation %s already exists" % req.output.qualified(suffix),
                                    "A stream creates its output: choose another output name.")
    used = C.load_hierarchies(plpy, [(a.hierarchy_name, 'for column "%s"' % a.name) for a in req.attrs
                                     if a.hierarchy_name is not None])
    identity = secrets.token_hex(16)
    oids = create_outputs(plpy, req, name, identity)
    state_oids = create_state(plpy, req.output, name, identity)
    register(plpy, OWN_ROLE, dict(
        name=name, source=req.source["qname"], source_oid=req.source["oid"], arrival=arrival, key=req.key.name,
        quasi_identifiers=[a.name for a in req.qis], sensitive=req.sa.name, t=req.t, k=req.k, window_size=omega,
        step=step, method=req.method, options=json.dumps(req.options.given), output_schema=req.output.schema,
        output_name=req.output.name, relation_oids=oids, identity=identity, engine=engine_for(req.method)), state_oids,
        hierarchies={n: h.fingerprint for n, h in used.items()})
    arrived = plpy.execute("SELECT pg_catalog.count(*) AS n FROM %s AS s%s" % (req.source["read"],
                                                                               req.row_filter()))[0]["n"]
    return [(name, req.output.qualified(), omega, step, arrived, W.advances_ready(arrived, 0, omega, step))]


REGISTRY = (("name", "text"), ("source", "text"), ("source_oid", "oid"), ("arrival", "text"), ("key", "text"),
            ("quasi_identifiers", "text[]"), ("sensitive", "text"), ("t", "float8"), ("k", "int4"),
            ("window_size", "int4"), ("step", "int4"), ("method", "text"), ("options", "jsonb"),
            ("output_schema", "name"), ("output_name", "name"), ("relation_oids", "oid[]"), ("identity", "text"),
            ("engine", "text"))


def register(plpy, owner_sql, s, state_oids, created_at=None, hierarchies=None):
    """The stream's row in ``sabre.streams`` (``s``: its definition, REGISTRY), owned by the
    role ``owner_sql`` (the caller's, which row-level security checks), stream_id the OID of its
    ``<output>_state``; ``hierarchies``: {name: {owner, sha256}} of the hierarchies it uses, which
    every advance checks (None: unchecked, streams migrated from 0.2).  ``engine``
    (:func:`engine_for`; None, as for streams created before engines were recorded: 'sabre')."""
    n = len(REGISTRY)
    plpy.execute(plpy.prepare(
        "INSERT INTO %s (stream_id, owner, state_oids, created_at, hierarchies, %s) VALUES ($%d::pg_catalog.int8, "
        "%s, $%d, COALESCE($%d, pg_catalog.now()), $%d::pg_catalog.jsonb, %s)" % (
            C.catalog("streams"), ", ".join(c for c, _ in REGISTRY), n + 1, owner_sql, n + 2, n + 3, n + 4,
            ", ".join("$%d::%s" % (i + 1, t) for i, (_, t) in enumerate(REGISTRY))),
        ["text" if t == "jsonb" else t for _, t in REGISTRY] + ["oid", "oid[]", "timestamptz", "text"]),
        [s.get(c) for c, _ in REGISTRY] + [state_oids[0], state_oids, created_at,
                                       None if hierarchies is None else json.dumps(hierarchies)])


def create_state(plpy, output, name, identity, suffix="") -> list:
    """<output>_state (its one row), <output>_rows and <output>_log, owner-only, each with the
    stream's identity in its COMMENT; returns their OIDs.  ``suffix`` follows the usual names
    (an upgrade's choice when they are taken)."""
    columns = {
        "_state": STATE_COLUMNS,
        "_rows": "row_no int8 PRIMARY KEY, key text NOT NULL UNIQUE",
        "_log": "advance_no int8 PRIMARY KEY, case_no int4 NOT NULL CHECK (case_no OPERATOR(pg_catalog.>=) 1 AND "
                "case_no OPERATOR(pg_catalog.<=) 3), d float8, rows int8 NOT NULL, classes int8 NOT NULL, "
                "max_emd float8, window_first int8 NOT NULL, window_last int8 NOT NULL, seconds float8 NOT NULL, "
                "phases jsonb, advanced_at timestamptz NOT NULL DEFAULT pg_catalog.now()"}
    texts = {"_state": "position and S_G", "_rows": "row numbering", "_log": "log of advances"}
    oids = []
    for part in STATE_SUFFIXES:
        table = output.qualified(part + suffix)
        plpy.execute("CREATE TABLE %s (%s)" % (table, columns[part]))
        plpy.execute("COMMENT ON TABLE %s IS %s" % (table, plpy.quote_literal(
            "sabre-pg stream %s: %s" % (name, texts[part]) + identity_marker(identity))))
        publish.owner_only(plpy, table)
        oids.append(plpy.execute(plpy.prepare("SELECT $1::pg_catalog.regclass::pg_catalog.oid AS o", ["text"]),
                                 [table])[0]["o"])
    state = output.qualified("_state" + suffix)
    # the arrays are rewritten by every advance: stored uncompressed (compressing some 100 kB of
    # row numbers cost more than the rest of the state's update)
    plpy.execute("ALTER TABLE %s %s" % (state, ", ".join(
        "ALTER COLUMN %s SET STORAGE EXTERNAL" % c for c in ("ahead", "sg_rows", "sg_classes", "sg_emds"))))
    plpy.execute("INSERT INTO %s DEFAULT VALUES" % state)
    return oids


def check_arrival(req, arrival):
    """The arrival column: exists, orders rows (integer, numeric, date, timestamp) and is NOT NULL."""
    if arrival is None or arrival not in req.columns:
        raise E.undefined_column('arrival column "%s" does not exist in the source' % arrival,
                                 "Name the column that gives the arrival order, e.g. a bigint identity or "
                                 "a timestamp; ties are broken by the key.")
    col = req.columns[arrival]
    if col["typname"] not in ARRIVAL_TYPES:
        raise E.datatype_mismatch('arrival column "%s" has type %s, which gives no arrival order' % (
            arrival, col["type"]), "Use a bigint identity, a sequence-filled integer or a timestamp column.")
    if not col["notnull"]:
        raise E.null_not_allowed('arrival column "%s" is nullable' % arrival,
                                 "A row without an arrival has no place in the stream: ALTER TABLE ... ALTER "
                                 "COLUMN %s SET NOT NULL (a view: stream from its table)." % C.ident(arrival))


def output_columns(req) -> tuple[list, list]:
    """(columns of <output>, columns of <output>_classes) as (name, SQL type), the extra
    stream columns last."""
    generalized = [(c, a.col["type"] if a.numerical else "text") for a in req.qis for c in a.published_as()]
    out = [("ec_id", "int8")] + generalized + [(req.sa.name, req.sa.col["type"])] + \
        [(c, req.columns[c]["type"]) for c in req.options.keep] + list(EXTRA)
    classes = [("ec_id", "int8"), ("size", "int8"), ("emd", "float8")] + generalized + list(EXTRA)
    return out, classes


def identity_marker(identity: str) -> str:
    """The suffix of the COMMENT of a stream's relations that carries its identity."""
    return " (sabre-pg stream identity %s)" % identity


def carries_identity_sql(oid: str, marker: str) -> str:
    """SQL: the relation ``oid``'s COMMENT ends with ``marker`` (:func:`identity_marker`, a
    parameter): the whole suffix, never a substring, so a name written before it cannot supply it."""
    return ("COALESCE(pg_catalog.right(pg_catalog.obj_description(%s, 'pg_class'), pg_catalog.length(%s)) "
            "OPERATOR(pg_catalog.=) %s, false)" % (oid, marker, marker))


def create_outputs(plpy, req, name, identity) -> list:
    """<output>, <output>_classes (PRIMARY KEY ec_id) and the owner-only <output>_keys, empty,
    each with the stream's identity in its COMMENT; returns their OIDs."""
    out, classes = output_columns(req)
    keys = [("key", req.key.col["type"]), ("row_no", "int8"), ("ec_id", "int8"), ("advance_no", "int8"),
            ("row_hash", "text")]
    texts = {"": "sabre-pg stream %s: %s published with SABRE_W" % (name, req.source["qname"]),
             "_classes": "sabre-pg stream %s: equivalence classes" % name,
             "_keys": "sabre-pg stream %s: source key -> row number, equivalence class" % name}
    oids = []
    for suffix, columns in (("", out), ("_classes", classes), ("_keys", keys)):
        table = req.output.qualified(suffix)
        plpy.execute("CREATE TABLE %s (%s)" % (table, ", ".join("%s %s" % (C.ident(c), t) for c, t in columns)))
        plpy.execute("COMMENT ON TABLE %s IS %s" % (table, plpy.quote_literal(texts[suffix] + identity_marker(identity))))
        oids.append(plpy.execute(plpy.prepare("SELECT $1::pg_catalog.regclass::pg_catalog.oid AS o", ["text"]),
                                 [table])[0]["o"])
    plpy.execute("ALTER TABLE %s ADD PRIMARY KEY (ec_id)" % req.output.qualified("_classes"))
    plpy.execute("CREATE INDEX ON %s (row_no)" % req.output.qualified("_keys"))
    publish.owner_only(plpy, req.output.qualified("_keys"))
    return oids


# ---------------------------------------------------------------------------- advance
@E.entry_point
def advance(plpy, name, max_advances=None):
    """sabre_stream_advance: number the new rows, then every advance whose step has arrived."""
    if max_advances is not None and max_advances < 0:
        raise E.invalid_parameter("max_advances must be >= 0", "NULL processes every complete step.")
    phases = {}                          # the call's own work counts in its first advance
    stopwatch.plan(CALL_STEPS)           # then one step per advance, once numbering has counted them
    with timed(phases, "validate", reported=True):
        s = load(plpy, name, lock=True)
        if len(output_relations(plpy, s)) != 3:
            raise E.not_in_prerequisite_state(
                'the output relations of stream "%s" are missing or no longer carry its identity' % name,
                "Drop the stream (sabre_stream_drop) and create it again.")
        req = stream_request(plpy, s)
        refuse_distributed(plpy, req.source)   # distributed since the stream was created
        if s.get("hierarchies"):         # fail before numbering; read_window checks what it reads
            check_hierarchies(s, req, None, C.hierarchy_fingerprints(plpy, list(json.loads(s["hierarchies"]))))
    out = []
    # small statements over one window each: a parallel plan's start-up costs more than it saves
    # (JIT never pays for them either: compiling takes longer than running them)
    with C.settings(plpy, work_mem="256MB", max_parallel_workers_per_gather=0, jit="off"):
        with timed(phases, "number", reported=True):
            number_rows(plpy, s, req)
        ready = W.advances_ready(s["numbered"], s["advances"], s["window_size"], s["step"])
        if max_advances is not None:
            ready = min(ready, max_advances)
        stopwatch.plan(CALL_STEPS + ("advance",) * ready)
        if not ready:                    # else the advance's state update records it
            plpy.execute("UPDATE %s SET numbered = %d" % (s["state"], s["numbered"]))
        for _ in range(ready):
            with Stopwatch().phase("advance"):   # progress: the engine's phases report within it
                out.append(one_advance(plpy, s, req, phases))
            phases = {}
    return out


def horizon(plpy, s, req):
    """(the arrival, as text, of the current window's first row, that row's number); (None,
    None) before the first numbering, (None, first) when that row was deleted: then every
    unnumbered row is a candidate."""
    if not s["numbered"]:
        return None, None
    first = W.window_of(s["advances"] + 1, s["window_size"], s["step"]).first
    r = plpy.execute(
        "SELECT (s.%s)::pg_catalog.text AS a FROM %s AS s JOIN %s AS r "
        "ON s.%s OPERATOR(pg_catalog.=) r.key::%s WHERE r.row_no OPERATOR(pg_catalog.=) %d" % (
            C.ident(s["arrival"]), req.source["read"], s["rows"], C.ident(req.key.name), req.key.col["type"], first))
    return (r[0]["a"] if len(r) else None), first


def number_rows(plpy, s, req):
    """Give the rows not yet numbered the next row numbers (the late-row rule, module doc), in
    one set-based INSERT.  The candidates are the source rows from the horizon on; the numbered
    rows they are matched against are those from the current window's first row on (a primary
    key range of about a window's rows), so a hash anti-join decides, not a probe per row.
    A numbered row before the window whose arrival is from the horizon on (numbered ahead of a
    late row, or its arrival was since changed) escapes that range: the unique index on
    (stream, key) then refuses the insert, and the exact anti-join by key (an index probe per
    candidate) numbers the rest -- no key is ever numbered twice.  The count is recorded by the
    caller (with the advance's state, when one follows)."""
    since, first = horizon(plpy, s, req)
    where, matched = req.row_filter() or " WHERE true", ""
    if since is not None:
        where += " AND s.%s OPERATOR(pg_catalog.>=) $1::%s" % (C.ident(s["arrival"]),
                                                               req.columns[s["arrival"]]["type"])
        matched = " AND r.row_no OPERATOR(pg_catalog.>=) %d" % first
    try:
        with plpy.subtransaction(), C.settings(plpy, enable_nestloop="off", **arrival_range(plpy, s, req)):
            got = plpy.execute(plpy.prepare(numbering_sql(s, req, where, matched), ["text"]), [since])
    except plpy.SPIError as e:
        if getattr(e, "sqlstate", None) != "23505":
            raise
        with C.settings(plpy, enable_hashjoin="off", enable_mergejoin="off"):
            got = plpy.execute(plpy.prepare(numbering_sql(s, req, where, ""), ["text"]), [since])
    s["numbered"] += got.nrows()


def arrival_range(plpy, s, req) -> dict:
    """Settings for the numbering: with a btree index leading with the arrival column, the
    candidates (arrival from the horizon on, about a step of rows) are an index range, however
    stale the statistics of the growing source; else the source is scanned."""
    indexed = plpy.execute(C.prepared(
        plpy, "SELECT 1 FROM pg_catalog.pg_index i JOIN pg_catalog.pg_attribute a ON a.attrelid OPERATOR(pg_catalog.=) "
        "i.indrelid AND a.attnum OPERATOR(pg_catalog.=) i.indkey[0] JOIN pg_catalog.pg_class c ON c.oid "
        "OPERATOR(pg_catalog.=) i.indexrelid JOIN pg_catalog.pg_am m ON m.oid OPERATOR(pg_catalog.=) c.relam "
        "WHERE i.indrelid OPERATOR(pg_catalog.=) $1 AND i.indisvalid AND i.indpred IS NULL "
        "AND m.amname OPERATOR(pg_catalog.=) 'btree' AND a.attname OPERATOR(pg_catalog.=) $2", ["oid", "name"]),
        [req.source["oid"], s["arrival"]])
    return dict(enable_seqscan="off") if len(indexed) else {}


def numbering_sql(s, req, where, matched) -> str:
    """INSERT of the candidates ``where`` not numbered (among the numbered rows ``matched``)
    into ``<output>_rows``, numbered on from ``s["numbered"]`` in (arrival, key) order."""
    key = C.ident(req.key.name)
    return ("INSERT INTO %s (row_no, key) SELECT %d OPERATOR(pg_catalog.+) pg_catalog.row_number() OVER "
            "(ORDER BY s.%s, s.%s), (s.%s)::pg_catalog.text FROM %s AS s%s AND NOT EXISTS (SELECT FROM %s AS r "
            "WHERE true%s AND r.key OPERATOR(pg_catalog.=) (s.%s)::pg_catalog.text)" % (
                s["rows"], s["numbered"], C.ident(s["arrival"]), key, key,
                req.source["read"], where, s["rows"], matched, key))


def window_state(s, window):
    """(published, S_G classes) of the window's rows, in row order, from the stream's state."""
    ahead = np.asarray(s["ahead"] or [], dtype=np.int64) - window.first
    sg_rows = np.asarray(s["sg_rows"] or [], dtype=np.int64) - window.first
    if ((ahead < 0) | (ahead >= window.size)).any() or ((sg_rows < 0) | (sg_rows >= window.size)).any():
        raise E.SabreError(E.INTERNAL, "the state of window %d..%d is inconsistent" % (window.first, window.last),
                           "Drop the stream and create it again; sabre_stream_verify checks its output.")
    published = np.zeros(window.size, dtype=bool)
    published[ahead] = True
    sg = np.full(window.size, -1, dtype=np.int64)
    sg[sg_rows] = np.asarray(s["sg_classes"] or [], dtype=np.int64)
    return published, sg


def window_table(s) -> str:
    """The session's temporary table of the stream's current window."""
    return "pg_temp.%s" % C.ident("sabre_w_window_%d" % s["stream_id"])


def slide_window(plpy, s, req, window) -> str:
    """The window's source rows, with their row numbers, in the session's temporary table of
    the stream (:func:`window_table`); returns the relation of the window's rows.  The table is
    kept between the session's advances: an advance copies only the rows that entered the window
    (the I new rows, found by their keys), and the rows that left it are no longer read (the
    relation returned selects the window's row numbers) until, once a window's worth of them
    has accumulated, the live ones are copied afresh.  Like the state it is transactional -- a rolled-back advance
    rolls it back too -- and one that holds no contiguous range ending inside the window
    (another session advanced the stream since) is rebuilt.  A row's values are therefore
    those read when it entered the window; a later UPDATE or DELETE of a published row is
    reported by sabre_stream_verify, and a DELETE before publication fails the advance
    (:func:`append`)."""
    table, start = window_table(s), window.first
    row_no = C.ident(ROW_NO)
    held, oid = None, table_oid(plpy, table)
    if oid is not None:
        held = held_rows(s, oid) or plpy.execute(
            "SELECT pg_catalog.min(w.%s) AS lo, pg_catalog.max(w.%s) AS hi, pg_catalog.count(*) AS n "
            "FROM %s AS w" % (row_no, row_no, table))[0]
    if held is not None and held["n"] and held["hi"] - held["lo"] + 1 == held["n"] and \
            held["lo"] <= window.first <= held["hi"] + 1 and held["hi"] <= window.last:
        start = held["hi"] + 1
        first = held["lo"]
        if (window.first - 1) % window.size == 0:
            rebuild_window(plpy, table, "SELECT w.* FROM %s AS w WHERE w.%s >= %d" % (table, row_no, window.first))
            first, oid = window.first, table_oid(plpy, table)
    else:
        rebuild_window(plpy, table, "SELECT s.*, NULL::pg_catalog.int8 AS %s FROM %s AS s WITH NO DATA" % (
            row_no, req.source["read"]))
        first, oid = start, table_oid(plpy, table)
    # the entering rows' keys joined with the source: an index probe per key when it is indexed
    with C.settings(plpy, **key_probe(req, join=True)):
        got = plpy.execute(
            "INSERT INTO %s SELECT s.*, r.row_no FROM %s AS r JOIN %s AS s ON s.%s OPERATOR(pg_catalog.=) r.key::%s "
            "WHERE r.row_no BETWEEN %d AND %d" % (
                table, s["rows"], req.source["read"], C.ident(req.key.name), req.key.col["type"],
                start, window.last))
    if got.nrows() != window.last - start + 1:
        raise deleted(window.last - start + 1 - got.nrows(), window)
    s["window_held"] = (oid, first, window.last)
    return "(SELECT * FROM %s AS w WHERE w.%s OPERATOR(pg_catalog.>=) %d)" % (table, row_no, window.first)


def table_oid(plpy, table):
    """The oid of the session's temporary ``table``, None when it does not exist."""
    return plpy.execute("SELECT pg_catalog.to_regclass(%s)::pg_catalog.oid AS o" % plpy.quote_literal(table))[0]["o"]


def held_rows(s, oid):
    """The row numbers the window table ``oid`` holds ({lo, hi, n}) as recorded by this session's
    last advance of the stream, if that advance is the stream's state (``s``: its advance count,
    and the xmin of its state row, which a rolled-back or another session's advance, or any
    later update, changes); else None (the caller counts the table's rows)."""
    got = _HELD.get(s["stream_id"])
    if got is None or got[:3] != (s["advances"], s["state_xmin"], oid):
        return None
    return dict(lo=got[3], hi=got[4], n=got[4] - got[3] + 1)


def rebuild_window(plpy, table, query):
    """The window table made afresh from ``query``."""
    plpy.execute("CREATE TEMP TABLE pg_temp.sabre_w_rebuilt AS %s" % query)
    with C.quietly(plpy):
        plpy.execute("DROP TABLE IF EXISTS %s" % table)
    plpy.execute("ALTER TABLE pg_temp.sabre_w_rebuilt RENAME TO %s" % table.split(".", 1)[1])


def deleted(n, window) -> E.SabreError:
    """The error of an advance whose window lost ``n`` rows from the source."""
    return E.not_in_prerequisite_state(
        "%d rows of window %d..%d were deleted from the source" % (n, window.first, window.last),
        "A stream's source is append-only: restore the rows (sabre_stream_verify lists deletions).")


def read_window(plpy, s, req, window, only=None):
    """The window read by the scan stage, in row order: (window request, summary, hierarchies,
    QIs, SA codes, per-attribute data).  The window's rows are held in a temporary table
    (:func:`slide_window`), which takes the source's place in the request, its row numbers
    the key's: the stages read it as the relation, and join it by row number.  ``only``: the
    window offsets of the rows to read (the others get the first of their values, and the SA
    summary and codes are those of these rows): what a case 3 of the 'window' engine
    publishes."""
    expected = window.rows if only is None else window.rows[only]
    if only is None or not holds(plpy, s, expected):
        rows = slide_window(plpy, s, req, window)
    if only is not None:
        rows = "(SELECT * FROM %s AS w WHERE w.%s OPERATOR(pg_catalog.=) ANY ('%s'::pg_catalog.int8[]))" % (
            window_table(s), C.ident(ROW_NO), array_literal(expected.tolist()))
    wreq = dataclasses.replace(req, source=dict(req.source, qname=rows, read=rows), key=request.Key(
        ROW_NO, dict(req.key.col, typname="int8", type="bigint", notnull=True), True))
    hierarchies = scan.hierarchies(plpy, wreq)
    check_hierarchies(s, req, hierarchies)
    encodings = scan.encodings(plpy, hierarchies)
    summary = scan.sa_summary(plpy, wreq, hierarchies.get(req.sa.name))
    if req.sa.name not in encodings and summary.text_codes() is not None:
        encodings[req.sa.name] = scan.encode(plpy, summary.text_codes())
    data = scan.read(plpy, wreq, encodings, summary)
    order = row_order(window, data.keys, expected)
    if order is None:
        raise deleted(len(expected) - data.rows, window)
    columns = [np.asarray(d)[order] for d in data.data]
    codes = np.asarray(data.sa_codes)[order]
    if only is not None:
        columns, codes = [spread(c, only, window.size) for c in columns], spread(codes, only, window.size)
    qis = scan.quasi_identifiers(req, columns, hierarchies)
    return wreq, summary, hierarchies, qis, codes, columns


def holds(plpy, s, row_numbers) -> bool:
    """Whether the session's window table holds the rows ``row_numbers`` as this session's
    last advance of the stream recorded it (:func:`held_rows`); then the table is kept as it
    is (the rows that entered since are copied by the next advance that slides it)."""
    oid = table_oid(plpy, window_table(s))
    held = None if oid is None else held_rows(s, oid)
    if held is None or not (held["lo"] <= row_numbers.min() and row_numbers.max() <= held["hi"]):
        return False
    s["window_held"] = (oid, held["lo"], held["hi"])
    return True


def spread(values, at, n):
    """``values`` placed at the offsets ``at`` of an array of ``n``, the others its first value."""
    out = np.full(n, values[0], dtype=values.dtype) if len(values) else np.asarray(values)
    out[at] = values
    return out


def check_hierarchies(s, req, hierarchies, current=None):
    """55000 when a hierarchy the stream was created with was dropped, redefined or taken over
    by another role since (docs/security.md, "Hierarchies are shared by name"): an advance must
    not silently publish with another definition.  Checked on the hierarchies the advance read."""
    recorded = json.loads(s["hierarchies"]) if s.get("hierarchies") else None
    if not recorded:
        return
    if current is None:                  # {name: fingerprint}, else those of the Hierarchy objects read
        current = {a.hierarchy_name: getattr(hierarchies.get(a.name), "fingerprint", None) for a in req.attrs
                   if a.hierarchy_name is not None}
    changed = C.changed_hierarchies(recorded, {n: f for n, f in current.items() if f is not None})
    if changed:
        raise E.not_in_prerequisite_state(
            'the hierarchies of stream "%s" changed since it was created: %s; nothing was advanced'
            % (s["name"], ", ".join(changed)),
            "A stream publishes every advance with the hierarchies it was created with. Restore the definition, "
            "or drop the stream (sabre_stream_drop) and create it again to accept the new one.")


def row_order(window, row_numbers, expected=None):
    """The permutation putting the rows as read (their row numbers) into the window's row
    order; None unless they are exactly the window's rows (or the ``expected`` row numbers,
    ascending)."""
    expected = window.rows if expected is None else expected
    read = np.asarray(row_numbers, dtype=np.int64)
    order = np.argsort(read, kind="stable")
    return order if np.array_equal(read[order], expected) else None


@contextmanager
def timed(phases: dict, name: str, reported: bool = False):
    """Add the block's wall time to ``phases[name]`` (an advance's phases: validate and number
    (the call's, in its first advance), state, read, engine, publish, save); ``reported``: also
    a step of the call's progress (``stopwatch``: validate, number)."""
    started = time.perf_counter()
    try:
        with Stopwatch().phase(name) if reported else nullcontext():
            yield
    finally:
        phases[name] = phases.get(name, 0.0) + time.perf_counter() - started


def one_advance(plpy, s, req, phases):
    """One window advance (the three cases), published and recorded; its result row.
    ``phases``: seconds per phase so far (the call's validation and numbering, for its first)."""
    a = s["advances"] + 1
    window = W.window_of(a, s["window_size"], s["step"])
    with timed(phases, "state"):
        published, sg_classes = window_state(s, window)
    sg = W.SG(sg_classes, np.asarray(s["sg_emds"] or [], dtype=np.float64),
              None if s["sg_first"] is None else W.Window(s["sg_first"], s["sg_last"] - s["sg_first"] + 1, s["step"]))
    result, read = W.Advance(W.SKIP, None, None, sg), None
    if not published[:window.step].all():
        # the 'window' engine's case 3 needs only the rows it publishes
        only = W.deferred_rows(window, published, sg) if s.get("engine") == "window" else None
        with timed(phases, "read"):
            read = read_window(plpy, s, req, window, only)
        with timed(phases, "engine"):
            result = engine(s, req, window, read, published, sg, a)
    if result.publication is not None:
        with timed(phases, "publish"):
            append(plpy, s, req, read, window, a, result.publication)
    with timed(phases, "save"):
        save(plpy, s, window, published, result)
    seconds = sum(phases.values())
    p = result.publication
    row = (a, result.case, None if result.d is None else float(result.d), result.rows, result.classes,
           None if p is None else p.max_emd, seconds)
    plpy.execute(plpy.prepare(
        "INSERT INTO %s (advance_no, case_no, d, rows, classes, max_emd, window_first, window_last, "
        "seconds, phases) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10::jsonb)" % s["log"],
        ["int8", "int4", "float8", "int8", "int8", "float8", "int8", "int8", "float8", "text"]),
        list(row[:6]) + [window.first, window.last, seconds, json.dumps({k: round(v, 6) for k, v in phases.items()})])
    return row


ENGINES = ("sabre", "refine", "window")


def engine_for(method) -> str:
    """The window engine a new stream records (``sabre.streams.engine``): 'window' for method
    'refine', the default (the whole window partitioned with ``sabre_anonymize``'s default
    method, S_G's classes published as their rows expire: :func:`sabre_pg.core.window.advance`
    with ``defer``); 'sabre' (SABRE with the stream's method on the unpublished rows,
    :func:`sabre_partition`) for the others.  A stream keeps the engine it was created with:
    'refine' (the searched cuts on the unpublished rows at every DIRECT,
    :func:`sabre_pg.core.window.refine_partition`) for streams created with it; a registry row
    without one (created before engines were recorded, or migrated from 0.2) runs 'sabre',
    whatever its method."""
    return "window" if method == "refine" else "sabre"


def partition_of(s, req):
    """The DIRECT partition of the stream ``s``'s recorded engine."""
    engine_name = s.get("engine") or "sabre"
    o = req.options
    if engine_name == "refine":
        # 'fast' (the default): no merge passes (an advance's time); 'thorough': refine's own
        return W.refine_partition(search=o.search, merges=0 if o.search == "fast" else None)
    method = "refine" if engine_name == "window" else req.method
    return W.sabre_partition(method, o.seed, o.takeout, o.weights, o.lookahead, search=o.search, threads=o.threads)


def engine(s, req, window, read, published, sg, a):
    """The core's advance on the window read, with the stream's engine (:func:`partition_of`;
    'window': ``defer``)."""
    wreq, summary, hierarchies, qis, codes, columns = read
    try:
        return W.advance(window, qis, codes, summary.domain(), published, sg, req.t, req.k, partition_of(s, req),
                         defer=s.get("engine") == "window")
    except (ValueError, ArithmeticError) as e:
        raise E.SabreError(E.INTERNAL, "SABRE_W advance %d failed: %s" % (a, e),
                           "Check the stream with sabre_stream_verify; report it if it persists.")


def save(plpy, s, window, published, result):
    """The state after an advance: the rows published ahead of the next window, S_G (replaced
    by a DIRECT, emptied by an INDIRECT) and the position.  Every expiring row must be
    published by now (Theorem 6), else the advance fails."""
    now = published.copy()
    if result.publication is not None:
        now[result.publication.rows] = True
        s["next_ec"] += result.publication.n_classes
    if not now[:window.step].all():
        raise E.SabreError(E.INTERNAL, "advance %d leaves expiring rows unpublished" % (s["advances"] + 1),
                           "The stream's state is inconsistent: drop and create it again.")
    s["advances"] += 1
    s["ahead"] = (window.first + np.flatnonzero(now[window.step:]) + window.step).tolist()
    if result.case != W.SKIP:
        held = np.flatnonzero(result.sg.classes >= 0)
        s["sg_rows"], s["sg_classes"] = (window.first + held).tolist(), result.sg.classes[held].tolist()
        g = result.sg.window
        s["sg_first"], s["sg_last"] = (None, None) if g is None else (g.first, g.last)
        s["sg_emds"] = result.sg.emds.tolist()
    s["state_xmin"] = plpy.execute(plpy.prepare(
        "UPDATE %s SET advances = $1, next_ec = $2, sg_first = $3, sg_last = $4, sg_emds = $5, "
        "sg_rows = $6::pg_catalog.int8[], sg_classes = $7::pg_catalog.int4[], ahead = $8::pg_catalog.int8[], last_case = $9, last_advance_at = pg_catalog.now(), numbered = $10 "
        "RETURNING xmin::pg_catalog.text AS x" % s["state"],
        ["int8", "int8", "int8", "int8", "float8[]", "text", "text", "text", "int4", "int8"]),
        [s["advances"], s["next_ec"], s["sg_first"], s["sg_last"], list(s["sg_emds"] or []),
         array_literal(s["sg_rows"]), array_literal(s["sg_classes"]), array_literal(s["ahead"]), result.case,
         s["numbered"]])[0]["x"]
    held = s.pop("window_held", None)          # what the window table holds, with this state
    if held is None:
        _HELD.pop(s["stream_id"], None)
    else:
        _HELD[s["stream_id"]] = (s["advances"], s["state_xmin"]) + held


def array_literal(values) -> str:
    """An integer array as its text literal: one datum to send, where a list is converted
    element by element."""
    return "{%s}" % ",".join(map(str, values or []))


def row_hash_sql(req, alias="s", stored=None) -> str:
    """The hash of a source row's quasi-identifiers and SA as text (64 bits, as text): what
    verify compares to detect an UPDATE of a published row.  With ``stored`` (the column of a
    recorded hash), the hash that recorded it: md5 (32 hex digits) in earlier installs."""
    text = "ROW(%s)::pg_catalog.text" % ", ".join("%s.%s" % (alias, C.ident(a.name)) for a in req.attrs)
    fast = "pg_catalog.hashtextextended(%s, 0)::pg_catalog.text" % text
    if stored is None:
        return fast
    return "CASE WHEN pg_catalog.length(%s) OPERATOR(pg_catalog.=) 32 THEN pg_catalog.md5(%s) ELSE %s END" % (
        stored, text, fast)


def append(plpy, s, req, read, window, a, p: W.Publication):
    """Append the published classes to <output>, <output>_classes and <output>_keys.  The
    publish stage's builders give the classes (one temporary table, which the output's rows
    expand) and the output's rows (inserted straight from the builder's query); keys, row
    hashes and class ids come from the window table by row number (the window request's key).
    Every published row must still be in the source, else the advance fails."""
    wreq, summary, hierarchies, qis, codes, columns = read
    rows = p.rows
    row_nos, ecs = window.rows[rows].tolist(), p.ec.tolist()
    temp = {x: "pg_temp.%s" % C.ident("sabre_w_%s" % x) for x in ("k", "c")}
    by_source = req.options.keep or not publish.exact_from_codes(req.sa)
    classes = publish.ClassesTable(wreq, p, [c[rows] for c in columns], temp["k"], hierarchies)
    if by_source or classes.exact_aggs:     # the builders that join the rows by key read them here
        plpy.execute(plpy.prepare(
            "CREATE TEMP TABLE %s AS SELECT u.key, u.ec_id FROM ROWS FROM (pg_catalog.unnest($1::int8[]), "
            "pg_catalog.unnest($2::int8[])) AS u(key, ec_id)" % temp["k"], ["int8[]", "int8[]"]), [row_nos, ecs])
    with C.settings(plpy, enable_nestloop="off"):
        publish.execute(plpy, classes.statement(temp["c"]))
    if by_source:
        rows_query, types, params = publish.output_from_source_query(wreq, temp["c"], temp["k"]), [], []
    else:
        rows_query, types, params = publish.output_from_classes_query(wreq, temp["c"], summary, codes[rows], p)
    out, classes_columns = output_columns(req)
    extra = "%d, %d, %d, pg_catalog.now()" % (a, p.window.first, p.window.last)
    offset = s["next_ec"]
    for suffix, columns_, query in (("", out, rows_query),
                                    ("_classes", classes_columns, "TABLE %s" % temp["c"])):
        names = [c for c, _ in columns_[1:-len(EXTRA)]]
        plpy.execute(plpy.prepare("INSERT INTO %s (%s) SELECT x.ec_id + %d, %s, %s FROM (%s) AS x" % (
            req.output.qualified(suffix), ", ".join(C.ident(c) for c, _ in columns_), offset,
            ", ".join("x.%s" % C.ident(c) for c in names), extra, query), types if suffix == "" else []),
            params if suffix == "" else [])
    append_keys(plpy, s, req, window, a, row_nos, ecs)
    with C.quietly(plpy):
        plpy.execute("DROP TABLE IF EXISTS %s, %s" % (temp["k"], temp["c"]))


def append_keys(plpy, s, req, window, a, row_nos, ecs):
    """<output>_keys of the published rows (the values hashed are those published: the window
    table's), and in the same statement the count of them still in the source: a row deleted
    from the source since it entered the window fails the advance."""
    key = C.ident(req.key.name)
    with C.settings(plpy, enable_nestloop="off", enable_mergejoin="off", **key_probe(req)):
        got = plpy.execute(plpy.prepare(
            "WITH ins AS (INSERT INTO %s (key, row_no, ec_id, advance_no, row_hash) SELECT w.%s, u.row_no, "
            "u.ec_id + %d, %d, %s FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.int8[]), "
            "pg_catalog.unnest($2::pg_catalog.int8[])) "
            "AS u(row_no, ec_id) JOIN %s AS w ON w.%s OPERATOR(pg_catalog.=) u.row_no RETURNING key) "
            "SELECT (SELECT pg_catalog.count(*) FROM ins) AS n, (SELECT pg_catalog.count(*) FROM %s AS s WHERE "
            "s.%s OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT i.key FROM ins AS i))) AS present" % (
                req.output.qualified("_keys"), key, s["next_ec"], a, row_hash_sql(req, "w"), window_table(s),
                C.ident(ROW_NO), req.source["read"], key), ["text", "text"]),
        [array_literal(row_nos), array_literal(ecs)])[0]
    if got["n"] != len(row_nos):
        raise E.SabreError(E.INTERNAL, "advance %d: %d published rows are not in the window table" % (
            a, len(row_nos) - got["n"]), "Drop the stream and create it again; sabre_stream_verify checks its output.")
    if got["present"] != got["n"]:
        raise deleted(got["n"] - got["present"], window)


def key_probe(req, join=False) -> dict:
    """Settings for a statement that finds a few thousand source rows by key (``join``: by a
    join with their keys): with the key indexed, an index probe per key, whatever the (often
    stale) statistics of a growing source say.  (The advance runs with JIT off: disabling a
    plan type inflates costs past its threshold.)"""
    if not req.key.unique:
        return {}
    probe = dict(enable_seqscan="off")
    return dict(probe, enable_hashjoin="off", enable_mergejoin="off") if join else probe


# ---------------------------------------------------------------------------- status, drop
@E.entry_point
def status(plpy, name):
    s = load(plpy, name)
    req = stream_request(plpy, s)
    arrived = plpy.execute("SELECT pg_catalog.count(*) AS n FROM %s AS s%s" % (req.source["read"],
                                                                               req.row_filter()))[0]["n"]
    window = W.window_of(s["advances"] + 1, s["window_size"], s["step"])
    published = window.first - 1 + len(s["ahead"] or [])
    lag = plpy.execute(plpy.prepare("SELECT pg_catalog.now() OPERATOR(pg_catalog.-) $1::timestamptz AS lag",
                                    ["timestamptz"]), [s["last_advance_at"]])[0]["lag"] \
        if s["last_advance_at"] is not None else None
    # rows not yet numbered join the stream at the next advance
    ready = W.advances_ready(max(arrived, s["numbered"]), s["advances"], s["window_size"], s["step"])
    return [(name, req.output.qualified(), s["advances"], window.first, window.last, s["numbered"], arrived,
             published, s["numbered"] - published, len(s["sg_emds"] or []), len(s["sg_rows"] or []), s["last_case"],
             s["last_advance_at"], ready, lag, s["cron_job"])]


@E.entry_point
def drop(plpy, name, purge):
    """sabre_stream_drop: the stream's state and job; with ``purge`` its output relations too
    (only those that still carry the stream's identity)."""
    s = load(plpy, name, lock=True)
    if s["cron_job"] is not None:
        cron.unschedule_job(plpy, s["cron_job"])
    if purge:
        oids = output_relations(plpy, s)
        if oids:
            found = plpy.execute(plpy.prepare(publish.dependents_sql(), ["oid[]"]), [oids])
            if len(found):
                raise E.dependent_objects(
                    "cannot purge the output of stream \"%s\": other objects depend on it: %s"
                    % (name, ", ".join(r["what"] for r in found)), "Drop them first, or drop without purge.")
            plpy.execute("DROP TABLE %s" % ", ".join(C.relation_info(plpy, o)["qname"] for o in oids))
    with C.quietly(plpy):
        plpy.execute("DROP TABLE IF EXISTS %s" % window_table(s))    # this session's copy of its window
    plpy.execute("DROP TABLE %s, %s, %s" % (s["state"], s["rows"], s["log"]))
    plpy.execute("SELECT %s(%d)" % (C.catalog("stream_forget"), s["stream_id"]))
    return True


# ---------------------------------------------------------------------------- verify
@E.entry_point
def verify(plpy, name):
    """sabre_stream_verify: from the output, its keys and the source (module docs/streams.md)."""
    s = load(plpy, name)
    req = stream_request(plpy, s)
    if len(output_relations(plpy, s)) != 3:
        raise E.not_in_prerequisite_state('the output relations of stream "%s" are missing' % name,
                                          "Nothing to verify: drop the stream.")
    emds, mismatched = window_emds(plpy, s, req)
    ours = plpy.execute(
        "SELECT (SELECT pg_catalog.count(*) FROM %s) AS out_rows, "
        "(SELECT pg_catalog.count(*) FROM (SELECT k.key FROM %s AS k GROUP BY k.key "
        "HAVING pg_catalog.count(*) > 1) AS d) AS twice" % (req.output.qualified(), req.output.qualified("_keys")))[0]
    lost = unpublished(plpy, s, req)
    changed = plpy.execute(
        "SELECT pg_catalog.count(*) FILTER (WHERE s.%s IS NULL) AS deleted, "
        "pg_catalog.count(*) FILTER (WHERE s.%s IS NOT NULL AND %s IS DISTINCT FROM k.row_hash) AS updated "
        "FROM %s AS k LEFT JOIN %s AS s ON s.%s OPERATOR(pg_catalog.=) k.key" % (
            C.ident(req.key.name), C.ident(req.key.name), row_hash_sql(req, "s", "k.row_hash"), req.output.qualified("_keys"),
            req.source["read"], C.ident(req.key.name)))[0]
    late = late_rows(plpy, s, req)
    # a class whose rows in <output> or <output>_keys are not its recorded size violates too
    violations = mismatched + (int(np.count_nonzero(emds.violating(req.t, req.k))) if emds is not None else 0)
    return [(s["advances"], emds.classes if emds is not None else 0, ours["out_rows"], violations,
             emds.max_emd if emds is not None else 0.0, emds.min_class_size if emds is not None else 0,
             ours["twice"], lost, changed["updated"], changed["deleted"], late)]


def unpublished(plpy, s, req) -> int:
    """Rows numbered but never published: expired row numbers (up to the current window's
    start) that ``<output>_keys`` does not hold with the same key, and rows numbered past the
    stream's count (which no window will ever reach in order)."""
    expired = W.window_of(s["advances"] + 1, s["window_size"], s["step"]).first - 1
    return plpy.execute(
        "SELECT pg_catalog.count(*) AS n FROM %s AS r WHERE r.row_no OPERATOR(pg_catalog.>) %d OR "
        "(r.row_no OPERATOR(pg_catalog.<=) %d AND NOT EXISTS (SELECT FROM %s AS k WHERE k.row_no "
        "OPERATOR(pg_catalog.=) r.row_no AND (k.key)::pg_catalog.text OPERATOR(pg_catalog.=) r.key))" % (
            s["rows"], s["numbered"], expired, req.output.qualified("_keys")))[0]["n"]


def window_emds(plpy, s, req):
    """(exact EMD and size of every published class against its generating window, number of
    classes whose size in <output> differs from <output>_keys).  Window rows come from the row
    numbering and the source; class membership from <output>_keys and <output>_classes."""
    sa = "s.%s" % C.ident(req.sa.name)
    rows = plpy.execute(
        "SELECT g.wf, pg_catalog.array_agg(%s ORDER BY r.row_no) AS sa, "
        "pg_catalog.array_agg(CASE WHEN c.window_first = g.wf THEN c.ec_id ELSE -1 END ORDER BY r.row_no) AS ec "
        "FROM (SELECT DISTINCT x.window_first AS wf, x.window_last AS wl FROM %s AS x) AS g "
        "JOIN %s AS r ON r.row_no BETWEEN g.wf AND g.wl "
        "JOIN %s AS s ON s.%s OPERATOR(pg_catalog.=) r.key::%s "
        "LEFT JOIN %s AS k ON k.row_no = r.row_no LEFT JOIN %s AS c ON c.ec_id = k.ec_id GROUP BY g.wf" % (
            "(%s)::pg_catalog.text" % sa if not req.sa.numerical else sa if req.sa.typname == "numeric"
            else C.numeric_expr(None, req.sa.name, req.sa.col, "s."),
            req.output.qualified("_classes"), s["rows"], req.source["read"],
            C.ident(req.key.name), req.key.col["type"], req.output.qualified("_keys"),
            req.output.qualified("_classes")))
    hierarchy = None
    if req.sa.hierarchy_name is not None:
        hierarchy = C.load_hierarchy(plpy, req.sa.hierarchy_name, 'for column "%s"' % req.sa.name)
    ids, sizes, nums, dens, emd = [], [], [], [], []
    for r in rows:
        checkpoint()
        ec = np.asarray(r["ec"], dtype=np.int64)
        codes, domain = verify_codes(r["sa"], req, hierarchy)
        exact = W.class_emds(codes, ec, domain)
        mine = exact.class_ids >= 0
        for arr, values in ((ids, exact.class_ids), (sizes, exact.sizes), (nums, exact.numerators),
                            (dens, exact.denominators), (emd, exact.emd)):
            arr.extend(values[mine].tolist())
    mismatched = plpy.execute(
        "SELECT pg_catalog.count(*) AS n FROM %s AS c LEFT JOIN (SELECT o.ec_id, pg_catalog.count(*) AS n FROM %s "
        "AS o GROUP BY 1) AS o ON o.ec_id = c.ec_id LEFT JOIN (SELECT k.ec_id, pg_catalog.count(*) AS n FROM %s AS k "
        "GROUP BY 1) AS k ON k.ec_id = c.ec_id WHERE o.n IS DISTINCT FROM c.size OR k.n IS DISTINCT FROM c.size" % (
            req.output.qualified("_classes"), req.output.qualified(), req.output.qualified("_keys")))[0]["n"]
    if not ids:
        return None, mismatched
    return ClassEMDs("window", 0, np.asarray(ids), np.asarray(sizes), np.asarray(nums, dtype=object),
                     np.asarray(dens, dtype=object), np.asarray(emd)), mismatched


def verify_codes(values, req, hierarchy):
    """SA codes of a window's rows in the window's own domain, computed from the values alone."""
    if req.sa.numerical:
        if req.sa.typname == "numeric":
            values = [Decimal(v) for v in values]
            distinct = sorted(set(values))
            rank = {v: i for i, v in enumerate(distinct)}
            return np.array([rank[v] for v in values], dtype=np.int64), SADomain("numerical", m=len(distinct))
        codes, m = W.window_codes(np.asarray(values, dtype=np.float64))
        return codes, SADomain("numerical", m=m)
    if hierarchy is None:
        hierarchy = Hierarchy.flat(sorted(set(values)), name=req.sa.name)
    leaf = {v: i for i, v in enumerate(hierarchy.leaves)}
    return np.array([leaf[v] for v in values], dtype=np.int64), SADomain("categorical", hierarchy=hierarchy)


def late_rows(plpy, s, req) -> int:
    """Source rows never numbered whose arrival precedes the current window's first row: the
    late-row rule leaves them unpublished."""
    if not s["numbered"]:
        return 0
    first = W.window_of(s["advances"] + 1, s["window_size"], s["step"]).first
    key, arrival = "s.%s" % C.ident(req.key.name), "s.%s" % C.ident(s["arrival"])
    where = req.row_filter() or " WHERE true"
    return plpy.execute(
        "SELECT pg_catalog.count(*) AS n FROM %s AS s%s AND %s OPERATOR(pg_catalog.<) (SELECT %s FROM %s AS s "
        "JOIN %s AS r ON %s = r.key::%s WHERE r.row_no = %d) AND NOT EXISTS (SELECT FROM %s "
        "AS r WHERE r.key = (%s)::pg_catalog.text)" % (
            req.source["read"], where, arrival, arrival, req.source["read"], s["rows"], key,
            req.key.col["type"], min(first, s["numbered"]), s["rows"], key))[0]["n"]


# ---------------------------------------------------------------------------- upgrade
@E.entry_point
def migrate(plpy) -> int:
    """``sabre-pg upgrade`` from the 0.2 layout (``sabre.streams_0_2``, ``sabre.stream_rows``,
    ``sabre.stream_advances``, shared by every role): each stream's state moves into relations
    its owner owns (:func:`create_state`, created by the installing superuser, then given to the
    owner), with only the rows that owner wrote -- rows another role planted under its stream id
    are left behind.  A stream whose owner or output schema is gone is skipped with a WARNING.
    Returns the number of streams moved."""
    moved = 0
    old = plpy.execute(
        "SELECT s.*, s.options::pg_catalog.text AS options, r.oid AS role_oid FROM %s AS s "
        "LEFT JOIN pg_catalog.pg_roles AS r ON r.rolname OPERATOR(pg_catalog.=) s.owner "
        "ORDER BY s.stream_id" % C.catalog("streams_0_2"))
    for s in old:
        schema = plpy.execute(plpy.prepare("SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname "
                                           "OPERATOR(pg_catalog.=) $1", ["name"]), [s["output_schema"]])
        if s["role_oid"] is None or not len(schema):
            plpy.warning('stream "%s" of %s not migrated: its role or its output schema no longer exists'
                         % (s["name"], s["owner"]))
            continue
        output = request.Output(s["output_schema"], s["output_name"])
        suffix, n = "", 0
        while any(plpy.execute(plpy.prepare("SELECT pg_catalog.to_regclass($1) AS r", ["text"]),
                               [output.qualified(part + suffix)])[0]["r"] is not None for part in STATE_SUFFIXES):
            n += 1
            suffix = "_%d" % n
        oids = create_state(plpy, output, s["name"], s["identity"], suffix)
        state, rows, log = (C.relation_info(plpy, o)["qname"] for o in oids)
        plpy.execute("UPDATE %s AS st SET (%s) = (SELECT %s FROM %s AS o WHERE o.stream_id OPERATOR(pg_catalog.=) %d)"
                     % (state, ", ".join(STATE_FIELDS), ", ".join("o.%s" % f for f in STATE_FIELDS),
                        C.catalog("streams_0_2"), s["stream_id"]))
        mine = "o.stream_id OPERATOR(pg_catalog.=) %d AND o.owner OPERATOR(pg_catalog.=) %s" % (
            s["stream_id"], plpy.quote_literal(s["owner"]))
        plpy.execute("INSERT INTO %s (row_no, key) SELECT o.row_no, o.key FROM %s AS o WHERE %s" % (
            rows, C.catalog("stream_rows"), mine))
        plpy.execute("INSERT INTO %s (%s) SELECT %s FROM %s AS o WHERE %s" % (
            log, ", ".join(LOG_FIELDS), ", ".join("o.%s" % f for f in LOG_FIELDS), C.catalog("stream_advances"), mine))
        for table in (state, rows, log):
            plpy.execute("ALTER TABLE %s OWNER TO %s" % (table, C.ident(s["owner"])))
            publish.owner_only(plpy, table)
        register(plpy, "%d::pg_catalog.oid" % s["role_oid"], s, oids, s["created_at"])
        moved += 1
    return moved
