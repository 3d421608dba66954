"""Stage 2 of sabre_anonymize: what is read from the source, and its consistency checks.

* hierarchies of the categorical attributes (named ones from the catalog, else flat);
* the **SA summary**: the sensitive attribute's frequencies from one ``GROUP BY``, on which
  bucketization and ECSize run before any row is read (an infeasible k fails fast);
* the **read**: one scan of the key and every attribute in binary, built and decoded by
  :class:`ReadPlan` (pure functions of the request: unit-tested without a server), with the
  NULL and non-finite counts that validate it.  Its SA frequencies must equal the summary's,
  else another session changed the source in between (40001).

A categorical value travels as the low 32 bits of a 64-bit hash of its text (two values per
bigint element) and is mapped to the hierarchy leaf with those bits; the seed is chosen so
that the leaves' low 32 bits are distinct.  Exactness does not rest on 32 bits: the scan also
sums the hashes' high 32 bits, and the sum over the mapped leaves must equal it -- a value that
is no leaf but shares a leaf's low 32 bits changes the sum unless its high 32 bits also match
(probability 2^-32 on top of the 2^-32 collision).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from sabre_pg.core.emd import SADomain
from sabre_pg.core.hierarchy import Hierarchy
from sabre_pg.core.sabre import QuasiIdentifier

from ..shared import common as C
from ..shared import errors as E
from ..shared import transfer as T

HASH = "pg_catalog.hashtextextended(({v})::pg_catalog.text, {seed})"
LOW32 = 4294967295
NONFINITE = "IN ('NaN'::float8, 'Infinity'::float8, '-Infinity'::float8)"


@dataclass(frozen=True)
class Encoding:
    """How a categorical attribute's values (or a ``numeric`` SA's) travel: as hashes of their
    text, mapped to positions in ``leaves`` (a hierarchy's leaves, or the SA's distinct values
    in order)."""
    leaves: list
    seed: int                      # of hashtextextended
    leaf_hashes: np.ndarray        # low 32 bits of each leaf's hash, in leaf order
    check_hashes: np.ndarray       # the full 64-bit hashes


@dataclass(frozen=True)
class SASummary:
    """The SA's frequencies: ``counts`` per SA code.  A numerical SA's codes index its sorted
    ``distinct`` values (int8 or float8), or for a ``numeric`` SA its distinct values' exact
    text in numeric order (``ranks``); a categorical SA's codes are leaf positions of
    ``hierarchy``."""
    rows: int
    counts: np.ndarray
    distinct: np.ndarray | None
    hierarchy: Hierarchy | None
    ranks: list | None = None
    spans: tuple | None = None     # (rows, ((count, min, max), ...)) of the expressions asked for

    def domain(self) -> SADomain:
        if self.hierarchy is None:
            return SADomain("numerical", m=len(self.counts))
        return SADomain("categorical", hierarchy=self.hierarchy)

    def text_codes(self) -> list | None:
        """What the read maps hashed SA values to: leaves, or a numeric SA's ranks."""
        return self.ranks if self.ranks is not None else (self.hierarchy.leaves if self.hierarchy else None)


@dataclass(frozen=True)
class Scan:
    rows: int
    keys: object                   # int64 array (integer keys) or list of the keys' text
    data: list                     # per attribute: numbers, or leaf positions
    sa_codes: np.ndarray
    codes_by_sa: np.ndarray | None = None     # several SAs: one column of codes per SA


# a float QI whose magnitude reaches this has a span (max - min) that may overflow float8
HUGE = 2.0 ** 1020


def quasi_identifiers(req, columns, hierarchies) -> list:
    """The engine's QIs of the read ``columns`` (per QI, in the request's order)."""
    return [QuasiIdentifier(a.name, engine_values(columns[i]), hierarchies.get(a.name))
            for i, a in enumerate(req.qis)]


def engine_values(values):
    """A column as the engine gets it: float values near float8's limit (|v| >= 2^1020, e.g.
    +-9e307, whose span max - min overflows to infinity) scaled by 2^-8, so the engine's Hilbert
    keys, spans and information loss stay finite (its geometry is scale-free).  The published
    ranges never come from these: publish takes each class's bounds from the scanned values."""
    values = np.asarray(values)
    if values.dtype.kind == "f" and len(values) and float(np.max(np.abs(values))) >= HUGE:
        return np.ldexp(values, -8)
    return values


