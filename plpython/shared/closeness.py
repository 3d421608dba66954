"""Exact t-closeness measurement of a relation with one row per tuple and its class in
``ec_id``: the database side shared by ``sabre_verify`` and the check made before an output
is published.

One grouped query reads ``(ec_id, code, count)``; the SA code is computed in SQL, exactly:

* numerical SA, no hierarchy: ``dense_rank() OVER (ORDER BY sa)`` in the column's own type
  (bigint, numeric, dates, timestamps, intervals compared as themselves, never as float8);
  the ordered EMD over the ranks;
* categorical SA, no hierarchy: the same rank, and the equal-distance EMD;
* any SA with a hierarchy: the position of ``sa::text`` among the hierarchy's leaves
  (``unnest(leaves) WITH ORDINALITY``, byte-wise equality); the hierarchical EMD.

The three columns come back as one binary ``bytea`` each (:mod:`.transfer`) and the EMDs
are computed by :mod:`sabre_pg.core.exact_emd`, in integers.  Built-ins are qualified with
``pg_catalog`` so the caller's search_path cannot redirect them.
"""
from __future__ import annotations

import numpy as np

from sabre_pg.core import exact_emd as X
from sabre_pg.core.hierarchy import Hierarchy

from . import common as C
from . import transfer as T

EC = "ec_id"

_OUTER = (
    "SELECT pg_catalog.count(*) AS groups, "
    "pg_catalog.sum(r.n) FILTER (WHERE r.ec_id IS NULL) AS null_ec, "
    "pg_catalog.sum(r.n) FILTER (WHERE r.sa IS NULL) AS null_sa, "
    "pg_catalog.sum(r.n) FILTER (WHERE r.sa IS NOT NULL AND r.code IS NULL) AS missing, "
    "{ec} AS ec, {code} AS code, {n} AS n FROM ({inner}) AS r")

_GROUPS = ("SELECT o.{ec}::pg_catalog.int8 AS ec_id, {sa} AS sa, pg_catalog.count(*) AS n "
           "FROM {rel} AS o GROUP BY 1, 2")

_RANKED = ("SELECT g.ec_id, g.sa, g.n, pg_catalog.dense_rank() OVER (ORDER BY g.sa) AS code "
           "FROM ({groups}) AS g")

_LEAF_POSITIONS = ("SELECT g.ec_id, g.sa, g.n, h.pos AS code FROM ({groups}) AS g "
                   + C.leaf_position_join("h", 1, "g.sa"))

_MISSING_EXAMPLES = (
    "SELECT d.v FROM (SELECT DISTINCT {sa} AS v FROM {rel} AS o WHERE o.{col} IS NOT NULL) AS d "
    "WHERE NOT EXISTS (SELECT FROM pg_catalog.unnest($1::pg_catalog.text[]) AS h(leaf) "
    "WHERE h.leaf OPERATOR(pg_catalog.=) d.v) ORDER BY d.v LIMIT 5")


def _as_leaf_text(plpy, sa_name: str) -> str:
    """The SA as text compared byte-wise (the C collation), as a hierarchy leaf label."""
    return '(o.%s)::pg_catalog.text COLLATE pg_catalog."C"' % C.qi(plpy, sa_name)


def measure(plpy, relation_qname: str, sa_name: str, sa_col: dict,
            hierarchy: Hierarchy | None = None, name: str | None = None, grouped: bool = False,
            small_classes: bool = False) -> X.ClassEMDs:
    """Size and exact EMD (against the whole relation) of every ``ec_id`` class.

    ``grouped``: always the grouped query (``GROUP BY ec_id, sa`` with ``count(*)``), never the
    one-row-per-tuple read: on a Citus distributed relation Citus pushes that ``GROUP BY`` down
    to the shards, so only per-shard counts reach the coordinator, never the rows.

    ``small_classes``: the caller knows every ``ec_id`` is in [0, 2^31) (the pre-swap check of
    a relation sabre just wrote): an SA that fits 32 bits then travels with its class in one
    int8 per row (:func:`_measure_rows`).  A class id outside that range would decode to
    another id, so the measurement would differ from the engine's and the check would fail: a
    false alarm, never a false pass.

    ``relation_qname`` is a quoted, qualified name or a ``FROM`` item reading a relation in
    safe types (``common.read_sql``; ``name`` is then the relation's, for messages); ``sa_col`` the SA's entry of
    ``common.columns()``; ``hierarchy`` the SA's hierarchy or None.  Errors: SA type with
    no EMD (42804), NULL ``ec_id`` or SA (22004), SA values that are not leaves (22023).
    """
    kind = "hierarchical" if hierarchy is not None else {
        "numerical": "ordered", "categorical": "equal"}.get(C.kind_of(sa_col))
    if kind is None:
        C.fail(plpy, C.DATATYPE_MISMATCH, 'column "%s" has unsupported type %s for a sensitive attribute'
               % (sa_name, sa_col.get("declared", sa_col["type"])),
               "Numeric and date/time types are numerical (ordered distance); text, bool and enum "
               "are categorical (equal distance); any type can use a hierarchy of its text values.")
    fast = None if grouped else _measure_rows(plpy, relation_qname, sa_name, sa_col, hierarchy, kind, small_classes)
    if fast is not None:
        return fast
    sa = _as_leaf_text(plpy, sa_name) if kind == "hierarchical" else "o.%s" % C.qi(plpy, sa_name)
    groups = _GROUPS.format(ec=C.qi(plpy, EC), sa=sa, rel=relation_qname)
    inner = (_LEAF_POSITIONS if kind == "hierarchical" else _RANKED).format(groups=groups)
    query = _OUTER.format(inner=inner, ec=T.binary_agg("r.ec_id", "int8"),
                          code=T.binary_agg("r.code", "int8"), n=T.binary_agg("r.n", "int8"))
    if kind == "hierarchical":
        row = plpy.execute(plpy.prepare(query, ["text[]"]), [hierarchy.leaves])[0]
    else:
        row = plpy.execute(query)[0]
    _check_complete(plpy, row, relation_qname, sa_name, hierarchy, name or relation_qname)
    n = int(row["groups"])
    ec = T.decode_array(row["ec"], "int8", n)
    codes = T.decode_array(row["code"], "int8", n) - 1        # ranks and ordinals start at 1
    counts = T.decode_array(row["n"], "int8", n)
    return _class_emds(kind, ec, codes, counts, int(codes.max()) + 1 if n else 0, hierarchy)


