"""sabre_anonymize on a Citus distributed table, pushed down shard by shard (docs/scale-out.md,
"Citus (built)": the **shard-local** design).

On the coordinator (:func:`run`): the SA summary, the categorical QIs' values and the numerical
QIs' ranges are aggregates (Citus pushes them down; only groups reach the coordinator).  Then
each shard is anonymized **on the worker that holds it** by :func:`shard_run` (the SQL function
``sabre_citus_shard_impl``), called in a *router query* of the run's own transaction::

    SELECT sabre.sabre_citus_shard_impl('<request>'::jsonb) AS r, pg_catalog.count(*)
    FROM <source> AS s WHERE s.<distribution column> OPERATOR(pg_catalog.=) <a value of that shard>

Citus sends the whole query to the shard's worker, over the connection of the coordinator's
distributed transaction (the one that created the output's shards there), so the worker sees
the uncommitted output tables and its writes commit or roll back with the run: Citus's
two-phase commit covers that connection (a worker transaction that touched a temporary table
cannot PREPARE: measured, so nothing here is temporary).  The function reads that shard's rows
locally through the request's read expression, runs the engine with every class measured
against the **whole table's** SA counts (``reference``), writes the shard's output, side table
and classes into the colocated shards of the run's relations, checks them exactly against the
whole table, and returns aggregates only: rows, classes, sizes, EMDs, violations, its SA
counts.  The coordinator sums them; anything off and nothing is published.

The first shard writes into owner-only staging tables on its worker: their columns are the
layout the coordinator then creates the distributed relations with (colocated with the
source); :func:`flush_run` moves those rows into their shards.  Class ids are unique across
shards: each shard's start after the classes of the shards before it.

Applies when the source is hash-distributed, with one SA, method 'refine' or 'mondrian', the
distribution column published (``options.keep``) and used as the key, and no
``options.partitions`` (hierarchies travel to the workers in the request: the workers' catalogs
need not hold them); otherwise the run goes through the coordinator (a NOTICE says why).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from sabre_pg.core import stopwatch
from sabre_pg.core.hierarchy import Hierarchy
from sabre_pg.core import metrics
from sabre_pg.core.mondrian import against_table
from sabre_pg.core.sabre import anonymize, plan_from_counts
from sabre_pg.core.stopwatch import Stopwatch

from ..shared import citus
from ..shared import common as C
from ..shared import errors as E
from ..stages import publish, request, scan
from . import partition

METHODS = ("refine", "mondrian")
ROUTING_TYPES = {"int2": "pg_catalog.int2", "int4": "pg_catalog.int4", "int8": "pg_catalog.int8",
                 "text": "pg_catalog.text", "varchar": "pg_catalog.varchar"}
ROUTING_CANDIDATES = 64           # candidate values per shard searched for one that hashes into it
TAGS = (("", "o"), ("_classes", "c"), ("_keys", "k"))    # the run's relations' temporary tags
SHARD_KEY = "shard_key"           # <output>_classes' distribution column: a value of the shard's
SHARD_HINT = ("Distribute the source into fewer shards (create_distributed_table(..., shard_count => n)), "
              "or raise t or lower k; or anonymize a local copy of the table.")


# ---------------------------------------------------------------------------- coordinator
def pushdown_column(plpy, req) -> str | None:
    """The source's distribution column when the run can be pushed down to the shards; None for
    a source that is not hash-distributed, or (with a NOTICE saying why) a call that needs the
    coordinator path."""
    column = citus.distribution_column(plpy, req.source["oid"])
    if column is None:
        return None
    why = []
    if req.sas:
        why.append("several sensitive attributes")
    if req.method not in METHODS:
        why.append("method '%s' (push-down runs 'refine' or 'mondrian')" % req.method)
    if column not in req.options.keep:
        why.append('the distribution column "%s" is not published (options.keep)' % column)
    elif req.key.name != column:
        why.append('the key "%s" is not the distribution column "%s"' % (req.key.name, column))
    if partition.partitions_option(req) is not None:
        why.append("options.partitions")
    if req.columns[column]["typname"] not in ROUTING_TYPES:
        why.append('the distribution column\'s type %s' % req.columns[column]["type"])
    if why:
        plpy.notice("sabre: %s is distributed, but this run reads it through the coordinator: %s"
                    % (req.source["qname"], "; ".join(why)),
                    hint='Pass options => \'{"keep": ["%s"]}\' with method \'refine\' (the default) and one '
                         'sensitive attribute to anonymize each shard on its worker.' % column.replace('"', '\\"'))
        return None
    return column


@dataclass(frozen=True)
class Shard:
    shardid: int
    name: str                 # qualified shard relation on its worker
    routing: str              # SQL literal of a distribution value that hashes into the shard
    node: str


_SHARDS_SQL = """
SELECT s.shardid, pg_catalog.shard_name(s.logicalrelid, s.shardid) AS name,
       n.nodename OPERATOR(pg_catalog.||) ':' OPERATOR(pg_catalog.||) n.nodeport AS node
