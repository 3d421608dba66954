"""sabre_anonymize on a Citus distributed table, pushed down shard by shard (docs/scale-out.md,
"Citus (built)": the **shard-local** design).

On the coordinator (:func:`run`): the SA summary, the categorical QIs' values, the numerical QIs'
ranges and one row per shard (a distribution value of one of its rows, its row count) are
aggregates that Citus pushes down; only groups reach the coordinator.  Then every shard is
anonymized **on the worker that holds it** by :func:`shard_run` (the SQL function
``sabre_citus_shard``), in one statement of the run's own transaction::

    SELECT s.<col>::text, sabre.sabre_citus_shard('<request>'::jsonb, s.<col>::text)
    FROM <source> AS s WHERE s.<col> = ANY (<one value per shard>)

Citus sends each shard's task to its worker, over the connection of the coordinator's
distributed transaction that created that shard's relations of the run (so the worker sees those
uncommitted tables), and its writes commit or roll back with the run: Citus's two-phase commit
covers those connections (measured: a worker transaction that touched a temporary table cannot
PREPARE, so nothing here is temporary).  The function reads its shard's rows locally through the
request's read expression, runs the engine with every class measured against the **whole
table's** SA counts (``reference``), writes the shard's output, side table and classes into the
colocated shards of the run's relations, checks them exactly against the whole table, and
returns aggregates only: rows, classes, sizes, EMDs, violations, its SA counts, its summed
information loss.  The coordinator sums them; anything off and nothing is published.

The relations' columns (created empty on the coordinator, then distributed colocated with the
source) come first from a dry run on the first shard: its rows read and put in one class
(t-Mondrian with k = the shard's rows: no search, about the read's cost; the columns do not
depend on the classes), written WITH NO DATA in a subtransaction its worker rolls back.  Class ids are unique across shards: each shard's start after the rows
of the shards before it.  The run uses :data:`CONNECTIONS` connection(s) per worker: a worker
anonymizes its shards one after another, the workers in parallel.

Applies when the source is hash-distributed, with the distribution column used as a unique key
and (for this design) published (``options.keep``), and no ``options.partitions`` (hierarchies
travel to the workers in the request: the workers' catalogs need not hold them); otherwise the
run goes through the coordinator (a NOTICE says why).  Every method and the several-SA form:
'refine' and 'mondrian' cut against the table's counts of every SA; 'ak' and 'knn' run on the
shard's own counts with the budget ``t - EMD(shard, table)`` (:func:`_engine`, docs/scale-out.md,
"Methods and several SAs on the workers").
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace

import numpy as np

from sabre_pg.core import stopwatch
from sabre_pg.core.hierarchy import Hierarchy
from sabre_pg.core import metrics
from sabre_pg.core.mondrian import against_table
from sabre_pg.core.multi_sa import anonymize_multi, most_constraining_of
from sabre_pg.core.sabre import anonymize, plan_from_counts
from sabre_pg.core.stopwatch import Stopwatch

from ..shared import citus
from ..shared import common as C
from ..shared import errors as E
from ..stages import publish, request, scan
from . import partition

REFERENCE_METHODS = ("refine", "mondrian")   # cut t-close to the whole table itself (``reference``)
TAGS = (("", "o"), ("_classes", "c"), ("_keys", "k"))    # the run's relations' temporary tags
SHARD_KEY = "shard_key"           # <output>_classes' distribution column: a value of the shard's
SHARD_HINT = ("Distribute the source into fewer shards (create_distributed_table(..., shard_count => n)), "
              "or raise t or lower k; or anonymize a local copy of the table.")
PART_HINT = ('Ask for fewer parts (options.partitions), or raise t or lower k; or pass options => '
             '\'{"citus_design": "shard_local"}\'.')
HINTS = {"shard": SHARD_HINT, "part": PART_HINT}     # a piece of a pushed-down run: a shard, or a QI-local part


# ---------------------------------------------------------------------------- coordinator
def pushdown_column(plpy, req) -> str | None:
    """The source's distribution column when the run can be pushed down to the shards; None for
    a source that is not hash-distributed, or (with a NOTICE saying why) a call that needs the
    coordinator path."""
    column = citus.distribution_column(plpy, req.source["oid"])
    if column is None:
        return None
    why = []
    if column not in req.options.keep and design(req) == "shard_local":
        why.append('the distribution column "%s" is not published (options.keep), which the shard-local design '
                   'needs' % column)
    elif req.key.name != column:
        why.append('the key "%s" is not the distribution column "%s"' % (req.key.name, column))
    if partition.partitions_option(req) is not None and design(req) == "shard_local":
        why.append("options.partitions (with options.citus_design 'shard_local')")
    if not req.key.unique:
        why.append('the key "%s" has no unique constraint' % req.key.name)
    if why:
        plpy.notice("sabre: %s is distributed, but this run reads it through the coordinator: %s"
                    % (req.source["qname"], "; ".join(why)),
                    hint='Pass options => \'{"keep": ["%s"]}\' to anonymize the table on its workers.'
                    % column.replace('"', '\\"'))
        return None
    return column


DEFAULT_DESIGN = "qi_local"    # the design with the better measured quality (docs/scale-out.md)
DESIGN_HINT = ('Pass options => \'{"citus_design": "shard_local"}\' to anonymize each shard where it is, or add a '
               'numerical quasi-identifier for the QI-local split to cut on.')


def design(req) -> str:
    """options.citus_design, else the default: 'qi_local' (citus_qi_local.py) when a numerical
    QI gives the split something to cut, else 'shard_local'.  'qi_local' asked without one: 22023."""
    numerical = any(a.numerical for a in req.qis)
    chosen = req.options.citus_design
    if chosen is None:
        return DEFAULT_DESIGN if numerical else "shard_local"
    if chosen == "qi_local" and not numerical:
        raise E.invalid_parameter("options.citus_design 'qi_local' needs a numerical quasi-identifier: the split "
                                  "into QI-local parts cuts on numerical quasi-identifiers only", DESIGN_HINT)
    return chosen


CONNECTIONS = 1    # Citus connections per worker for the whole run: the shards on a worker are
                   # anonymized one after another on it (memory: one shard's per worker), the
                   # workers in parallel


def connections(plpy):
    """The run's settings, set before its first Citus query: one connection per worker (Citus's
    sequential mode; its DDL included), the one that creates a shard's relations and then runs
    that shard's call; :data:`CONNECTIONS` > 1: that many per worker."""
    if CONNECTIONS == 1:
        return C.settings(plpy, **{"citus.multi_shard_modify_mode": "sequential"})
    return C.settings(plpy, **{"citus.max_adaptive_executor_pool_size": str(CONNECTIONS)})


