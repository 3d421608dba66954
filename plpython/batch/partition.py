"""Partitioned runs (docs/scale-out.md): bounded memory per backend, parts in parallel.

1. **split** (:func:`split`): a top-down t-Mondrian split of the source computed from
   aggregates only: one scan groups the table into cells -- a bucket of each numerical QI
   (its own values for a small integer span, else equal width) and the SA value, at most
   ``CELL_CAP`` of them -- and the cuts are made in numpy on the cells: the largest open part
   is cut next, at the most balanced of all its bucket boundaries (every numerical QI) whose
   two sides have >= k rows and an exact EMD to the whole table of at most ``t / 2`` (for the
   first few cuts, the best of the few most balanced by the largest part once the split is
   finished); a part no boundary can cut stays whole. Parts are predicates over the QIs (no
   Python runs per row);
2. **budgets**: part P is anonymized with SABRE on its own rows and distribution with
   ``t_P = (t - EMD(P, table)) * scale_P``; by the triangle inequality (the paper's argument
   for SABRE_W's DIRECT case) every class C of P then has ``EMD(C, table) <= t``.  ``scale_P``
   is 1 for a categorical SA (the part's ground distance is the table's); for a numerical SA
   the part ranks only its own m_P distinct values, and one step of its ordered distance spans
   at most G of the table's m, so ``scale_P = (m - 1) / ((m_P - 1) * G)``.  In this backend
   ('refine' and 'mondrian' over a numerical or hierarchical SA, :func:`against_the_table`), a
   part is instead cut with the table's t against the table's own SA counts (the part's SA in
   the table's domain): every class's exact EMD to the table is what each cut checks, which
   the budget only bounds (10M census-like rows: the parts' searches about 1.4x faster and
   their AIL lower, docs/scale-out.md);
3. **parts**: each part's rows are read through a temporary view of the source and its
   predicate (:func:`view_rows`, when each part's stages read them once and there are at most
   ``VIEW_PARTS`` parts), else copied into a table of their own by one scan of the source
   (:func:`stage_rows`); each part is one ``sabre_anonymize`` over them (in this
   backend one after another with options.partitions, or by the client's connections in
   parallel: ``sabre-pg anonymize --parts``), so no backend holds more than one part;
4. **publish** (:func:`publish_parts`): the parts' outputs become one output with class ids
   offset per part; every row of the source exactly once (by key), the SA distribution equal
   to the source's, every class checked by the exact EMD against the whole table, >= k; then
   the atomic swap and one catalog row, as ``sabre_anonymize`` does.
"""
from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field, replace

import numpy as np

from sabre_pg.core import limits, stopwatch
from sabre_pg.core.checkpoint import checkpoint
from sabre_pg.core.exact_emd import domain_class_emds
from sabre_pg.core.mondrian import against_table
from sabre_pg.core.stopwatch import Stopwatch

from ..shared import closeness
from ..shared import common as C
from ..shared import errors as E
from ..shared import transfer as T
from ..stages import publish, request, scan

PART_SHARE = 0.5         # a part keeps at least this share of t as its budget
HIST_BUCKETS = 256       # at most this many buckets per numerical QI in the split's cells
CELL_CAP = 1 << 20       # at most this many cells (buckets x SA values): the split's memory bound
MAX_PARTS = limits.PARTS
EDGE_BATCH = 16          # candidate cuts per exact-EMD call of the split
LOOKAHEAD = 4            # cuts compared by finishing the split after each (the split's first cuts)
LOOKAHEAD_CUTS = 4       # ... for this many first cuts
LOOKAHEAD_PARTS = 256    # ... when at most this many parts are asked (its cost is about 16 splits)
PARTS_HINT = ('options.partitions is the number of parts, e.g. {"partitions": 8}; each part is read '
              'and anonymized alone, so a backend holds at most about rows / partitions rows.')
TAG_BYTES = 4
CHECK_ROWS = 1 << 20     # rows per chunk of the check of one output the parts wrote into
AUTO_SPANS_SHARE = 0.75   # a table estimated at most this share of auto_partition_rows: no spans in its summary
KEYS_IN_MEMORY = 1 << 24  # up to this many rows, an integer key's exactly-once check sorts the keys in numpy
DENSE_KEYS = 2           # integer keys spanning below this many times their number are compared by counting
VIEW_PARTS = 8           # up to this many parts of one call read the source through views, more are copied


@dataclass(frozen=True)
class Part:
    predicate: str           # SQL over the source's columns (unqualified)
    rows: int
    emd: float               # EMD(part, table), rounded up
    budget: float            # the t SABRE gets inside the part
    output: str = ""         # qualified name of the part's output
    rows_table: str = ""     # qualified name of the table (or view, ``view``) holding the part's rows
    conds: tuple = ()        # the cuts on the part's path from the whole table (predicate = their AND)
    counts: object = None    # the part's SA counts per table code (the split's, exact), or None
    # rows_table is a temporary view of the source (view_rows); keyword-only, so no positional
    # field above shifts when one is added
    view: bool = field(default=False, kw_only=True)


@dataclass
class _Leaf:
    conds: list
    rows: int
    counts: np.ndarray       # SA counts per table code
    final: bool = False
    cells: np.ndarray = None   # indices of the split's cells that make the leaf
    emd: float = 0.0
    children: list = field(default_factory=list)

    def where(self, req) -> str:
        base = req.row_filter()
        conds = ([base[len(" WHERE "):]] if base else []) + self.conds
        return " WHERE " + " AND ".join(conds) if conds else ""


def partitions_option(req) -> int | None:
    """options.partitions, checked (None when not given)."""
    n = req.options.given.get("partitions")
    if n is None:
        return None
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_PARTS:
        raise E.invalid_parameter("options.partitions must be an integer from 1 to %d" % MAX_PARTS, PARTS_HINT)
    return n


def automatic(req, rows: int) -> bool:
    """Whether a plain run (no options.partitions) over ``rows`` rows goes in parts: more rows
    than options.auto_partition_rows (0: never), one SA and a numerical QI to cut on
    (docs/scale-out.md, "Automatic partitions")."""
    limit = req.options.auto_partition_rows
    return bool(limit) and rows > limit and not req.sas and any(a.numerical for a in req.qis)


def split(plpy, req, summary, n: int, max_rows: int | None = None) -> list:
    """At most ``n`` parts (fewer when no further cut keeps t / 2 of the budget): the largest
    open part is cut next, all in numpy over the table's cells (:func:`_cells`, one scan).
    ``max_rows`` (automatic partitions): cutting goes on past ``n`` while a part that can be
    cut has more rows (up to MAX_PARTS parts)."""
    nums = [a for a in req.qis if a.numerical]
    if not nums:
        raise E.invalid_parameter("a partitioned run needs a numerical quasi-identifier to cut on",
                                  "Add a numerical quasi-identifier, or run without options.partitions.")
    root = _Leaf([], summary.rows, np.asarray(summary.counts, dtype=np.int64))
    bounds = _spans(plpy, req, nums, root, summary)
    if n < 2 and not (max_rows and root.rows > max_rows):
        return [Part("true", root.rows, 0.0, _budget(req.t, 0.0, summary, root.counts), counts=root.counts)]
    cells = _cells(plpy, req, summary, nums, bounds)
    if not np.array_equal(np.bincount(cells.code, weights=cells.n, minlength=len(root.counts)), root.counts):
        raise _changed()
    root.cells = np.arange(len(cells.n))
    ctx = _Split(plpy, req, summary, nums, [(hi - lo) or 1.0 for lo, hi in bounds], cells)
    leaves = _grow(ctx, [root], n, LOOKAHEAD_CUTS if n <= LOOKAHEAD_PARTS else 0)
    if max_rows:
        leaves = _grow(ctx, leaves, MAX_PARTS, max_rows=max_rows)
    return [Part(" AND ".join(leaf.conds) or "true", leaf.rows, leaf.emd,
                 _budget(req.t, leaf.emd, summary, leaf.counts), conds=tuple(leaf.conds), counts=leaf.counts)
            for leaf in leaves]


