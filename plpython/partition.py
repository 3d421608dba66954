"""Partitioned runs (docs/scale-out.md): bounded memory per backend, parts in parallel.

1. **split** (:func:`split`): a top-down t-Mondrian split of the source computed from
   aggregates only, round by round: each round cuts every open part from two scans of the
   source -- per-part histograms of the numerical QIs (``width_bucket``, with exact minima and
   maxima), then one ``GROUP BY part, sa`` with the rows below each QI's cut near the median.
   A cut is kept only if each side's exact EMD to the whole table is at most ``t / 2``; parts
   are predicates over the QIs (no Python runs per row);
2. **budgets**: part P is anonymized with SABRE on its own rows and distribution with
   ``t_P = (t - EMD(P, table)) * scale_P``; by the triangle inequality (the paper's argument
   for SABRE_W's DIRECT case) every class C of P then has ``EMD(C, table) <= t``.  ``scale_P``
   is 1 for a categorical SA (the part's ground distance is the table's); for a numerical SA
   the part ranks only its own m_P distinct values, and one step of its ordered distance spans
   at most G of the table's m, so ``scale_P = (m - 1) / ((m_P - 1) * G)``;
3. **parts**: each part is one ``sabre_anonymize`` over a temporary view of its rows (in this
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
from dataclasses import dataclass, field

import numpy as np

from sabre_pg.core.exact_emd import domain_class_emds
from sabre_pg.core.stopwatch import Stopwatch

from . import closeness
from . import common as C
from . import errors as E
from . import publish, request, scan
from . import transfer as T

PART_SHARE = 0.5         # a part keeps at least this share of t as its budget
HIST_BUCKETS = 1024      # equal-width buckets per leaf and QI in a round of the split
MAX_PARTS = 4096
PARTS_HINT = ('options.partitions is the number of parts, e.g. {"partitions": 8}; each part is read '
              'and anonymized alone, so a backend holds at most about rows / partitions rows.')
TAG_BYTES = 4


@dataclass(frozen=True)
class Part:
    predicate: str           # SQL over the source's columns (unqualified)
    rows: int
    emd: float               # EMD(part, table), rounded up
    budget: float            # the t SABRE gets inside the part
    output: str = ""         # qualified name of the part's output


@dataclass
class _Leaf:
    conds: list
    rows: int
    counts: np.ndarray       # SA counts per table code
    final: bool = False
    bounds: list = field(default_factory=list)   # (lo, hi) per numerical QI, enclosing the leaf
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


def split(plpy, req, summary, n: int) -> list:
    """At most ``n`` parts (fewer when no further cut keeps t / 2 of the budget), cut round by
    round: each round cuts every open part at once (the largest first, up to ``n`` parts) from
    two scans of the source (:func:`_cut_round`), so the split costs O(rows * log n)."""
    nums = [a for a in req.qis if a.numerical]
    if not nums:
        raise E.invalid_parameter("a partitioned run needs a numerical quasi-identifier to cut on",
                                  "Add a numerical quasi-identifier, or run without options.partitions.")
    root = _Leaf([], summary.rows, np.asarray(summary.counts, dtype=np.int64))
    root.bounds = _spans(plpy, req, nums, root)
    spans = [(hi - lo) or 1.0 for lo, hi in root.bounds]
    leaves = [root]
    while len(leaves) < n:
        open_ = sorted((leaf for leaf in leaves if not leaf.final), key=lambda x: -x.rows)[:n - len(leaves)]
        if not open_:
            break
        for leaf, sides in zip(open_, _cut_round(plpy, req, summary, nums, spans, open_)):
            if sides is None:
                leaf.final = True
                continue
            i = leaves.index(leaf)
            leaves[i:i + 1] = sides
    return [Part(" AND ".join(leaf.conds) or "true", leaf.rows, leaf.emd,
                 _budget(req.t, leaf.emd, summary, leaf.counts)) for leaf in leaves]


def _spans(plpy, req, nums, root) -> list:
    """The table's (min, max) of each numerical QI (and the NULL error of options.nulls = 'error')."""
    exprs = [C.numeric_expr(plpy, a.name, a.col, "s.") for a in nums]
    r = plpy.execute("SELECT pg_catalog.count(*) AS n, %s FROM %s AS s%s" % (
        ", ".join("pg_catalog.count(%s) AS c%d, pg_catalog.min(%s) AS lo%d, pg_catalog.max(%s) AS hi%d"
                  % (e, i, e, i, e, i) for i, e in enumerate(exprs)), req.source["qname"], root.where(req)))[0]
    if any(r["c%d" % i] != r["n"] for i in range(len(nums))):
        raise scan.null_error(req.attrs, plpy.execute("SELECT count(*) AS n, %s FROM %s AS s" % (
            ", ".join("count(s.%s) AS c%d" % (C.ident(a.name), i) for i, a in enumerate(req.attrs)),
            req.source["qname"]))[0])
    if r["n"] != root.rows:
        raise _changed()
    return [(r["lo%d" % i], r["hi%d" % i]) for i in range(len(nums))]