@dataclass(frozen=True)
class Shard:
    shardid: int
    name: str                 # qualified shard relation on its worker
    routing: str              # SQL literal of a distribution value of one of its rows
    node: str
    rows: int
    value: str                # that value as text


_SHARDS_SQL = """
SELECT s.shardid, i.parts[pg_catalog.array_length(i.parts, 1)] AS name,
       n.nodename OPERATOR(pg_catalog.||) ':' OPERATOR(pg_catalog.||) n.nodeport AS node
FROM pg_catalog.pg_dist_shard s
CROSS JOIN LATERAL pg_catalog.parse_ident(pg_catalog.shard_name(s.logicalrelid, s.shardid)) AS i(parts)
JOIN pg_catalog.pg_dist_placement p ON p.shardid OPERATOR(pg_catalog.=) s.shardid
JOIN pg_catalog.pg_dist_node n ON n.groupid OPERATOR(pg_catalog.=) p.groupid AND n.noderole OPERATOR(pg_catalog.=) 'primary'
WHERE s.logicalrelid OPERATOR(pg_catalog.=) $1::pg_catalog.regclass
ORDER BY s.shardminvalue::pg_catalog.int4"""


def shard_rows(plpy, relation: str, schema: str) -> list:
    """(shard id, qualified shard relation, node) of a distributed relation, in hash order
    (colocated relations: the same order, shard for shard)."""
    return [(r["shardid"], C.qname(None, schema, r["name"]), r["node"])
            for r in plpy.execute(C.prepared(plpy, _SHARDS_SQL, ["text"]), [relation])]


def shards(plpy, req, column) -> list:
    """The source's non-empty shards in hash order, each with one of its rows' distribution
    value (that routes a query to it) and its row count: one aggregate, pushed down."""
    found = {r["shard"]: r for r in plpy.execute(plpy.prepare(
        "SELECT pg_catalog.get_shard_id_for_distribution_column($1::pg_catalog.oid::pg_catalog.regclass, s.%s) "
        "AS shard, pg_catalog.min(s.%s)::pg_catalog.text AS v, pg_catalog.count(*) AS n FROM %s AS s%s GROUP BY 1"
        % (C.ident(column), C.ident(column), req.source["read"], req.row_filter()), ["oid"]), [req.source["oid"]])}
    typ = req.columns[column]["type"]
    return [Shard(shardid, name, "%s::%s" % (plpy.quote_literal(found[shardid]["v"]), typ), node,
                  int(found[shardid]["n"]), found[shardid]["v"])
            for shardid, name, node in shard_rows(plpy, req.source["qname"], req.source["nspname"])
            if shardid in found]