@dataclass(frozen=True)
class _Split:
    """What every cut of one split reads."""
    plpy: object
    req: object
    summary: object
    nums: list               # the numerical QIs (the only ones cut)
    spans: list              # each one's span in the table (normalizes the QIs' widths)
    cells: "_Cells"


def _grow(ctx, leaves: list, n: int, lookahead: int = 0, max_rows: int = 0) -> list:
    """The leaves after cutting the largest open one until ``n`` (or none can be cut).  For the
    first ``lookahead`` cuts, each of the ``LOOKAHEAD`` most balanced cuts that pass is followed
    by the plain split (no lookahead) to ``n`` leaves, and the cut whose finished split has the
    smallest largest leaf is taken (the most balanced on ties).  As the plain split's own cut is
    among them, the result's largest leaf is never above the plain split's.  ``max_rows``: stop
    as soon as no open leaf has more rows."""
    leaves = [replace(leaf) for leaf in leaves]        # ``final`` is set on these copies only
    while len(leaves) < n:
        checkpoint()
        open_ = [leaf for leaf in leaves if not leaf.final]
        if not open_:
            break
        leaf = max(open_, key=lambda x: x.rows)
        if leaf.rows <= max_rows:
            break
        at = next(j for j, x in enumerate(leaves) if x is leaf)
        options = [_sides(ctx, leaf, *cut) for cut in _cuts(ctx, leaf, LOOKAHEAD if lookahead > 0 else 1)]
        if not options:
            leaf.final = True
            continue
        if len(options) > 1:
            finished = [max(x.rows for x in _grow(ctx, leaves[:at] + sides + leaves[at + 1:], n))
                        for sides in options]
            options = [options[int(np.argmin(finished))]]
        lookahead -= 1
        leaves[at:at + 1] = options[0]
    return leaves


def span_exprs(plpy, req) -> list:
    """The split's numerical QIs as float8 SQL over ``s.`` (their spans: :func:`_spans`)."""
    return [C.numeric_expr(plpy, a.name, a.col, "s.", clamp=True) for a in req.qis if a.numerical]


def automatic_spans(plpy, req) -> list:
    """What the SA summary of a plain run also reads for the split (``scan.sa_summary``'s
    ``spans``: the numerical QIs' spans, one scan fewer) when the run may go in automatic parts
    (:func:`automatic`; its rows not known yet, the planner's estimate of a table at most
    ``AUTO_SPANS_SHARE`` of the threshold says it will not: the aggregates cost a 1M-row summary
    about 0.1 s; a wrong estimate costs the split one scan, as before); else nothing."""
    if not automatic(req, float("inf")):
        return []
    estimate = plpy.execute(plpy.prepare(
        "SELECT c.reltuples::pg_catalog.float8 AS n FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) $1",
        ["oid"]), [req.source["oid"]])
    if len(estimate) and 0 <= estimate[0]["n"] <= req.options.auto_partition_rows * AUTO_SPANS_SHARE:
        return []
    return span_exprs(plpy, req)


def _spans(plpy, req, nums, root, summary) -> list:
    """The table's (min, max) of each numerical QI (and the NULL error of options.nulls = 'error'):
    from the SA summary's scan when it read them (``summary.spans``), else one scan."""
    if summary.spans is not None:
        rows, spans = summary.spans
        r = {"n": rows, **{"%s%d" % (c, i): x for i, span in enumerate(spans) for c, x in zip(("c", "lo", "hi"), span)}}
    else:
        exprs = span_exprs(plpy, req)
        r = plpy.execute("SELECT pg_catalog.count(*) AS n, %s FROM %s AS s%s" % (
            ", ".join("pg_catalog.count(%s) AS c%d, pg_catalog.min(%s) AS lo%d, pg_catalog.max(%s) AS hi%d"
                      % (e, i, e, i, e, i) for i, e in enumerate(exprs)), req.source["read"], root.where(req)))[0]
    if any(r["c%d" % i] != r["n"] for i in range(len(nums))):
        raise scan.null_error(req.attrs, plpy.execute("SELECT count(*) AS n, %s FROM %s AS s" % (
            ", ".join("count(s.%s) AS c%d" % (C.ident(a.name), i) for i, a in enumerate(req.attrs)),
            req.source["read"]))[0])
    if r["n"] != root.rows:
        raise _changed()
    return [(r["lo%d" % i], r["hi%d" % i]) for i in range(len(nums))]


@dataclass(frozen=True)
class _Cells:
    """The table grouped by (bucket of each numerical QI, SA value): cells x QIs arrays."""
    bucket: np.ndarray       # int64, cells x QIs
    lo: np.ndarray           # each cell's smallest value of each QI (float8)
    hi: np.ndarray
    code: np.ndarray         # the cell's SA, as a table code
    n: np.ndarray            # rows


def bucket_counts(nums, bounds, m: int) -> list:
    """Buckets per numerical QI: an integer QI's own values when its span is at most
    HIST_BUCKETS, else HIST_BUCKETS of equal width; the largest halved until the cells
    (buckets x SA values) are at most CELL_CAP, so the split's memory is bounded."""
    sizes = []
    for a, (lo, hi) in zip(nums, bounds):
        exact = a.col["typname"] in C.INTEGER_TYPES + ("date",) and np.isfinite(hi - lo) and hi - lo < HIST_BUCKETS
        sizes.append(int(hi - lo) + 1 if exact else HIST_BUCKETS)
    while float(np.prod(sizes, dtype=float)) * m > CELL_CAP and max(sizes) > 1:
        i = int(np.argmax(sizes))
        sizes[i] //= 2
    return sizes


def _bucket_sql(v: str, lo: float, hi: float, size: int) -> str:
    """A monotone bucket of float8 ``v`` in [lo, hi]: the integer offset when there is one
    bucket per integer, else width_bucket (0 when the span is empty or infinite)."""
    if not (np.isfinite(lo) and np.isfinite(hi) and hi > lo) or size < 2:
        return "0::pg_catalog.int8"
    if size == hi - lo + 1:
        return "(%s - %s)::pg_catalog.int8" % (v, _float_literal(lo))
    return "pg_catalog.width_bucket(%s, %s, %s, %d)::pg_catalog.int8" % (v, _float_literal(lo), _float_literal(hi), size)


def _one_value_buckets(a, lo: float, hi: float, size: int) -> bool:
    """Whether each bucket of :func:`_bucket_sql` holds one value, ``lo`` + the bucket (an
    integer or date QI with a bucket per integer, as :func:`bucket_counts` gives it, or a QI of
    one value): its cells' smallest and largest values are then known without aggregating."""
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return False
    return bool(hi == lo or (a.col["typname"] in C.INTEGER_TYPES + ("date",) and size == hi - lo + 1))