def _leaves_sql(plpy, req, nums, leaves, extra: str) -> str:
    """``SELECT leaf, v0, v1, ... <extra>`` over the source: each row's index among ``leaves``
    (NULL outside them) and its numerical QIs as float8, the QIs' order of ``nums``."""
    case = "CASE %s END" % " ".join("WHEN %s THEN %d" % (" AND ".join(leaf.conds) or "true", j)
                                     for j, leaf in enumerate(leaves))
    cols = "".join(", %s AS v%d" % (C.numeric_expr(plpy, a.name, a.col, "s."), i) for i, a in enumerate(nums))
    return "SELECT %s AS leaf%s%s FROM %s AS s%s" % (case, cols, extra, req.source["qname"], req.row_filter())


def _histograms(plpy, req, nums, leaves) -> dict:
    """{(leaf, qi): (buckets' rows, mins, maxes)}, buckets in order: HIST_BUCKETS equal-width
    buckets of each leaf's bounds per QI (width_bucket is monotone, so a bucket's minimum cuts
    the QI exactly between the buckets below and the rest); one scan for all leaves."""
    lo = [[leaf.bounds[i][0] for i in range(len(nums))] for leaf in leaves]
    hi = [[leaf.bounds[i][1] if leaf.bounds[i][1] > leaf.bounds[i][0] else None for i in range(len(nums))]
          for leaf in leaves]
    rows = plpy.execute(plpy.prepare(
        "SELECT x.leaf, q.i, q.b, pg_catalog.count(*) AS n, pg_catalog.min(q.v) AS lo, pg_catalog.max(q.v) AS hi "
        "FROM (%s) AS x CROSS JOIN LATERAL (SELECT w.i, w.v, pg_catalog.width_bucket(w.v, "
        "($1::pg_catalog.float8[])[x.leaf OPERATOR(pg_catalog.+) 1][w.i OPERATOR(pg_catalog.+) 1], "
        "($2::pg_catalog.float8[])[x.leaf OPERATOR(pg_catalog.+) 1][w.i OPERATOR(pg_catalog.+) 1], %d) AS b "
        "FROM (VALUES %s) AS w(i, v)) AS q WHERE x.leaf IS NOT NULL GROUP BY 1, 2, 3 ORDER BY 1, 2, 3" % (
            _leaves_sql(plpy, req, nums, leaves, ""), HIST_BUCKETS,
            ", ".join("(%d, x.v%d)" % (i, i) for i in range(len(nums)))), ["float8[]", "float8[]"]), [lo, hi])
    out = {}
    for r in rows:
        out.setdefault((r["leaf"], r["i"]), []).append((r["b"], r["n"], r["lo"], r["hi"]))
    return {key: (np.array([x[1] for x in v]), [x[2] for x in v], [x[3] for x in v], [x[0] for x in v])
            for key, v in out.items()}


def _candidate(hist):
    """(the cut value: the minimum of the bucket nearest the median, rows below it) or None."""
    n, mins, _, buckets = hist
    if len(n) < 2 or None in buckets:
        return None
    below = np.cumsum(n)[:-1]                     # rows below bucket p + 1
    p = int(np.argmin(np.abs(below - n.sum() / 2.0)))
    return mins[p + 1]


