"""The statistics of a Citus distributed table, combined from its shards' (for sabre_estimate).

On the coordinator a hash-distributed table is an empty shell: its ``pg_stats`` and
``reltuples`` describe no row (or the rows it held before it was distributed).  ``ANALYZE`` on
it is run by Citus on every shard, on the workers.  So the statistics are read there, by
``run_command_on_workers``, each worker listing its shards from the Citus metadata it holds (or,
when the workers do not list every shard, one shard at a time by ``run_command_on_shards``):
per shard its reltuples, its last ANALYZE and the pg_stats rows of the columns asked, as JSON
text; no row of the table is read.  They are combined
into one pg_stats-like row per column, rows weighted by each shard's ``reltuples``:

* ``reltuples``: the sum; ``null_frac``: the rows-weighted mean;
* most common values: the union of the shards' lists, a value's frequency the sum of its rows
  over the shards (a shard that does not list it adds nothing); a shard whose histogram bounds
  are all its other values (values seen once are no MCV) adds its other rows equally to them; when the union holds every
  distinct value the table is estimated to have, the shards' other rows are among them, and the
  frequencies are scaled up to the non-NULL share (no histogram then);
* histogram (numerical columns): the mixture of the shards' histograms, each bucket holding an
  equal share of its shard's non-MCV rows and spread linearly inside it, cut again into as
  many equal-mass buckets as the largest shard histogram has (bounds rounded for integers);
* ``n_distinct``: where most rows sit in shards whose ``n_distinct`` grows with the rows
  (negative), the rows-weighted mean of those fractions; else the largest of the shards'
  counts and the number of distinct most common values;
* the rows ANALYZE sampled: the sum over the shards of min(shard rows, 300 x target), given as
  the statistics target that samples as many (whole shards make a whole table).

Hash distribution spreads the rows of every value over all shards, so the shards' statistics
are samples of one distribution; the combination is an estimate of the table's, not exact.
"""
from __future__ import annotations

import json
import math

import numpy as np

from ..shared import common as C
from ..shared import errors as E

ROWS_PER_TARGET = 300

_SHARD_JSON = (
    "pg_catalog.json_build_object('shardid', {shardid}, 'reltuples', c.reltuples, 'analyzed', "
    "GREATEST(pg_catalog.pg_stat_get_last_analyze_time(c.oid), pg_catalog.pg_stat_get_last_autoanalyze_time(c.oid))::pg_catalog.text, "
    "'stats', (SELECT pg_catalog.json_agg(pg_catalog.json_build_object('name', s.attname, 'null_frac', s.null_frac, "
    "'n_distinct', s.n_distinct, 'mcv', s.most_common_vals::pg_catalog.text, 'freqs', s.most_common_freqs, "
    "'histogram', s.histogram_bounds::pg_catalog.text, 'target', (SELECT CASE WHEN a.attstattarget IS NULL "
    "OR a.attstattarget OPERATOR(pg_catalog.<) 0 THEN pg_catalog.current_setting('default_statistics_target')"
    "::pg_catalog.int4 ELSE a.attstattarget END FROM pg_catalog.pg_attribute AS a WHERE a.attrelid "
    "OPERATOR(pg_catalog.=) c.oid AND a.attname OPERATOR(pg_catalog.=) s.attname))) "
    "FROM pg_catalog.pg_stats AS s WHERE s.schemaname OPERATOR(pg_catalog.=) n.nspname "
    "AND s.tablename OPERATOR(pg_catalog.=) c.relname AND s.attname OPERATOR(pg_catalog.=) ANY (ARRAY[{names}]"
    "::pg_catalog.name[])))")
_NAMESPACE_JOIN = "JOIN pg_catalog.pg_namespace AS n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace "
# one shard, by run_command_on_shards (%s: the shard's name)
_SHARD_SQL = ("SELECT " + _SHARD_JSON + "::pg_catalog.text FROM pg_catalog.pg_class AS c " + _NAMESPACE_JOIN
              + "WHERE c.oid OPERATOR(pg_catalog.=) '%s'::pg_catalog.regclass")