def _hierarchy_json(h) -> dict:
    return {"rows": h.rows, "empty_leaves": h.empty_leaves}


def _hierarchy(j: dict, name: str):
    return Hierarchy(j["rows"], name=name, empty_leaves=j["empty_leaves"])


def _summary_json(summary) -> dict:
    return {"rows": int(summary.rows), "counts": np.asarray(summary.counts).tolist(),
            "distinct": None if summary.distinct is None else summary.distinct.tolist(),
            "dtype": None if summary.distinct is None else summary.distinct.dtype.str,
            "hierarchy": None if summary.hierarchy is None else _hierarchy_json(summary.hierarchy),
            "ranks": summary.ranks}


def _ranges(plpy, req) -> dict:
    """{numerical QI: [min, max]} over the whole table (one pushed-down aggregate), so each
    shard's information loss is normalized as on one node."""
    nums = [a for a in req.qis if a.numerical]
    if not nums:
        return {}
    r = plpy.execute("SELECT %s FROM %s AS s%s" % (", ".join(
        "pg_catalog.min(%s) AS lo%d, pg_catalog.max(%s) AS hi%d" % (e, i, e, i) for i, e in enumerate(
            C.numeric_expr(plpy, a.name, a.col, "s.") for a in nums)), req.source["read"], req.row_filter()))[0]
    return {a.name: [float(r["lo%d" % i]), float(r["hi%d" % i])] for i, a in enumerate(nums)}


def _call(plpy, req, column, shard: Shard, function: str, payload: dict, relation: str | None = None) -> dict:
    """``function`` (sabre's, on the worker) called once in a router query on ``shard`` (of
    ``relation``, a FROM item distributed by ``column``: the source by default)."""
    row = _privileged(plpy, shard, lambda: plpy.execute(plpy.prepare(
        "SELECT %s($1::jsonb) AS r, pg_catalog.count(*) AS n FROM %s AS s WHERE s.%s OPERATOR(pg_catalog.=) %s"
        % (C.catalog(function), relation or req.source["read"], C.ident(column), shard.routing), ["text"]),
        [json.dumps(payload)])[0])
    return json.loads(row["r"])


def _privileged(plpy, shard: Shard, statement):
    """``statement()``; sabre runs on the workers as the caller, who needs USAGE on sabre's schema
    on each node (it is each node's own, so its grants are not propagated): 42501 says so.  (The
    names in the HINT are read first: after a failed statement a run reads nothing more.)"""
    names = plpy.execute(plpy.prepare("SELECT pg_catalog.quote_ident($1) AS s, pg_catalog.quote_ident("
                                      "CURRENT_USER::pg_catalog.text) AS u", ["text"]), [C.SCHEMA])[0]
    try:
        return statement()
    except plpy.SPIError as e:
        if getattr(e, "sqlstate", None) != E.INSUFFICIENT_PRIVILEGE:
            raise
        raise E.insufficient_privilege(
            "on the Citus worker %s that holds shard %s: %s" % (shard.node, shard.name, str(e).splitlines()[0]),
            "sabre runs each shard on its worker as you: the DBA grants there what the coordinator grants, e.g. "
            "SELECT run_command_on_workers($$GRANT USAGE ON SCHEMA %s TO %s$$) (sabre's schema is each "
            "node's own, so its grants are not propagated)." % (names["s"], names["u"])) from e


def _call_all(plpy, req, column, parts: list, base: dict, each: dict, relation: str | None = None,
              typ: str | None = None) -> list:
    """sabre_citus_shard on every shard of ``parts`` (``each``: their requests by their
    row's distribution value) in one multi-shard statement over ``relation`` (the source by
    default; ``column`` of type ``typ`` unique in it); the replies in ``parts``' order."""
    if not parts:
        return []
    rows = _privileged(plpy, parts[0], lambda: plpy.execute(plpy.prepare(
        "SELECT s.%s::pg_catalog.text AS v, %s($1::jsonb, s.%s::pg_catalog.text) AS r FROM %s AS s "
        "WHERE s.%s OPERATOR(pg_catalog.=) ANY ($2::%s[])" % (
            C.ident(column), C.catalog("sabre_citus_shard"), C.ident(column), relation or req.source["read"],
            C.ident(column), typ or req.columns[column]["type"]), ["text", "text[]"]),
        [json.dumps(dict(base, shards=each)), [p.value for p in parts]]))
    by_value = {r["v"]: json.loads(r["r"]) for r in rows}
    if sorted(by_value) != sorted(p.value for p in parts) or len(rows) != len(parts):
        raise partition._changed()
    for p in parts:
        by_value[p.value]["node"] = p.node
    return [by_value[p.value] for p in parts]


