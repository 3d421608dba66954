"""The QI-locality split of a Citus distributed table (docs/scale-out.md, "Citus (built)"),
from aggregates so small that the coordinator receives a few hundred kB whatever the table.

The single-node split (``partition.split``) reads the cells ``GROUP BY b1..bq, sa`` once: on a
distributed table Citus aggregates each shard apart, so the coordinator would receive every
shard's cells -- about one group per row when the cells are sparse (measured: 0.6x the table at
5,000 rows in 4 shards).  Here each cut of the largest open part reads instead, pushed down:

1. the part's span of each numerical QI (``min``/``max``: one row per shard);
2. a histogram of each numerical QI over the part, ``BUCKETS`` equal-width buckets, **without
   the SA** (a ``LATERAL VALUES`` unpivot, ``GROUP BY qi, bucket``: at most q x BUCKETS groups
   per shard), with each bucket's smallest value (where a cut goes);
3. for the ``CANDIDATES`` most balanced bucket boundaries (both sides >= k rows), the SA counts
   of the part and of each cut's lower side (``GROUP BY sa`` with one ``count(*) FILTER`` per
   cut: m groups per shard);

then the first cut, most balanced first, whose two sides have an exact EMD to the whole table of
at most ``t * partition.PART_SHARE`` (``partition._cut_emds``) is made; a part no candidate can
cut stays whole.  Parts are :class:`partition.Part`: conjunctions of ``qi < v`` and
``NOT (qi < v)``, routed by ``partition.part_case``.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..shared import common as C
from ..shared import transfer as T
from . import partition

BUCKETS = 64        # equal-width buckets per numerical QI in a part's histogram
BUDGET_SHARE = 0.25  # 'ak', 'knn': a cut's sides within t * this of the table (their budget t - EMD >= 3/4 t)
CANDIDATES = 8      # cuts whose sides' SA counts are read per pass, the most balanced first


def split(plpy, req, summaries: list, n: int, max_rows: int | None = None) -> list:
    """At most ``n`` parts (more while a part that can be cut has more than ``max_rows`` rows,
    up to ``partition.MAX_PARTS``); the largest open part is cut next.  ``summaries``: the
    whole table's SA summary of each SA (several SAs: a cut keeps both sides within
    ``t_i * PART_SHARE`` of the table on every SA i)."""
    summary = summaries[0]
    nums = [a for a in req.qis if a.numerical]
    leaves = [partition._Leaf([], summary.rows, np.asarray(summary.counts, dtype=np.int64))]
    while len(leaves) < partition.MAX_PARTS:
        open_ = [leaf for leaf in leaves if not leaf.final]
        if not open_:
            break
        leaf = max(open_, key=lambda x: x.rows)
        if len(leaves) >= n and not (max_rows and leaf.rows > max_rows):
            break
        sides = _cut(plpy, req, summaries, nums, leaf)
        if sides is None:
            leaf.final = True
            continue
        at = next(j for j, x in enumerate(leaves) if x is leaf)
        leaves[at:at + 1] = sides
    return [partition.Part(" AND ".join(leaf.conds) or "true", leaf.rows, leaf.emd,
                           partition._budget(req.t, leaf.emd, summary, leaf.counts), conds=tuple(leaf.conds))
            for leaf in leaves]


def _values(plpy, nums) -> list:
    return [C.numeric_expr(plpy, a.name, a.col, "s.", clamp=True, immutable=True) for a in nums]


def _spans(plpy, req, nums, leaf) -> list:
    """(min, max) of each numerical QI over the leaf's rows."""
    r = plpy.execute("SELECT %s FROM %s AS s%s" % (", ".join(
        "pg_catalog.min(%s) AS lo%d, pg_catalog.max(%s) AS hi%d" % (v, i, v, i) for i, v in enumerate(
            _values(plpy, nums))), req.source["read"], leaf.where(req)))[0]
    return [(r["lo%d" % i], r["hi%d" % i]) for i in range(len(nums))]