def _cut_round(plpy, req, summary, nums, spans, leaves) -> list:
    """For each leaf, its cut (two new leaves) or None: the widest normalized QI (then the next
    widest) whose cut near the median leaves both sides >= k rows and an exact EMD to the table
    <= t * PART_SHARE.  Scan 1: per-leaf histograms (:func:`_histograms`); scan 2: SA counts
    per leaf, and below each QI's candidate cut, as exact counts (:func:`_side_counts`)."""
    hist = _histograms(plpy, req, nums, leaves)
    cands = [[_candidate(hist[(j, i)]) if (j, i) in hist else None for i in range(len(nums))]
             for j in range(len(leaves))]
    total, below = _side_counts(plpy, req, summary, nums, leaves, cands)
    out = []
    for j, leaf in enumerate(leaves):
        if total[j].sum() != leaf.rows:
            raise _changed()
        exact = [(min(hist[(j, i)][1]), max(hist[(j, i)][2])) for i in range(len(nums))]
        out.append(None)
        for width, i in sorted((((b[1] - b[0]) / spans[i], i) for i, b in enumerate(exact)), reverse=True):
            if not width > 0 or cands[j][i] is None:
                continue
            counts = np.vstack([below[j, i], total[j] - below[j, i]])
            rows = counts.sum(axis=1)
            if rows.min() < max(req.k, 1):
                continue
            emds = _emds_to_table(summary, counts)
            if emds.max() <= req.t * PART_SHARE:
                cut = float(cands[j][i])
                cond = "%s < %s" % (C.numeric_expr(plpy, nums[i].name, nums[i].col), _float_literal(cut))
                sides = [_Leaf(leaf.conds + [c], int(r), cs, emd=float(e)) for c, r, cs, e in
                         zip((cond, "NOT (%s)" % cond), rows, counts, emds)]
                sides[0].bounds = [(exact[q][0], cut) if q == i else exact[q] for q in range(len(nums))]
                sides[1].bounds = [(cut, exact[q][1]) if q == i else exact[q] for q in range(len(nums))]
                out[-1] = sides
                break
    return out


def _float_literal(x: float) -> str:
    return "%s::pg_catalog.float8" % ("'%r'" % x)


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


def _codes(summary) -> dict:
    values = summary.text_codes()
    return {v: i for i, v in enumerate(values if values is not None else summary.distinct.tolist())}


def _side_counts(plpy, req, summary, nums, leaves, cands):
    """(SA counts per table code of each leaf (leaves x m), and of its rows below each QI's
    candidate cut (leaves x QIs x m)): one scan, grouped by leaf and SA value."""
    below = ", ".join("pg_catalog.count(*) FILTER (WHERE x.v%d < ($%d::pg_catalog.float8[])[x.leaf "
                      "OPERATOR(pg_catalog.+) 1]) AS b%d" % (i, i + 1, i) for i in range(len(nums)))
    rows = plpy.execute(plpy.prepare(
        "SELECT x.leaf, x.sa, pg_catalog.count(*) AS n, %s FROM (%s) AS x WHERE x.leaf IS NOT NULL GROUP BY 1, 2" % (
            below, _leaves_sql(plpy, req, nums, leaves, ", %s AS sa" % _sa_expr(plpy, req, summary))),
        ["float8[]"] * len(nums)), [[c[i] for c in cands] for i in range(len(nums))])
    codes, m = _codes(summary), len(summary.counts)
    total, under = np.zeros((len(leaves), m), dtype=np.int64), np.zeros((len(leaves), len(nums), m), dtype=np.int64)
    for r in rows:
        if r["sa"] not in codes:
            raise _changed()
        c = codes[r["sa"]]
        total[r["leaf"], c] += r["n"]
        under[r["leaf"], :, c] += [r["b%d" % i] for i in range(len(nums))]
    return total, under


def _emds_to_table(summary, parts: np.ndarray) -> np.ndarray:
    """Exact EMD (rounded up) of each row of ``parts`` (SA counts) to the whole table: the rest
    of the table is one more class, so the EMDs are against the table's distribution."""
    rest = np.asarray(summary.counts, dtype=np.int64) - parts.sum(axis=0)
    if rest.min() < 0:
        raise _changed()
    groups = np.vstack([parts, rest[None, :]])
    ec, codes = np.nonzero(groups)
    emds = domain_class_emds(ec, codes, groups[ec, codes], summary.domain())
    out = np.zeros(len(parts))
    for cid, e in zip(emds.class_ids.tolist(), emds.emd.tolist()):
        if cid < len(parts):
            out[cid] = np.nextafter(e, np.inf)
    return out


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
PART_OPTIONS_DROPPED = ("partitions", "labels", "refresh", "replace", "cascade", "lock_timeout")