def create_distributed(plpy, tables: dict, layout: dict, by: dict, colocate_with: str, drop: str = "") -> None:
    """The relations ``tables`` ({suffix: name}), empty, with the columns of ``layout`` (but
    ``drop``), each distributed by its column of ``by``, colocated with ``colocate_with``; the
    side table unlogged and owner-only."""
    for suffix, table in tables.items():
        plpy.execute("CREATE %sTABLE %s (%s)" % ("UNLOGGED " if suffix == "_keys" else "", table, ", ".join(
            "%s %s" % (C.ident(n), t) for n, t in layout[suffix] if n != drop)))
        with C.quietly(plpy):
            plpy.execute(C.prepared(plpy, "SELECT pg_catalog.create_distributed_table($1::pg_catalog.regclass, $2, "
                                    "colocate_with => $3)", ["text", "text", "text"]),
                         [table, by[suffix], colocate_with])
        if suffix == "_keys":
            publish.owner_only(plpy, table)


def base_request(req, column: str, summaries: list, ranges: dict, hierarchies: dict) -> dict:
    """What every worker call of the run gets (the SA summaries, the QI ranges, the hierarchies);
    several SAs (the array overload): ``sensitive`` and ``t`` are lists."""
    sas = [a.name for a in req.sensitive]
    return {"source": req.source["qname"], "qis": [a.name for a in req.qis],
            "sensitive": sas if req.sas else req.sa.name, "t": list(req.thresholds) if req.sas else req.t,
            "k": req.k, "method": req.method, "options": dict(req.options.given, key=column),
            "output": req.output.qualified(), "summaries": [_summary_json(s) for s in summaries], "ranges": ranges,
            "hierarchies": {a: _hierarchy_json(h) for a, h in hierarchies.items() if a not in sas}}


def run(plpy, req, clock: Stopwatch, column: str, hierarchies: dict, summaries: list):
    """The pushed-down run (module doc); ``summaries``: the whole table's SA summary of each SA."""
    stopwatch.plan(("validate", "summary", "partition", "check", "swap"))
    with clock.phase("summary"):
        ranges = _ranges(plpy, req)
        parts = shards(plpy, req, column)
    run_ = publish.begin(plpy, req)
    prev = publish.previous(plpy, req)
    built = partition._built(req, run_)
    base = base_request(req, column, summaries, ranges, hierarchies)
    offsets = np.cumsum([0] + [p.rows for p in parts])     # class ids: a shard has at most its rows' classes
    with clock.phase("partition"):      # the shards, on their workers
        # the layout of the run's relations: the first shard's, written WITH NO DATA in a
        # subtransaction its worker rolls back (nothing stays there)
        layout = _call(plpy, req, column, parts[0], "sabre_citus_shard", dict(
            base, shard=parts[0].name, offset=0, routing=parts[0].routing, layout=True,
            tables={s: req.output.temporary_qualified(run_.run_id, "l" + tag) for s, tag in TAGS}))["layout"]
        create_distributed(plpy, built, layout, {"": column, "_classes": SHARD_KEY, "_keys": "key"},
                           req.source["qname"])
        source_ids = [i for i, _, _ in shard_rows(plpy, req.source["qname"], req.source["nspname"])]
        targets = {s: dict(zip(source_ids, [n for _, n, _ in shard_rows(plpy, built[s], req.output.schema)]))
                   for s in built}
        # every shard in one statement: Citus runs each shard's call on its worker, on the
        # connection that created that shard's relations (CONNECTIONS per worker)
        replies = _call_all(plpy, req, column, parts, base, {
            p.value: {"shard": p.name, "offset": int(offsets[j]), "routing": p.routing,
                      "tables": {s: targets[s][p.shardid] for s in built}} for j, p in enumerate(parts)})
    with clock.phase("check"):
        facts = _summed(req, summaries, replies)
    return publish_run(plpy, req, clock, run_, prev, built, facts, replies, {
        "parts": len(parts), "automatic": False, "citus": "shard-local", "citus_design": "shard_local"}, hierarchies)


