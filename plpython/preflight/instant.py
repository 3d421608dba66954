"""sabre_instant: S-INSTANT (Nergiz, Tamersoy, Saygin, TODS 2011) inside PostgreSQL.

1. **request**: the arguments checked (the rules and parsers of ``request.py``/``common.py``);
2. **summary** (no row read): per QI its marginal from ``pg_stats`` (the paper's histogram
   variant) and, when an extended statistics object with an MCV list covers the QIs, the most
   common value combinations from ``pg_stats_ext`` (``options.statistics``); the levels of each
   QI: its hierarchy, or doubling intervals for a numerical QI (``core.instant``);
3. **phase 1**: the core's top-down walk with mu-probability (or mu-expectation when rows may
   be suppressed) and pruning; candidates sorted by predicted LM;
4. **phase 2**: candidates validated in cost order, several per scan of the source with
   ``GROUPING SETS`` (:class:`Generalizer` builds the SQL, pure); each scan also gives every
   candidate's exact outliers and LM; a candidate below one that failed is skipped
   (anti-monotonicity); the best passing one of the first scan that has one is chosen;
5. **publish**: the output written under a temporary name from the source in one statement
   that keeps only the classes passing on the rows it reads (suppressed rows removed), checked,
   swapped in and recorded in ``sabre.runs`` by ``publish.py``'s helpers.

``options.search = 'exhaustive'`` replaces phases 1-2 by the exact optimum: Incognito's
lattice top-down, one ``GROUP BY`` per node whose parents all passed (the baseline of
``sabre-pg bench --instant``).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass

import numpy as np

from sabre_pg.core import instant as I
from sabre_pg.core.checkpoint import checked
from sabre_pg.core.metrics import discernibility

from ..shared import citus
from ..shared import common as C
from ..shared import errors as E
from ..stages import publish, request, scan
from . import estimate as S
from . import expression_statistics as X

OPTION_KEYS = ("hierarchies", "threshold", "criterion", "batch", "statistics", "analyze", "hybrid", "search",
               "keep", "nulls", "replace", "cascade", "lock_timeout", "statistics_target", "expression_level")
OPTIONS_EXAMPLE = '{"hierarchies": {"education": "education_h"}, "threshold": 0.8}'
K_HINT = "k is the minimum number of rows per equivalence class."
L_HINT = "l is the minimum number of distinct sensitive values per class (distinct l-diversity)."
NO_SA = "\x00"                      # a column name PostgreSQL cannot have: the request has no SA
MAX_GROUPING = 31                   # arguments of GROUPING()
STATISTICS = ("auto", "marginals", "extended", "create", "create_expressions")
# The paper's 0.8 pruned the optimum on census-like data whose rare values (outliers) the
# independent marginals misjudge (docs/instant.md); several candidates per scan make a
# lower threshold cheap.
DEFAULT_THRESHOLD = 0.5


@dataclass(frozen=True)
class InstantRequest:
    source: dict
    columns: dict
    qis: tuple
    sa: object                      # request.Attr or None
    k: int
    l: int | None
    max_suppressed: float
    threshold: float
    criterion: str
    batch: int
    statistics: str
    analyze: bool
    hybrid: bool
    search: str
    options: request.Options        # keep, nulls, replace, cascade, lock_timeout
    output: request.Output
    given: dict

    def row_filter(self) -> str:
        if self.options.nulls != "drop":
            return ""
        return " WHERE " + " AND ".join("s.%s IS NOT NULL" % C.ident(a.name) for a in self.attrs)

    @property
    def attrs(self) -> tuple:
        return self.qis + ((self.sa,) if self.sa is not None else ())


# ------------------------------------------------------------------ 1. request

def build(plpy, source, quasi_identifiers, k, l, sensitive, max_suppressed, output, options) -> InstantRequest:
    given = C.parse_options(plpy, options, OPTION_KEYS, OPTIONS_EXAMPLE)
    k = C.check_k(k, K_HINT)
    if l is not None:
        l = C.check_k(l, L_HINT)
        if sensitive is None:
            raise E.invalid_parameter("l needs a sensitive attribute", "Pass sensitive => 'column' with l.")
    max_suppressed = _fraction(max_suppressed)
    src = C.resolve_relation(plpy, source)
    if src["relkind"] not in S.STATISTICS_RELKINDS:
        raise E.invalid_parameter("%s is %s: PostgreSQL keeps no statistics for it" % (
            src["qname"], "a view" if src["relkind"] == "v" else "not a table"),
            "sabre_instant predicts from the statistics ANALYZE keeps: pass the table itself.")
    citus.refuse_distributed(plpy, src, "sabre_instant", "its search counts the rows with GROUPING SETS, which "
                             "Citus does not run on a distributed table",
                             "Run sabre_anonymize, which runs on distributed tables, or sabre_instant on a local "
                             "copy of the table (which copies every row to the coordinator).")
    columns = C.columns(plpy, src["oid"])
    named = dict(columns, **{NO_SA: {"category": "S", "type": "text", "typname": "text", "notnull": True}})
    qis, sa = request.attributes(named, quasi_identifiers, NO_SA if sensitive is None else sensitive,
                                 given.get("hierarchies"))
    sa = None if sa.name == NO_SA else sa
    general = {key: given[key] for key in ("keep", "nulls", "replace", "cascade", "lock_timeout") if key in given}
    opts = request.parse_options(general, columns, qis)
    if sa is not None and sa.name in opts.keep:
        raise E.duplicate_column('options.keep column "%s" is the sensitive attribute' % sa.name,
                                 "The sensitive attribute is published anyway; keep other columns.")
    out = request.output_names(plpy, src, output if output is not None else
                               C.qname(None, src["nspname"], src["relname"] + "_instant"))
    threshold = given.get("threshold", DEFAULT_THRESHOLD)
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold <= 1:
        raise E.invalid_parameter("options.threshold must be a number in (0, 1]",
                                  "The mu-probability a candidate needs (default %g; the paper uses 0.8)." % DEFAULT_THRESHOLD)
    criterion = request._choice(given, "criterion", "expectation" if max_suppressed > 0 else "probability",
                                ("probability", "expectation"),
                                "'probability' (mu-probability >= threshold) or 'expectation' (expected "
                                "outliers <= max_suppressed rows; the default when max_suppressed > 0).")
    batch = request._integer(given, "batch", 4, 1, 30, "Candidates validated per scan of the source.")
    statistics = request._choice(given, "statistics", "auto", STATISTICS,
                                 "'marginals' (pg_stats), 'extended' (a pg_stats_ext MCV list on the QIs), "
                                 "'create' (create one, ANALYZE, use it), 'create_expressions' (an MCV list on the "
                                 "QIs' generalization expressions, for this call) or 'auto' (extended when one exists).")
    for key in ("statistics_target", "expression_level"):
        if key in given and statistics != "create_expressions":
            raise E.invalid_parameter("options.%s applies to options.statistics = 'create_expressions'" % key,
                                      "Pass both, or leave options.%s out." % key)
    search = request._choice(given, "search", "instant", ("instant", "exhaustive"),
                             "'instant' (S-INSTANT) or 'exhaustive' (the optimum, one scan per lattice node).")
    flags = [request.boolean_option(given, name, False, hint) for name, hint in (
        ("analyze", "true runs ANALYZE on the QIs first (the table's owner only)."),
        ("hybrid", "true uses the normal approximation (HYBRID) for buckets of 9 or more expected rows."))]
    src["read"] = C.read_sql(src, columns, [a.name for a in qis + ([sa] if sa else [])] + list(opts.keep))
    req = InstantRequest(src, columns, tuple(qis), sa, k, l, max_suppressed, float(threshold), criterion, batch,
                         statistics, flags[0], flags[1], search, opts, out, given)
    check_columns(req)
    return req


def _fraction(value) -> float:
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise E.invalid_parameter("max_suppressed must be a fraction in [0, 1)",
                                  "The share of rows that may be suppressed, e.g. 0.01.")
    return float(value)


def check_columns(req: InstantRequest):
    """The output's columns do not collide: ec_id, the QIs as published, the SA, kept columns."""
    seen = {"ec_id": "sabre's own column"}
    named = [(c, "quasi-identifier %s" % a.name) for a in req.qis for c in a.published_as()]
    named += ([(req.sa.name, "the sensitive attribute")] if req.sa else []) + [(c, "options.keep") for c in req.options.keep]
    for name, origin in named:
        if name in seen:
            raise E.duplicate_column('the output would have two columns named "%s" (%s and %s)' % (
                name, seen[name], origin), "Rename one of the source columns in a view: a numerical "
                "quasi-identifier x is published as x_lo and x_hi.")
        seen[name] = origin