def _cells(plpy, req, summary, nums, bounds) -> _Cells:
    """One scan of the source grouped into cells (:func:`bucket_counts`), read in binary; a
    QI's cell minima and maxima are aggregated only where a bucket holds several values
    (:func:`_one_value_buckets`; 10M census-like rows, two integer QIs: 4 aggregates a row fewer)."""
    sizes = bucket_counts(nums, bounds, len(summary.counts))
    one = [_one_value_buckets(a, lo, hi, z) for a, (lo, hi), z in zip(nums, bounds, sizes)]
    vs = [C.numeric_expr(plpy, a.name, a.col, "s.", clamp=True) for a in nums]
    inner = "SELECT %s, %s AS sa FROM %s AS s%s" % (
        ", ".join(["%s AS b%d" % (_bucket_sql("(%s)" % v, lo, hi, z), i)
                   for i, (v, (lo, hi), z) in enumerate(zip(vs, bounds, sizes))]
                  + ["%s AS v%d" % (v, i) for i, v in enumerate(vs) if not one[i]]),
        _sa_expr(plpy, req, summary), req.source["read"], req.row_filter())
    grouped = "SELECT %s FROM (%s) AS x GROUP BY %s, x.sa" % (
        ", ".join(["x.b%d" % i for i in range(len(nums))] + ["x.sa", "pg_catalog.count(*) AS n"]
                  + ["pg_catalog.min(x.v%d) AS lo%d, pg_catalog.max(x.v%d) AS hi%d" % (i, i, i, i)
                     for i in range(len(nums)) if not one[i]]),
        inner, ", ".join("x.b%d" % i for i in range(len(nums))))
    cols = {"n": "int8", **{"b%d" % i: "int8" for i in range(len(nums))},
            **{"%s%d" % (c, i): "float8" for i in range(len(nums)) if not one[i] for c in ("lo", "hi")}}
    got = _coded(plpy, summary, grouped, cols)
    for i, (lo, _) in enumerate(bounds):
        if one[i]:          # (integers below 2^53: the float8 sum is exact, as the SQL's was)
            got["lo%d" % i] = got["hi%d" % i] = lo + got["b%d" % i].astype(np.float64)
    return _Cells(*(np.stack([got["%s%d" % (c, i)] for i in range(len(nums))], axis=1) for c in ("b", "lo", "hi")),
                  got["code"], got["n"])


def _coded(plpy, summary, grouped: str, cols: dict) -> dict:
    """The columns ``cols`` ({name: int8 | float8}) of the query ``grouped`` as numpy arrays,
    and ``code``: its column ``sa`` (as :func:`_sa_expr` reads it) as the table's SA code."""
    aggs = ", ".join("%s AS %s" % (T.binary_agg("g.%s" % c, t), c) for c, t in cols.items())
    texts = summary.text_codes()
    if texts is None:
        vtype = "int8" if summary.distinct.dtype.kind in "iu" else "float8"
        r = plpy.execute("SELECT pg_catalog.count(*) AS rows, %s, %s AS sa FROM (%s) AS g" % (
            aggs, T.binary_agg("g.sa", vtype), grouped))[0]
        n = int(r["rows"])
        values = T.decode_array(r["sa"], vtype, n)
        code = np.searchsorted(summary.distinct, values)
        if n and (code.max() >= len(summary.distinct) or not np.array_equal(summary.distinct[code], values)):
            raise _changed()
    else:
        r = plpy.execute(plpy.prepare(
            "SELECT pg_catalog.count(*) AS rows, pg_catalog.count(h.pos) AS known, %s, %s AS code FROM (%s) AS g %s" % (
                aggs, T.binary_agg("h.pos", "int8"), grouped, C.leaf_position_join("h", 1, "g.sa")),
            ["text[]"]), [texts])[0]
        n = int(r["rows"])
        if r["known"] != n:
            raise _changed()
        code = T.decode_array(r["code"], "int8", n) - 1
    return {"code": code, **{c: T.decode_array(r[c], t, n) if n else np.zeros(0) for c, t in cols.items()}}


def _cuts(ctx, leaf, limit: int) -> list:
    """Up to ``limit`` cuts of the leaf (module doc, 1.) as ``(qi index, edge, below, emds)``,
    the most balanced first: of every bucket boundary of every numerical QI whose two sides have
    >= k rows, those with the largest smaller side (ties: the wider normalized QI) whose sides
    both have an exact EMD to the table <= t * PART_SHARE.  Candidates are tested in that order,
    ``EDGE_BATCH`` per exact-EMD call, until ``limit`` pass.  Cells never straddle a cut, so the
    counts are exact."""
    cells, mine = ctx.cells, leaf.cells
    lo, hi = cells.lo[mine].min(axis=0), cells.hi[mine].max(axis=0)
    found = [(i, (hi[i] - lo[i]) / ctx.spans[i]) + _edges(ctx.req, cells, leaf, i) for i in range(len(ctx.nums))]
    found = [f for f in found if f[1] > 0 and len(f[2])]
    if not found:
        return []
    qi = np.concatenate([np.full(len(f[2]), f[0]) for f in found])
    width = np.concatenate([np.full(len(f[2]), f[1]) for f in found])
    edge, below = np.concatenate([f[2] for f in found]), np.vstack([f[3] for f in found])
    smaller = np.minimum(below.sum(axis=1), leaf.rows - below.sum(axis=1))
    order = np.lexsort((-width, -smaller))             # the most balanced first, then the widest QI
    out = []
    for start in range(0, len(order), EDGE_BATCH):
        checkpoint()
        batch = order[start:start + EDGE_BATCH]
        emds = _cut_emds(ctx.summary, leaf.counts, below[batch])
        for j in np.flatnonzero(emds.max(axis=1) <= ctx.req.t * PART_SHARE)[:limit - len(out)]:
            out.append((int(qi[batch[j]]), edge[batch[j]], below[batch[j]], emds[j]))
        if len(out) == limit:
            break
    return out


def _edges(req, cells, leaf, i: int) -> tuple:
    """The leaf's cuts on QI ``i``: ``(edge, below)`` with ``edge`` each bucket that starts an
    upper side and ``below[e]`` the SA counts of the leaf's rows in lower buckets (one row per
    cut), only cuts whose two sides have >= k rows.  One bincount over the leaf's cells."""
    mine = leaf.cells
    buckets, inv = np.unique(cells.bucket[mine, i], return_inverse=True)
    m = len(leaf.counts)
    per_bucket = np.bincount(inv * m + cells.code[mine], weights=cells.n[mine],
                             minlength=len(buckets) * m).reshape(len(buckets), m)
    below = np.cumsum(per_bucket, axis=0)[:-1].astype(np.int64)
    rows = below.sum(axis=1)
    keep = np.flatnonzero(np.minimum(rows, leaf.rows - rows) >= max(req.k, 1))
    return buckets[1:][keep], below[keep]


def _sides(ctx, leaf, i: int, edge, below, emds) -> list:
    """The two leaves of the leaf's cut on numerical QI ``i`` below bucket ``edge``."""
    cells, mine, qi = ctx.cells, leaf.cells, ctx.nums[i]
    left = cells.bucket[mine, i] < edge
    # the smallest value of bucket ``edge`` in the whole table: every row of a lower bucket is
    # below it, every row of this or a higher bucket is not (buckets are monotone)
    at = cells.bucket[:, i] == edge
    cond = "%s OPERATOR(pg_catalog.<) %s" % (C.numeric_expr(ctx.plpy, qi.name, qi.col, clamp=True), _float_literal(cells.lo[at, i].min()))
    counts = np.vstack([below, leaf.counts - below])
    return [_Leaf(leaf.conds + [c], int(cs.sum()), cs, emd=float(e), cells=ix) for c, cs, e, ix in
            zip((cond, "NOT (%s)" % cond), counts, emds, (mine[left], mine[~left]))]


def _float_literal(x: float) -> str:
    return "'%r'::pg_catalog.float8" % float(x)


def _sa_expr(plpy, req, summary, prefix: str = "s.") -> str:
    """The SA as the summary reads it (values that key :func:`_codes`)."""
    c = prefix + C.ident(req.sa.name)
    if summary.ranks is not None:
        return "pg_catalog.trim_scale(%s)::pg_catalog.text" % c
    if summary.hierarchy is not None:
        return "(%s)::pg_catalog.text" % c
    if req.sa.typname in C.INTEGER_TYPES:
        return "%s::pg_catalog.int8" % c
    return C.numeric_expr(plpy, req.sa.name, req.sa.col, prefix)


def _cut_emds(summary, leaf_counts: np.ndarray, below: np.ndarray) -> np.ndarray:
    """Exact EMD (rounded up) to the whole table of both sides of each candidate cut, one row
    per cut: ``below`` (cuts x SA codes) are the lower sides' SA counts, the upper sides are the
    rest of the leaf.  One exact-EMD call for all cuts: each cut brings its two sides and the
    rest of the table as classes, so the classes' union is that many copies of the table, whose
    distribution is the table's and against which the EMDs are measured."""
    rest = np.asarray(summary.counts, dtype=np.int64) - leaf_counts
    if rest.min() < 0:
        raise _changed()
    groups = np.stack([below, leaf_counts - below, np.broadcast_to(rest, below.shape)], axis=1)
    groups = groups.reshape(-1, len(leaf_counts))
    ec, codes = np.nonzero(groups)
    emds = domain_class_emds(ec, codes, groups[ec, codes], summary.domain())
    out = np.zeros(len(groups))
    out[emds.class_ids] = np.nextafter(emds.emd, np.inf)
    return out.reshape(len(below), 3)[:, :2]