def publish_run(plpy, req, clock, run_, prev, built, facts: dict, replies: list, fact: dict, hierarchies: dict):
    """The classes' primary key, the swap and the run's catalog row (``fact``: its
    ``partitions``, with the workers' reply bytes and how many workers replied)."""
    with clock.phase("check"):
        plpy.execute("ALTER TABLE %s ADD CONSTRAINT %s PRIMARY KEY (%s, ec_id)" % (
            built["_classes"], C.ident(req.output.temporary(run_.run_id, "c_pkey")), C.ident(SHARD_KEY)))
        publish.index_keys(plpy, req, run_, built["_keys"])     # 'ak', 'knn': the side table's index (Citus
                                                                # builds it on every shard, on its worker)
    with clock.phase("swap"):
        publish.swap(plpy, req, run_, prev, built)
        publish.comment(plpy, req, run_)
    facts.update({"quasi_identifiers": [a.name for a in req.qis], "sensitive": req.sa.name, "t": req.t, "k": req.k,
                  "method": req.method, "options": req.options.given, "buckets": None, "u": None,
                  "sensitive_attributes": [a.name for a in req.sensitive], "t_values": list(req.thresholds),
                  "partitions": dict(fact, reply_bytes=sum(len(json.dumps(r)) for r in replies),
                                     workers=len({r["node"] for r in replies})),
                  "phases": clock.report(), "seconds": clock.total()})
    output_oid = publish.record(plpy, req, run_, facts, hierarchies)
    return [(run_.run_id, output_oid, facts["rows"], facts["classes"], facts["min_class_size"],
             facts["max_emds"] if req.sas else facts["max_emd"], facts["ail"], facts["seconds"])]


def reach_workers(plpy, req) -> None:
    """A last statement over the published output, on the run's connection to each worker that
    holds a shard of it: a worker lost after the run's last statement fails the run here (sabre's
    08006, ``citus.node_failures``) rather than at COMMIT (Citus's own error)."""
    plpy.execute("SELECT 1 FROM %s AS o LIMIT 1" % req.output.qualified())


def _summed(req, summaries: list, replies, piece: str = "shard") -> dict:
    """The workers' checks summed: every source row once (each shard's own check) and the SA
    counts of the rows written the whole table's, on every SA; every class >= k and within t of
    the whole table (each SA's t), by the exact EMD each worker computed against the whole
    table's counts.  ``piece``: what each reply anonymized, "shard" or "part" (:data:`HINTS`)."""
    rows = sum(r["rows"] for r in replies)
    for j, summary in enumerate(summaries):
        counts = np.sum([r["sa_counts"][j] for r in replies], axis=0)
        if rows != summary.rows or not np.array_equal(counts, summary.counts):
            raise E.source_changed("the %ss' outputs do not hold the source's rows (%d rows written, %d in the "
                                   "SA summary)" % (piece, rows, summary.rows),
                                   "Run again; inside REPEATABLE READ if the source is being written.")
    bad = [r for r in replies if r["violations"]]
    if bad:
        worst = max(bad, key=lambda r: r["max_emd"])
        raise E.invalid_parameter(
            "%d class(es) of %d %s(s) violate t = %s or k = %d against the whole table (max EMD %.6g, "
            "smallest class %d, %s on %s): a %s's rows alone cannot be split within t of the table"
            % (sum(r["violations"] for r in bad), len(bad), piece, "/".join("%g" % t for t in req.thresholds),
               req.k, worst["max_emd"], min(r["min_class_size"] for r in bad), piece, worst["node"], piece),
            HINTS[piece])
    full = [r for r in replies if r["rows"]]
    max_emds = [max(r["max_emds"][j] for r in full) for j in range(len(summaries))]
    return {"rows": rows, "classes": sum(r["classes"] for r in replies),
            "min_class_size": min(r["min_class_size"] for r in full),
            "max_class_size": max(r["max_class_size"] for r in full),
            "max_emd": max_emds[0], "max_emds": max_emds, "ail": sum(r["il_sum"] for r in full) / rows,
            "discernibility": sum(r["discernibility"] for r in full)}


# ---------------------------------------------------------------------------- worker
@dataclass(frozen=True)
class ShardInto(publish.Into):
    """:class:`publish.Into` of one shard: its classes also carry the shard's distribution value
    (the classes' distribution column, so they stay on the shard's worker).  ``create``: the
    layout's dry run, relations created WITH NO DATA."""
    routing: str = "NULL"
    keyed: tuple = (("_classes", SHARD_KEY),)   # (suffix, column): relations that also carry the routing value

    def write(self, suffix: str, select: str, unlogged: bool = False) -> str:
        column = dict(self.keyed).get(suffix)
        if column:
            select = "SELECT c.*, %s AS %s FROM (%s) AS c" % (self.routing, C.ident(column), select)
        return super().write(suffix, select, unlogged) + (" WITH NO DATA" if self.create else "")