# ------------------------------------------------------------------ 2. the summary

@dataclass(frozen=True)
class Prepared:
    summary: I.Summary
    hierarchies: dict               # {QI name: Hierarchy} of the categorical QIs
    rows: int                       # N estimated
    sa_probs: np.ndarray | None
    described: str                  # where the statistics came from
    expressions: dict | None = None     # the expression statistics made for the call (their facts)


def prepare(plpy, req: InstantRequest) -> Prepared:
    for a in req.qis:
        if a.numerical:
            continue
        if a.hierarchy_name is None:
            raise E.SabreError(E.UNDEFINED_OBJECT, 'quasi-identifier "%s" (%s) has no hierarchy' % (
                a.name, a.col["type"]), 'A categorical quasi-identifier generalizes along a hierarchy: define one '
                'with sabre_define_hierarchy and name it in options.hierarchies, e.g. {"hierarchies": {"%s": '
                '"%s_h"}}.' % (a.name, a.name))
    named = C.load_hierarchies(plpy, [(a.hierarchy_name, 'for column "%s"' % a.name) for a in req.qis
                                      if not a.numerical])
    hierarchies = {a.name: named[a.hierarchy_name] for a in req.qis if not a.numerical}
    S.check_privileges(plpy, req.source, req.attrs, "sabre_instant")
    if req.statistics == "create":
        create_statistics(plpy, req)
    elif req.analyze:
        S.run_analyze(plpy, req.source, req.attrs)
    stats, analyzed = S.read_statistics(plpy, req.source, req.attrs, req.analyze or req.statistics == "create")
    rows = S.estimated_rows(stats, req.qis[0], req.qis[1:] + ((req.sa,) if req.sa else ())) \
        if req.options.nulls == "drop" else int(round(stats[req.qis[0].name].reltuples))
    if rows < 1:
        raise scan.no_rows(req.source["qname"], req.options.nulls == "drop")
    joint = read_joint(plpy, req) if req.statistics in ("auto", "extended", "create") else None
    if req.statistics == "extended" and joint is None:
        raise E.not_in_prerequisite_state(
            "%s has no extended statistics with an MCV list on %s" % (req.source["qname"], ", ".join(
                C.ident(a.name) for a in req.qis)),
            "Pass options.statistics = 'create' (the table's owner), or CREATE STATISTICS ... (mcv) ON %s FROM %s "
            "and ANALYZE it." % (", ".join(C.ident(a.name) for a in req.qis), req.source["qname"]))
    extra = {} if joint is None else {a.name: joint[0][:, i] for i, a in enumerate(req.qis)}
    levels = tuple(qi_levels(a, stats[a.name], hierarchies.get(a.name), extra.get(a.name)) for a in req.qis)
    check_lattice(levels)
    summary = I.Summary(levels)
    if joint is not None:
        cells = np.stack([cell_index(q, joint[0][:, i]) for i, q in enumerate(levels)], axis=1)
        summary = I.Summary(levels, cells, np.asarray(joint[1], dtype=np.float64))
    made = X.build(plpy, req, levels, hierarchies) if req.statistics == "create_expressions" else None
    if made is not None:
        summary = I.Summary(levels, made.cells, made.freqs, made.level)
    sa_probs = sa_distribution(stats[req.sa.name], req.sa) if req.sa is not None and req.l else None
    described = "pg_stats marginals of %d quasi-identifiers (analyzed %s)%s%s; %d rows estimated" % (
        len(req.qis), analyzed or "at an unknown time",
        "" if joint is None else " + pg_stats_ext MCV list of %d combinations (%.1f%% of rows)" % (
            len(joint[1]), 100 * float(np.sum(joint[1]))),
        "" if made is None else " + expression statistics at levels %s, MCV list of %d combinations (%.1f%% of "
        "rows)" % (list(made.level), len(made.freqs), 100 * made.facts["share"]), rows)
    return Prepared(summary, hierarchies, rows, sa_probs, described, made.facts if made is not None else None)


