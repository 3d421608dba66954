"""sabre_verify: recompute t-closeness and k-anonymity of an output from the relation alone.

Classes are the groups of ``ec_id``; the reference distribution is the SA distribution of the
whole relation (one row per source row, so it equals the source's).  A numerical SA uses the
ordered EMD, a categorical SA the hierarchical EMD under ``hierarchy`` (equal distance if
NULL).  Sizes and EMDs are exact (:mod:`.closeness`, :mod:`sabre_pg.core.exact_emd`): a class
violates when its EMD exceeds t as a rational number, or it has fewer than k rows.  Nothing
is read from the run catalog.
"""
from __future__ import annotations

from . import closeness
from . import common as C
from . import errors as E

EC_ID_TYPES = ("int2", "int4", "int8")


@E.entry_point
def run(plpy, output, sensitive, t, k, hierarchy, l=None):
    """One row: classes, violations (classes over t, under k rows or under l distinct values),
    max_emd (NULL when t is NULL: k and l alone are checked), min_class_size."""
    if t is not None:
        C.check_t(t, "Pass the t the output was made for (an EMD bound in (0, 1]), or NULL to check k (and l) alone.")
    C.check_k(k, "Pass the k the output was made for (1 checks t-closeness only).")
    if l is not None:
        C.check_k(l, "l is the minimum number of distinct sensitive values per class (distinct l-diversity).")
    needs_sa = t is not None or l is not None
    for name, value in (("output", output), ("sensitive", sensitive if needs_sa else "")):
        if value is None:
            C.fail(plpy, C.NULL_NOT_ALLOWED, "%s must not be NULL" % name,
                   "Pass the output relation and the name of its sensitive column (sensitive may be NULL "
                   "only when t and l are).")
    rel = C.resolve_relation(plpy, output)
    cols = C.columns(plpy, rel["oid"])
    if closeness.EC not in cols:
        C.fail(plpy, C.UNDEFINED_COLUMN, '%s has no column "ec_id"' % rel["qname"],
               "sabre_verify checks relations with one row per record and its class in ec_id.")
    if cols[closeness.EC]["typname"] not in EC_ID_TYPES:
        C.fail(plpy, C.DATATYPE_MISMATCH, 'column "ec_id" of %s has type %s, not an integer type'
               % (rel["qname"], cols[closeness.EC]["type"]),
               "Class ids must be smallint, integer or bigint (sabre_anonymize writes bigint).")
    if sensitive is not None and sensitive not in cols:
        C.fail(plpy, C.UNDEFINED_COLUMN, 'column "%s" does not exist in %s' % (sensitive, rel["qname"]),
               "Available columns: %s." % ", ".join(cols))
    if t is not None and l is None:
        h = None
        if hierarchy is not None:
            h = C.load_hierarchy(plpy, hierarchy, 'for column "%s"' % sensitive)
        res = closeness.measure(plpy, rel["qname"], sensitive, cols[sensitive], h)
        return [(res.classes, res.violations(t, k), res.max_emd, res.min_class_size)]
    return [_diversity_row(plpy, rel, sensitive, cols, t, k, l, hierarchy)]


def _diversity_row(plpy, rel, sensitive, cols, t, k, l, hierarchy):
    """k, distinct l-diversity and (when t is given) t-closeness, class by class."""
    ids, sizes, distinct = closeness.diversity(plpy, rel["qname"], sensitive if l is not None else None)
    bad = sizes < k
    if l is not None:
        bad |= distinct < l
    max_emd = None
    if t is not None:
        h = C.load_hierarchy(plpy, hierarchy, 'for column "%s"' % sensitive) if hierarchy is not None else None
        res = closeness.measure(plpy, rel["qname"], sensitive, cols[sensitive], h)
        bad |= res.exceeds(t)       # classes in ec_id order in both
        max_emd = res.max_emd
    return (len(ids), int(bad.sum()), max_emd, int(sizes.min()) if len(sizes) else 0)