def _budget(t: float, emd: float, summary, counts) -> float:
    """SABRE's t inside a part (module doc, 2.), rounded down, at most 1."""
    scale = 1.0
    if summary.hierarchy is None:                       # numerical SA: the part ranks its own values
        present = np.flatnonzero(counts)
        if len(present) < 2:
            return 1.0                                  # one SA value: every class is the part itself
        scale = (len(counts) - 1) / ((len(present) - 1) * int(np.diff(present).max()))
    return float(min(1.0, np.nextafter((t - emd) * scale, 0.0)))


def _not_the_source(rows, source_rows):
    return E.source_changed(
        "the parts' outputs do not hold the source's rows: their sensitive values differ from the source's "
        "(%d rows in the parts read so far, %d in the source)" % (rows, source_rows),
        "Publish all parts of one sabre_partitions call; run again if the source changed meanwhile.")


def _changed():
    return E.source_changed("the source changed while sabre split it into parts",
                            "Run again, or inside a REPEATABLE READ transaction.")


# ---------------------------------------------------------------------------- plan and parts
PART_OPTIONS_DROPPED = ("partitions", "auto_partition_rows", "labels", "refresh", "replace", "cascade",
                        "lock_timeout")


def plan(plpy, req, n: int, summary=None, max_rows: int | None = None):
    """(the table's SA summary, the parts with their budgets, output names and, with several
    parts, the tables holding their rows).  ``summary``: the SA summary when the caller has it;
    ``max_rows``: see :func:`split`."""
    if summary is None:
        hierarchy = None
        if req.sa.hierarchy_name is not None:
            hierarchy = C.load_hierarchy(plpy, req.sa.hierarchy_name, 'for column "%s"' % req.sa.name)
        summary = scan.sa_summary(plpy, req, hierarchy, spans=span_exprs(plpy, req))
    if summary.rows < req.k:
        raise E.invalid_parameter("k = %d exceeds the %d rows of the source" % (req.k, summary.rows),
                                  "Every equivalence class needs at least k rows.")
    tag = secrets.token_hex(TAG_BYTES)
    with C.settings(plpy, jit="off"):      # (aggregate scans: JIT compiles for seconds, saves none)
        found = split(plpy, req, summary, n, max_rows)
        name = "sabre_part_%s_%d"
        parts = [Part(p.predicate, p.rows, p.emd, p.budget, C.qname(None, req.output.schema, name % (tag, j)),
                      C.qname(None, req.output.schema, (name + "_rows") % (tag, j)) if len(found) > 1 else "",
                      p.conds, p.counts)
                 for j, p in enumerate(found)]
    return summary, parts


def part_case(leaves: list) -> str:
    """SQL giving each row its part's index, as a tree of ``CASE`` on the cuts (a comparison or
    two per level, not every part's predicate): ``leaves`` are (cuts from the root, index);
    NULL for a row in no part, as the predicates say."""
    if len(leaves) == 1:
        return "%d" % leaves[0][1]
    first = leaves[0][0][0]
    cut = first[len("NOT ("):-1] if first.startswith("NOT (") else first
    below = [(conds[1:], j) for conds, j in leaves if conds[0] == cut]
    rest = [(conds[1:], j) for conds, j in leaves if conds[0] != cut]
    return "CASE WHEN %s THEN %s WHEN NOT (%s) THEN %s END" % (cut, part_case(below), cut, part_case(rest))


def staged(req, summary, parts) -> bool:
    """Whether a one-call run copies each part's rows into a table of their own
    (:func:`stage_rows`) rather than letting each part read the source through a temporary
    view of its predicate.  The view costs each part one filtered scan of the whole table,
    about 0.085 us a row (serial, as every read is), where the copy costs every row about
    1.2 us once (10M census-like rows in 7 parts: the copy 11-14 s, the views 6 s more read in
    all, docs/evaluation.md "Parts read through views"); the break-even is about 12 parts, so
    views when there are at most ``VIEW_PARTS`` parts and each part's stages read its rows
    only once (:func:`reads_rows_once`)."""
    return len(parts) > 1 and (len(parts) > VIEW_PARTS or not reads_rows_once(req)
                                or not all(_counted(req, summary, p) for p in parts))


def reads_rows_once(req) -> bool:
    """Whether a part's stages scan its rows once (the read), so a view of the source costs one
    scan per part, given an SA summary the split counted (:func:`_counted`, which
    :func:`staged` checks per part): no flat categorical QI (``scan.hierarchies`` reads each one's values), no exact range
    aggregate (``publish.EXACT_RANGE_TYPES``: joined with the source) and the output built
    from the classes (no keep column, an SA rebuilt from its codes)."""
    return (not req.options.keep and all(publish.exact_from_codes(sa) for sa in req.sensitive)
            and all(a.hierarchy_name is not None for a in req.qis if not a.numerical)
            and not any(a.numerical and a.typname in publish.EXACT_RANGE_TYPES for a in req.qis))


def view_rows(plpy, req, parts) -> list:
    """Each part's rows as a temporary view of the source, ``SELECT * FROM source WHERE
    <predicate>`` (:func:`staged`: its stages read it once), dropped after its part; the parts
    naming them."""
    tag, viewed = secrets.token_hex(TAG_BYTES), []
    for j, p in enumerate(parts):
        name = C.ident("sabre_part_%s_%d_view" % (tag, j))
        plpy.execute("CREATE TEMP VIEW %s AS SELECT * FROM %s AS s WHERE %s" % (name, req.source["read"], p.predicate))
        viewed.append(replace(p, rows_table="pg_temp.%s" % name, view=True))
    return viewed


def stage_rows(plpy, req, parts):
    """With several parts, each part's rows copied into its own unlogged table (owner-only) by one scan of the
    source -- routed by a partitioned table, then detached and the routing column dropped --
    so that each part reads its own rows, not the whole table once per part.  (The parts' CASE
    as the parent's key expression instead of a routing column copied 10-25% faster, but the
    classes at 3M rows were not all the same: docs/evaluation.md.)"""
    if len(parts) < 2:
        return
    head, _, tail = parts[0].rows_table.rpartition("_0_rows")
    parent = head + "_rows" + tail
    col = C.ident("sabre_part_%s" % secrets.token_hex(TAG_BYTES))
    # the source's columns in their safe types (safe_types): no type of another role in a table of the run
    plpy.execute("CREATE TABLE %s (%s pg_catalog.int4 NOT NULL, %s) PARTITION BY LIST (%s)" % (
        parent, col, ", ".join("%s %s%s" % (C.ident(name), c["type"], " NOT NULL" if c["notnull"] else "")
                               for name, c in req.columns.items() if not c["unsafe"]), col))
    for j, p in enumerate(parts):
        plpy.execute("CREATE UNLOGGED TABLE %s PARTITION OF %s FOR VALUES IN (%d)" % (p.rows_table, parent, j))
    case = part_case([(p.conds, j) for j, p in enumerate(parts)])
    # (no synchronized scan: it starts a large table where another scan of it was, so the parts'
    # rows -- and the classes the parts made of them -- came in an order that changed between runs)
    with C.settings(plpy, jit="off", synchronize_seqscans="off"):
        plpy.execute("INSERT INTO %s SELECT x.* FROM (SELECT %s AS p, s.* FROM %s AS s%s) AS x WHERE x.p IS NOT NULL"
                     % (parent, case, req.source["read"], req.row_filter()))
    for p in parts:
        plpy.execute("ALTER TABLE %s DETACH PARTITION %s" % (parent, p.rows_table))
        plpy.execute("ALTER TABLE %s DROP COLUMN %s" % (p.rows_table, col))
        publish.owner_only(plpy, p.rows_table)
    plpy.execute("DROP TABLE %s" % parent)


