"""sabre_utility, sabre_query_error, sabre_kl_divergence: utility of an anonymized relation.

The output relation has one row per source row: ``ec_id``, for each numerical QI
``<qi>_lo``/``<qi>_hi``, for each categorical QI ``<qi>`` holding a hierarchy node's label, and
the sensitive attribute unchanged (sabre_anonymize's shape; the Mondrian peer of
``sabre-pg bench`` writes the same shape).  The source gives the domains (numerical extents
and distinct values) and the exact answers.  Hierarchies come from ``options.hierarchies``,
else from the sabre run that made the output, else flat (every value under one root).
All columns are read with one aggregate scan per relation; the arithmetic is
``sabre_pg.core.metrics`` and ``sabre_pg.core.workload``.
"""
from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np

from sabre_pg.core import limits, metrics
from sabre_pg.core import workload as W
from sabre_pg.core.generalize import CategoricalNode, NumericalRange
from sabre_pg.core.hierarchy import Hierarchy

from ..shared import common as C
from ..shared import errors as E
from ..stages.request import Attr, parse_weights

OPTION_KEYS = ("hierarchies", "weights", "k", "max_cells", "max_bins")


def _options(plpy, options) -> dict:
    opts = C.parse_options(plpy, options, OPTION_KEYS, '{"hierarchies": {"marital": "census_marital"}}')
    for key in ("k", "max_cells", "max_bins"):
        v = opts.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            C.fail(plpy, C.INVALID_PARAMETER, "options.%s must be a positive integer" % key,
                   "For example options => '{\"%s\": 6}'." % key)
    for key, cap in (("max_cells", limits.WORKLOAD_MAX_CELLS), ("max_bins", limits.WORKLOAD_MAX_BINS)):
        if opts.get(key) is not None:
            E.cap("options.%s" % key, opts[key], cap, "Leave it out for the default (%d)." % (
                W.DEFAULT_MAX_CELLS if key == "max_cells" else W.DEFAULT_MAX_BINS))
    h = opts.get("hierarchies")
    if h is not None and (not isinstance(h, dict) or not all(isinstance(v, str) for v in h.values())):
        C.fail(plpy, C.INVALID_PARAMETER, "options.hierarchies must map column names to hierarchy names",
               'For example {"marital": "census_marital"}.')
    return opts


class Data:
    """Everything read from the source and the output."""


def _run_record(plpy, out_oid):
    """The caller's recorded run that made the output (the catalog shows each role its own)."""
    r = plpy.execute(plpy.prepare(
        "SELECT quasi_identifiers, sensitive, k, options::text AS options FROM %s "
        "WHERE output_oid OPERATOR(pg_catalog.=) $1 ORDER BY run_id DESC LIMIT 1" % C.catalog("runs"),
        ["oid"]), [out_oid])
    if not len(r):
        return None
    rec = dict(r[0])
    rec["options"] = json.loads(rec["options"]) if rec["options"] else {}
    return rec