FROM pg_catalog.pg_dist_shard s
JOIN pg_catalog.pg_dist_placement p ON p.shardid OPERATOR(pg_catalog.=) s.shardid
JOIN pg_catalog.pg_dist_node n ON n.groupid OPERATOR(pg_catalog.=) p.groupid AND n.noderole OPERATOR(pg_catalog.=) 'primary'
WHERE s.logicalrelid OPERATOR(pg_catalog.=) $1::pg_catalog.regclass
ORDER BY s.shardminvalue::pg_catalog.int4"""


def shard_rows(plpy, relation: str, schema: str) -> list:
    """(shard id, qualified shard relation, node) of a distributed relation, in hash order
    (colocated relations: the same order, shard for shard)."""
    out = []
    for r in plpy.execute(C.prepared(plpy, _SHARDS_SQL, ["text"]), [relation]):
        local = plpy.execute(C.prepared(plpy, "SELECT (pg_catalog.parse_ident($1))[pg_catalog.array_length("
                                        "pg_catalog.parse_ident($1), 1)] AS n", ["text"]), [r["name"]])[0]["n"]
        out.append((r["shardid"], C.qname(None, schema, local), r["node"]))
    return out


def shards(plpy, req, column) -> list:
    """The source's shards in hash order, each with a distribution value that routes to it."""
    rows = shard_rows(plpy, req.source["qname"], req.source["nspname"])
    typ = ROUTING_TYPES[req.columns[column]["typname"]]
    routing = {r["shard"]: r["v"] for r in plpy.execute(plpy.prepare(
        "SELECT DISTINCT ON (x.shard) x.shard, x.v::pg_catalog.text AS v FROM (SELECT "
        "pg_catalog.get_shard_id_for_distribution_column($1::pg_catalog.oid::pg_catalog.regclass, g::%s) AS shard, "
        "g::%s AS v, g FROM pg_catalog.generate_series(0, $2) AS g) AS x ORDER BY x.shard, x.g" % (typ, typ),
        ["oid", "int8"]), [req.source["oid"], ROUTING_CANDIDATES * max(len(rows), 1)])}
    out = []
    for shardid, name, node in rows:
        if shardid not in routing:
            raise E.SabreError(E.INTERNAL, "no value of %s routes to shard %d" % (column, shardid),
                               "Report this: sabre searched %d values." % (ROUTING_CANDIDATES * len(rows)))
        out.append(Shard(shardid, name, "%s::%s" % (plpy.quote_literal(routing[shardid]), typ), node))
    return out


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