# every shard placed on a worker, by run_command_on_workers (one connection per worker, not per
# shard: about 0.1 s instead of 1.1 s for 32 shards); needs the Citus metadata on the workers
_WORKER_SQL = (
    "SELECT pg_catalog.json_agg(" + _SHARD_JSON + ")::pg_catalog.text FROM pg_catalog.pg_dist_shard AS ds "
    "JOIN pg_catalog.pg_dist_placement AS p ON p.shardid OPERATOR(pg_catalog.=) ds.shardid "
    "JOIN pg_catalog.pg_class AS c ON c.oid OPERATOR(pg_catalog.=) "
    "pg_catalog.to_regclass(pg_catalog.shard_name(ds.logicalrelid, ds.shardid)) " + _NAMESPACE_JOIN
    + "WHERE ds.logicalrelid OPERATOR(pg_catalog.=) {table}::pg_catalog.regclass "
    "AND p.groupid OPERATOR(pg_catalog.=) (SELECT l.groupid FROM pg_catalog.pg_dist_local_group AS l)")


def _on_shards(plpy, src, command: str, what: str) -> list:
    """``run_command_on_shards`` (``%s``: the shard), one result text per shard; a shard that
    fails (a worker down) raises 08006 naming it."""
    results = plpy.execute(plpy.prepare(
        "SELECT r.shardid, r.success, r.result FROM pg_catalog.run_command_on_shards($1::pg_catalog.regclass, $2) AS r "
        "ORDER BY r.shardid", ["oid", "text"]), [src["oid"], command])
    failed = [r for r in results if not r["success"]]
    if failed:
        raise E.connection_failure(
            "could not %s shard %s of %s: %s" % (what, failed[0]["shardid"], src["qname"], failed[0]["result"]),
            "sabre_estimate reads the statistics of a distributed table on the workers: every worker must be up.")
    return [r["result"] for r in results]


def analyze(plpy, src, attrs):
    """ANALYZE every shard (the columns ``attrs``) on its worker, each in its own transaction there:
    an ANALYZE of the distributed table inside the estimate's transaction would leave the shards'
    new statistics invisible to the connections that read them."""
    columns = ", ".join(C.ident(a.name).replace("%", "%%") for a in attrs)
    _on_shards(plpy, src, "ANALYZE %%s (%s)" % columns, "ANALYZE")


def read(plpy, src, attrs, decode) -> tuple:
    """(relation row {reltuples, analyzed}, {attribute name: combined row} for the attributes
    that have statistics on every shard with rows), as read_statistics reads them from
    pg_stats, values already decoded by ``decode(plpy, attr, text)``."""
    shards = _by_workers(plpy, src, attrs)
    if shards is None:
        names = ", ".join(plpy.quote_literal(a.name).replace("%", "%%") for a in attrs)
        shards = [json.loads(r) for r in _on_shards(plpy, src, _SHARD_SQL.format(
            shardid="NULL", names=names), "read the statistics of") if r]
    rows = np.array([max(float(s["reltuples"]), 0.0) for s in shards])
    unknown = any(float(s["reltuples"]) < 0 for s in shards)
    analyzed = max((s["analyzed"] for s in shards if s["analyzed"]), default=None)
    rel = {"reltuples": -1.0 if unknown or not shards else float(rows.sum()), "analyzed": analyzed}
    combined = {}
    for a in attrs:
        per_shard = []
        for s, r in zip(shards, rows):
            row = next((x for x in (s["stats"] or ()) if x["name"] == a.name), None)
            if row is None and r > 0:
                break
            if row is not None and r > 0:
                per_shard.append((r, row))
        else:
            if per_shard:
                combined[a.name] = _combine(plpy, a, per_shard, decode)
    return rel, combined