def encode(plpy, leaves: list) -> Encoding:
    """The leaves' hashes under the first seed that makes their low 32 bits distinct."""
    plan = plpy.prepare(
        "SELECT %s AS h FROM (SELECT v FROM pg_catalog.unnest($1::text[]) WITH ORDINALITY AS u(v, i) "
        "ORDER BY i) AS u" % T.binary_agg(HASH.format(v="u.v", seed="$2"), "int8"), ["text[]", "int8"])
    for seed in range(64):
        full = T.decode_array(plpy.execute(plan, [leaves, seed])[0]["h"], "int8", len(leaves))
        low = full & LOW32
        if len(np.unique(low)) == len(low):
            return Encoding(list(leaves), seed, low, full)
    raise E.SabreError(E.INTERNAL, "cannot find distinct 32-bit hashes for the %d leaves of a hierarchy"
                       % len(leaves), "Hierarchies of more than about 100,000 leaves are not supported.")


def encodings(plpy, hierarchies: dict) -> dict:
    """{attribute: Encoding} of ``hierarchies`` ({attribute: Hierarchy}); attributes sharing one
    Hierarchy object (a name several attributes use) share one encoding, hashed once."""
    by_object, found = {}, {}
    for name, h in hierarchies.items():
        if id(h) not in by_object:
            by_object[id(h)] = encode(plpy, h.leaves)
        found[name] = by_object[id(h)]
    return found


def hierarchies(plpy, req) -> dict:
    """{attribute name: Hierarchy} of the categorical QIs, and of the SA when one is named
    (a flat SA hierarchy comes from the SA summary)."""
    found, sensitive = {}, [sa.name for sa in req.sensitive]
    # every named hierarchy in one read, each name once (the per-call cap counts each use)
    named = C.load_hierarchies(plpy, [(a.hierarchy_name, 'for column "%s"' % a.name) for a in req.attrs
                                      if a.hierarchy_name is not None and not a.numerical])
    for a in req.attrs:
        if a.numerical or (a.name in sensitive and a.hierarchy_name is None):
            continue
        if a.hierarchy_name is not None:
            found[a.name] = named[a.hierarchy_name]
            continue
        where = req.row_filter() or " WHERE s.%s IS NOT NULL" % C.ident(a.name)
        values = plpy.execute(
            "SELECT pg_catalog.array_agg(v ORDER BY v) AS vs FROM (SELECT DISTINCT (s.%s)::pg_catalog.text AS v "
            "FROM %s AS s%s) d" % (C.ident(a.name), req.source["read"], where))[0]["vs"]
        if values:
            found[a.name] = Hierarchy.flat(values, name=a.name)
    return found


