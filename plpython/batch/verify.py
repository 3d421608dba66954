"""sabre_verify: recompute t-closeness and k-anonymity of an output from the relation alone.

Classes are the groups of ``ec_id``; the reference distribution is the SA distribution of the
whole relation (one row per source row, so it equals the source's).  A numerical SA uses the
ordered EMD, a categorical SA the hierarchical EMD under ``hierarchy`` (equal distance if
NULL).  Sizes and EMDs are exact (:mod:`.closeness`, :mod:`sabre_pg.core.exact_emd`): a class
violates when its EMD exceeds t as a rational number, or it has fewer than k rows.  Nothing
is read from the run catalog.  ``run_multi`` checks several sensitive columns, each against
its own t (docs/multiple-sa.md).  On a Citus distributed output the counts are one grouped
query that Citus runs on the shards (docs/scale-out.md): only counts reach the coordinator.
"""
from __future__ import annotations

import numpy as np

from ..shared import citus
from ..shared import closeness
from ..shared import common as C
from ..shared import errors as E
from ..shared import safe_types
from ..stages import request

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
    rel, cols = _relation(plpy, output)
    if sensitive is not None:
        _column(plpy, rel, cols, sensitive)
    with citus.reads_without_worker_transactions(plpy, rel["distributed"]):
        if t is not None and l is None:
            res = _measure(plpy, rel, cols, sensitive, hierarchy)
            return [(res.classes, res.violations(t, k), res.max_emd, res.min_class_size)]
        return [_diversity_row(plpy, rel, sensitive, cols, t, k, l, hierarchy)]


@E.entry_point
def run_multi(plpy, output, sensitive, t, k, hierarchies):
    """Several SAs, each with its own t: a class violates when it exceeds the t of any SA or
    has fewer than k rows; ``max_emd`` per SA.  ``hierarchies`` (NULL, or one name or NULL per
    SA) as ``hierarchy`` of the one-SA form."""
    if output is None or sensitive is None or t is None:
        C.fail(plpy, C.NULL_NOT_ALLOWED, "output, sensitive and t must not be NULL", request.SENSITIVE_HINT)
    ts = request.sensitive_thresholds(list(sensitive), list(t))
    C.check_k(k, "Pass the k the output was made for (1 checks t-closeness only).")
    hierarchies = [None] * len(sensitive) if hierarchies is None else list(hierarchies)
    if len(hierarchies) != len(sensitive):
        C.fail(plpy, C.INVALID_PARAMETER, "hierarchies has %d entries for %d sensitive attributes"
               % (len(hierarchies), len(sensitive)), "Give one hierarchy name (or NULL) per sensitive attribute.")
    rel, cols = _relation(plpy, output)
    with citus.reads_without_worker_transactions(plpy, rel["distributed"]):
        found = [_measure(plpy, rel, cols, sa, h) for sa, h in zip(sensitive, hierarchies)]
    bad = np.zeros(found[0].classes, dtype=bool)
    for res, limit in zip(found, ts):
        bad |= res.violating(limit, k)
    return [(found[0].classes, int(np.count_nonzero(bad)), [res.max_emd for res in found], found[0].min_class_size)]


def _relation(plpy, output):
    """The output relation and its columns, with an integer ``ec_id``."""
    rel = C.resolve_relation(plpy, output)
    cols = C.columns(plpy, rel["oid"])
    rel["read"] = C.read_sql(rel, cols, [closeness.EC])
    # a Citus distributed output: counts grouped on the workers, no row through the coordinator
    rel["distributed"] = citus.distribution_column(plpy, rel["oid"]) is not None
    if closeness.EC not in cols:
        C.fail(plpy, C.UNDEFINED_COLUMN, '%s has no column "ec_id"' % rel["qname"],
               "sabre_verify checks relations with one row per record and its class in ec_id.")
    if cols[closeness.EC]["typname"] not in EC_ID_TYPES:
        C.fail(plpy, C.DATATYPE_MISMATCH, 'column "ec_id" of %s has type %s, not an integer type'
               % (rel["qname"], cols[closeness.EC]["type"]),
               "Class ids must be smallint, integer or bigint (sabre_anonymize writes bigint).")
    return rel, cols


def _column(plpy, rel, cols, name):
    if name not in cols:
        C.fail(plpy, C.UNDEFINED_COLUMN, 'column "%s" does not exist in %s' % (name, rel["qname"]),
               "Available columns, nearest first: %s." % C.nearest_text(name, cols))
    if cols[name]["unsafe"]:
        raise safe_types.refuse(name, cols[name])


def _measure(plpy, rel, cols, sensitive, hierarchy):
    """Exact sizes and EMDs of the classes on one sensitive column."""
    _column(plpy, rel, cols, sensitive)
    h = None
    if hierarchy is not None:
        h = C.load_hierarchy(plpy, hierarchy, 'for column "%s"' % sensitive)
    return closeness.measure(plpy, rel["read"], sensitive, cols[sensitive], h, rel["qname"], rel["distributed"])


def _diversity_row(plpy, rel, sensitive, cols, t, k, l, hierarchy):
    """k, distinct l-diversity and (when t is given) t-closeness, class by class."""
    ids, sizes, distinct = closeness.diversity(plpy, rel["read"], sensitive if l is not None else None, rel["qname"])
    bad = sizes < k
    if l is not None:
        bad |= distinct < l
    max_emd = None
    if t is not None:
        res = _measure(plpy, rel, cols, sensitive, hierarchy)
        bad |= res.exceeds(t)       # classes in ec_id order in both
        max_emd = res.max_emd
    return (len(ids), int(bad.sum()), max_emd, int(sizes.min()) if len(sizes) else 0)