def check_lattice(levels) -> int:
    """The lattice's node count; above ``core.instant.MAX_LATTICE_NODES`` an error (54000)
    before any node is made or any row read."""
    try:
        return I.check_lattice(levels)
    except I.LatticeTooLarge as e:
        raise E.program_limit_exceeded(
            str(e), "Use coarser hierarchies (fewer levels: a level that merges few values adds nodes but little "
            "choice), fewer quasi-identifiers, or one hierarchy for a numerical quasi-identifier; the lattice "
            "has one node per combination of levels (docs/instant.md, \"Bounds\").")


def qi_levels(a, stats: S.ColumnStatistics, hierarchy, extra_values) -> I.QILevels:
    """A QI's levels over its marginal: a hierarchy's leaves, or the numerical values."""
    if hierarchy is not None:
        freqs = dict(zip([str(v) for v in stats.mcv_values], stats.mcv_freqs))
        missing = sorted(v for v in list(freqs) + [str(v) for v in (extra_values if extra_values is not None else ())]
                         if v not in hierarchy.leaf_pos)
        if missing:
            raise scan.missing_error(a, len(set(missing)), sorted(set(missing))[:5])
        rest = [leaf for leaf in hierarchy.leaves if leaf not in freqs]
        share = stats.rest() / len(rest) if rest else 0.0
        probs = np.array([freqs.get(leaf, share) for leaf in hierarchy.leaves]) + 1e-12
        return I.hierarchy_levels(a.name, hierarchy, probs)
    values, shares = S.numerical_shares(stats, integer_like(a))
    if extra_values is not None and len(extra_values):
        added = np.setdiff1d(np.asarray(extra_values, dtype=np.float64), values)
        values, shares = np.concatenate((values, added)), np.concatenate((shares, np.zeros(len(added))))
    if not len(values):
        raise E.not_in_prerequisite_state('no statistics on the values of "%s"' % a.name, S.NO_STATISTICS_HINT % (
            "the table", C.ident(a.name)))
    _check_binnable(a, values)
    return I.interval_levels(a.name, values, shares + 1e-12, integer_like(a))


BINNABLE = 2.0 ** 52      # |value| below which float8 bins of integers (and spans of floats) are exact enough


def _check_binnable(a, values):
    """22023 when a numerical QI's values reach where sabre_instant's float8 bins are not exact
    (integers beyond 2^52, a float span that overflows, a numeric beyond float8): its bounds
    would no longer be truthful.  sabre_anonymize takes any range."""
    v = np.asarray(values, dtype=np.float64)
    low, high = float(v.min()), float(v.max())
    limit = BINNABLE if integer_like(a) else float(C.NUMERIC_FLOAT_MAX)
    if max(abs(low), abs(high)) >= limit or not np.isfinite(high - low):
        raise E.invalid_parameter(
            'quasi-identifier "%s" has values from %r to %r, beyond what sabre_instant bins exactly in float8 '
            "(|value| < %.0f%s)" % (a.name, low, high, limit, "" if integer_like(a) else ", with a finite span"),
            "Use sabre_anonymize, which publishes any range exactly, or generalize the column in a view first.")