def sa_summary(plpy, req, hierarchy: Hierarchy | None, sa=None, spans=()) -> SASummary:
    """The SA frequency summary: one ``GROUP BY`` over the sensitive column (``sa``, by
    default the request's first).  ``spans``: float8 SQL expressions (over ``s.``) whose
    count, min and max over the rows the same scan also gives, as ``SASummary.spans`` (the
    split of a partitioned run: its QIs' spans, docs/scale-out.md).

    A value that is no leaf of a named hierarchy is reported here, matched exactly by text; a
    numerical SA's distinct values are int8 for integer types, else the float8 of the read.
    """
    sa, source, where = sa or req.sa, req.source["read"], req.row_filter()
    c = "s." + C.ident(sa.name)
    inner, outer = _span_sql(spans)
    if sa.numerical and sa.typname == "numeric":
        return _numeric_summary(plpy, req, c, sa, spans)
    if sa.numerical:
        integer = sa.typname in C.INTEGER_TYPES
        vtype = "int8" if integer else "float8"
        r = plpy.execute(
            "SELECT coalesce(sum(g.n) FILTER (WHERE g.v IS NULL), 0) AS nulls, "
            "coalesce(sum(g.n) FILTER (WHERE g.v IS NOT NULL), 0) AS total, "
            "count(*) FILTER (WHERE g.v IS NOT NULL) AS m, %s AS bad, "
            "string_agg(%ssend(g.v), ''::bytea ORDER BY g.v) FILTER (WHERE g.v IS NOT NULL) AS vs, "
            "string_agg(int8send(g.n), ''::bytea ORDER BY g.v) FILTER (WHERE g.v IS NOT NULL) AS ns%s "
            "FROM (SELECT %s AS v, count(*) AS n%s FROM %s AS s%s GROUP BY 1) AS g" % (
                "0" if integer else "coalesce(sum(g.n) FILTER (WHERE g.v %s), 0)" % NONFINITE,
                vtype, outer, "%s::int8" % c if integer else C.numeric_expr(plpy, sa.name, sa.col, "s."),
                inner, source, where))[0]
        if r["bad"]:
            raise nonfinite_error([(sa.name, r["bad"])], nonfinite_values(plpy, req, [(sa.name, r["bad"])]))
        distinct = T.decode_array(r["vs"], vtype, r["m"])
        counts = T.decode_array(r["ns"], "int8", r["m"])
    else:
        r = plpy.execute(
            "SELECT coalesce(sum(g.n) FILTER (WHERE g.v IS NULL), 0) AS nulls, "
            "coalesce(sum(g.n) FILTER (WHERE g.v IS NOT NULL), 0) AS total, "
            "array_agg(g.v) FILTER (WHERE g.v IS NOT NULL) AS vs, "
            "array_agg(g.n) FILTER (WHERE g.v IS NOT NULL) AS ns%s "
            "FROM (SELECT %s::text AS v, count(*) AS n%s FROM %s AS s%s GROUP BY 1) AS g" % (
                outer, c, inner, source, where))[0]
        if hierarchy is None and r["vs"]:           # no hierarchy named: the flat one
            hierarchy = Hierarchy.flat(r["vs"], name=sa.name)
        counts, distinct = _leaf_counts(sa, hierarchy, r["vs"] or [], r["ns"] or []), None
    _check_rows(plpy, req, r)
    return SASummary(int(r["total"]), counts, distinct, hierarchy, spans=_spans_of(r, spans))


def _span_sql(spans) -> tuple:
    """(inner, outer) SQL of :func:`sa_summary`'s ``spans``: per SA group, then over the groups."""
    inner = "".join(", pg_catalog.count(%s) AS c%d, pg_catalog.min(%s) AS lo%d, pg_catalog.max(%s) AS hi%d"
                    % (e, i, e, i, e, i) for i, e in enumerate(spans))
    outer = (", pg_catalog.sum(g.n) AS all_rows" if spans else "") + "".join(
        ", pg_catalog.sum(g.c%d) AS c%d, pg_catalog.min(g.lo%d) AS lo%d, pg_catalog.max(g.hi%d) AS hi%d"
        % ((i,) * 6) for i in range(len(spans)))
    return inner, outer


def _spans_of(r, spans) -> tuple | None:
    if not spans:
        return None
    return int(r["all_rows"] or 0), tuple((int(r["c%d" % i] or 0), r["lo%d" % i], r["hi%d" % i])
                                          for i in range(len(spans)))


def _numeric_summary(plpy, req, column, sa, spans=()) -> SASummary:
    """A ``numeric`` SA, exactly: its distinct values in numeric order (their canonical text,
    ``trim_scale``, is what the read hashes), so no two values merge as they would in float8."""
    source, where = req.source["read"], req.row_filter()
    inner, outer = _span_sql(spans)
    r = plpy.execute(
        "SELECT COALESCE(pg_catalog.sum(g.n) FILTER (WHERE g.v IS NULL), 0) AS nulls, "
        "COALESCE(pg_catalog.sum(g.n) FILTER (WHERE g.v IS NOT NULL), 0) AS total, "
        "COALESCE(pg_catalog.sum(g.n) FILTER (WHERE g.v IN ('NaN'::numeric, 'Infinity'::numeric, "
        "'-Infinity'::numeric)), 0) AS bad, "
        "pg_catalog.array_agg(pg_catalog.trim_scale(g.v)::text ORDER BY g.v) FILTER (WHERE g.v IS NOT NULL) AS vs, "
        "pg_catalog.array_agg(g.n ORDER BY g.v) FILTER (WHERE g.v IS NOT NULL) AS ns%s "
        "FROM (SELECT %s AS v, pg_catalog.count(*) AS n%s FROM %s AS s%s GROUP BY 1) AS g" % (
            outer, column, inner, source, where))[0]
    if r["bad"]:
        raise nonfinite_error([(sa.name, r["bad"])], nonfinite_values(plpy, req, [(sa.name, r["bad"])]))
    _check_rows(plpy, req, r)
    return SASummary(int(r["total"]), np.asarray(r["ns"] or [], dtype=np.int64), None, None, list(r["vs"] or []),
                     _spans_of(r, spans))