def read(plpy, output, source, quasi_identifiers, sensitive, options) -> Data:
    opts = _options(plpy, options)
    out = C.resolve_relation(plpy, output)
    src = C.resolve_relation(plpy, source)
    if out["oid"] == src["oid"]:
        C.fail(plpy, C.INVALID_PARAMETER, "output and source are the same relation %s" % out["qname"],
               "Pass the anonymized relation as output and the original as source.")
    run = _run_record(plpy, out["oid"])
    if quasi_identifiers is None or sensitive is None:
        if run is None:
            C.fail(plpy, C.INVALID_PARAMETER,
                   "%s is not a recorded sabre output: name its quasi_identifiers and sensitive attribute"
                   % out["qname"], "Pass quasi_identifiers => ARRAY[...] and sensitive => '...'.")
        quasi_identifiers = quasi_identifiers if quasi_identifiers is not None else run["quasi_identifiers"]
        sensitive = sensitive if sensitive is not None else run["sensitive"]
    qnames = list(quasi_identifiers)
    if not qnames or any(q is None for q in qnames) or len(set(qnames)) != len(qnames):
        C.fail(plpy, C.INVALID_PARAMETER, "quasi_identifiers must be a non-empty list of distinct names",
               "For example ARRAY['age','sex']; each column once.")
    if sensitive in qnames:
        C.fail(plpy, C.INVALID_PARAMETER, 'the sensitive attribute "%s" is also a quasi-identifier' % sensitive,
               None)
    hier = dict((run or {}).get("options", {}).get("hierarchies") or {})
    hier.update(opts.get("hierarchies") or {})
    scols = C.columns(plpy, src["oid"])
    ocols = C.columns(plpy, out["oid"])
    if "ec_id" not in ocols:
        C.fail(plpy, C.UNDEFINED_COLUMN, '%s has no column "ec_id"' % out["qname"],
               "The output needs one row per record with its equivalence class in ec_id.")
    attrs = []
    for name in qnames + [sensitive]:
        if name not in scols:
            C.fail(plpy, C.UNDEFINED_COLUMN, 'column "%s" does not exist in the source %s' % (name, src["qname"]),
                   "Available columns, nearest first: %s." % C.nearest_text(name, scols))
        kind = "categorical" if name in hier else C.kind_of(scols[name])
        if kind is None:
            C.fail(plpy, C.DATATYPE_MISMATCH, 'column "%s" has unsupported type %s' % (name, scols[name]["declared"]),
                   "Numeric and date/time types are numerical; text, varchar, bool and enum are categorical.")
        a = Attr(name, scols[name], kind)
        need = [name] if (not a.numerical or name == sensitive) else [name + "_lo", name + "_hi"]
        for c in need:
            if c not in ocols:
                C.fail(plpy, C.UNDEFINED_COLUMN, 'column "%s" does not exist in the output %s' % (c, out["qname"]),
                       "A numerical quasi-identifier is published as <qi>_lo and <qi>_hi, a categorical "
                       "one as <qi> (a hierarchy node), the sensitive attribute unchanged.")
        attrs.append(a)
    source_q, output_q = C.read_sql(src, scols, [a.name for a in attrs]), C.read_sql(out, ocols)
    named = C.load_hierarchies(plpy, [(hier[a.name], 'for column "%s"' % a.name) for a in attrs
                                      if not a.numerical and a.name in hier])
    for i, a in enumerate(attrs):
        if a.numerical:
            continue
        if a.name in hier:
            attrs[i] = replace(a, hierarchy=named[hier[a.name]])
        else:
            vals = plpy.execute("SELECT array_agg(v ORDER BY v) AS vs FROM (SELECT DISTINCT %s::text AS v "
                                "FROM %s AS s WHERE %s IS NOT NULL) d" % (C.qi(plpy, a.name), source_q, C.qi(plpy, a.name)))[0]["vs"]
            if not vals:
                C.fail(plpy, C.INVALID_PARAMETER, 'column "%s" of %s has no values' % (a.name, src["qname"]),
                       "The column has only NULLs; choose another quasi-identifier.")
            attrs[i] = replace(a, hierarchy=Hierarchy.flat(vals, name=a.name))

    data = Data()
    data.attrs, data.qis, data.sa, data.opts, data.run = attrs, attrs[:-1], attrs[-1], opts, run
    data.k = opts.get("k") or (run or {}).get("k")
    data.src_vals = _read_columns(plpy, source_q, attrs, "source", leaves=True)
    data.out_ec, data.out_vals = _read_output(plpy, output_q, attrs, out["qname"])
    if len(data.src_vals[-1]) == 0:
        C.fail(plpy, C.INVALID_PARAMETER, "the source %s has no rows" % src["qname"],
               "Evaluate against the non-empty source the output was made from.")
    return data


def _leaf_join(plpy, a, i, params, types, prefix):
    """Leaf positions of a categorical column (``m<i>.pos``, 1-based) by a join."""
    params.append(a.hierarchy.leaves)
    types.append("text[]")
    return C.leaf_position_join("m%d" % i, len(params), "(%s%s)::pg_catalog.text" % (prefix, C.qi(plpy, a.name)))


def _exec(plpy, q, types, params):
    return plpy.execute(plpy.prepare(q, types), params)[0] if params else plpy.execute(q)[0]


def _read_columns(plpy, source_q, attrs, what, leaves):
    """Source columns as arrays: float8 for numerical, leaf positions for categorical."""
    sel, joins, params, types = [], [], [], []
    for i, a in enumerate(attrs):
        if a.numerical:
            sel.append("array_agg(%s) AS a%d" % (C.numeric_expr(plpy, a.name, a.col, "s.", clamp=True), i))
        else:
            joins.append(_leaf_join(plpy, a, i, params, types, "s."))
            sel.append("array_agg(m%d.pos - 1) AS a%d, count(*) - count(m%d.pos) AS miss%d" % (i, i, i, i))
    where = " WHERE " + " AND ".join("s.%s IS NOT NULL" % C.qi(plpy, a.name) for a in attrs)
    row = _exec(plpy, "SELECT %s FROM %s AS s %s%s" % (", ".join(sel), source_q, " ".join(joins), where), types, params)
    out = []
    for i, a in enumerate(attrs):
        if not a.numerical and row["miss%d" % i]:
            C.fail(plpy, C.INVALID_PARAMETER, '%d values of "%s" in the %s are not leaves of its hierarchy'
                   % (row["miss%d" % i], a.name, what), "Pass the hierarchy the output was made with in "
                   "options.hierarchies.")
        v = row["a%d" % i] or []
        out.append(np.asarray(v, dtype=np.float64 if a.numerical else np.int64))
    return out