def _by_workers(plpy, src, attrs) -> list | None:
    """Every shard's statistics, read on each worker for all its shards at once; None when the
    workers do not list every shard of the table (no metadata there): then shard by shard."""
    names = ", ".join(plpy.quote_literal(a.name) for a in attrs)
    results = plpy.execute(plpy.prepare(
        "SELECT r.nodename, r.nodeport, r.success, r.result FROM pg_catalog.run_command_on_workers($1) AS r "
        "ORDER BY r.nodename, r.nodeport", ["text"]), [_WORKER_SQL.format(
            shardid="ds.shardid", names=names, table=plpy.quote_literal(src["qname"]))])
    failed = [r for r in results if not r["success"]]
    if failed:
        raise E.connection_failure(
            "could not read the statistics of %s on worker %s:%s: %s" % (
                src["qname"], failed[0]["nodename"], failed[0]["nodeport"], failed[0]["result"]),
            "sabre_estimate reads the statistics of a distributed table on the workers: every worker must be up.")
    shards = {}
    for r in results:
        for shard in json.loads(r["result"]) if r["result"] else ():
            shards.setdefault(shard["shardid"], shard)      # one placement per shard
    expected = {int(r["shardid"]) for r in plpy.execute(plpy.prepare(
        "SELECT s.shardid FROM pg_catalog.pg_dist_shard AS s WHERE s.logicalrelid OPERATOR(pg_catalog.=) $1",
        ["oid"]), [src["oid"]])}
    if set(shards) != expected:
        return None
    return [shards[k] for k in sorted(shards)]


def _combine(plpy, attr, per_shard, decode) -> dict:
    rows = np.array([r for r, _ in per_shard])
    total = float(rows.sum())
    mass, hist = {}, []
    for r, row in per_shard:
        for v, f in zip(decode(plpy, attr, row["mcv"]), row["freqs"] or ()):
            mass[v] = mass.get(v, 0.0) + r * float(f)
        bounds = decode(plpy, attr, row["histogram"])
        rest = max(1.0 - float(row["null_frac"]) - float(sum(row["freqs"] or ())), 0.0)
        seen = list(dict.fromkeys(bounds))
        others = _distinct(float(row["n_distinct"]), r) - len(row["freqs"] or ())
        if seen and others <= len(seen):     # the bounds are all the shard's other values (e.g. seen once)
            for v in seen:
                mass[v] = mass.get(v, 0.0) + r * rest / len(seen)
        elif attr.numerical and len(bounds) >= 2:
            hist.append((np.asarray(bounds, dtype=np.float64), r * rest))
    values = sorted(mass) if attr.numerical else sorted(mass, key=lambda v: -mass[v])
    null_frac = float(sum(r * float(row["null_frac"]) for r, row in per_shard)) / total
    n_distinct = _n_distinct(per_shard, len(mass))
    freqs = np.array([mass[v] / total for v in values])
    complete = 0 <= n_distinct <= len(values)
    if complete and freqs.sum() > 0:   # every value is a common one somewhere: the shards' other rows are among them
        freqs *= (1.0 - null_frac) / freqs.sum()
    return {
        "name": attr.name, "null_frac": null_frac, "n_distinct": n_distinct,
        "mcv": values, "freqs": [float(f) for f in freqs],
        "histogram": _histogram(hist, attr.typname in C.INTEGER_TYPES) if hist and not complete else [],
        "target": int(math.ceil(sum(min(r, ROWS_PER_TARGET * int(row["target"] or 0)) for r, row in per_shard)
                                / ROWS_PER_TARGET)),
    }


def _n_distinct(per_shard, mcvs: int) -> float:
    rows = np.array([r for r, _ in per_shard])
    nd = np.array([float(row["n_distinct"]) for _, row in per_shard])
    growing = nd < 0
    if rows[growing].sum() > rows[~growing].sum():
        return float((rows[growing] * nd[growing]).sum() / rows[growing].sum())
    return float(max(max(_distinct(n, r) for n, r in zip(nd, rows)), mcvs))


def _distinct(n_distinct: float, rows: float) -> float:
    """A pg_stats n_distinct as a count (negative: minus a fraction of the rows)."""
    return -n_distinct * rows if n_distinct < 0 else n_distinct


def _histogram(hist, integer: bool) -> list:
    """Equal-mass bounds of the mixture of the shards' histograms (see the module docstring)."""
    points = np.unique(np.concatenate([b for b, _ in hist]))
    cdf = np.zeros(len(points))
    for b, weight in hist:
        cdf += weight * np.interp(points, b, np.linspace(0.0, 1.0, len(b)), left=0.0, right=1.0)
    buckets = max(len(b) for b, _ in hist) - 1
    if cdf[-1] <= 0:
        return []
    bounds = np.interp(np.linspace(0.0, cdf[-1], buckets + 1), cdf, points)
    bounds[0], bounds[-1] = points[0], points[-1]
    if integer:
        bounds = np.round(bounds)
    return [float(x) for x in np.unique(bounds)] if len(np.unique(bounds)) >= 2 else []