def _global_summary(g: dict, sa_name: str):
    distinct = None if g["distinct"] is None else np.asarray(g["distinct"], dtype=np.dtype(g["dtype"]))
    hierarchy = None if g["hierarchy"] is None else _hierarchy(g["hierarchy"], sa_name)
    return scan.SASummary(int(g["rows"]), np.asarray(g["counts"], dtype=np.int64), distinct, hierarchy, g["ranks"])


def _in_table_codes(plpy, req, table, sa=None):
    """The shard's SA summary (of ``sa``, the request's first by default) with the whole
    table's codes (its values, leaves or ranks)."""
    own = scan.sa_summary(plpy, req, table.hierarchy, sa)
    if table.hierarchy is not None:
        return scan.SASummary(own.rows, own.counts, None, table.hierarchy)
    counts = np.zeros(len(table.counts), dtype=np.int64)
    if table.ranks is not None:
        at = {v: i for i, v in enumerate(table.ranks)}
        if any(v not in at for v in own.ranks):
            raise partition._changed()
        counts[[at[v] for v in own.ranks]] = own.counts
        return scan.SASummary(own.rows, counts, None, None, table.ranks)
    idx = np.minimum(np.searchsorted(table.distinct, own.distinct), len(table.distinct) - 1)
    if not np.array_equal(table.distinct[idx], own.distinct):
        raise partition._changed()
    counts[idx] = own.counts
    return scan.SASummary(own.rows, counts, table.distinct, None)


def _layout(plpy, tables: dict) -> dict:
    return {s: [(r["n"], r["t"]) for r in plpy.execute(C.prepared(
        plpy, "SELECT a.attname::pg_catalog.text AS n, pg_catalog.format_type(a.atttypid, a.atttypmod) AS t "
        "FROM pg_catalog.pg_attribute a WHERE a.attrelid OPERATOR(pg_catalog.=) $1::pg_catalog.regclass "
        "AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped ORDER BY a.attnum", ["text"]), [t])]
            for s, t in tables.items()}


def _empty(plpy, req) -> bool:
    return not len(plpy.execute("SELECT 1 FROM %s AS s%s LIMIT 1" % (req.source["read"], req.row_filter())))