def integer_like(a) -> bool:
    """Values one apart are neighbours (integers; dates as days)."""
    return a.typname in C.INTEGER_TYPES or a.typname == "date"


def cell_index(q: I.QILevels, values) -> np.ndarray:
    """Level-0 cells of the values of MCV items (leaf text or float)."""
    position = {v: i for i, v in enumerate(q.cells)}
    return np.array([position[v if q.intervals is None else float(v)] for v in values], dtype=np.int64)


def sa_distribution(stats: S.ColumnStatistics, sa) -> np.ndarray:
    """The sensitive values' shares (independent of the QIs under the marginal summary)."""
    if sa.numerical:
        return S.numerical_shares(stats, integer_like(sa))[1]
    others = stats.others()
    shares = list(stats.mcv_freqs) + ([stats.rest() / others] * others if others else [])
    return np.asarray(shares, dtype=np.float64)


EXTENDED_SQL = (
    "SELECT e.attnames::pg_catalog.text[] AS attnames, e.most_common_vals AS vals, "
    "e.most_common_val_nulls AS nulls, e.most_common_freqs AS freqs FROM pg_catalog.pg_stats_ext AS e "
    "WHERE e.schemaname = $1 AND e.tablename = $2 AND e.most_common_vals IS NOT NULL "
    "AND e.attnames @> $3::pg_catalog.name[] AND e.attnames <@ $4::pg_catalog.name[] ORDER BY e.inherited DESC, pg_catalog.cardinality(e.attnames), "
    "e.statistics_name LIMIT 1")


def read_joint(plpy, req):
    """(items x QIs values, frequencies) of the best pg_stats_ext MCV list covering the QIs,
    projected on them (items with a NULL QI left out), or None."""
    # (only lists on columns read safely: pg_stats_ext prints every column's values with its output function)
    found = plpy.execute(plpy.prepare(EXTENDED_SQL, ["name", "name", "text[]", "text[]"]), [
        req.source["nspname"], req.source["relname"], [a.name for a in req.qis],
        [n for n, c in req.columns.items() if not c["unsafe"]]])
    if not len(found):
        return None
    r = found[0]
    where = [r["attnames"].index(a.name) for a in req.qis]
    keep = [i for i, nulls in enumerate(r["nulls"]) if not any(nulls[j] for j in where)]
    columns = []
    for a, j in zip(req.qis, where):
        texts = [r["vals"][i][j] for i in keep]
        columns.append(S.decode_list(plpy, a, texts) if a.numerical else texts)
    values = np.empty((len(keep), len(req.qis)), dtype=object)
    for i, column in enumerate(columns):
        values[:, i] = column
    return values, np.asarray([r["freqs"][i] for i in keep], dtype=np.float64)


def create_statistics(plpy, req):
    """``CREATE STATISTICS IF NOT EXISTS`` an MCV list on the QIs (named after the source and
    the QIs, in the source's schema; left in place for later runs) and ANALYZE."""
    S.check_owner(plpy, req.source, "options.statistics = 'create': only the owner of %s can create statistics "
                  "on it" % req.source["qname"], "Ask its owner to create them, or use 'marginals'.")
    digest = plpy.execute(plpy.prepare("SELECT pg_catalog.md5($1) AS h", ["text"]),
                          [json.dumps([a.name for a in req.qis])])[0]["h"][:8]
    name = C.qname(None, req.source["nspname"], "%s_sabre_mcv_%s" % (req.source["relname"][:40], digest))
    with C.quietly(plpy):   # a later run: 'statistics object ... already exists, skipping'
        plpy.execute("CREATE STATISTICS IF NOT EXISTS %s (mcv) ON %s FROM %s" % (
            name, ", ".join(C.ident(a.name) for a in req.qis), req.source["qname"]))
    plpy.execute("ANALYZE %s (%s)" % (req.source["qname"], ", ".join(C.ident(a.name) for a in req.attrs)))


# ------------------------------------------------------------------ SQL of a generalization (pure)

class Params:
    """Positional parameters of one statement."""

    def __init__(self):
        self.values, self.types = [], []

    def add(self, value, sqltype: str) -> str:
        self.values.append(value)
        self.types.append(sqltype)
        return "$%d" % len(self.values)