def diversity(plpy, relation_qname: str, sa_name: str | None, name: str | None = None) -> tuple:
    """(class ids ascending, sizes, distinct non-NULL sensitive values) of every ``ec_id``
    class (distinct values 0 when ``sa_name`` is None); NULL ``ec_id`` is refused (22004)."""
    distinct = "pg_catalog.count(DISTINCT o.%s)" % C.ident(sa_name) if sa_name else "0::pg_catalog.int8"
    row = plpy.execute(
        "SELECT pg_catalog.count(*) AS groups, pg_catalog.sum(g.n) FILTER (WHERE g.ec_id IS NULL) AS null_ec, "
        "%s AS ec, %s AS n, %s AS d FROM (SELECT o.%s::pg_catalog.int8 AS ec_id, pg_catalog.count(*) AS n, %s AS d "
        "FROM %s AS o GROUP BY 1) AS g" % (
            T.binary_agg("g.ec_id", "int8"), T.binary_agg("g.n", "int8"), T.binary_agg("g.d", "int8"),
            C.ident(EC), distinct, relation_qname))[0]
    if row["null_ec"]:
        C.fail(plpy, C.NULL_NOT_ALLOWED, '%s has %d rows with NULL in column "%s"' % (name or relation_qname, row["null_ec"], EC),
               "Every row needs its class in ec_id.")
    n = int(row["groups"])
    ec, sizes, d = (T.decode_array(row[c], "int8", n) for c in ("ec", "n", "d"))
    order = np.argsort(ec, kind="stable")
    return ec[order], sizes[order], d[order]


def _class_emds(kind, ec, codes, counts, m, hierarchy):
    if kind == "hierarchical":
        return X.hierarchical_class_emds(ec, codes, counts, hierarchy)
    if kind == "ordered":
        return X.ordered_class_emds(ec, codes, counts, m)
    return X.equal_class_emds(ec, codes, counts, m)


# SA types whose values travel exactly as int8 / float8, so their ranks are computed in numpy
ROW_TYPES = {"int2": "int8", "int4": "int8", "int8": "int8", "float4": "float8", "float8": "float8"}


# SA types whose values fit an int4, so they can share one int8 with their class id
PAIR_TYPES = ("int2", "int4")


def _measure_rows(plpy, relation_qname, sa_name, sa_col, hierarchy, kind, small_classes=False):
    """The same measurement from one scan without grouping in SQL, when the SA travels exactly
    (an integer or float SA, or leaf positions of a hierarchy): ``(ec_id, code)`` per row in
    binary, grouped in numpy.  None when the relation has NULLs or values that are no leaves
    (the grouped query reports them) or the SA needs SQL's own order (numeric, dates, text).

    With ``small_classes`` (see :func:`measure`) and an SA of at most 32 bits (int2, int4, a
    leaf position), each row's class and value travel as one int8 (``transfer.int32_pair_sql``):
    one aggregate per row instead of four (a row with a NULL makes the pair NULL, which
    ``string_agg`` skips, so the byte count shows it); 1M rows: about 0.15 s less backend CPU."""
    column = "o.%s" % C.qi(plpy, sa_name)
    if kind == "hierarchical":
        value, sqltype = "h.pos", "int8"
        source = "%s AS o %s" % (relation_qname, C.leaf_position_join("h", 1, _as_leaf_text(plpy, sa_name)))
    elif kind == "ordered" and sa_col["typname"] in ROW_TYPES:
        value, sqltype, source = column, ROW_TYPES[sa_col["typname"]], "%s AS o" % relation_qname
    else:
        return None
    ec_column = "o.%s" % C.qi(plpy, EC)
    leaves = hierarchy.leaves if hierarchy is not None else None
    if small_classes and (kind == "hierarchical" or sa_col["typname"] in PAIR_TYPES):
        got = paired_rows(plpy, ec_column, value, source, leaves)
        if got is None or got[0] == 0:                      # NULLs: the grouped query
            return None
        _, ec, values = got
    else:
        query = ("SELECT pg_catalog.count(*) AS n, pg_catalog.count(%s) AS n_ec, pg_catalog.count(%s) AS n_sa, "
                 "%s AS ec, %s AS sa FROM %s" % (ec_column, value, T.binary_agg(ec_column, "int8"),
                                                  T.binary_agg(value, sqltype), source))
        row = (plpy.execute(plpy.prepare(query, ["text[]"]), [leaves]) if leaves is not None
               else plpy.execute(query))[0]
        n = int(row["n"])
        if n == 0 or row["n_ec"] < n or row["n_sa"] < n:
            return None
        ec = T.decode_array(row["ec"], "int8", n)
        values = T.decode_array(row["sa"], sqltype, n)
    codes, m = (values - 1, len(hierarchy.leaves)) if kind == "hierarchical" else ranks(values)
    return _class_emds(kind, *groups(ec, codes, m), m, hierarchy)