def plan(plpy, req, n: int):
    """(the table's SA summary, the parts with their budgets and output names)."""
    hierarchy = None
    if req.sa.hierarchy_name is not None:
        hierarchy = C.load_hierarchy(plpy, req.sa.hierarchy_name, 'for column "%s"' % req.sa.name)
    summary = scan.sa_summary(plpy, req, hierarchy)
    if summary.rows < req.k:
        raise E.invalid_parameter("k = %d exceeds the %d rows of the source" % (req.k, summary.rows),
                                  "Every equivalence class needs at least k rows.")
    tag = secrets.token_hex(TAG_BYTES)
    with C.settings(plpy, jit="off"):      # (aggregate scans: JIT compiles for seconds, saves none)
        found = split(plpy, req, summary, n)
    parts = [Part(p.predicate, p.rows, p.emd, p.budget,
                  C.qname(None, req.output.schema, "sabre_part_%s_%d" % (tag, j))) for j, p in enumerate(found)]
    return summary, parts


def part_options(req) -> dict:
    """The options of each part's sabre_anonymize: the caller's, keyed by the source's key."""
    opts = {k: v for k, v in req.options.given.items() if k not in PART_OPTIONS_DROPPED}
    opts["key"] = req.key.name
    return opts


def anonymize_part(plpy, req, part: Part, j: int):
    """One part in this backend: sabre_anonymize over a temporary view of its rows."""
    view = "pg_temp.%s" % C.ident("sabre_part_view_%d" % j)
    plpy.execute("CREATE TEMP VIEW %s AS SELECT * FROM %s WHERE %s" % (
        view.split(".", 1)[1], req.source["qname"], part.predicate))
    plpy.execute(plpy.prepare(
        "SELECT 1 FROM %s($1::pg_catalog.regclass, $2, $3, $4, $5, $6, $7, $8::jsonb)" % C.catalog("sabre_anonymize"),
        ["text", "text[]", "text", "float8", "int4", "text", "text", "text"]),
        [view, [a.name for a in req.qis], req.sa.name, part.budget, req.k, req.method, part.output,
         json.dumps(part_options(req))])
    plpy.execute("DROP VIEW %s" % view)


def run(plpy, req, clock: Stopwatch):
    """sabre_anonymize with options.partitions: split, each part in turn, publish as one."""
    n = partitions_option(req)
    if req.sas:
        raise E.invalid_parameter("options.partitions takes one sensitive attribute",
                                  "Run the several-SA overload without options.partitions.")
    with clock.phase("summary"):           # the split: aggregates only
        summary, parts = plan(plpy, req, n)
    with clock.phase("partition"):         # the parts, one after another
        for j, part in enumerate(parts):
            anonymize_part(plpy, req, part, j)
    return publish_parts(plpy, req, [p.output for p in parts], clock, summary)


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
    built = {s: req.output.temporary_qualified(run.run_id, tag) for s, tag in (("", "o"), ("_classes", "c"),
                                                                                ("_keys", "k"))}
    with clock.phase("build_output"):
        for suffix, table in built.items():
            _execute(plpy, _union_sql(plpy, table, relations, suffix, written))
        plpy.execute("ALTER TABLE %s ADD CONSTRAINT %s PRIMARY KEY (ec_id)" % (
            built["_classes"], C.ident(req.output.temporary(run.run_id, "c_pkey"))))
        plpy.execute("CREATE INDEX %s ON %s (bucket, hilbert_key)" % (
            C.ident(req.output.temporary(run.run_id, "k_idx")), built["_keys"]))
        publish.owner_only(plpy, built["_keys"])
        # (statistics, so the exactly-once check hashes the keys: without them the planner
        # guessed 200 keys and probed the source's index once per row, 12 s at 1M rows)
        plpy.execute("ANALYZE %s" % built["_keys"])
    with clock.phase("check"):
        check_every_row_once(plpy, req, built)
    for r in relations:
        plpy.execute("DROP TABLE %s, %s, %s" % (r[""], r["_classes"], r["_keys"]))
    with clock.phase("swap"):
        publish.swap(plpy, req, run, prev, built)
        publish.comment(plpy, req, run)
    sizes = written.sizes
    facts = {"quasi_identifiers": [a.name for a in req.qis], "sensitive": req.sa.name, "t": req.t, "k": req.k,
             "method": req.method, "options": {**req.options.given, "partitions": len(outputs)},
             "rows": int(sizes.sum()), "classes": len(sizes), "buckets": None, "u": None,
             "min_class_size": int(sizes.min()), "max_class_size": int(sizes.max()),
             "max_emd": written.max_emd, "ail": None, "discernibility": int((sizes ** 2).sum()),
             "sensitive_attributes": [req.sa.name], "t_values": [req.t], "max_emds": [written.max_emd],
             "phases": clock.report(), "seconds": clock.total()}
    output_oid = publish.record(plpy, req, run, facts)
    return [(run.run_id, output_oid, facts["rows"], facts["classes"], facts["min_class_size"], facts["max_emd"],
             None, facts["seconds"])]


