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


def _read_source(conn, source: str, source_schema: str, names: list[str]):
    """(kind per column, SQL type per column, the columns ``names`` as value lists)."""
    attributes = conn.execute(
        "SELECT a.attname, t.typcategory, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
        "JOIN pg_type t ON t.oid = a.atttypid WHERE a.attrelid = %s::regclass AND a.attnum > 0 "
        "AND NOT a.attisdropped", (f"{source_schema}.{source}",)).fetchall()
    kinds = {name: ("numerical" if category in ("N",) else "categorical") for name, category, _ in attributes}
    types = {name: sql_type for name, _, sql_type in attributes}
    rows = conn.execute(sql.SQL("SELECT {} FROM {}.{}").format(
        sql.SQL(", ").join(sql.Identifier(c) for c in names), sql.Identifier(source_schema),
        sql.Identifier(source))).fetchall()
    columns = list(zip(*rows)) if rows else [[] for _ in names]
    return kinds, types, columns


def _encode_qis(conn, quasi_identifiers, kinds, columns, hierarchies: dict, sabre_schema: str):
    """Mondrian's input per QI (numbers, or pre-order leaf positions of its hierarchy, flat
    when none is given) and (name, values, hierarchy or None) for the generalization."""
    qi_arrays, encoded = {}, []
    for name, values in zip(quasi_identifiers, columns):
        if kinds[name] == "numerical" and name not in hierarchies:
            numbers = np.asarray(values, dtype=np.float64)
            qi_arrays[name] = numbers
            encoded.append((name, numbers, None))
        else:
            hierarchy = (load_hierarchy(conn, hierarchies[name], sabre_schema) if name in hierarchies
                         else Hierarchy.flat(values, name=name))
            positions = hierarchy.codes([str(x) for x in values])
            qi_arrays[name] = positions
            encoded.append((name, positions, hierarchy))
    return qi_arrays, encoded


def _generalize(ec: np.ndarray, encoded, types: dict):
    """Output columns, their SQL types and per-class values: [min, max] per numerical QI,
    the lowest common ancestor's label per categorical QI (as sabre generalizes)."""
    index = ECIndex(ec)
    names, column_types, per_class = ["ec_id"], ["bigint"], []
    for name, values, hierarchy in encoded:
        if hierarchy is None:
            ranges = generalize_numerical(index, values)
            names += [name + "_lo", name + "_hi"]
            column_types += [types[name], types[name]]
            per_class += [ranges.lo, ranges.hi]
        else:
            names.append(name)
            column_types.append("text")
            per_class.append(generalize_categorical(index, values, hierarchy).labels)
    return index, names, column_types, per_class


def _copy_text(ec: np.ndarray, per_class, sa: list[str]) -> str:
    """The output rows in COPY text format: class id, its generalized QIs, the row's SA."""
    formatted = []
    for values in per_class:
        if values.dtype.kind == "f" and np.all(values == np.round(values)):
            formatted.append(values.astype(np.int64).astype(str))
        else:
            formatted.append(np.array([_copy_escape(str(x)) for x in values], dtype=object))
    ec_text = ec.astype(str)
    buffer = io.StringIO()
    for row in range(len(ec)):
        class_id = ec[row]
        buffer.write("\t".join([ec_text[row]] + [column[class_id] for column in formatted]
                               + [_copy_escape(sa[row])]) + "\n")
    return buffer.getvalue()


def _write_output(conn, qualified, names, column_types, text: str) -> None:
    with conn.transaction():
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(qualified))
        conn.execute(sql.SQL("CREATE TABLE {} ({})").format(qualified, sql.SQL(", ").join(
            sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(ty)) for c, ty in zip(names, column_types))))
        with conn.cursor().copy(sql.SQL("COPY {} FROM STDIN").format(qualified)) as copy:
            copy.write(text)
        conn.execute(sql.SQL("ANALYZE {}").format(qualified))


def run_mondrian(conn, source: str, quasi_identifiers, sensitive: str, t: float, k: int,
                 output: str, hierarchies: dict | None = None, sabre_schema: str = "sabre",
                 source_schema: str = "public") -> dict:
    """Anonymize ``source`` with the peer and store ``output`` (replaced) in ``source_schema``.

    ``hierarchies`` maps categorical QIs to sabre hierarchy names (flat when missing).
    Returns {"classes", "rows", "seconds": {"read", "partition", "write", "total"}}.
    """
    hierarchies = hierarchies or {}
    started = time.perf_counter()
    kinds, types, columns = _read_source(conn, source, source_schema, list(quasi_identifiers) + [sensitive])
    read = time.perf_counter()
    qi_arrays, encoded = _encode_qis(conn, quasi_identifiers, kinds, columns, hierarchies, sabre_schema)
    sa = [str(x) for x in columns[-1]]
    ec = mondrian_partition(qi_arrays, sa, k, t)
    partitioned = time.perf_counter()
    index, names, column_types, per_class = _generalize(ec, encoded, types)
    names.append(sensitive)
    column_types.append(types[sensitive])
    qualified = sql.SQL("{}.{}").format(sql.Identifier(source_schema), sql.Identifier(output))
    _write_output(conn, qualified, names, column_types, _copy_text(ec, per_class, sa))
    written = time.perf_counter()
    return {"classes": index.n_classes, "rows": len(ec),
            "seconds": {"read": read - started, "partition": partitioned - read,
                        "write": written - partitioned, "total": written - started}}


def _copy_escape(s: str) -> str:
    return s.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