def _call(plpy, req, column, shard: Shard, function: str, payload: dict) -> dict:
    """``function`` (sabre's, on the worker) called once in a router query on ``shard``; it runs
    there as the caller, who needs USAGE on sabre's schema on that node too."""
    try:
        row = plpy.execute(plpy.prepare(
            "SELECT %s($1::jsonb) AS r, pg_catalog.count(*) AS n FROM %s AS s WHERE s.%s OPERATOR(pg_catalog.=) %s"
            % (C.catalog(function), req.source["qname"], C.ident(column), shard.routing), ["text"]),
            [json.dumps(payload)])[0]
    except plpy.SPIError as e:
        if getattr(e, "sqlstate", None) != E.INSUFFICIENT_PRIVILEGE:
            raise
        raise E.insufficient_privilege(
            "on the Citus worker %s that holds shard %s: %s" % (shard.node, shard.name, str(e).splitlines()[0]),
            "sabre runs each shard on its worker as you: the DBA grants there what the coordinator grants, e.g. "
            "SELECT run_command_on_workers($$GRANT USAGE ON SCHEMA %s TO %s$$) (sabre's schema is each "
            "node's own, so its grants are not propagated)." % (
                plpy.quote_ident(C.SCHEMA), plpy.execute("SELECT pg_catalog.quote_ident(CURRENT_USER::pg_catalog.text) AS u"
                                                )[0]["u"])) from e
    return json.loads(row["r"])


def _create(plpy, req, built: dict, layout: dict, column: str):
    """The run's relations, empty, with the first shard's columns, distributed colocated with the
    source: the output by the distribution column, the side table by its key, the classes by
    their shard's distribution value."""
    for suffix, by in (("", column), ("_classes", SHARD_KEY), ("_keys", "key")):
        plpy.execute("CREATE %sTABLE %s (%s)" % ("UNLOGGED " if suffix == "_keys" else "", built[suffix], ", ".join(
            "%s %s" % (C.ident(n), t) for n, t in layout[suffix])))
        with C.quietly(plpy):
            plpy.execute(C.prepared(plpy, "SELECT pg_catalog.create_distributed_table($1::pg_catalog.regclass, $2, "
                                    "colocate_with => $3)", ["text", "text", "text"]),
                         [built[suffix], by, req.source["qname"]])
    publish.owner_only(plpy, built["_keys"])


def run(plpy, req, clock: Stopwatch, column: str, hierarchies: dict, summary):
    """The pushed-down run (module doc); ``summary``: the whole table's SA summary."""
    stopwatch.plan(("validate", "summary", "partition", "check", "swap"))
    with clock.phase("summary"):
        ranges = _ranges(plpy, req)
        parts = shards(plpy, req, column)
    run_ = publish.begin(plpy, req)
    prev = publish.previous(plpy, req)
    built = partition._built(req, run_)
    base = {"source": req.source["qname"], "qis": [a.name for a in req.qis], "sensitive": req.sa.name,
            "t": req.t, "k": req.k, "method": req.method, "options": dict(req.options.given, key=column),
            "output": req.output.qualified(), "summary": _summary_json(summary), "ranges": ranges,
            "hierarchies": {a: _hierarchy_json(h) for a, h in hierarchies.items() if a != req.sa.name}}
    replies, offset, targets = [], 0, None
    with clock.phase("partition"):      # the shards, on their workers
        for j, shard in enumerate(parts):
            staged = {s: req.output.temporary_qualified(run_.run_id, "s" + tag) for s, tag in TAGS}
            reply = _call(plpy, req, column, shard, "sabre_citus_shard_impl",
                          dict(base, shard=shard.name, offset=offset, routing=shard.routing, stage=j == 0,
                               tables=staged if j == 0 else {s: targets[s][j] for s in built}))
            if j == 0:
                _create(plpy, req, built, reply["layout"], column)
                targets = {s: [name for _, name, _ in shard_rows(plpy, built[s], req.output.schema)]
                           for s in built}
                _call(plpy, req, column, shard, "sabre_citus_flush_impl",
                      {"from": staged, "into": {s: targets[s][0] for s in built}})
            reply["node"] = shard.node
            replies.append(reply)
            offset += reply["classes"]
    with clock.phase("check"):
        facts = _summed(req, summary, replies)
        plpy.execute("ALTER TABLE %s ADD CONSTRAINT %s PRIMARY KEY (%s, ec_id)" % (
            built["_classes"], C.ident(req.output.temporary(run_.run_id, "c_pkey")), C.ident(SHARD_KEY)))
    with clock.phase("swap"):
        publish.swap(plpy, req, run_, prev, built)
        publish.comment(plpy, req, run_)
    facts.update({"quasi_identifiers": [a.name for a in req.qis], "sensitive": req.sa.name, "t": req.t, "k": req.k,
                  "method": req.method, "options": req.options.given, "buckets": None, "u": None,
                  "sensitive_attributes": [req.sa.name], "t_values": [req.t], "max_emds": [facts["max_emd"]],
                  "partitions": {"parts": len(parts), "automatic": False, "citus": "shard-local",
                                 "reply_bytes": sum(len(json.dumps(r)) for r in replies),
                                 "workers": len({r["node"] for r in replies})},
                  "phases": clock.report(), "seconds": clock.total()})
    output_oid = publish.record(plpy, req, run_, facts, hierarchies)
    return [(run_.run_id, output_oid, facts["rows"], facts["classes"], facts["min_class_size"], facts["max_emd"],
             facts["ail"], facts["seconds"])]