def paired_rows(plpy, ec: str, value: str, source: str, leaves=None):
    """(rows, class ids, values) of every row of ``source`` (a ``FROM`` item), its class id and
    its value (SQL expressions, both 32-bit) read as one int8 per row (``transfer.int32_pair_sql``:
    one aggregate instead of two); ``leaves``: the text[] parameter $1 ``source`` uses, if any.
    None when a row has a NULL in either: its pair is NULL, which ``string_agg`` skips, so fewer
    than 8 bytes a row were read."""
    query = "SELECT pg_catalog.count(*) AS n, %s AS pairs FROM %s" % (
        T.binary_agg(T.int32_pair_sql(ec, value), "int8"), source)
    row = (plpy.execute(plpy.prepare(query, ["text[]"]), [leaves]) if leaves is not None
           else plpy.execute(query))[0]
    n = int(row["n"])
    if n and (row["pairs"] is None or len(row["pairs"]) != 8 * n):
        return None
    return (n, *T.split_int32_pair(T.decode_array(row["pairs"], "int8", n) if n else np.zeros(0, np.int64)))


def ranks(values):
    """(dense rank of each value from 0, number of distinct values); integers of a short range
    by a presence table (linear time), others by sorting."""
    if len(values) and values.dtype.kind == "i":
        low = int(values.min())
        span = int(values.max()) - low + 1
        if span <= 4 * len(values) + 1024:
            shifted = values - low
            present = np.zeros(span, dtype=bool)
            present[shifted] = True
            rank = np.cumsum(present) - 1
            return rank[shifted], int(rank[-1]) + 1
    distinct, codes = np.unique(values, return_inverse=True)
    return np.asarray(codes, dtype=np.int64).reshape(-1), len(distinct)


def groups(ec, codes, m):
    """The distinct (class, code) pairs of the rows with their counts, ordered by class then
    code: by counting when classes x codes is small, else by sorting."""
    low = int(ec.min())
    span = int(ec.max()) - low + 1
    if span * m <= max(8 * len(ec), 1 << 22):
        counts = np.bincount((ec - low) * m + codes, minlength=span * m)
        keys = np.flatnonzero(counts)
        return keys // m + low, keys % m, counts[keys]
    order = np.lexsort((codes, ec))
    ec, codes = ec[order], codes[order]
    starts = np.flatnonzero(np.concatenate(([True], (ec[1:] != ec[:-1]) | (codes[1:] != codes[:-1]))))
    return ec[starts], codes[starts], np.diff(np.append(starts, len(ec)))


def _check_complete(plpy, row, relation_qname: str, sa_name: str, hierarchy, name: str):
    """Every tuple needs a class, an SA value and (with a hierarchy) a leaf."""
    for column, nulls in ((EC, row["null_ec"]), (sa_name, row["null_sa"])):
        if nulls:
            C.fail(plpy, C.NULL_NOT_ALLOWED, '%s has %d rows with NULL in column "%s"'
                   % (name, nulls, column),
                   "Every row needs its class in ec_id and a sensitive value; t-closeness is "
                   "undefined for a row without them.")
    if row["missing"]:
        examples = [r["v"] for r in plpy.execute(plpy.prepare(_MISSING_EXAMPLES.format(
            sa=_as_leaf_text(plpy, sa_name), rel=relation_qname, col=C.qi(plpy, sa_name)),
            ["text[]"]), [hierarchy.leaves])]
        C.fail(plpy, C.INVALID_PARAMETER, '%d rows of %s have a value of "%s" that is not a leaf '
               'of hierarchy "%s"' % (row["missing"], name, sa_name, hierarchy.name),
               "Use the hierarchy the output was made with, or add the missing values to it "
               "with sabre_define_hierarchy.",
               detail="Values not in the hierarchy include: %s." % ", ".join(repr(v) for v in examples))
