"""sabre_anonymize on a Citus distributed table, the **QI-local** design (docs/scale-out.md,
"Citus (built)"): the rows repartitioned once by the QI-locality split, each part anonymized
on the worker that holds it.

1. **split** (coordinator, aggregates only): ``citus_split.split``, per cut a span, a histogram
   of each numerical QI and the SA counts of a few candidate cuts, pushed down to the shards
   (only groups reach the coordinator: a few hundred kB whatever the table's size), into parts
   that are QI predicates: one part per worker by default, more
   while a part has more rows than ``options.auto_partition_rows`` (a worker's memory bound);
   ``options.partitions`` asks for a number;
2. **repartition** (worker to worker): a staging table of the source's rows and a part column,
   distributed by that column in **one shard per part** (each part's value is chosen to hash
   to its own shard; Citus places the shards round-robin over the workers), filled by one
   ``INSERT INTO staging SELECT <CASE over the cuts> AS part, s.* FROM source s``, which
   Citus runs with its *repartition* strategy (each source shard's rows are split by target
   shard on their worker and fetched by the target's worker, never through the coordinator);
3. **parts** (workers): ``sabre_citus_shard`` once per staging shard (a one-row driver table
   colocated with the staging table routes the calls, in one multi-shard statement), the
   shard-local machinery of ``citus_shards.shard_run``: the part's rows anonymized with every
   class measured against the **whole table's** SA counts (``reference``), written into the
   colocated shards of staged relations (each row carries its part's value), checked exactly
   on the worker; only aggregates return, summed on the coordinator (``citus_shards._summed``);
4. **move** (worker to worker): the staged output and side table moved into the run's
   relations distributed by the source's distribution column, colocated with the source, by
   one repartitioned ``INSERT ... SELECT`` each (an output that does not publish that column,
   ``options.keep``, is distributed by ``ec_id`` instead, with a NOTICE); ``<output>_classes`` stays distributed by
   ``shard_key`` (its part's value), colocated with the staging table;
5. the staging and staged relations dropped; the classes' primary key, the swap and the run's
   catalog row as the shard-local run does.  Everything runs in the coordinator's distributed
   transaction (nothing temporary: a worker transaction that touched a temporary table cannot
   PREPARE), so an error anywhere leaves nothing behind and the old output intact.
"""
from __future__ import annotations

import secrets

import numpy as np

from sabre_pg.core import stopwatch
from sabre_pg.core.stopwatch import Stopwatch

from ..shared import common as C
from ..shared import errors as E
from ..stages import publish
from . import citus_shards as S
from . import citus_split, partition

NOT_COLOCATED = ("sabre: %s is distributed by ec_id, not colocated with the source: its distribution column "
                 "\"%s\" is not published")
NOT_COLOCATED_HINT = 'Pass options => \'{"keep": ["%s"]}\' to publish it and colocate the output with the source.'
PART_VALUES = 64          # candidate values per staging shard when looking for one that hashes to it
PART_TYPE = "pg_catalog.int4"
MIN_STAGING_SHARDS = 2    # a staging table of one shard made Citus pull the rows to the coordinator


def staging_shards(parts: int) -> int:
    """Shards of the staging table: one per part, at least :data:`MIN_STAGING_SHARDS` (the
    others stay empty).  Measured: with one part (no cut kept the sides close enough), the
    one-shard staging table's INSERT ... SELECT received 17.3 MB on the coordinator for an 11.7 MB
    table of 100,000 rows -- Citus pulled every row through it instead of repartitioning."""
    return max(parts, MIN_STAGING_SHARDS)