class Generalizer:
    """SQL of the generalizations of the QIs over ``source AS s``: each categorical QI joins its
    hierarchy's leaves once (``h<i>.pos``); a (QI, level) below the top is a group key column
    ``c<i>_<j>`` with its LM and its published values."""

    def __init__(self, req: InstantRequest, levels, hierarchies):
        self.req, self.levels, self.hierarchies = req, levels, hierarchies
        self.params = Params()
        self.joins = []
        self.leaf_param = {}
        for i, (a, q) in enumerate(zip(req.qis, levels)):
            if q.intervals is None:
                self.leaf_param[i] = self.params.add(list(self.hierarchies[a.name].leaves), "text[]")
                self.joins.append(C.leaf_position_join("h%d" % i, len(self.params.values),
                                                       "(s.%s)::pg_catalog.text" % C.ident(a.name)))

    def _number(self, i) -> str:
        a = self.req.qis[i]
        return C.numeric_expr(None, a.name, a.col, "s.")

    def key(self, i: int, j: int) -> str:
        """The group key of QI i at level j (< top)."""
        q = self.levels[i]
        if q.intervals is None:
            if j == 0:
                return "h%d.pos" % i
            return "(%s::pg_catalog.int4[])[h%d.pos]" % (self.params.add(q.groups[j].tolist(), "int4[]"), i)
        if j == 0:
            return "s.%s" % C.ident(self.req.qis[i].name)
        return "pg_catalog.floor((%s - %r::pg_catalog.float8) / %r::pg_catalog.float8)" % (
            self._number(i), q.intervals.origin, q.intervals.widths[j - 1])

    def lm(self, i: int, j: int, column: str) -> str | None:
        """The LM of the group in ``column`` (NULL when not grouped there); None when 0."""
        q = self.levels[i]
        if j == 0:
            return None
        if q.intervals is None:
            return "(%s::pg_catalog.float8[])[%s + 1]" % (self.params.add(q.lm[j].tolist(), "float8[]"), column)
        iv, w = q.intervals, q.intervals.widths[j - 1]
        unit = 1.0 if iv.integer else 0.0
        # (GREATEST and LEAST skip NULLs: a column not grouped in a set must stay NULL)
        return ("CASE WHEN %s IS NOT NULL THEN LEAST(GREATEST(LEAST(%r + (%s + 1) * %r - %r, %r) - "
                "GREATEST(%r + %s * %r, %r), 0) / %r, 1) END"
                % (column, iv.origin, column, w, unit, iv.high, iv.origin, column, w, iv.low, (iv.high - iv.low) or 1.0))

    def published(self, i: int, j: int, column: str) -> list:
        """The output columns of QI i at level j (group key in ``column``)."""
        a, q = self.req.qis[i], self.levels[i]
        name = [C.ident(n) for n in a.published_as()]
        if q.intervals is None:
            h = self.hierarchies[a.name]
            if j == 0:
                return ["(s.%s)::pg_catalog.text AS %s" % (C.ident(a.name), name[0])]
            nodes = np.unique(h.anc[:, j])
            labels = self.params.add([h.labels[n] for n in nodes], "text[]")
            return ["(%s::pg_catalog.text[])[%s + 1] AS %s" % (labels, column, name[0])]
        raw = "s.%s" % C.ident(a.name)
        if j == 0:
            return ["%s AS %s" % (raw, name[0]), "%s AS %s" % (raw, name[1])]
        if j == q.top:
            return ["pg_catalog.min(%s) OVER () AS %s" % (raw, name[0]), "pg_catalog.max(%s) OVER () AS %s" % (raw, name[1])]
        iv, w = q.intervals, q.intervals.widths[j - 1]
        unit = 1.0 if iv.integer else 0.0
        return [publish.from_float("(%r + %s * %r)" % (iv.origin, column, w), a.col) + " AS %s" % name[0],
                publish.from_float("(%r + (%s + 1) * %r - %r)" % (iv.origin, column, w, unit), a.col)
                + " AS %s" % name[1]]

    def bad(self) -> str:
        """0, 1 (a categorical value that is no leaf) or 2 (a NULL) per row."""
        nulls = " OR ".join("s.%s IS NULL" % C.ident(a.name) for a in self.req.attrs)
        missing = " OR ".join("h%d.pos IS NULL" % i for i, q in enumerate(self.levels) if q.intervals is None)
        return "CASE WHEN %s THEN 2 WHEN %s THEN 1 ELSE 0 END" % (nulls, missing or "false")

    def source(self) -> str:
        return "%s AS s %s%s" % (self.req.source["read"], " ".join(self.joins), self.req.row_filter())

    def condition(self, alias: str) -> str:
        ok = "%s.n >= %d" % (alias, self.req.k)
        return ok + (" AND %s.d >= %d" % (alias, self.req.l) if self.req.l else "")

    def validation(self, nodes, check_bad: bool) -> tuple:
        """(SQL, {node: GROUPING() value}, bad set's value): one scan grouping by every node."""
        columns = sorted({(i, j) for v in nodes for i, j in enumerate(v) if j < self.levels[i].top})
        names = ["c%d_%d" % c for c in columns] + (["bad"] if check_bad else [])
        select = ["%s AS %s" % (self.key(i, j), "c%d_%d" % (i, j)) for i, j in columns]
        select += ["%s AS bad" % self.bad()] if check_bad else []
        select += ["s.%s AS sa" % C.ident(self.req.sa.name)] if self.req.l else []
        sets = ["(%s)" % ", ".join("x.c%d_%d" % (i, j) for i, j in enumerate(v) if j < self.levels[i].top)
                for v in nodes] + (["(x.bad)"] if check_bad else [])
        width = len(names)
        ids = {v: sum(1 << (width - 1 - names.index(n)) for n in names
                      if n not in {"c%d_%d" % (i, j) for i, j in enumerate(v)}) for v in nodes}
        lms = [self.lm(i, j, "b.c%d_%d" % (i, j)) for i, j in columns]
        lm_sum = " + ".join("COALESCE(%s, 0)" % e for e in lms if e) or "0"
        grouping = "GROUPING(%s)" % ", ".join("x." + n for n in names) if names else "0"
        inner = "SELECT %s AS g, %s, pg_catalog.count(*) AS n%s FROM (SELECT %s FROM %s) AS x GROUP BY GROUPING SETS (%s)" % (
            grouping, ", ".join("x." + n for n in names) or "1 AS one",
            ", pg_catalog.count(DISTINCT x.sa) AS d" if self.req.l else "", ", ".join(select) or "1 AS one",
            self.source(), ", ".join(sets))
        ok = self.condition("b")
        sql = ("SELECT b.g, pg_catalog.sum(b.n)::pg_catalog.int8 AS rows, pg_catalog.count(*) FILTER (WHERE %s) AS classes, "
               "COALESCE(pg_catalog.sum(b.n) FILTER (WHERE NOT (%s)), 0)::pg_catalog.int8 AS outliers, "
               "COALESCE(pg_catalog.sum(b.n * (%s)) FILTER (WHERE %s), 0)::pg_catalog.float8 AS lm_kept, %s "
               "FROM (%s) AS b GROUP BY b.g" % (
                   ok, ok, lm_sum, ok, ("COALESCE(pg_catalog.sum(b.n) FILTER (WHERE b.bad = 1), 0) AS missing, "
                                        "COALESCE(pg_catalog.sum(b.n) FILTER (WHERE b.bad = 2), 0) AS nulls"
                                        if check_bad else "0 AS missing, 0 AS nulls"), inner))
        return sql, ids, (1 << width) - 1 - 1 if check_bad else None

    def materialize(self, node, table: str) -> str:
        """CREATE TABLE ``table``: the rows of the classes of ``node`` that pass on the rows this
        statement reads (the rest suppressed), generalized; classes numbered at random, rows in
        random order (one snapshot: the source is read twice by the one statement)."""
        req = self.req
        keys = ["k%d" % i for i, j in enumerate(node) if j < self.levels[i].top]
        carried = ([req.sa.name] if req.sa else []) + list(req.options.keep)
        x = "SELECT %s FROM %s" % (", ".join(
            ["%s AS k%d" % (self.key(i, j), i) for i, j in enumerate(node) if j < self.levels[i].top]
            + ["s.%s" % C.ident(c) for c in carried]
            + ["s.%s AS %s" % (C.ident(a.name), C.ident("q_" + a.name)) for a in req.qis]), self.source())
        having = "pg_catalog.count(*) >= %d" % req.k + (
            " AND pg_catalog.count(DISTINCT x.%s) >= %d" % (C.ident(req.sa.name), req.l) if req.l else "")
        grouped = ", ".join("x." + k for k in keys)
        classes = "SELECT %s FROM x GROUP BY %s HAVING %s" % (grouped or "1 AS one", grouped or "()", having)
        numbered = "SELECT c.*, pg_catalog.row_number() OVER (ORDER BY pg_catalog.random()) - 1 AS ec_id FROM classes AS c"
        join = " AND ".join("x.%s = e.%s" % (k, k) for k in keys) or "true"
        columns = self._published_from_x(node) + ["x.%s" % C.ident(c) for c in carried]
        # OFFSET 0 keeps the second read of x whole: every key is computed before the join with
        # the passing classes (one hash join on all keys), not after a join on some of them
        return ("CREATE TABLE %s AS WITH x AS NOT MATERIALIZED (%s), classes AS (%s), e AS MATERIALIZED (%s) "
                "SELECT e.ec_id::pg_catalog.int8 AS ec_id, %s FROM (SELECT * FROM x OFFSET 0) AS x JOIN e ON %s "
                "ORDER BY pg_catalog.random()" % (table, x, classes, numbered, ", ".join(columns), join))

    def _published_from_x(self, node) -> list:
        """The published columns, computed in the final select from the keys ``x.k<i>`` and
        the QIs' raw values ``x."q_<name>"``."""
        out = []
        for i, j in enumerate(node):
            a, q = self.req.qis[i], self.levels[i]
            raw = "x.%s" % C.ident("q_" + a.name)
            if q.intervals is None and j == q.top:
                h = self.hierarchies[a.name]
                out.append("%s::pg_catalog.text AS %s" % (self.params.add(h.labels[h.root], "text"), C.ident(a.name)))
                continue
            cols = self.published(i, j, "x.k%d" % i)
            out += [c.replace("s.%s" % C.ident(a.name), raw) for c in cols]
        return out