def _execute(plpy, statement):
    sql, types, params = statement
    plpy.execute(plpy.prepare(sql, types), params)


@dataclass(frozen=True)
class Written:
    """The exact check of every part's classes against the whole table."""
    offsets: list            # class id offset of each part
    class_ids: np.ndarray    # offset ids, ascending
    sizes: np.ndarray
    emd: np.ndarray          # each class's EMD to the whole table (correctly rounded)

    @property
    def max_emd(self) -> float:
        return float(self.emd.max()) if len(self.emd) else 0.0


def check_against_table(plpy, req, relations, summary) -> Written:
    """Part by part (memory: one part's groups), every class's exact EMD against the whole
    table's SA counts, >= k rows, and as many rows as the side table maps to it; then the
    parts' SA counts together must be the table's."""
    total = np.zeros(len(summary.counts), dtype=np.int64)
    offsets, ids, sizes, emds, violations, offset = [], [], [], [], 0, 0
    for r in relations:
        ec, codes, n = _part_groups(plpy, req, summary, r[""])
        part_counts = np.bincount(codes, weights=n, minlength=len(total)).astype(np.int64)
        total += part_counts
        rest = np.asarray(summary.counts, dtype=np.int64) - part_counts
        if rest.min() < 0:
            raise _not_the_source(int(total.sum()), summary.rows)
        present = np.flatnonzero(rest)          # the rest of the table as class -1: EMDs against the table
        measured = domain_class_emds(np.r_[np.full(len(present), -1), ec], np.r_[present, codes],
                                     np.r_[rest[present], n], summary.domain())
        real = measured.class_ids >= 0
        violations += int(np.count_nonzero(measured.violating(req.t, req.k)[real]))
        _check_classes_match_keys(plpy, r["_keys"], measured.class_ids[real], measured.sizes[real])
        offsets.append(offset)
        ids.append(measured.class_ids[real] + offset)
        sizes.append(np.asarray(measured.sizes[real], dtype=np.int64))
        emds.append(measured.emd[real])
        offset = int(ids[-1].max()) + 1 if len(ids[-1]) else offset
    if not np.array_equal(total, np.asarray(summary.counts, dtype=np.int64)):
        raise _not_the_source(int(total.sum()), summary.rows)
    written = Written(offsets, np.concatenate(ids), np.concatenate(sizes), np.concatenate(emds))
    if violations:
        raise E.source_changed(
            "%d class(es) of the partitioned output violate t = %g or k = %d against the whole table in "
            "exact arithmetic (max EMD %.6g, smallest class %d)" % (
                violations, req.t, req.k, written.max_emd, int(written.sizes.min())),
            "Run again without options.partitions, or with fewer parts.")
    return written


def _part_groups(plpy, req, summary, output):
    """(class id, table SA code, rows) of every (class, SA value) of a part's output: a number
    SA travels per row in binary and is grouped in numpy (as ``closeness`` does), a text SA
    (leaves, numeric ranks) is grouped in SQL and matched to its leaf position."""
    value = _sa_expr(plpy, req, summary, "o.")
    if summary.text_codes() is None:
        vtype = "int8" if req.sa.typname in C.INTEGER_TYPES else "float8"
        row = plpy.execute("SELECT pg_catalog.count(*) AS n, %s AS ec, %s AS v FROM %s AS o" % (
            T.binary_agg("o.ec_id::pg_catalog.int8", "int8"), T.binary_agg(value, vtype), output))[0]
        n = int(row["n"])
        values = T.decode_array(row["v"], vtype, n)
        codes = np.searchsorted(summary.distinct, values)
        if n and (codes.max() >= len(summary.distinct) or not np.array_equal(summary.distinct[codes], values)):
            raise _changed()
        return closeness.groups(T.decode_array(row["ec"], "int8", n), codes, len(summary.distinct)) if n \
            else (codes, codes, codes)
    inner = ("SELECT g.ec_id, h.pos AS v, g.n FROM (SELECT o.ec_id::pg_catalog.int8 AS ec_id, %s AS v, "
             "pg_catalog.count(*) AS n FROM %s AS o GROUP BY 1, 2) AS g %s" % (
                 value, output, C.leaf_position_join("h", 1, "g.v")))
    row = plpy.execute(plpy.prepare(
        "SELECT pg_catalog.count(*) AS groups, pg_catalog.count(x.v) AS known, %s AS ec, %s AS v, %s AS n "
        "FROM (%s) AS x" % (T.binary_agg("x.ec_id", "int8"), T.binary_agg("x.v", "int8"),
                            T.binary_agg("x.n", "int8"), inner), ["text[]"]), [summary.text_codes()])[0]
    groups = int(row["groups"])
    if row["known"] != groups:
        raise _changed()
    ec, values, n = (T.decode_array(row[c], "int8", groups) for c in ("ec", "v", "n"))
    return ec, values - 1, n