def _candidates(plpy, req, nums, leaf) -> list:
    """Up to ``CANDIDATES`` cuts ``(qi index, value, rows below)``, the most balanced first,
    from one histogram of every numerical QI over the leaf (each cut at a bucket's smallest
    value, so the rows below it are exactly the lower buckets')."""
    spans = _spans(plpy, req, nums, leaf)
    values = _values(plpy, nums)
    sizes = [min(BUCKETS, int(hi - lo) + 1) if a.col["typname"] in C.INTEGER_TYPES + ("date",) and hi is not None
             and np.isfinite(hi - lo) else BUCKETS for a, (lo, hi) in zip(nums, spans)]
    unpivot = ", ".join("(%d, %s, %s)" % (i, partition._bucket_sql(v, lo, hi, z), v)
                        for i, (v, (lo, hi), z) in enumerate(zip(values, spans, sizes)) if lo is not None and hi > lo)
    if not unpivot:
        return []
    grouped = ("SELECT u.i, u.b, pg_catalog.count(*) AS n, pg_catalog.min(u.v) AS v FROM %s AS s CROSS JOIN LATERAL "
               "(VALUES %s) AS u(i, b, v)%s GROUP BY 1, 2" % (req.source["read"], unpivot, leaf.where(req)))
    r = plpy.execute("SELECT pg_catalog.count(*) AS c, %s AS i, %s AS b, %s AS n, %s AS v FROM (%s) AS g" % (
        T.binary_agg("g.i", "int8"), T.binary_agg("g.b", "int8"), T.binary_agg("g.n", "int8"),
        T.binary_agg("g.v", "float8"), grouped))[0]
    c = int(r["c"])
    qi, b, n, v = (T.decode_array(r[x], t, c) for x, t in (("i", "int8"), ("b", "int8"), ("n", "int8"),
                                                             ("v", "float8")))
    found = []
    for i, (lo, hi) in enumerate(spans):
        mine = np.flatnonzero(qi == i)
        if not len(mine):
            continue
        mine = mine[np.argsort(b[mine])]
        below = np.cumsum(n[mine])[:-1]
        for j in np.flatnonzero(np.minimum(below, leaf.rows - below) >= max(req.k, 1)):
            found.append((min(below[j], leaf.rows - below[j]), i, float(v[mine[j + 1]]), int(below[j])))
    found.sort(key=lambda x: -x[0])                    # the most balanced first (stable: QI order on ties)
    return [(i, value, rows) for _, i, value, rows in found[:CANDIDATES]]


def _cut(plpy, req, summaries, nums, leaf):
    """The leaf's two sides by the most balanced candidate cut within t * PART_SHARE of the
    table on both sides (on every SA, each with its t), or None."""
    cuts = _candidates(plpy, req, nums, leaf)
    if not cuts:
        return None
    conds = ["%s OPERATOR(pg_catalog.<) %s" % (C.numeric_expr(plpy, nums[i].name, nums[i].col, clamp=True, immutable=True), partition._float_literal(v))
             for i, v, _ in cuts]
    ok = np.ones(len(cuts), dtype=bool)
    for i, (sa, t, summary) in enumerate(zip(req.sensitive, req.thresholds, summaries)):
        counts, below = _cut_counts(plpy, replace(req, sa=sa), summary, leaf, conds)
        if (i == 0 and not np.array_equal(counts, leaf.counts)) or int(counts.sum()) != leaf.rows or \
                not np.array_equal(below.sum(axis=1), [rows for _, _, rows in cuts]):
            raise partition._changed()
        emds = partition._cut_emds(summary, counts, below)
        ok &= emds.max(axis=1) <= t * share(req)
        if i == 0:
            first = (below, emds)
    ok = np.flatnonzero(ok)
    if not len(ok):
        return None
    j = int(ok[0])
    below, emds = first
    return [partition._Leaf(leaf.conds + [c], int(cs.sum()), cs, emd=float(e))
            for c, cs, e in zip((conds[j], "NOT (%s)" % conds[j]), (below[j], leaf.counts - below[j]), emds[j])]


def share(req) -> float:
    """The share of t a cut's sides may be from the table: ``partition.PART_SHARE`` for 'refine'
    and 'mondrian' (a part is cut against the table's counts: its EMD costs it nothing), less
    for 'ak' and 'knn', which run in a part with the budget ``t - EMD(part, table)``."""
    return partition.PART_SHARE if req.method in ("refine", "mondrian") else BUDGET_SHARE


def _cut_counts(plpy, req, summary, leaf, conds) -> tuple:
    """(the leaf's SA counts, the SA counts below each cut of ``conds``) of the request's SA
    (``req.sa``): one ``GROUP BY sa`` with a ``count(*) FILTER`` per cut, pushed down."""
    grouped = "SELECT %s AS sa, pg_catalog.count(*) AS n, %s FROM %s AS s%s GROUP BY 1" % (
        partition._sa_expr(plpy, req, summary), ", ".join(
            "pg_catalog.count(*) FILTER (WHERE %s) AS c%d" % (c, j) for j, c in enumerate(conds)),
        req.source["read"], leaf.where(req))
    got = partition._coded(plpy, summary, grouped, {"n": "int8", **{"c%d" % j: "int8" for j in range(len(conds))}})
    m = len(summary.counts)
    counts = np.bincount(got["code"], weights=got["n"], minlength=m).astype(np.int64)
    below = np.stack([np.bincount(got["code"], weights=got["c%d" % j], minlength=m).astype(np.int64)
                      for j in range(len(conds))])
    return counts, below