# ------------------------------------------------------------------ 4. validation (phase 2)

@dataclass(frozen=True)
class Checked:
    """A node as the data has it."""
    node: tuple
    rows: int
    classes: int
    outliers: int
    lm: float                       # exact LM, suppressed rows counting 1 in every QI

    def passes(self, max_suppressed: float) -> bool:
        return self.classes > 0 and self.outliers <= int(np.floor(max_suppressed * self.rows + 1e-9))


class Validator:
    """Scans of the source, each checking a batch of nodes; counts the scans."""

    def __init__(self, plpy, req: InstantRequest, gen: Generalizer):
        self.plpy, self.req, self.gen = plpy, req, gen
        self.scans = 0
        self.tried = 0

    def check(self, nodes) -> dict:
        gen = self.gen
        saved = len(gen.params.values)
        sql, ids, bad_id = gen.validation(nodes, self.scans == 0)
        rows = self.plpy.execute(self.plpy.prepare(sql, gen.params.types), gen.params.values)
        del gen.params.values[saved:], gen.params.types[saved:]
        self.scans += 1
        self.tried += len(nodes)
        by_id = {r["g"]: r for r in rows}
        if bad_id is not None and bad_id in by_id:
            self._report(by_id[bad_id])
        out = {}
        a = len(self.req.qis)
        for v in nodes:
            r = by_id.get(ids[v])
            if r is None:           # no row at all
                raise scan.no_rows(self.req.source["qname"], self.req.options.nulls == "drop")
            n, outliers = int(r["rows"]), int(r["outliers"])
            tops = sum(1 for i, j in enumerate(v) if j == self.gen.levels[i].top)
            lm = (r["lm_kept"] + tops * (n - outliers) + a * outliers) / (n * a)
            out[v] = Checked(v, n, int(r["classes"]), outliers, float(lm))
        return out

    def _report(self, row):
        if row["nulls"]:
            raise E.null_not_allowed(
                "%s has %d rows with NULL in a quasi-identifier%s" % (
                    self.req.source["qname"], row["nulls"], " or the sensitive attribute" if self.req.sa else ""),
                "Pass options => '{\"nulls\": \"drop\"}' to leave those rows out.")
        if row["missing"]:
            raise E.invalid_parameter(
                "%d rows of %s have a quasi-identifier value that is not a leaf of its hierarchy" % (
                    row["missing"], self.req.source["qname"]),
                "Add every value as a leaf of the hierarchy (sabre_define_hierarchy replaces it).")


