"""The Mondrian t-closeness peer: ``anonypyx`` (PyPI) on the rows of a source table.

``run_mondrian`` fetches the QI and SA columns with psycopg, partitions them with anonypyx's
Mondrian, and writes the classes back as a relation of sabre_anonymize's shape (``ec_id``,
``<qi>_lo``/``<qi>_hi`` for numerical QIs, ``<qi>`` = hierarchy node label for categorical QIs,
the SA unchanged), so ``sabre_verify``, ``sabre_utility``, ``sabre_query_error`` and
``sabre_kl_divergence`` apply to it unchanged.

anonypyx configuration (0.2.x), and why:

* ``anonypyx.mondrian.Mondrian(df, feature_columns=<QIs>)`` with the privacy models
  ``anonypyx.models.kAnonymity(k)`` and
  ``anonypyx.models.tCloseness(t, df, <SA>, anonypyx.models.earth_movers_distance_categorical)``:
  exactly what ``Anonymiser(df, k=k, t=t, closeness_metric="earth mover's distance",
  algorithm="Mondrian")`` builds.  ``Anonymiser`` itself refuses that metric unless *every QI*
  has the pandas ``category`` dtype (it raises NotImplementedError for numerical QIs), so the
  two model objects are passed to ``Mondrian.partition`` directly.
* anonypyx's EMD is ``0.5 * sum |p - q|`` over the SA values, i.e. the equal-distance EMD, which
  is sabre's hierarchical EMD under a *flat* hierarchy.  The SA is given the ``category`` dtype
  with all its values as categories, so a class's distribution includes its zero frequencies
  (otherwise anonypyx sums only over the values present in the class and under-estimates the
  distance).  The comparison therefore runs SABRE with the same SA as categorical under a flat
  hierarchy.
* Categorical QIs are passed as their pre-order leaf positions (integers), so Mondrian's
  median split follows the hierarchy order (anonypyx splits a ``category`` column into two
  halves of its values in order of appearance, which ignores the hierarchy); numerical QIs as
  numbers.  Mondrian cuts at the median (``< median`` / ``>= median``) of the widest
  normalized span and keeps a cut only if both halves satisfy both models.
* The classes are then generalized exactly as sabre generalizes its own (``sabre_pg.core.
  generalize``: [min, max] per numerical QI, lowest common ancestor per categorical QI), so
  AIL and the workload estimates are computed identically for both.
"""
from __future__ import annotations

import io
import time

import numpy as np
from psycopg import sql

from sabre_pg.core.generalize import ECIndex, generalize_categorical, generalize_numerical
from sabre_pg.core.hierarchy import Hierarchy


class PeerUnavailable(RuntimeError):
    pass


def available() -> bool:
    try:
        import anonypyx  # noqa: F401
        import pandas  # noqa: F401
    except Exception:
        return False
    return True


def load_hierarchy(conn, name: str, schema: str = "sabre") -> Hierarchy:
    rows = conn.execute(sql.SQL("SELECT path FROM {}.hierarchy_rows WHERE hierarchy = %s ORDER BY ord")
                        .format(sql.Identifier(schema)), (name,)).fetchall()
    if not rows:
        raise ValueError(f"hierarchy {name!r} does not exist")
    return Hierarchy([list(r[0]) for r in rows], name=name)


def mondrian_partition(qi_arrays: dict, sa_values, k: int, t: float) -> np.ndarray:
    """anonypyx Mondrian with k-anonymity and equal-distance EMD t-closeness: class id per row."""
    try:
        import pandas as pd
        from anonypyx import models, mondrian
    except ImportError as e:
        raise PeerUnavailable("the Mondrian peer needs anonypyx: pip install -e '.[bench]'") from e
    df = pd.DataFrame({name: np.asarray(v) for name, v in qi_arrays.items()})
    sa_name = "__sa__"
    df[sa_name] = pd.Categorical(np.asarray(sa_values), categories=sorted(set(np.asarray(sa_values).tolist())))
    privacy = [models.kAnonymity(int(k)),
               models.tCloseness(float(t), df, sa_name, models.earth_movers_distance_categorical)]
    parts = mondrian.Mondrian(df, list(qi_arrays)).partition(privacy)
    ec = np.full(len(df), -1, dtype=np.int64)
    for i, p in enumerate(parts):
        ec[np.asarray(p)] = i
    assert (ec >= 0).all()
    return ec