@E.entry_point
def shard_run(plpy, payload, value=None):
    """One shard on its worker (module doc): anonymized against the whole table, written into
    ``tables``, checked; returns the aggregates of the check (``layout``: only the columns of
    the relations it would write, nothing written).
    ``value``: this shard's distribution value, which picks its part of ``payload["shards"]``."""
    p = json.loads(payload)
    if value is not None:
        p = dict(p, **p.pop("shards")[value])
    shard = C.resolve_relation(plpy, p["shard"])
    req = request.build(plpy, shard["oid"], p["shard"], p["qis"], p["sensitive"], p["t"], p["k"], p["method"],
                        p["output"], json.dumps(p["options"]))
    tables = [_global_summary(g, sa.name) for g, sa in zip(p["summaries"], req.sensitive)]
    reply = {"rows": 0, "classes": 0, "violations": 0, "sa_counts": [[0] * len(t.counts) for t in tables]}
    layout = bool(p.get("layout"))
    into = ShardInto(p["tables"], int(p["offset"]), layout, routing=p["routing"],
                     keyed=tuple(tuple(x) for x in p.get("keyed", ShardInto.keyed)))
    if _empty(plpy, req):
        return json.dumps(reply)
    hierarchies = {a: _hierarchy(h, a) for a, h in p["hierarchies"].items()}
    for sa, table in zip(req.sensitive, tables):
        if table.hierarchy is not None:
            hierarchies[sa.name] = table.hierarchy
    encodings = scan.encodings(plpy, hierarchies)
    for sa in req.sensitive:
        hierarchies.pop(sa.name, None)
    owns = [_in_table_codes(plpy, req, table, sa) for sa, table in zip(req.sensitive, tables)]
    for sa, own in zip(req.sensitive, owns):
        if sa.name not in encodings and own.text_codes() is not None:
            encodings[sa.name] = scan.encode(plpy, own.text_codes())
    domains = [t.domain() for t in tables]
    try:
        if owns[0].rows < req.k:
            raise ValueError("the shard has %d rows, fewer than k = %d" % (owns[0].rows, req.k))
        data = scan.read(plpy, req, encodings, owns if req.sas else owns[0])
        qis = scan.quasi_identifiers(req, data.data, hierarchies)
        if layout:      # only the relations' columns: one class of every row (no cut can keep k = n)
            result = anonymize(qis, data.sa_codes, domains[0], 1.0, owns[0].rows, method="mondrian", with_emds=False)
        else:
            result = _engine(req, qis, data, owns, tables, domains)
    except ValueError as e:
        piece = p.get("piece", "shard")
        raise E.invalid_parameter("%s %s of %s: %s" % (piece, p["shard"], p["source"], e), HINTS[piece])
    if layout or req.sas or req.method not in REFERENCE_METHODS:     # (one SA with ``reference``: measured so)
        _against_whole_table(result, data.codes_by_sa if req.sas else data.sa_codes[:, None], tables, domains,
                             several=bool(req.sas))
    # as the run on one node (batch/anonymize.py): work_mem for the output's joins and sorts (at
    # the default 4MB they spilled to disk: 2.2 s for a part of 250k rows); jit off: the relations
    # just written have no statistics, the planner's estimates run to billions of rows, and JIT
    # compiled the output's join for about a second
    with C.settings(plpy, work_mem="256MB", jit="off"):
        if layout:
            return json.dumps({"layout": _dry_layout(plpy, req, data, owns, result, hierarchies, into)})
        keys = publish.write_keys(plpy, req, None, data.keys, result, into)
        classes = publish.write_classes(plpy, req, None, result, data.data, keys, hierarchies, into)
        publish.write_output(plpy, req, None, classes, keys, owns if req.sas else owns[0],
                             data.codes_by_sa if req.sas else data.sa_codes, result, into)
        reply.update(_check(plpy, req, tables, {"": into.tables[""], "_keys": keys}))
    reply["il_sum"] = _il_sum(qis, result, p["ranges"], req.options.weights)
    return json.dumps(reply)


def budget(own_counts, table_counts, domain, t: float) -> float:
    """SABRE's t inside a piece whose SA counts ``own_counts`` (in the whole table's codes) lie
    at the exact EMD e from the table's: ``t - e`` rounded down.  A class within it of the
    piece's distribution is within t of the table's (EMD is a metric: the triangle inequality,
    the partitioned runs' argument, docs/scale-out.md).  ValueError when e >= t."""
    present = np.flatnonzero(own_counts)
    measured, real = against_table(np.zeros(len(present), dtype=np.int64), present,
                                   np.asarray(own_counts, dtype=np.int64)[present], table_counts, domain)
    e = float(measured.emd[real].max()) if real.any() else 0.0
    b = float(np.nextafter(t - e, 0.0))
    if b <= 0:
        raise ValueError("its SA distribution is at EMD %.6g from the whole table's, not below t = %g: no class "
                         "of its rows alone can be within t of the table" % (e, t))
    return min(1.0, b)


def _engine(req, qis, data, owns, tables, domains):
    """The piece's classes, every one within t of the **whole** table: 'refine' and 'mondrian'
    cut against the table's counts themselves (``reference``; several SAs: each SA's, the
    most constraining SA by SABRE's plans as the primary, as on one node); 'ak' and 'knn' (whose
    plans, takeOut and several-SA merges measure the rows they are given) run on the piece's
    own distribution with each SA's :func:`budget`."""
    lookahead = req.options.lookahead
    if req.method in REFERENCE_METHODS:
        first, plan = most_constraining_of([o.counts for o in owns], domains, req.thresholds, req.k, lookahead)
        codes = data.codes_by_sa if req.sas else data.sa_codes[:, None]
        others = [(codes[:, j], domains[j], req.thresholds[j], tables[j].counts)
                  for j in range(len(owns)) if j != first]
        return anonymize(qis, codes[:, first], domains[first], req.thresholds[first], req.k, method=req.method,
                         seed=req.options.seed, weights=req.options.weights, sa_plan=plan, search=req.options.search,
                         threads=req.options.threads, reference=tables[first].counts, other_sas=others)
    ts = [budget(o.counts, t.counts, d, u) for o, t, d, u in zip(owns, tables, domains, req.thresholds)]
    if not req.sas:
        plan = plan_from_counts(owns[0].counts, domains[0], ts[0], req.k, lookahead)
        return anonymize(qis, data.sa_codes, domains[0], ts[0], req.k, method=req.method, seed=req.options.seed,
                         takeout=req.options.takeout, weights=req.options.weights, sa_plan=plan,
                         search=req.options.search, threads=req.options.threads)
    base = most_constraining_of([o.counts for o in owns], domains, ts, req.k, lookahead)
    return anonymize_multi(qis, data.codes_by_sa, domains, ts, req.k, method=req.method, seed=req.options.seed,
                           takeout=req.options.takeout, weights=req.options.weights, strategy="auto", base=base,
                           search=req.options.search, threads=req.options.threads)