def batches(candidates, validator: Validator, failed: list):
    """The candidates not below a failed node, in order, in groups of ``batch`` whose key
    columns fit one GROUPING()."""
    group, columns = [], set()
    levels = validator.gen.levels
    for v in checked(candidates):
        if any(I.below(v, f) for f in failed):
            continue
        mine = {(i, j) for i, j in enumerate(v) if j < levels[i].top}
        if group and (len(group) >= validator.req.batch or len(columns | mine) + 1 > MAX_GROUPING):
            yield group
            group, columns = [], set()
            if any(I.below(v, f) for f in failed):
                continue
        group.append(v)
        columns |= mine
    if group:
        yield group


def phase2(validator: Validator, candidates, top) -> Checked | None:
    """S-INSTANT's phase 2: candidates in cost order, a batch per scan; the passing candidate
    of least exact LM in the first batch that has one.  The top is checked last if needed."""
    failed = []
    for group in batches(list(candidates) + ([top] if top not in candidates else []), validator, failed):
        found = validator.check(group)
        passing = [c for c in found.values() if c.passes(validator.req.max_suppressed)]
        if passing:
            return min(passing, key=lambda c: (c.lm, -sum(c.node)))
        failed += list(group)
    return None


def exhaustive(validator: Validator, heights) -> Checked | None:
    """The optimal full-domain generalization: every node whose parents all passed is checked
    with one GROUP BY (top-down Incognito); the passing node of least LM."""
    passed = {}
    for v in I.lattice_nodes(heights):
        if any(p not in passed for p in I.parents(v, heights)):
            continue
        c = validator.check([v])[v]
        if c.passes(validator.req.max_suppressed):
            passed[v] = c
    return min(passed.values(), key=lambda c: (c.lm, -sum(c.node))) if passed else None


# ------------------------------------------------------------------ 5. publish

def write(plpy, req: InstantRequest, gen: Generalizer, chosen: Checked, run) -> tuple:
    """The output under a temporary name, checked: (table, classes, rows, min, max class size, sizes)."""
    table = req.output.temporary_qualified(run.run_id, "o")
    # the planner cannot estimate the join of the rows with their passing classes (a few
    # hundred): without a hint it sorts both sides for a merge join, and its cost estimate
    # turns on JIT inlining and optimization, which took longer (4 s at 1M rows) than the
    # statement's own work
    with C.settings(plpy, enable_mergejoin="off", jit="off"):
        plpy.execute(plpy.prepare(gen.materialize(chosen.node, table), gen.params.types), gen.params.values)
    diversity = ", pg_catalog.count(DISTINCT o.%s) AS d" % C.ident(req.sa.name) if req.l else ""
    got = plpy.execute("SELECT pg_catalog.array_agg(g.n) AS sizes, pg_catalog.min(%s) AS low_d FROM (SELECT o.ec_id, "
                       "pg_catalog.count(*) AS n%s FROM %s AS o GROUP BY o.ec_id) AS g" % (
                           "g.d" if req.l else "g.n", diversity, table))[0]
    sizes = np.asarray(got["sizes"] or [], dtype=np.int64)
    suppressed = chosen.rows - int(sizes.sum())
    if (len(sizes) and sizes.min() < req.k) or (req.l and got["low_d"] is not None and got["low_d"] < req.l) \
            or suppressed > int(np.floor(req.max_suppressed * chosen.rows + 1e-9)) or not len(sizes):
        raise E.source_changed(
            "the output written does not match the generalization validated (%d rows suppressed, %d allowed): "
            "the source changed while sabre_instant read it" % (suppressed, int(req.max_suppressed * chosen.rows)),
            "Run again, or call sabre_instant inside a REPEATABLE READ transaction so that all of its "
            "queries see one snapshot.")
    return table, sizes, suppressed