def _summed(req, summary, replies) -> dict:
    """The workers' checks summed: every source row once (each shard's own check) and the SA
    counts of the rows written the whole table's; every class >= k and within t of the whole
    table, by the exact EMD each worker computed against the whole table's counts."""
    counts = np.sum([r["sa_counts"] for r in replies], axis=0)
    rows = sum(r["rows"] for r in replies)
    if rows != summary.rows or not np.array_equal(counts, summary.counts):
        raise E.source_changed("the shards' outputs do not hold the source's rows (%d rows written, %d in the "
                               "SA summary)" % (rows, summary.rows),
                               "Run again; inside REPEATABLE READ if the source is being written.")
    bad = [r for r in replies if r["violations"]]
    if bad:
        worst = max(bad, key=lambda r: r["max_emd"])
        raise E.invalid_parameter(
            "%d class(es) of %d shard(s) violate t = %g or k = %d against the whole table (max EMD %.6g, "
            "smallest class %d, shard on %s): a shard's rows alone cannot be split within t of the table"
            % (sum(r["violations"] for r in bad), len(bad), req.t, req.k, worst["max_emd"],
               min(r["min_class_size"] for r in bad), worst["node"]), SHARD_HINT)
    full = [r for r in replies if r["rows"]]
    return {"rows": rows, "classes": sum(r["classes"] for r in replies),
            "min_class_size": min(r["min_class_size"] for r in full),
            "max_class_size": max(r["max_class_size"] for r in full),
            "max_emd": max(r["max_emd"] for r in full), "ail": sum(r["il_sum"] for r in full) / rows,
            "discernibility": sum(r["discernibility"] for r in full)}


# ---------------------------------------------------------------------------- worker
@dataclass(frozen=True)
class ShardInto(publish.Into):
    """:class:`publish.Into` of one shard: its classes also carry the shard's distribution value
    (the classes' distribution column, so they stay on the shard's worker)."""
    routing: str = "NULL"

    def write(self, suffix: str, select: str, unlogged: bool = False) -> str:
        if suffix == "_classes":
            select = "SELECT c.*, %s AS %s FROM (%s) AS c" % (self.routing, SHARD_KEY, select)
        return super().write(suffix, select, unlogged)


def _global_summary(g: dict, sa_name: str):
    distinct = None if g["distinct"] is None else np.asarray(g["distinct"], dtype=np.dtype(g["dtype"]))
    hierarchy = None if g["hierarchy"] is None else _hierarchy(g["hierarchy"], sa_name)
    return scan.SASummary(int(g["rows"]), np.asarray(g["counts"], dtype=np.int64), distinct, hierarchy, g["ranks"])