def _read_output(plpy, output_q, attrs, out_name):
    """ec_id; per QI (lo, hi) floats or node ids; the SA as float8 or leaf positions."""
    sel, joins, params, types = ["array_agg(o.ec_id) AS ec"], [], [], []
    qis, sa = attrs[:-1], attrs[-1]
    for i, a in enumerate(qis):
        if a.numerical:
            for suf in ("_lo", "_hi"):
                col = {"typname": a.col["typname"], "category": a.col["category"]}
                sel.append("array_agg(%s) AS a%d%s" % (C.numeric_expr(plpy, a.name + suf, col, "o.", clamp=True), i, suf))
        else:
            labels = W.node_of_label(a.hierarchy)
            p1, p2 = len(params) + 1, len(params) + 2
            params += [list(labels), list(labels.values())]
            types += ["text[]", "int[]"]
            joins.append("LEFT JOIN unnest($%d::text[], $%d::int[]) AS m%d(v, node) ON m%d.v = o.%s::text"
                         % (p1, p2, i, i, C.qi(plpy, a.name)))
            sel.append("array_agg(m%d.node) AS a%d, count(*) - count(m%d.node) AS miss%d" % (i, i, i, i))
    j = len(qis)
    if sa.numerical:
        sel.append("array_agg(%s) AS a%d" % (C.numeric_expr(plpy, sa.name, sa.col, "o.", clamp=True), j))
    else:
        joins.append(_leaf_join(plpy, sa, j, params, types, "o."))
        sel.append("array_agg(m%d.pos - 1) AS a%d, count(*) - count(m%d.pos) AS miss%d" % (j, j, j, j))
    row = _exec(plpy, "SELECT %s FROM %s AS o %s" % (", ".join(sel), output_q, " ".join(joins)), types, params)
    if row["ec"] is None:
        C.fail(plpy, C.INVALID_PARAMETER, "the output %s has no rows" % out_name,
               "Evaluate a sabre output (one row per source row) that is not empty.")
    vals = []
    for i, a in enumerate(attrs):
        if not a.numerical and row["miss%d" % i]:
            C.fail(plpy, C.INVALID_PARAMETER, '%d values of "%s" in the output are not nodes of hierarchy "%s"'
                   % (row["miss%d" % i], a.name, a.hierarchy.name),
                   "Pass the hierarchy the output was made with in options.hierarchies.")
        if a.numerical and i < j:
            lo, hi = row["a%d_lo" % i], row["a%d_hi" % i]
            if any(v is None for v in lo) or any(v is None for v in hi):
                C.fail(plpy, C.NULL_NOT_ALLOWED, 'the output has NULLs in "%s_lo" or "%s_hi"' % (a.name, a.name),
                       "Evaluate the relation as sabre_anonymize wrote it; every class has a range.")
            vals.append((np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64)))
        else:
            v = row["a%d" % i]
            if a.numerical and any(x is None for x in v):
                C.fail(plpy, C.NULL_NOT_ALLOWED, 'the output has NULLs in "%s"' % a.name,
                       "Evaluate the relation as sabre_anonymize wrote it; every class has a label.")
            vals.append(np.asarray(v, dtype=np.float64 if a.numerical else np.int64))
    ec = row["ec"]
    if any(e is None for e in ec):
        C.fail(plpy, C.NULL_NOT_ALLOWED, "the output has NULLs in ec_id", "Every row needs a class.")
    return np.asarray(ec, dtype=np.int64), vals