def comment(plpy, req: InstantRequest, run, node):
    text = "sabre-pg output of run %d: %s anonymized with S-INSTANT, k = %d%s, levels %s" % (
        run.run_id, req.source["qname"], req.k, ", l = %d" % req.l if req.l else "", list(node))
    plpy.execute("COMMENT ON TABLE %s IS %s" % (req.output.qualified(), plpy.quote_literal(run.comment(text))))


def record(plpy, req: InstantRequest, run, facts: dict) -> int:
    name = req.output.qualified()
    out = plpy.execute(plpy.prepare(
        "SELECT %s($1, $2::pg_catalog.regclass, $3::pg_catalog.regclass[], $4::pg_catalog.oid::pg_catalog.regclass, "
        "$5::jsonb), $2::pg_catalog.regclass::pg_catalog.oid AS output" % C.catalog("run_record"),
        ["int8", "text", "text[]", "oid", "text"]), [run.run_id, name, [name], req.source["oid"], json.dumps(facts)])
    return out[0]["output"]


# ------------------------------------------------------------------ the entry point

@E.entry_point
def instant(plpy, source, quasi_identifiers, k, l, sensitive, max_suppressed, output, options):
    """sabre_instant: one row (output, levels, scans, candidates_tried, predicted_probability,
    suppressed, lm, classes, seconds)."""
    started = time.perf_counter()
    with C.settings(plpy, work_mem="256MB"):
        req = build(plpy, source, quasi_identifiers, k, l, sensitive, max_suppressed, output, options)
        clock = time.perf_counter()
        prep = prepare(plpy, req)
        summary_seconds = time.perf_counter() - clock
        cond = I.Condition.build(req.k, req.l, prep.sa_probs)
        levels = prep.summary.qis
        top = tuple(q.top for q in levels)
        gen = Generalizer(req, levels, prep.hierarchies)
        validator = Validator(plpy, req, gen)
        phase1_seconds = 0.0
        if req.search == "exhaustive":
            clock = time.perf_counter()
            chosen, evaluated = exhaustive(validator, list(top)), 0
        else:
            clock = time.perf_counter()
            found = I.walk(prep.summary, prep.rows, cond, req.threshold, req.criterion,
                           req.max_suppressed * prep.rows, hybrid=req.hybrid)
            phase1_seconds = time.perf_counter() - clock
            clock = time.perf_counter()
            chosen, evaluated = phase2(validator, [c.node for c in found.candidates], top), found.evaluated
        if chosen is None:
            raise E.invalid_parameter(
                "no full-domain generalization of %s is %d-anonymous%s with at most %g of its rows suppressed, "
                "not even the top of the lattice (every quasi-identifier fully generalized)" % (
                    req.source["qname"], req.k, " and distinct %d-diverse" % req.l if req.l else "", req.max_suppressed),
                "Lower k%s, or allow suppression with max_suppressed." % (" or l" if req.l else ""))
        validate_seconds = time.perf_counter() - clock
        probability = I.mu_probability(prep.summary.likelihoods(chosen.node), prep.rows, cond, hybrid=req.hybrid)
        run = publish.begin(plpy, req)
        prev = publish.previous(plpy, req)
        clock = time.perf_counter()
        table, sizes, suppressed = write(plpy, req, gen, chosen, run)
        write_seconds = time.perf_counter() - clock
        publish.swap(plpy, req, run, prev, {"": table})
        comment(plpy, req, run, chosen.node)
        seconds = time.perf_counter() - started
        facts = {"quasi_identifiers": [a.name for a in req.qis], "sensitive": req.sa.name if req.sa else "",
                 "t": 1.0, "k": req.k, "method": "instant" if req.search == "instant" else "exhaustive",
                 "options": dict(req.given, instant={
                     "l": req.l, "max_suppressed": req.max_suppressed, "levels": list(chosen.node),
                     "scans": validator.scans, "candidates_tried": validator.tried, "evaluated": evaluated,
                     "predicted_probability": probability, "suppressed": suppressed, "lm": chosen.lm,
                     "statistics": prep.described, "expression_statistics": prep.expressions}),
                 "rows": int(sizes.sum()), "classes": len(sizes), "min_class_size": int(sizes.min()),
                 "max_class_size": int(sizes.max()), "discernibility": discernibility(sizes),
                 "phases": {"summary": summary_seconds, "phase1": phase1_seconds, "validate": validate_seconds, "write": write_seconds},
                 "seconds": seconds}
        output_oid = record(plpy, req, run, facts)
    return [(output_oid, list(chosen.node), validator.scans, validator.tried, probability, suppressed,
             chosen.lm, len(sizes), seconds)]