def _against_whole_table(result, codes, tables, domains, several: bool) -> None:
    """The classes' EMDs (``emds``; several SAs: ``emds_by_sa``) measured against the whole
    table's counts, as the classes relation publishes them (the engine's were against the
    piece's own distribution when it ran with a budget)."""
    n = np.bincount(result.ec, minlength=result.n_classes)
    by_sa = []
    for j, (table, domain) in enumerate(zip(tables, domains)):
        m = len(table.counts)
        key, count = np.unique(result.ec * m + codes[:, j], return_counts=True)
        measured, real = against_table(key // m, key % m, count, table.counts, domain)
        emd = np.zeros(result.n_classes)
        emd[measured.class_ids[real]] = measured.emd[real]
        by_sa.append(emd)
    if not np.array_equal(n, result.sizes):
        raise partition._changed()
    result.emds = by_sa[0]
    if several:
        result.emds_by_sa = np.column_stack(by_sa)


class _RollBack(Exception):
    """Leaves the subtransaction of :func:`_dry_layout`, rolling it back."""


def _dry_layout(plpy, req, data, owns, result, hierarchies, into) -> dict:
    """The columns of the relations the shard would write: created WITH NO DATA in a
    subtransaction that is then rolled back."""
    found = {}
    try:
        with plpy.subtransaction():
            keys = publish.write_keys(plpy, req, None, data.keys, result, into)
            classes = publish.write_classes(plpy, req, None, result, data.data, keys, hierarchies, into)
            publish.write_output(plpy, req, None, classes, keys, owns if req.sas else owns[0],
                                 data.codes_by_sa if req.sas else data.sa_codes, result, into)
            found.update(_layout(plpy, into.tables))
            raise _RollBack
    except _RollBack:
        pass
    return found


def _check(plpy, req, tables, built) -> dict:
    """The shard's part of the pre-swap check: its rows once each (keys, output and shard
    rows), and its classes' exact EMDs against the whole table's SA counts, on every SA."""
    partition.check_every_row_once(plpy, req, built)
    found = {"violations": 0, "max_emds": [], "sa_counts": []}
    for j, (sa, t, table) in enumerate(zip(req.sensitive, req.thresholds, tables)):
        ec, codes, n = partition._part_groups(plpy, replace(req, sa=sa), table, built[""])
        written = np.bincount(codes, weights=n, minlength=len(table.counts)).astype(np.int64)
        if (written > table.counts).any():
            raise partition._changed()
        measured, real = against_table(ec, codes, n, table.counts, table.domain())
        sizes = np.asarray(measured.sizes[real], dtype=np.int64)
        if j == 0:
            partition._check_classes_match_keys(partition._keys_per_class(plpy, built["_keys"]),
                                                measured.class_ids[real], sizes)
            first = (measured.class_ids[real], sizes)
            found.update({"rows": int(sizes.sum()), "classes": len(sizes), "min_class_size": int(sizes.min()),
                          "max_class_size": int(sizes.max()), "discernibility": metrics.discernibility(sizes)})
        elif not (np.array_equal(first[0], measured.class_ids[real]) and np.array_equal(first[1], sizes)):
            raise partition._keys_mismatch()
        found["violations"] += int(np.count_nonzero(measured.violating(t, req.k)[real]))
        found["max_emds"].append(float(measured.emd[real].max()))
        found["sa_counts"].append(written.tolist())
    found["max_emd"] = found["max_emds"][0]
    return found


def _il_sum(qis, result, ranges, weights) -> float:
    """The shard's classes' information loss times their sizes, numerical QIs normalized by the
    whole table's ranges (so the run's AIL is the rows' mean, as on one node)."""
    ils = []
    for qi, g in zip(qis, result.generalization):
        if qi.numerical:
            lo, hi = ranges[qi.name]
            ils.append(metrics.il_numerical(g, lo, hi))
        else:
            ils.append(metrics.il_categorical(g))
    return float((metrics.il_per_class(ils, weights) * result.sizes).sum())