def part_options(req) -> dict:
    """The options of each part's sabre_anonymize: the caller's, keyed by the source's key."""
    opts = {k: v for k, v in req.options.given.items() if k not in PART_OPTIONS_DROPPED}
    opts["key"] = req.key.name
    return opts


def anonymize_part(plpy, req, part: Part, j: int, into, run_part, summary=None) -> int:
    """One part in this backend: sabre_anonymize's stages (``run_part``, which the entry point
    passes in, so this module never imports it) over the part's rows (its table or its view of
    the source, :func:`view_rows`; then dropped), written
    straight into the run's relations ``into`` (class ids from its offset); returns the part's
    number of classes.  ``summary``: the table's SA summary, whose part the split counted
    (:func:`part_summary`: the part's own summary without a scan of its rows)."""
    source = part.rows_table
    whole = against_the_table(req, summary, part)
    given = part_summary(req, summary, part, whole) if summary is not None else None
    part_req = request.build(plpy, _oid(plpy, source), None, [a.name for a in req.qis], req.sa.name,
                             req.t if whole else part.budget, req.k, req.method, part.output,
                             json.dumps(part_options(req)))
    # messages name the caller's source and the part, not the part's view or rows table
    part_req = replace(part_req, source={**part_req.source, "qname": "%s (part %d)" % (req.source["qname"], j + 1)})
    if whole:
        into = replace(into, reference=np.asarray(summary.counts, dtype=np.int64))
    classes = run_part(plpy, part_req, into, given)
    plpy.execute("DROP %s %s" % ("VIEW" if part.view else "TABLE", source))
    return classes


def against_the_table(req, summary, part: Part) -> bool:
    """Whether the part is cut with the table's t against the table's SA counts (module doc,
    2.) rather than with its budget: 'refine' and 'mondrian' (the methods that measure every
    cut exactly against a reference distribution), the split's counts of the part at hand, and
    an SA whose domain the part can share (numerical, or a named hierarchy; a flat categorical
    SA's leaves are the part's own values)."""
    return req.method in ("refine", "mondrian") and summary is not None and _counted(req, summary, part)


def _counted(req, summary, part: Part) -> bool:
    """Whether the split's counts give the part's SA summary (:func:`part_summary`): counts of
    the part, and an SA whose leaves are not the part's own values (a flat categorical SA's)."""
    return part.counts is not None and (summary.hierarchy is None or req.sa.hierarchy_name is not None)


def part_summary(req, summary, part: Part, whole: bool = False):
    """The part's SA summary as ``scan.sa_summary`` of its rows reads it, from the split's exact
    counts (its read then checks them, as it checks a summary it scanned): a numerical SA's
    values present in the part (with ``whole``, every value of the table, those absent from
    the part counted 0: the table's domain), a named hierarchy's leaves.  None (scanned) for a
    flat categorical SA (its leaves are the part's own values) or a part without counts."""
    if not _counted(req, summary, part):
        return None
    counts = np.asarray(part.counts, dtype=np.int64)
    if summary.hierarchy is not None:
        return scan.SASummary(part.rows, counts, None, summary.hierarchy)
    if whole:
        return scan.SASummary(part.rows, counts, summary.distinct, None, summary.ranks)
    present = np.flatnonzero(counts)
    if summary.ranks is not None:
        return scan.SASummary(part.rows, counts[present], None, None, [summary.ranks[i] for i in present])
    return scan.SASummary(part.rows, counts[present], summary.distinct[present], None)