def _in_table_codes(plpy, req, table):
    """The shard's SA summary with the whole table's codes (its values, leaves or ranks)."""
    own = scan.sa_summary(plpy, req, table.hierarchy)
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
def shard_run(plpy, payload):
    """One shard on its worker (module doc): anonymized against the whole table, written into
    ``tables``, checked; returns the aggregates of the check (and, staged, the layout)."""
    p = json.loads(payload)
    shard = C.resolve_relation(plpy, p["shard"])
    req = request.build(plpy, shard["oid"], p["shard"], p["qis"], p["sensitive"], p["t"], p["k"], p["method"],
                        p["output"], json.dumps(p["options"]))
    table = _global_summary(p["summary"], req.sa.name)
    reply = {"rows": 0, "classes": 0, "violations": 0, "sa_counts": [0] * len(table.counts)}
    into = ShardInto(p["tables"], int(p["offset"]), bool(p["stage"]), p["routing"])
    if _empty(plpy, req):
        if p["stage"]:
            raise E.invalid_parameter("the first shard of %s is empty" % p["source"], SHARD_HINT)
        return json.dumps(reply)
    hierarchies = {a: _hierarchy(h, a) for a, h in p["hierarchies"].items()}
    if table.hierarchy is not None:
        hierarchies[req.sa.name] = table.hierarchy
    encodings = scan.encodings(plpy, hierarchies)
    hierarchies.pop(req.sa.name, None)
    own = _in_table_codes(plpy, req, table)
    if req.sa.name not in encodings and own.text_codes() is not None:
        encodings[req.sa.name] = scan.encode(plpy, own.text_codes())
    domain = table.domain()
    try:
        if own.rows < req.k:
            raise ValueError("the shard has %d rows, fewer than k = %d" % (own.rows, req.k))
        plan = plan_from_counts(own.counts, domain, req.t, req.k, req.options.lookahead)
        data = scan.read(plpy, req, encodings, own)
        qis = scan.quasi_identifiers(req, data.data, hierarchies)
        result = anonymize(qis, data.sa_codes, domain, req.t, req.k, method=req.method, seed=req.options.seed,
                           weights=req.options.weights, sa_plan=plan, search=req.options.search,
                           threads=req.options.threads, reference=table.counts)
    except ValueError as e:
        raise E.invalid_parameter("shard %s of %s: %s" % (p["shard"], p["source"], e), SHARD_HINT)
    keys = publish.write_keys(plpy, req, None, data.keys, result, into)
    classes = publish.write_classes(plpy, req, None, result, data.data, keys, hierarchies, into)
    out = publish.write_output(plpy, req, None, classes, keys, own, data.sa_codes, result, into)
    reply.update(_check(plpy, req, table, {"": out, "_keys": keys}))
    reply["il_sum"] = _il_sum(qis, result, p["ranges"], req.options.weights)
    if p["stage"]:
        reply["layout"] = _layout(plpy, p["tables"])
        for t in p["tables"].values():
            publish.owner_only(plpy, t)
    return json.dumps(reply)


def _check(plpy, req, table, built) -> dict:
    """The shard's part of the pre-swap check: its rows once each (keys, output and shard
    rows), and its classes' exact EMDs against the whole table's SA counts."""
    partition.check_every_row_once(plpy, req, built)
    ec, codes, n = partition._part_groups(plpy, req, table, built[""])
    written = np.bincount(codes, weights=n, minlength=len(table.counts)).astype(np.int64)
    if (written > table.counts).any():
        raise partition._changed()
    measured, real = against_table(ec, codes, n, table.counts, table.domain())
    sizes = np.asarray(measured.sizes[real], dtype=np.int64)
    partition._check_classes_match_keys(partition._keys_per_class(plpy, built["_keys"]), measured.class_ids[real],
                                        sizes)
    return {"rows": int(sizes.sum()), "classes": len(sizes),
            "violations": int(np.count_nonzero(measured.violating(req.t, req.k)[real])),
            "min_class_size": int(sizes.min()), "max_class_size": int(sizes.max()),
            "max_emd": float(measured.emd[real].max()), "discernibility": metrics.discernibility(sizes),
            "sa_counts": written.tolist()}


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


@E.entry_point
def flush_run(plpy, payload):
    """The first shard's staged rows into their shards of the run's relations; staging dropped."""
    p = json.loads(payload)
    for suffix, staged in p["from"].items():
        plpy.execute("INSERT INTO %s SELECT * FROM %s" % (p["into"][suffix], staged))
        plpy.execute("DROP TABLE %s" % staged)
    return json.dumps({"flushed": True})