def _check_rows(plpy, req, r):
    """The NULL error (options.nulls = 'error') and the no-rows error of the SA summary."""
    where = req.row_filter()
    if r["nulls"] and req.options.nulls == "error":
        raise null_error(req.attrs, plpy.execute("SELECT count(*) AS n, %s FROM %s AS s" % (
            ", ".join("count(s.%s) AS c%d" % (C.ident(a.name), i) for i, a in enumerate(req.attrs)),
            req.source["read"]))[0])
    if r["total"] == 0:
        raise no_rows(req.source["qname"], where)


def _leaf_counts(sa, hierarchy, values, counts) -> np.ndarray:
    leaf = {v: i for i, v in enumerate(hierarchy.leaves)} if hierarchy else {}
    missing = sorted(v for v in values if v not in leaf)
    if missing:
        raise missing_error(sa, len(missing), missing[:5])
    out = np.zeros(len(leaf), dtype=np.int64)
    for v, n in zip(values, counts):
        out[leaf[v]] = n
    return out


class NonFinite(Exception):
    """The read found non-finite values: [(column, rows)] (:func:`read` names them)."""

    def __init__(self, bad):
        super().__init__(bad)
        self.bad = bad


class ReadPlan:
    """The one scan of the source: its SQL (:attr:`sql`) and the decoder of its single row
    (:meth:`decode`), built together so the aliases they share are defined once.

    An inner query computes each value once (categorical hashes, numbers as float8 where
    needed); the aggregate reads numerical columns as int8, float8 or two per element
    (int2/int4), categorical ones as the low 32 bits of their hash, two per element.  NULL
    counts are read only for columns that may hold NULLs.
    """

    def __init__(self, req, encodings: dict):
        self.req, self.encodings = req, encodings
        self.binary = [None] * len(req.attrs)      # per attribute: int8/float8 read alone, or None
        key_sql = C.ident(req.key.name)
        inner = ["s.%s AS k" % key_sql]
        select = ["count(*) AS n",
                  (T.binary_agg("s.k", "int8") if req.key.integer else "array_agg(s.k::text)") + " AS key"]
        if not req.key.col["notnull"]:
            select.append("count(s.k) AS nk")
        halves = []                                # 32-bit items, read two per element
        for i, a in enumerate(req.attrs):
            self._column(i, a, inner, select, halves)
        self.pairs = [(halves[j], halves[j + 1] if j + 1 < len(halves) else None)
                      for j in range(0, len(halves), 2)]
        for (i, first), second in self.pairs:
            select.append("%s AS p%d" % (T.binary_agg(
                T.int32_pair_sql(first, second[1]) if second else first, "int8"), i))
        # OFFSET 0 keeps the inner query a subquery, so each hash is computed once per row
        self.sql = "SELECT %s FROM (SELECT %s FROM %s AS s%s OFFSET 0) AS s" % (
            ", ".join(select), ", ".join(inner), req.source["read"], req.row_filter())

    def _column(self, i, a, inner, select, halves):
        column, alias = "s." + C.ident(a.name), "s.a%d" % i
        if not a.col["notnull"]:
            select.append("count(%s) AS c%d" % (alias, i))
        if a.name in self.encodings:           # categorical, or a numeric SA (its exact text)
            text = "pg_catalog.trim_scale(%s)" % column if a.numerical else column
            inner.append("%s AS a%d" % (HASH.format(v=text, seed=self.encodings[a.name].seed), i))
            halves.append((i, "(%s & %d)" % (alias, LOW32)))
            select.append("sum((%s >> 32)::int4) AS h%d" % (alias, i))
        elif a.typname in ("int2", "int4"):
            inner.append("%s AS a%d" % (column, i))
            halves.append((i, alias))
        elif a.typname == "int8":
            inner.append("%s AS a%d" % (column, i))
            select.append("%s AS a%d" % (T.binary_agg(alias, "int8"), i))
            self.binary[i] = "int8"
        else:
            inner.append("%s AS a%d" % (C.numeric_expr(None, a.name, a.col, "s.", clamp=True), i))
            select.append("count(*) FILTER (WHERE %s %s) AS f%d" % (alias, NONFINITE, i))
            select.append("%s AS a%d" % (T.binary_agg(alias, "float8"), i))
            self.binary[i] = "float8"

    def decode(self, row: dict):
        """(rows, keys, per-attribute arrays, names of attributes whose values are not all
        leaves).  Raises the NULL, non-finite and no-rows errors."""
        req, n = self.req, row["n"]
        if n == 0:
            raise no_rows(req.source["qname"], req.row_filter())
        nulls = null_error(req.attrs, row)
        if nulls is not None:
            raise nulls
        bad = [(a.name, row["f%d" % i]) for i, a in enumerate(req.attrs) if row.get("f%d" % i)]
        if bad:
            raise NonFinite(bad)
        if not req.key.col["notnull"] and row["nk"] < n:
            raise E.null_not_allowed('key column "%s" has %d NULLs' % (req.key.name, n - row["nk"]),
                                     "The key must identify each row: use a primary key or a unique NOT NULL column.")
        keys = T.decode_array(row.pop("key"), "int8", n) if req.key.integer else list(row.pop("key"))
        data = [None] * len(req.attrs)
        for (i, _), second in self.pairs:
            words = T.decode_array(row.pop("p%d" % i), "int8", n)
            if second:
                data[i], data[second[0]] = T.split_int32_pair(words)
            else:
                data[i] = words
        missing = []
        for i, a in enumerate(req.attrs):
            if self.binary[i] is not None:
                data[i] = T.decode_array(row.pop("a%d" % i), self.binary[i], n)
            elif a.name in self.encodings:
                data[i], ok = self._leaf_positions(data[i], row["h%d" % i], self.encodings[a.name])
                if not ok:
                    missing.append(a)
        return n, keys, data, missing

    @staticmethod
    def _leaf_positions(hashes, high_sum, encoding: Encoding):
        """Leaf positions of the rows' hashes, and whether every row is a leaf: each low 32
        bits matched, and the high 32 bits summed over the rows equal the mapped leaves' sum."""
        positions, unmatched = T.hash_positions(hashes & LOW32, encoding.leaf_hashes)
        if unmatched:
            return positions, False
        counts = np.bincount(positions, minlength=len(encoding.check_hashes))
        high = (encoding.check_hashes >> 32).tolist()
        return positions, int(high_sum) == sum(int(c) * h for c, h in zip(counts.tolist(), high) if c)


