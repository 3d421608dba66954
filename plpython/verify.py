"""sabre_verify: recompute t-closeness and k-anonymity of an output from the relation alone.

Classes are the groups of ``ec_id``; the reference distribution is the SA distribution of the
whole relation (one row per source row, so it equals the source's).  A numerical SA uses the
ordered EMD, a categorical SA the hierarchical EMD under ``hierarchy`` (flat if NULL).
Nothing is read from the run catalog.
"""
from __future__ import annotations

import numpy as np

from sabre_pg.core.emd import SADomain, class_emds
from sabre_pg.core.hierarchy import Hierarchy

from . import common as C

TOLERANCE = 1e-9


def run(plpy, output, sensitive, t, k, hierarchy):
    if t is None or t != t or not (0 < t <= 1):
        C.fail(plpy, C.INVALID_PARAMETER, "t must satisfy 0 < t <= 1, got %s" % t,
               "Pass the t the output was made for.")
    if k is None or k < 1:
        C.fail(plpy, C.INVALID_PARAMETER, "k must be at least 1, got %s" % k,
               "Pass the k the output was made for (1 checks t-closeness only).")
    rel = C.resolve_relation(plpy, output)
    cols = C.columns(plpy, rel["oid"])
    if "ec_id" not in cols:
        C.fail(plpy, C.UNDEFINED_COLUMN, '%s has no column "ec_id"' % rel["qname"],
               "sabre_verify checks relations with one row per record and its class in ec_id.")
    if sensitive not in cols:
        C.fail(plpy, C.UNDEFINED_COLUMN, 'column "%s" does not exist in %s' % (sensitive, rel["qname"]),
               "Available columns: %s." % ", ".join(cols))
    col = cols[sensitive]
    kind = "categorical" if hierarchy is not None else C.kind_of(col)
    if kind is None:
        C.fail(plpy, C.DATATYPE_MISMATCH, 'column "%s" has unsupported type %s' % (sensitive, col["type"]),
               "Numeric and date/time types are numerical; text, bool and enum are categorical.")
    sq = C.qi(plpy, sensitive)
    nulls = plpy.execute("SELECT count(*) - count(%s) AS m, count(*) - count(ec_id) AS e FROM %s"
                         % (sq, rel["qname"]))[0]
    if nulls["m"] or nulls["e"]:
        C.fail(plpy, C.NULL_NOT_ALLOWED, "%s has NULLs in %s" % (
            rel["qname"], "ec_id" if nulls["e"] else sensitive), "Every row needs a class and an SA value.")
    if kind == "numerical":
        r = plpy.execute("SELECT array_agg(ec_id) AS e, array_agg(%s) AS v FROM %s"
                         % (C.numeric_expr(plpy, sensitive, col), rel["qname"]))[0]
        if r["e"] is None:
            return [(0, 0, 0.0, 0)]
        codes, distinct = np.unique(np.asarray(r["v"], dtype=np.float64), return_inverse=True)[1], None
        domain = SADomain("numerical", m=int(codes.max()) + 1)
    else:
        if hierarchy is not None:
            h = C.load_hierarchy(plpy, hierarchy, 'for column "%s"' % sensitive)
        else:
            vals = plpy.execute("SELECT array_agg(DISTINCT %s::text) AS v FROM %s" % (sq, rel["qname"]))[0]["v"]
            if vals is None:
                return [(0, 0, 0.0, 0)]
            h = Hierarchy.flat(sorted(vals))
        r = plpy.execute(plpy.prepare(
            "SELECT array_agg(o.ec_id) AS e, array_agg(m.pos) AS v, count(*) - count(m.pos) AS miss "
            "FROM %s AS o LEFT JOIN unnest($1::text[], $2::int[]) AS m(v, pos) ON m.v = o.%s::text"
            % (rel["qname"], sq), ["text[]", "int[]"]), [h.leaves, list(range(h.n_leaves))])[0]
        if r["e"] is None:
            return [(0, 0, 0.0, 0)]
        if r["miss"]:
            C.fail(plpy, C.INVALID_PARAMETER, '%d values of "%s" are not leaves of hierarchy "%s"'
                   % (r["miss"], sensitive, hierarchy), "Use the hierarchy the output was made with.")
        codes = np.asarray(r["v"], dtype=np.int64)
        domain = SADomain("categorical", hierarchy=h)
    ec_raw = np.asarray(r["e"], dtype=np.int64)
    _, ec = np.unique(ec_raw, return_inverse=True)
    ec = np.asarray(ec).reshape(-1)
    n_classes = int(ec.max()) + 1
    sizes = np.bincount(ec, minlength=n_classes)
    emds = class_emds(ec, codes, domain, n_classes)
    violations = int(np.count_nonzero((emds > t + TOLERANCE) | (sizes < k)))
    return [(n_classes, violations, float(emds.max()), int(sizes.min()))]