def part_count(plpy, req, rows: int) -> tuple:
    """(parts asked, max rows per part or None): ``options.partitions``, else one per active
    worker, a multiple of the workers when the parts would exceed options.auto_partition_rows
    (then cut further while a part has more rows)."""
    n = partition.partitions_option(req)
    if n is not None:
        return n, None
    workers = max(1, int(plpy.execute("SELECT pg_catalog.count(*) AS n FROM "
                                      "pg_catalog.citus_get_active_worker_nodes()")[0]["n"]))
    limit = req.options.auto_partition_rows
    if not limit:
        return workers, None
    return min(partition.MAX_PARTS, workers * -(-rows // (workers * limit))), limit


def _staging(plpy, req, run_, n: int) -> tuple:
    """(staging table, its part column): the source's columns in their safe types and the part
    column, distributed by it in :func:`staging_shards` of ``n`` parts (its own colocation),
    owner-only."""
    table = req.output.temporary_qualified(run_.run_id, "s")
    col = "sabre_part_%s" % secrets.token_hex(partition.TAG_BYTES)
    plpy.execute("CREATE TABLE %s (%s %s NOT NULL, %s)" % (
        table, C.ident(col), PART_TYPE, ", ".join("%s %s%s" % (C.ident(name), c["type"], " NOT NULL" if c["notnull"]
                                                               else "")
                                                  for name, c in req.columns.items() if not c["unsafe"])))
    with C.quietly(plpy):
        plpy.execute(C.prepared(plpy, "SELECT pg_catalog.create_distributed_table($1::pg_catalog.regclass, $2, "
                                "shard_count => $3, colocate_with => 'none')", ["text", "text", "int4"]),
                     [table, col, staging_shards(n)])
    publish.owner_only(plpy, table)
    return table, col


def _part_shards(plpy, req, table: str, parts: list) -> list:
    """One :class:`citus_shards.Shard` per part: the staging table's shards in hash order (so
    round-robin over the workers), each with a part value that hashes to it."""
    n = len(parts)
    found = {}
    for r in plpy.execute(C.prepared(plpy, (
            "SELECT pg_catalog.get_shard_id_for_distribution_column($1::pg_catalog.regclass, g.v) AS shard, "
            "pg_catalog.min(g.v) AS v FROM pg_catalog.generate_series(0, $2) AS g(v) GROUP BY 1"),
            ["text", "int4"]), [table, PART_VALUES * staging_shards(n)]):
        found[r["shard"]] = int(r["v"])
    shards = S.shard_rows(plpy, table, req.output.schema)
    if len(shards) != staging_shards(n) or any(i not in found for i, _, _ in shards[:n]):
        raise E.not_in_prerequisite_state(
            "the QI-local run's staging table has %d shard placements for %d parts (one shard each was "
            "expected)" % (len(shards), n),
            "Set citus.shard_replication_factor to 1 for the run, or pass options => "
            "'{\"citus_design\": \"shard_local\"}'.")
    return [S.Shard(i, name, "%d::%s" % (found[i], PART_TYPE), node, p.rows, str(found[i]))
            for (i, name, node), p in zip(shards, parts)]


def _stage(plpy, req, staging: str, parts: list, shards: list, rows: int) -> None:
    """Every source row into the staging table with its part's value: one INSERT ... SELECT
    that Citus repartitions worker to worker (module doc, 2.)."""
    case = partition.part_case([(p.conds, int(s.value)) for p, s in zip(parts, shards)])
    with C.settings(plpy, jit="off"):
        done = plpy.execute("INSERT INTO %s SELECT x.* FROM (SELECT (%s)::%s AS p, s.* FROM %s AS s%s) AS x "
                            "WHERE x.p IS NOT NULL" % (staging, case, PART_TYPE, req.source["read"],
                                                       req.row_filter()))
    if done.nrows() != rows:
        raise partition._changed()


def _driver(plpy, req, run_, staging: str, col: str, shards: list) -> str:
    """A table of one row per part (its value), colocated with the staging table: the calls
    of the parts are a multi-shard SELECT over it, one row (one call) per part."""
    table = req.output.temporary_qualified(run_.run_id, "d")
    plpy.execute("CREATE TABLE %s (%s %s NOT NULL)" % (table, C.ident(col), PART_TYPE))
    with C.quietly(plpy):
        plpy.execute(C.prepared(plpy, "SELECT pg_catalog.create_distributed_table($1::pg_catalog.regclass, $2, "
                                "colocate_with => $3)", ["text", "text", "text"]), [table, col, staging])
    plpy.execute("INSERT INTO %s VALUES %s" % (table, ", ".join("(%s)" % s.routing for s in shards)))
    return table


def _move(plpy, staged: dict, built: dict, layout: dict, col: str, rows: int) -> None:
    """The staged output and side table into the run's relations colocated with the source:
    one repartitioned INSERT ... SELECT each (module doc, 4.); the staged ones dropped."""
    for suffix in ("", "_keys"):
        names = [C.ident(n) for n, _ in layout[suffix] if n != col]
        done = plpy.execute("INSERT INTO %s (%s) SELECT %s FROM %s AS o" % (
            built[suffix], ", ".join(names), ", ".join("o." + n for n in names), staged[suffix]))
        if done.nrows() != rows:
            raise partition._changed()
        plpy.execute("DROP TABLE %s" % staged[suffix])


def run(plpy, req, clock: Stopwatch, column: str, hierarchies: dict, summaries: list):
    """The QI-local run (module doc); ``summaries``: the whole table's SA summary of each SA."""
    stopwatch.plan(("validate", "summary", "read", "partition", "check", "build_output", "swap"))
    rows = summaries[0].rows
    n, max_rows = part_count(plpy, req, rows)
    with clock.phase("summary"):        # the split: aggregates only
        ranges = S._ranges(plpy, req)
        with C.settings(plpy, jit="off"):
            parts = citus_split.split(plpy, req, summaries, n, max_rows)
    run_ = publish.begin(plpy, req)
    prev = publish.previous(plpy, req)
    built = partition._built(req, run_)
    with clock.phase("read"):           # the one repartition of the rows
        staging, col = _staging(plpy, req, run_, len(parts))
        shards = _part_shards(plpy, req, staging, parts)
        _stage(plpy, req, staging, parts, shards, rows)
        driver = _driver(plpy, req, run_, staging, col, shards)
    staged = {"": req.output.temporary_qualified(run_.run_id, "so"), "_classes": built["_classes"],
              "_keys": req.output.temporary_qualified(run_.run_id, "sk")}
    with clock.phase("partition"):      # the parts, on their workers
        replies, layout = _parts(plpy, req, run_, column, col, staging, driver, shards, staged, {
            **S.base_request(req, column, summaries, ranges, hierarchies),
            "keyed": [["", col], ["_classes", S.SHARD_KEY], ["_keys", col]], "piece": "part"})
    with clock.phase("check"):
        facts = S._summed(req, summaries, replies, "part")
    with clock.phase("build_output"):   # back to the source's distribution column
        if column in req.options.keep:
            S.create_distributed(plpy, {s: built[s] for s in ("", "_keys")}, layout, {"": column, "_keys": "key"},
                                 req.source["qname"], drop=col)
        else:                           # the output has no distribution column: by its class
            S.create_distributed(plpy, {"_keys": built["_keys"]}, layout, {"_keys": "key"}, req.source["qname"],
                                 drop=col)
            S.create_distributed(plpy, {"": built[""]}, layout, {"": "ec_id"}, "none", drop=col)
            plpy.notice(NOT_COLOCATED % (req.output.qualified(), column), hint=NOT_COLOCATED_HINT % column.replace(
                '"', '\\"'))
        _move(plpy, staged, built, layout, col, rows)
        plpy.execute("DROP TABLE %s, %s" % (driver, staging))
    return S.publish_run(plpy, req, clock, run_, prev, built, facts, replies, {
        "parts": len(parts), "automatic": partition.partitions_option(req) is None, "citus": "qi-local",
        "citus_design": "qi_local", "part_rows": [p.rows for p in parts],
        "part_workers": len({s.node for s in shards})}, hierarchies)


def _parts(plpy, req, run_, column, col, staging, driver, shards, staged, base) -> tuple:
    """(the parts' replies, the layout of the staged relations): the layout from a dry run on
    the first part's worker, the staged relations created colocated with the staging table,
    then every part in one statement over the driver table."""
    layout = S._call(plpy, req, col, shards[0], "sabre_citus_shard", dict(
        base, shard=shards[0].name, offset=0, routing=shards[0].routing, layout=True,
        tables={s: req.output.temporary_qualified(run_.run_id, "l" + tag) for s, tag in S.TAGS}),
        relation=driver)["layout"]
    S.create_distributed(plpy, staged, layout, {"": col, "_classes": S.SHARD_KEY, "_keys": col}, staging)
    ids = [i for i, _, _ in S.shard_rows(plpy, staging, req.output.schema)]
    targets = {s: dict(zip(ids, [n for _, n, _ in S.shard_rows(plpy, staged[s], req.output.schema)]))
               for s in staged}
    offsets = np.cumsum([0] + [s.rows for s in shards])     # class ids: a part has at most its rows' classes
    replies = S._call_all(plpy, req, col, shards, base, {
        s.value: {"shard": s.name, "offset": int(offsets[j]), "routing": s.routing,
                  "tables": {x: targets[x][s.shardid] for x in staged}} for j, s in enumerate(shards)},
        relation=driver, typ=PART_TYPE)
    return replies, layout