def read(plpy, req, encodings: dict, summary) -> Scan:
    """The scan, validated: every categorical value a leaf, the key unique, and the SA's
    frequencies those of the summary (else 40001: the source changed in between).
    ``summary``: an :class:`SASummary`, or a list of them, one per SA (several SAs)."""
    plan = ReadPlan(req, encodings)
    try:
        # from the table's first block: a synchronized scan (a table over shared_buffers / 4)
        # starts where another scan of it is or stopped, so the rows, their ties and so the
        # classes would depend on other sessions' scans; and by this backend alone: a parallel
        # scan under a Gather (which the planner takes for a filtered read, such as a part's
        # view) interleaves its workers' rows in an order that changes from run to run
        with C.settings(plpy, synchronize_seqscans="off", max_parallel_workers_per_gather=0):
            row = dict(plpy.execute(plan.sql)[0])
            # rows the summary counted, gone: the source changed (not "no rows")
            if row["n"] == 0 and any(one.rows for one in (summary if isinstance(summary, list) else [summary])):
                raise source_changed(req.source["qname"], "its rows were gone when read")
            n, keys, data, missing = plan.decode(row)
            del row
    except NonFinite as e:
        raise nonfinite_error(e.bad, nonfinite_values(plpy, req, e.bad))
    sensitive = [sa.name for sa in req.sensitive]
    for a in missing:
        if a.name in sensitive and a.numerical:    # a numeric SA value the summary did not have
            raise source_changed(req.source["qname"], "a value of the SA was not in the summary")
        raise missing_values(plpy, req, a, encodings[a.name].leaves)
    if not req.key.unique:
        distinct = len(np.unique(keys)) if req.key.integer else len(set(keys))
        if distinct < n:
            raise E.invalid_parameter('options.key column "%s" is not unique (%d duplicates)'
                                      % (req.key.name, n - distinct),
                                      "The key must identify each row; use a primary key or a unique column.")
    summaries = summary if isinstance(summary, list) else [summary]
    columns = []
    for j, one in enumerate(summaries):
        codes, same = sa_codes(data[len(req.qis) + j], one)
        if n != one.rows or not same or \
                not np.array_equal(np.bincount(codes, minlength=len(one.counts)), one.counts):
            raise source_changed(req.source["qname"], "the SA frequencies of the summary and of the scan differ")
        columns.append(codes)
    if isinstance(summary, list):
        return Scan(n, keys, data, columns[0], np.column_stack(columns).astype(np.int64))
    return Scan(n, keys, data, columns[0])