def run(plpy, req, clock: Stopwatch, run_part, summary=None):
    """sabre_anonymize with options.partitions: split, then each part in turn (``run_part``:
    ``anonymize.run_part``) written straight into the run's relations (class ids offset by the
    classes before it, so the parts' union is never copied), checked against the whole table,
    swapped in as one output.  Without options.partitions (automatic partitions,
    :func:`automatic`; ``summary`` is the table's SA summary): as many parts as
    options.auto_partition_rows asks, cut further until none that can be cut has more rows."""
    n = partitions_option(req)
    auto = n is None
    max_rows = req.options.auto_partition_rows if auto else None
    if auto:
        n = min(MAX_PARTS, -(-summary.rows // max_rows))
    if req.sas:
        raise E.invalid_parameter("options.partitions takes one sensitive attribute",
                                  "Run the several-SA overload without options.partitions.")
    with clock.phase("summary"):           # the split: aggregates only
        summary, parts = plan(plpy, req, n, summary, max_rows)
    with clock.phase("read"):              # each part's rows: a table of their own, or a view of the source
        if staged(req, summary, parts):
            stage_rows(plpy, req, parts)
        else:
            parts = view_rows(plpy, req, parts)
    run_ = publish.begin(plpy, req)
    prev = publish.previous(plpy, req)
    built = _built(req, run_)
    # the parts' classes carry their EMD to their part: the run's classes get the table's
    written_by_parts = {**built, "_classes": req.output.temporary_qualified(run_.run_id, "pc")}
    # (each part's read from its first block: a synchronized scan of a part over shared_buffers / 4
    # started where an earlier scan of it stopped, so a part's rows -- and its classes -- could
    # come in another order)
    with clock.phase("partition"), C.settings(plpy, synchronize_seqscans="off"):   # the parts, one after another
        offset = 0
        tally = publish.PartsWritten(summary.rows, KEYS_IN_MEMORY if req.key.integer else -1)
        for j, part in enumerate(parts):
            offset += anonymize_part(plpy, req, part, j, publish.Into(written_by_parts, offset, j == 0,
                                                                      written=tally), run_part, summary)
    with C.settings(plpy, jit="off"):
        with clock.phase("check"):
            written = check_written_in_chunks(plpy, req, written_by_parts, summary, tally)
        with clock.phase("build_output"):
            publish.execute(plpy, _union_sql(plpy, built["_classes"], [written_by_parts], "_classes", written))
            plpy.execute("DROP TABLE %s" % written_by_parts["_classes"])
        return _finish(plpy, req, run_, prev, built, written, clock, len(parts), max_rows, own=True)


# ---------------------------------------------------------------------------- publish
def _part_relations(plpy, output) -> dict:
    """{suffix: qualified name} of a part's output, each a relation a recorded run of the
    caller created (never anything else is read as a part, or dropped)."""
    found = {}
    for suffix in ("", "_classes", "_keys"):
        r = plpy.execute(plpy.prepare(
            "SELECT pg_catalog.quote_ident(n.nspname) OPERATOR(pg_catalog.||) '.' OPERATOR(pg_catalog.||) "
            "pg_catalog.quote_ident(c.relname) AS q, c.relowner OPERATOR(pg_catalog.=) u.oid AS mine, "
            "EXISTS (SELECT 1 FROM %s() x WHERE x.relation OPERATOR(pg_catalog.=) c.oid) AS recorded "
            "FROM pg_catalog.pg_class o JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) o.relnamespace "
            "JOIN pg_catalog.pg_class c ON c.relnamespace OPERATOR(pg_catalog.=) n.oid "
            "AND c.relname OPERATOR(pg_catalog.=) (o.relname::pg_catalog.text OPERATOR(pg_catalog.||) $2), "
            "pg_catalog.pg_roles u WHERE u.rolname OPERATOR(pg_catalog.=) CURRENT_USER "
            "AND o.oid OPERATOR(pg_catalog.=) $1::pg_catalog.regclass" % C.catalog("recorded_relations"),
            ["text", "text"]), [output, suffix])
        if not len(r) or not (r[0]["mine"] and r[0]["recorded"]):
            raise E.invalid_parameter("%s%s is not the output of one of your recorded sabre runs" % (output, suffix),
                                      "Pass the part outputs sabre_partitions named, after their sabre_anonymize.")
        found[suffix] = r[0]["q"]
    return found


def _union_sql(plpy, table, relations, suffix, written):
    """(SQL, types, params): CREATE TABLE ``table`` AS the parts' ``suffix`` relations, class
    ids offset per part; ``_classes`` gets each class's EMD to the whole table."""
    shapes = [list(C.columns(plpy, _oid(plpy, r[suffix])).items()) for r in relations]
    first = [(name, col["type"]) for name, col in shapes[0]]
    if any([(name, col["type"]) for name, col in s] != first for s in shapes):
        raise E.datatype_mismatch("the parts' outputs differ in their columns",
                                  "Anonymize every part with the same quasi-identifiers, SA and options.")
    emd = suffix == "_classes"
    selects = []
    for r, off in zip(relations, written.offsets):
        # (the EMD by subscript of one array indexed by class id: no join, whose hash tables
        # would stay allocated for every branch of the UNION ALL until the statement ends)
        cols = ["(p.%s OPERATOR(pg_catalog.+) %d)::%s AS %s" % (C.ident(n), off, t, C.ident(n)) if n == closeness.EC
                else "($1::pg_catalog.float8[])[p.ec_id OPERATOR(pg_catalog.+) %d]::%s AS emd" % (off + 1, t)
                if emd and n == "emd" else "p.%s" % C.ident(n) for n, t in first]
        selects.append("SELECT %s FROM %s AS p" % (", ".join(cols), r[suffix]))
    sql = "CREATE %sTABLE %s AS %s" % ("UNLOGGED " if suffix == "_keys" else "", table, " UNION ALL ".join(selects))
    if emd:
        by_id = np.full(int(written.class_ids.max()) + 1 if len(written.class_ids) else 0, np.nan)
        by_id[written.class_ids] = written.emd
        return sql, ["float8[]"], [by_id.tolist()]
    return sql, [], []


def _oid(plpy, name):
    return plpy.execute(plpy.prepare("SELECT $1::pg_catalog.regclass::pg_catalog.oid AS oid", ["text"]),
                        [name])[0]["oid"]


def publish_parts(plpy, req, outputs: list, clock: Stopwatch, summary=None):
    """The parts' outputs as one output of ``req``: checked (module doc, 4.), swapped in, recorded."""
    with C.settings(plpy, jit="off"):      # (big scans and joins: JIT compiles for seconds, saves none)
        return _publish_parts(plpy, req, outputs, clock, summary)


def _built(req, run) -> dict:
    """{suffix: temporary qualified name} of the run's relations before the swap."""
    return {s: req.output.temporary_qualified(run.run_id, tag) for s, tag in (("", "o"), ("_classes", "c"),
                                                                              ("_keys", "k"))}


def _publish_parts(plpy, req, outputs, clock, summary):
    run = publish.begin(plpy, req)
    prev = publish.previous(plpy, req)
    relations = [_part_relations(plpy, o) for o in outputs]
    with clock.phase("check"):
        if summary is None:
            hierarchy = None if req.sa.hierarchy_name is None else C.load_hierarchy(
                plpy, req.sa.hierarchy_name, 'for column "%s"' % req.sa.name)
            summary = scan.sa_summary(plpy, req, hierarchy)
        written = check_against_table(plpy, req, relations, summary)
    built = _built(req, run)
    with clock.phase("build_output"):
        for suffix, table in built.items():
            publish.execute(plpy, _union_sql(plpy, table, relations, suffix, written))
    for r in relations:
        plpy.execute("DROP TABLE %s, %s, %s" % (r[""], r["_classes"], r["_keys"]))
    return _finish(plpy, req, run, prev, built, written, clock, len(outputs))


def _finish(plpy, req, run, prev, built, written, clock, n_parts, auto_rows=None, own=False):
    """The run's relations ``built`` (checked against the table: ``written``) indexed, checked
    to hold every source row once, swapped in and recorded.  ``auto_rows``: the threshold of
    automatic partitions (the options are then recorded as given, so a refresh decides again);
    ``own``: ``built`` are the relations ``written`` was read from, created in this transaction
    (see :func:`check_every_row_once`)."""
    with clock.phase("build_output"):
        plpy.execute("ALTER TABLE %s ADD CONSTRAINT %s PRIMARY KEY (ec_id)" % (
            built["_classes"], C.ident(req.output.temporary(run.run_id, "c_pkey"))))
        publish.index_keys(plpy, req, run, built["_keys"], int(written.sizes.sum()))
        publish.owner_only(plpy, built["_keys"])
        if not (own and written.keys is not None):
            # (statistics, so the exactly-once check in SQL hashes the keys: without them the planner
            # guessed 200 keys and probed the source's index once per row, 12 s at 1M rows; the
            # check in memory reads no side table: 10M rows, 0.8-1.2 s saved)
            plpy.execute("ANALYZE %s" % built["_keys"])
    with clock.phase("check"):
        check_every_row_once(plpy, req, built, written if own else None)
    with clock.phase("swap"):
        publish.swap(plpy, req, run, prev, built)
        publish.comment(plpy, req, run)
    sizes = written.sizes
    facts = {"quasi_identifiers": [a.name for a in req.qis], "sensitive": req.sa.name, "t": req.t, "k": req.k,
             "method": req.method,
             "options": dict(req.options.given) if auto_rows else {**req.options.given, "partitions": n_parts},
             "partitions": partitions_fact(n_parts, auto_rows),
             "rows": int(sizes.sum()), "classes": len(sizes), "buckets": None, "u": None,
             "min_class_size": int(sizes.min()), "max_class_size": int(sizes.max()),
             "max_emd": written.max_emd, "ail": None, "discernibility": int((sizes ** 2).sum()),
             "sensitive_attributes": [req.sa.name], "t_values": [req.t], "max_emds": [written.max_emd],
             "phases": clock.report(), "seconds": clock.total()}
    output_oid = publish.record(plpy, req, run, facts)
    return [(run.run_id, output_oid, facts["rows"], facts["classes"], facts["min_class_size"], facts["max_emd"],
             None, facts["seconds"])]


@dataclass(frozen=True)
class Written:
    """The exact check of every part's classes against the whole table."""
    offsets: list            # class id offset of each part
    class_ids: np.ndarray    # offset ids, ascending
    sizes: np.ndarray
    emd: np.ndarray          # each class's EMD to the whole table (correctly rounded)
    keys: np.ndarray = None  # the keys the parts wrote, kept as they wrote them (integer keys), or None

    @property
    def max_emd(self) -> float:
        return float(self.emd.max()) if len(self.emd) else 0.0


def partitions_fact(n_parts: int, auto_rows=None) -> dict:
    """``sabre.runs.partitions`` of a run in parts: how many, and whether they were chosen
    automatically (with the threshold in rows that chose them)."""
    fact = {"parts": n_parts, "automatic": bool(auto_rows)}
    if auto_rows:
        fact["auto_partition_rows"] = auto_rows
    return fact


def check_against_table(plpy, req, relations, summary) -> Written:
    """Part by part (memory: one part's groups), every class's exact EMD against the whole
    table's SA counts, >= k rows, and as many rows as the side table maps to it; then the
    parts' SA counts together must be the table's.  The parts' class ids are offset."""
    check = _TableCheck(req, summary, renumber=True)
    for r in relations:
        check.add(_part_groups(plpy, req, summary, r[""]), _keys_per_class(plpy, r["_keys"]))
    return check.written()


def check_written_in_chunks(plpy, req, relations, summary, parts: publish.PartsWritten) -> Written:
    """The check of :func:`check_against_table` of one output the parts wrote into (class ids
    final), read in chunks of about ``CHECK_ROWS`` rows (a TID range of blocks each, so the
    chunks are the table's rows exactly once): a class is measured once it has all the rows
    the part that made it put in it (``parts``: kept in memory as the parts wrote them, most
    classes lie in one chunk), so memory is one chunk's groups whatever the table size; a
    class with more rows than its part gave it, or rows missing, fails.  The keys the parts
    wrote (``parts.written_keys()``, or None) go on to the exactly-once check."""
    out = relations[""]
    expected = parts.class_sizes()
    ids, keys = np.arange(len(expected)), parts.written_keys()
    blocks = int(plpy.execute(plpy.prepare(
        "SELECT pg_catalog.pg_relation_size($1::pg_catalog.regclass) OPERATOR(pg_catalog./) "
        "pg_catalog.current_setting('block_size')::pg_catalog.int8 AS b", ["text"]), [out])[0]["b"])
    step = max(1, blocks * CHECK_ROWS // max(summary.rows, 1))
    m = len(summary.counts)
    check = _TableCheck(req, summary, renumber=False)
    pending = (np.zeros(0, dtype=np.int64),) * 3
    for b in range(0, blocks, step):
        chunk = _part_groups(plpy, req, summary, "(SELECT o.* FROM %s AS o WHERE o.ctid OPERATOR(pg_catalog.>=) "
                             "'(%d,0)'::pg_catalog.tid AND o.ctid OPERATOR(pg_catalog.<) '(%d,0)'::pg_catalog.tid)"
                             % (out, b, b + step), small_classes=len(expected) <= 1 << 31)
        pair, n = (np.r_[pending[0], chunk[0]] * m + np.r_[pending[1], chunk[1]]), np.r_[pending[2], chunk[2]]
        pair, at = np.unique(pair, return_inverse=True)
        ec, codes, n = pair // m, pair % m, np.bincount(at, weights=n).astype(np.int64)
        if len(ec) and ec.max() >= len(expected):
            raise _not_what_parts_wrote()
        rows = np.bincount(ec, weights=n, minlength=len(expected)).astype(np.int64)
        if (rows > expected).any():
            raise _not_what_parts_wrote()
        full = rows[ec] == expected[ec]
        done = np.unique(ec[full])
        check.add((ec[full], codes[full], n[full]), (done, expected[done]))
        pending = (ec[~full], codes[~full], n[~full])
    if len(pending[0]):
        raise _not_what_parts_wrote()
    written = check.written()
    if not np.array_equal(written.class_ids, ids):         # (every class the parts made has rows)
        raise _not_what_parts_wrote()
    return replace(written, keys=keys)


class _TableCheck:
    """The check of :func:`check_against_table`, fed a part's (or a chunk's) classes at a time."""

    def __init__(self, req, summary, renumber: bool):
        self.req, self.summary, self.renumber = req, summary, renumber
        self.table = np.asarray(summary.counts, dtype=np.int64)
        self.total = np.zeros(len(self.table), dtype=np.int64)
        self.offsets, self.ids, self.sizes, self.emds, self.violations, self.offset = [], [], [], [], 0, 0

    def add(self, groups, keys):
        """Some classes: their (class id, table SA code, rows) groups and the side table's
        (class ids ascending, rows) of those classes."""
        ec, codes, n = groups
        part_counts = np.bincount(codes, weights=n, minlength=len(self.total)).astype(np.int64)
        self.total += part_counts
        rest = self.table - part_counts
        if rest.min() < 0:
            raise _not_the_source(int(self.total.sum()), self.summary.rows)
        measured, real = against_table(ec, codes, n, self.table, self.summary.domain())
        self.violations += int(np.count_nonzero(measured.violating(self.req.t, self.req.k)[real]))
        _check_classes_match_keys(keys, measured.class_ids[real], measured.sizes[real])
        offset = self.offset if self.renumber else 0
        self.offsets.append(offset)
        self.ids.append(measured.class_ids[real] + offset)
        self.sizes.append(np.asarray(measured.sizes[real], dtype=np.int64))
        self.emds.append(measured.emd[real])
        self.offset = int(self.ids[-1].max()) + 1 if len(self.ids[-1]) else self.offset

    def written(self) -> Written:
        req = self.req
        if not np.array_equal(self.total, self.table):
            raise _not_the_source(int(self.total.sum()), self.summary.rows)
        ids = np.concatenate(self.ids) if self.ids else np.zeros(0, dtype=np.int64)
        order = np.argsort(ids, kind="stable")
        written = Written(self.offsets if self.renumber else [0], ids[order],
                          *(np.concatenate(x)[order] if x else np.zeros(0) for x in (self.sizes, self.emds)))
        if self.violations:
            raise E.source_changed(
                "%d class(es) of the partitioned output violate t = %g or k = %d against the whole table in "
                "exact arithmetic (max EMD %.6g, smallest class %d)" % (
                    self.violations, req.t, req.k, written.max_emd, int(written.sizes.min())),
                "Run again without options.partitions, or with fewer parts.")
        return written


def _part_groups(plpy, req, summary, output, small_classes: bool = False):
    """(class id, table SA code, rows) of every (class, SA value) of a part's output: a number
    SA travels per row in binary and is grouped in numpy (as ``closeness`` does), a text SA
    (leaves, numeric ranks) is grouped in SQL and matched to its leaf position.
    ``small_classes``: every class id is in [0, 2^31) (the run's own output), so an SA of at
    most 32 bits travels with its class in one int8 per row (``closeness.measure`` does the
    same; 10M rows: 2.1 s against 5.2 s for the two aggregates)."""
    value, texts = _sa_expr(plpy, req, summary, "o."), summary.text_codes()
    if texts is None:
        if small_classes and req.sa.typname in closeness.PAIR_TYPES:
            got = closeness.paired_rows(plpy, "o.ec_id", "o.%s" % C.ident(req.sa.name), "%s AS o" % output)
            if got is None:                                 # (a NULL in the output sabre wrote)
                raise _changed()
            n, ec, values = got
        else:
            vtype = "int8" if req.sa.typname in C.INTEGER_TYPES else "float8"
            row = plpy.execute("SELECT pg_catalog.count(*) AS n, %s AS ec, %s AS v FROM %s AS o" % (
                T.binary_agg("o.ec_id::pg_catalog.int8", "int8"), T.binary_agg(value, vtype), output))[0]
            n = int(row["n"])
            values = T.decode_array(row["v"], vtype, n)
            ec = T.decode_array(row["ec"], "int8", n) if n else values
            del row
        codes = np.searchsorted(summary.distinct, values)
        if n and (codes.max() >= len(summary.distinct) or not np.array_equal(summary.distinct[codes], values)):
            raise _changed()
        return closeness.groups(ec, codes, len(summary.distinct)) if n else (codes, codes, codes)
    inner = ("SELECT g.ec_id, h.pos AS v, g.n FROM (SELECT o.ec_id::pg_catalog.int8 AS ec_id, %s AS v, "
             "pg_catalog.count(*) AS n FROM %s AS o GROUP BY 1, 2) AS g %s" % (
                 value, output, C.leaf_position_join("h", 1, "g.v")))
    row = plpy.execute(plpy.prepare(
        "SELECT pg_catalog.count(*) AS groups, pg_catalog.count(x.v) AS known, %s AS ec, %s AS v, %s AS n "
        "FROM (%s) AS x" % (T.binary_agg("x.ec_id", "int8"), T.binary_agg("x.v", "int8"),
                            T.binary_agg("x.n", "int8"), inner), ["text[]"]), [texts])[0]
    groups = int(row["groups"])
    if row["known"] != groups:
        raise _changed()
    ec, values, n = (T.decode_array(row[c], "int8", groups) for c in ("ec", "v", "n"))
    return ec, values - 1, n


def _keys_per_class(plpy, keys_table):
    """(class ids ascending, rows) of a side table."""
    r = plpy.execute("SELECT pg_catalog.count(*) AS c, %s AS ids, %s AS ns FROM (SELECT ec_id::pg_catalog.int8 AS "
                     "ec_id, pg_catalog.count(*) AS n FROM %s GROUP BY 1 ORDER BY 1) AS g" % (
                         T.binary_agg("g.ec_id", "int8"), T.binary_agg("g.n", "int8"), keys_table))[0]
    c = int(r["c"])
    return T.decode_array(r["ids"], "int8", c), T.decode_array(r["ns"], "int8", c)


def _check_classes_match_keys(keys, class_ids, sizes):
    """Each class of a part's output has as many rows as its side table maps to it."""
    ids, ns = keys
    if not (np.array_equal(ids, class_ids) and np.array_equal(ns, np.asarray(sizes, dtype=np.int64))):
        raise _keys_mismatch()


def _not_what_parts_wrote():
    return E.source_changed("the output the parts wrote differs from the classes they computed: the source "
                            "changed while sabre read it",
                            "Run again, or call sabre_anonymize inside a REPEATABLE READ transaction so that "
                            "all of its queries see one snapshot.")


def _keys_mismatch():
    return E.source_changed("the parts' side tables do not match their outputs' classes",
                            "Pass the part outputs of one sabre_partitions call, as their runs made them.")


def check_every_row_once(plpy, req, built, written: Written | None = None):
    """Every row of the source exactly once: as many keys as source rows and output rows, and
    every source row's key among them (so the keys are the source's, each once).  (An uncorrelated
    ``= ANY (subquery)``, the semi-join EXISTS would be: Citus plans it on a distributed source.)
    ``written``: the check of ``built`` themselves (:func:`check_written_in_chunks`: each class
    has as many output rows as keys), relations of this transaction no other session sees -- their
    row counts are then its sizes' sum, not counted again (two scans fewer: the output and keys);
    with an integer key and at most ``KEYS_IN_MEMORY`` rows, the same counts from the keys
    compared in numpy (:func:`_rows_once_in_memory`)."""
    r = None if written is None else _rows_once_in_memory(plpy, req, built, int(written.sizes.sum()), written.keys)
    if r is None:
        r = _rows_once_in_sql(plpy, req, built, written)
    n = r["source_rows"]
    if not r["keys"] == r["matched"] == r["output_rows"] == n:
        raise E.source_changed(
            "the parts' outputs do not hold every row of the source exactly once (%d source rows, %d output "
            "rows, %d keys, %d source rows found among them)" % (n, r["output_rows"], r["keys"], r["matched"]),
            "Run again (inside REPEATABLE READ if the source is being written), with the parts of one "
            "sabre_partitions call.")


def _rows_once_in_sql(plpy, req, built, written: Written | None) -> dict:
    """The counts of :func:`check_every_row_once` by one statement: the source counted, and its
    rows whose key is among the side table's (a hash semi-join)."""
    key, src = C.ident(req.key.name), req.source["read"]
    filt = req.row_filter()
    counted = "(SELECT pg_catalog.count(*) FROM %s) AS keys, (SELECT pg_catalog.count(*) FROM %s) AS output_rows, " \
        % (built["_keys"], built[""]) if written is None else \
        "%d::pg_catalog.int8 AS keys, %d::pg_catalog.int8 AS output_rows, " % ((int(written.sizes.sum()),) * 2)
    return plpy.execute(
        "SELECT %(counted)s(SELECT pg_catalog.count(*) FROM %(src)s AS s%(filt)s) AS source_rows, "
        "(SELECT pg_catalog.count(*) FROM %(src)s AS s WHERE s.%(key)s OPERATOR(pg_catalog.=) ANY (SELECT k.key "
        "FROM %(k)s AS k)%(and)s) AS matched" % {
            "counted": counted, "k": built["_keys"], "src": src, "key": key, "filt": filt,
            "and": filt.replace(" WHERE ", " AND ", 1)})[0]


def _rows_once_in_memory(plpy, req, built, output_rows: int, keys=None) -> dict | None:
    """The counts of :func:`check_every_row_once` from the source's keys (one binary read) and
    ``keys`` (the keys the parts wrote, kept as they wrote them; None: the side table's, read in
    binary) compared in numpy (:func:`same_keys`): the same values, each as often, are every
    source row's key among the keys, each once (the hash semi-join of 10M keys cost several
    times the two reads, docs/evaluation.md "Automatic parts: the fixed costs, 2").  None (do
    it in SQL) for a key that is no integer or more than ``KEYS_IN_MEMORY`` rows (memory: 8
    bytes a row per array)."""
    if not req.key.integer or output_rows > KEYS_IN_MEMORY:
        return None
    counts = {"output_rows": output_rows}
    reads = [("source_rows", req.key.name, "%s AS s%s" % (req.source["read"], req.row_filter()))]
    if keys is None:                                    # (else kept from the parts' writes)
        reads.append(("keys", "key", "%s AS s" % built["_keys"]))
    else:
        counts["keys"] = len(keys)
    arrays = []
    for name, col, sql in reads:
        column = "s.%s" % C.ident(col)
        r = plpy.execute("SELECT pg_catalog.count(*) AS rows, pg_catalog.count(%s) AS n, %s AS v FROM %s" % (
            column, T.binary_agg(column, "int8"), sql))[0]
        counts[name] = int(r["rows"])
        arrays.append(T.decode_array(r["v"], "int8", int(r["n"])))
        del r
    source, keys = arrays[0], arrays[1] if keys is None else keys
    if same_keys(source, keys):
        counts["matched"] = len(source)
    else:                                               # (only for the error's message)
        source.sort()
        keys.sort()
        at = np.minimum(np.searchsorted(keys, source), max(len(keys) - 1, 0))
        counts["matched"] = int(np.count_nonzero(keys[at] == source)) if len(keys) else 0
    return counts


def same_keys(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two int64 arrays hold the same values, each as often: by counting when the
    values are dense (their range below ``DENSE_KEYS`` times their number: a bincount each,
    8 bytes per value of the range; 10M keys: about 0.2 s against 1.5 s for the two sorts), else
    by sorting (``a`` and ``b`` are then sorted in place)."""
    if len(a) != len(b):
        return False
    if not len(a):
        return True
    lo, hi = min(int(a.min()), int(b.min())), max(int(a.max()), int(b.max()))
    if hi - lo < DENSE_KEYS * len(a):
        return np.array_equal(np.bincount(a - lo, minlength=hi - lo + 1), np.bincount(b - lo, minlength=hi - lo + 1))
    a.sort()
    b.sort()
    return np.array_equal(a, b)


# ---------------------------------------------------------------------------- entry points
@E.entry_point
def run_plan(plpy, source, quasi_identifiers, sensitive, t, k, method, output, options, stage=False):
    """sabre_partitions: the parts of a partitioned run, for a client running them in parallel; with
    ``stage`` (several parts) each part's rows are also copied into a table of their own, which the
    caller anonymizes and drops (a plan looked at without ``stage`` leaves nothing behind)."""
    req = request.build(plpy, source, None, quasi_identifiers, sensitive, t, k, method, output, options)
    n = partitions_option(req)
    if n is None:
        raise E.invalid_parameter("sabre_partitions needs options.partitions", PARTS_HINT)
    _, parts = plan(plpy, req, n)
    if stage:
        stage_rows(plpy, req, parts)
    opts = json.dumps(part_options(req))
    return [(j, p.rows, p.emd, p.budget, p.predicate, p.output, opts, (p.rows_table if stage else None) or None)
            for j, p in enumerate(parts)]


PUBLISH_STEPS = ("check", "build_output", "swap")     # progress of sabre_publish_parts (docs/progress.md)


@E.entry_point
def run_publish(plpy, source, quasi_identifiers, sensitive, t, k, method, output, options, parts):
    """sabre_publish_parts: the parts' outputs (made by sabre_anonymize) published as one."""
    if not parts:
        raise E.invalid_parameter("parts must name at least one part output", "Pass sabre_partitions' part_output.")
    E.cap("parts", len(parts), limits.PARTS, "Pass sabre_partitions' part_output: it makes at most this many.")
    stopwatch.plan(PUBLISH_STEPS)
    req = request.build(plpy, source, None, quasi_identifiers, sensitive, t, k, method, output, options)
    return publish_parts(plpy, req, list(parts), Stopwatch())