def _check_classes_match_keys(plpy, keys_table, class_ids, sizes):
    """Each class of a part's output has as many rows as its side table maps to it."""
    r = plpy.execute("SELECT pg_catalog.count(*) AS c, %s AS ids, %s AS ns FROM (SELECT ec_id::pg_catalog.int8 AS "
                     "ec_id, pg_catalog.count(*) AS n FROM %s GROUP BY 1 ORDER BY 1) AS g" % (
                         T.binary_agg("g.ec_id", "int8"), T.binary_agg("g.n", "int8"), keys_table))[0]
    c = int(r["c"])
    if not (np.array_equal(T.decode_array(r["ids"], "int8", c), class_ids)
            and np.array_equal(T.decode_array(r["ns"], "int8", c), np.asarray(sizes, dtype=np.int64))):
        raise E.source_changed("the parts' side tables do not match their outputs' classes",
                               "Pass the part outputs of one sabre_partitions call, as their runs made them.")


def check_every_row_once(plpy, req, built):
    """Every row of the source exactly once: as many keys as source rows and output rows, and
    every source row's key among them (so the keys are the source's, each once)."""
    key, src = C.ident(req.key.name), req.source["qname"]
    filt = req.row_filter()
    r = plpy.execute(
        "SELECT (SELECT pg_catalog.count(*) FROM %(k)s) AS keys, (SELECT pg_catalog.count(*) FROM %(o)s) AS "
        "output_rows, (SELECT pg_catalog.count(*) FROM %(src)s AS s%(filt)s) AS source_rows, "
        "(SELECT pg_catalog.count(*) FROM %(src)s AS s WHERE EXISTS (SELECT FROM %(k)s AS k WHERE "
        "k.key OPERATOR(pg_catalog.=) s.%(key)s)%(and)s) AS matched" % {
            "k": built["_keys"], "o": built[""], "src": src, "key": key, "filt": filt,
            "and": filt.replace(" WHERE ", " AND ", 1)})[0]
    n = r["source_rows"]
    if not r["keys"] == r["matched"] == r["output_rows"] == n:
        raise E.source_changed(
            "the parts' outputs do not hold every row of the source exactly once (%d source rows, %d output "
            "rows, %d keys, %d source rows found among them)" % (n, r["output_rows"], r["keys"], r["matched"]),
            "Run again (inside REPEATABLE READ if the source is being written), with the parts of one "
            "sabre_partitions call.")


# ---------------------------------------------------------------------------- entry points
@E.entry_point
def run_plan(plpy, source, quasi_identifiers, sensitive, t, k, method, output, options):
    """sabre_partitions: the parts of a partitioned run, for a client running them in parallel."""
    req = request.build(plpy, source, None, quasi_identifiers, sensitive, t, k, method, output, options)
    n = partitions_option(req)
    if n is None:
        raise E.invalid_parameter("sabre_partitions needs options.partitions", PARTS_HINT)
    _, parts = plan(plpy, req, n)
    opts = json.dumps(part_options(req))
    return [(j, p.rows, p.emd, p.budget, p.predicate, p.output, opts) for j, p in enumerate(parts)]


@E.entry_point
def run_publish(plpy, source, quasi_identifiers, sensitive, t, k, method, output, options, parts):
    """sabre_publish_parts: the parts' outputs (made by sabre_anonymize) published as one."""
    if not parts:
        raise E.invalid_parameter("parts must name at least one part output", "Pass sabre_partitions' part_output.")
    req = request.build(plpy, source, None, quasi_identifiers, sensitive, t, k, method, output, options)
    return publish_parts(plpy, req, list(parts), Stopwatch())