def run_mondrian(conn, source: str, quasi_identifiers, sensitive: str, t: float, k: int,
                 output: str, hierarchies: dict | None = None, sabre_schema: str = "sabre",
                 source_schema: str = "public") -> dict:
    """Anonymize ``source`` with the peer and store ``output`` (replaced) in ``source_schema``.

    ``hierarchies`` maps categorical QIs to sabre hierarchy names (flat when missing).
    Returns {"classes", "seconds": {"read", "partition", "write", "total"}}.
    """
    hierarchies = hierarchies or {}
    T0 = time.perf_counter()
    cols = conn.execute(
        "SELECT a.attname, t.typcategory, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
        "JOIN pg_type t ON t.oid = a.atttypid WHERE a.attrelid = %s::regclass AND a.attnum > 0 "
        "AND NOT a.attisdropped", (f"{source_schema}.{source}",)).fetchall()
    kinds = {c[0]: ("numerical" if c[1] in ("N",) else "categorical") for c in cols}
    types = {c[0]: c[2] for c in cols}
    names = list(quasi_identifiers) + [sensitive]
    rows = conn.execute(sql.SQL("SELECT {} FROM {}.{}").format(
        sql.SQL(", ").join(sql.Identifier(c) for c in names), sql.Identifier(source_schema),
        sql.Identifier(source))).fetchall()
    columns = list(zip(*rows)) if rows else [[] for _ in names]
    T1 = time.perf_counter()
    qi_arrays, gen_in = {}, []
    for j, q in enumerate(quasi_identifiers):
        if kinds[q] == "numerical" and q not in hierarchies:
            v = np.asarray(columns[j], dtype=np.float64)
            qi_arrays[q] = v
            gen_in.append((q, v, None))
        else:
            h = (load_hierarchy(conn, hierarchies[q], sabre_schema) if q in hierarchies
                 else Hierarchy.flat(columns[j], name=q))
            pos = h.codes([str(x) for x in columns[j]])
            qi_arrays[q] = pos
            gen_in.append((q, pos, h))
    sa = [str(x) for x in columns[-1]]
    ec = mondrian_partition(qi_arrays, sa, k, t)
    T2 = time.perf_counter()
    idx = ECIndex(ec)
    out_cols, per_ec = ["ec_id"], []
    col_types = ["bigint"]
    for q, v, h in gen_in:
        if h is None:
            g = generalize_numerical(idx, v)
            out_cols += [q + "_lo", q + "_hi"]
            col_types += [types[q], types[q]]
            per_ec += [g.lo, g.hi]
        else:
            g = generalize_categorical(idx, v, h)
            out_cols.append(q)
            col_types.append("text")
            per_ec.append(g.labels)
    out_cols.append(sensitive)
    col_types.append(types[sensitive])
    qout = sql.SQL("{}.{}").format(sql.Identifier(source_schema), sql.Identifier(output))
    with conn.transaction():
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(qout))
        conn.execute(sql.SQL("CREATE TABLE {} ({})").format(qout, sql.SQL(", ").join(
            sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(ty)) for c, ty in zip(out_cols, col_types))))
        buf = io.StringIO()
        fmt = []
        for arr in per_ec:
            if arr.dtype.kind == "f" and np.all(arr == np.round(arr)):
                fmt.append(arr.astype(np.int64).astype(str))
            else:
                fmt.append(np.array([_copy_escape(str(x)) for x in arr], dtype=object))
        ec_s = ec.astype(str)
        for r in range(len(ec)):
            e = ec[r]
            buf.write("\t".join([ec_s[r]] + [f[e] for f in fmt] + [_copy_escape(sa[r])]) + "\n")
        with conn.cursor().copy(sql.SQL("COPY {} FROM STDIN").format(qout)) as cp:
            cp.write(buf.getvalue())
        conn.execute(sql.SQL("ANALYZE {}").format(qout))
    T3 = time.perf_counter()
    return {"classes": idx.n_classes, "rows": len(ec),
            "seconds": {"read": T1 - T0, "partition": T2 - T1, "write": T3 - T2, "total": T3 - T0}}


def _copy_escape(s: str) -> str:
    return s.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