def sa_codes(values, summary: SASummary):
    """(SA codes of the read values, whether every value is one of the summary's)."""
    if summary.distinct is None:
        return values, True
    codes = np.searchsorted(summary.distinct, values)
    np.minimum(codes, len(summary.distinct) - 1, out=codes)
    return codes, bool((summary.distinct[codes] == values).all())


def source_changed(source, what):
    return E.source_changed(
        "the source %s changed while sabre read it (%s)" % (source, what),
        "Run again, or call sabre_anonymize inside a REPEATABLE READ transaction so that all of "
        "its queries see one snapshot.")


def null_error(attrs, row):
    """The NULL error naming every attribute with NULLs (None if there are none), given a row
    with the total ``n`` and ``c<i>`` = count(attribute i) (absent for NOT NULL columns)."""
    n = row["n"]
    nulls_by = [(a.name, n - row["c%d" % i]) for i, a in enumerate(attrs)
                if row.get("c%d" % i) is not None and row["c%d" % i] < n]
    if not nulls_by:
        return None
    return E.null_not_allowed(
        "NULL values in %s" % ", ".join('"%s" (%d rows)' % nc for nc in nulls_by),
        "Fill or filter them (e.g. in a view), or pass options => '{\"nulls\": \"drop\"}' to "
        "exclude those rows explicitly.")


def missing_values(plpy, req, a, leaves):
    """The error for values of a categorical column that are not hierarchy leaves."""
    miss = plpy.execute(plpy.prepare(
        "SELECT v, count(*) OVER () AS m FROM (SELECT DISTINCT s.%s::text AS v FROM %s AS s%s) d "
        "WHERE NOT (v = ANY ($1)) ORDER BY v LIMIT 5" % (C.ident(a.name), req.source["read"],
                                                          req.row_filter()), ["text[]"]),
        [leaves])
    if not len(miss):
        return E.SabreError(E.INTERNAL, 'inconsistent read of column "%s"' % a.name,
                            "Run again; if it persists, report it.")
    return missing_error(a, miss[0]["m"], [r["v"] for r in miss])


def missing_error(a, count, examples):
    return E.invalid_parameter('column "%s" has %d value(s) missing from hierarchy "%s", e.g. %s'
                               % (a.name, count, a.hierarchy_name, ", ".join(json.dumps(v) for v in examples)),
                               "Add every value as a leaf of the hierarchy (sabre_define_hierarchy replaces it).")


def nonfinite_error(bad, values=None):
    """bad: [(column, rows)] of numerical attributes holding NaN or infinities; ``values``:
    {column: the distinct non-finite values found, as text} when known (:func:`nonfinite_values`)."""
    values = values or {}
    return E.invalid_parameter("non-finite values (NaN or infinity) in %s" % ", ".join(
        '"%s" (%d rows%s)' % (name, rows, ": " + ", ".join(values[name]) if values.get(name) else "")
        for name, rows in bad),
        "A numerical attribute needs finite values to be generalized to a range: filter or "
        "replace them in a view.")


def nonfinite_values(plpy, req, bad) -> dict:
    """{column: its distinct non-finite values as text ('NaN', 'Infinity', 'infinity', ...)} of
    the columns in ``bad`` (the error path only: one small query per column)."""
    by_name = {a.name: a for a in req.attrs}
    found = {}
    for name, _ in bad:
        a = by_name.get(name)
        if a is None:
            continue
        found[name] = [r["v"] for r in plpy.execute(
            "SELECT DISTINCT (s.%s)::pg_catalog.text AS v FROM %s AS s WHERE %s %s ORDER BY 1 LIMIT 3" % (
                C.ident(name), req.source["read"], C.numeric_expr(None, name, a.col, "s.", clamp=True), NONFINITE))]
    return found


def no_rows(source, where):
    return E.invalid_parameter("the source %s has no rows%s" % (source, " without NULLs" if where else ""),
                               "There is nothing to anonymize.")