def grid(plpy, data) -> W.Grid:
    max_bins = data.opts.get("max_bins", W.DEFAULT_MAX_BINS)
    sizes, src, lo, hi = [], [], [], []
    for i, a in enumerate(data.attrs):
        if a.numerical:
            ax = W.NumericalAxis(data.src_vals[i], max_bins)
            s_cells = ax.cells(data.src_vals[i])
            if i < len(data.qis):
                l, h = ax.box(*data.out_vals[i])
            else:
                o = data.out_vals[i]
                ok = np.isin(o, ax.domain)
                if not ok.all():
                    C.fail(plpy, C.INVALID_PARAMETER, '%d values of the sensitive attribute "%s" in the output '
                           'do not occur in the source' % (int((~ok).sum()), a.name),
                           "The output must publish the sensitive values unchanged.")
                l = h = ax.cells(o)
        else:
            ax = W.CategoricalAxis(a.hierarchy)
            s_cells = data.src_vals[i]
            if i < len(data.qis):
                l, h = ax.box(data.out_vals[i])
            else:
                l = h = data.out_vals[i]
        sizes.append(ax.size)
        src.append(s_cells)
        lo.append(l)
        hi.append(h)
    d = len(data.qis)
    try:
        return W.Grid(sizes[:d], sizes[d], np.column_stack(src[:d]), src[d],
                      np.column_stack(lo[:d]), np.column_stack(hi[:d]), lo[d])
    except ValueError as e:
        C.fail(plpy, C.INVALID_PARAMETER, str(e),
               "Check the arguments against docs/evaluation.md.")


# ----------------------------------------------------------------------------- entry points
@E.entry_point
def utility(plpy, output, source, quasi_identifiers, sensitive, options):
    data = read(plpy, output, source, quasi_identifiers, sensitive, options)
    ils = []
    for i, a in enumerate(data.qis):
        if a.numerical:
            v = data.src_vals[i]
            lo, hi = data.out_vals[i]
            ils.append(metrics.il_numerical(NumericalRange(lo, hi), v.min(), v.max()))
        else:
            ils.append(metrics.il_categorical(CategoricalNode(data.out_vals[i], a.hierarchy)))
    weights = parse_weights(data.opts.get("weights") or (data.run or {}).get("options", {}).get("weights"),
                            [a.name for a in data.qis])
    u = W.output_utility(data.out_ec, ils, weights, data.k)
    return [(u["rows"], u["classes"], u["ail"], u["discernibility"], u["aecs"], u["aecs_normalized"],
             u["min_class_size"], u["max_class_size"])]


@E.entry_point
def query_error(plpy, output, source, quasi_identifiers, sensitive, queries, dimensionality, selectivity,
                seed, options):
    if queries is None or queries < 1:
        C.fail(plpy, C.INVALID_PARAMETER, "queries must be at least 1, got %s" % queries,
               "The paper's workload uses 10,000 queries.")
    E.cap("queries", queries, limits.WORKLOAD_QUERIES, "The paper's workload uses 10,000 queries.")
    if selectivity is None or selectivity != selectivity or not (0 < selectivity <= 1):
        C.fail(plpy, C.INVALID_PARAMETER, "selectivity (theta) must satisfy 0 < theta <= 1, got %s" % selectivity,
               "theta is the expected fraction of rows a query selects; the paper uses 0.1.")
    data = read(plpy, output, source, quasi_identifiers, sensitive, options)
    d = len(data.qis)
    if dimensionality is None or not (1 <= dimensionality <= d):
        C.fail(plpy, C.INVALID_PARAMETER, "dimensionality (lambda) must be between 1 and %d, got %s"
               % (d, dimensionality), "lambda is the number of quasi-identifiers each query constrains.")
    g = grid(plpy, data)
    r = W.median_relative_error(g, queries, dimensionality, selectivity, 1 if seed is None else seed,
                                data.opts.get("max_cells", W.DEFAULT_MAX_CELLS))
    return [(r["median_relative_error"], r["mean_relative_error"], r["answered"], r["dropped"])]


@E.entry_point
def kl_divergence(plpy, output, source, quasi_identifiers, sensitive, level, options):
    data = read(plpy, output, source, quasi_identifiers, sensitive, options)
    d = len(data.qis)
    if level is None or not (1 <= level <= d):
        C.fail(plpy, C.INVALID_PARAMETER, "level (mu) must be between 1 and %d, got %s" % (d, level),
               "The datacube of level mu groups by every combination of mu quasi-identifiers.")
    E.cap("cuboids (combinations of %d of %d quasi-identifiers)" % (level, d), math.comb(d, level), limits.KL_CUBOIDS,
          "Lower the level or name fewer quasi-identifiers.")
    g = grid(plpy, data)
    try:
        r = W.kl_divergence(g, level, data.opts.get("max_cells", W.DEFAULT_MAX_CELLS))
    except ValueError as e:
        C.fail(plpy, C.INVALID_PARAMETER, str(e), "Lower the level or raise options.max_cells.")
    names = [a.name for a in data.qis]
    return [([names[j] for j in axes], float(v)) for axes, v in r["per_cuboid"].items()]
