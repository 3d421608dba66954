"""sabre_instant's joint summary from PostgreSQL 14+ **expression statistics**
(``options.statistics = 'create_expressions'``; docs/instant.md, "Expression statistics").

The paper's Bayesian network gives the joint distribution of the QIs; an MCV list of
extended statistics on the QI *columns* holds only the few most common combinations of raw
values (a small share of the rows once there are three or more QIs).  Here the MCV list is
taken over the QIs' **generalization expressions** at one lattice node v
(:func:`sabre_pg.core.instant.joint_level`: the lowest, balanced node whose combinations fit
the statistics target), where it can hold nearly every combination:

* a numerical QI at interval level j: ``floor((x - origin) / width_j)``, the bin the
  validation's SQL groups by (same origin and width, same float8 arithmetic); at level 0 the
  column itself;
* a categorical QI at level j: ``(ARRAY[groups]::int4[])[array_position(ARRAY[leaves]::text[],
  x::text)]``, the group of its leaf at level j from constant arrays built from the hierarchy
  (a statistics expression may reference only the table's columns, so the hierarchy's table
  cannot be joined; arrays, ``array_position`` and the text cast of the listed types are
  immutable); for a type whose text form depends on settings (dates, enums ...), the column
  itself, so such a QI is at level 0 or ``*``;
* a QI at its top level (``*``) is left out.

The object is created in the session's temporary schema under a name unique to the
transaction, ANALYZEd (the table's statistics refreshed; no row changed), its MCV list read
from ``pg_stats_ext`` and the object dropped again in the same call: the product drops only
the object it has just created, and nothing stays behind (an error rolls the creation back).
The call's run records the object's definition (``options->'instant'->'expression_statistics'``).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import numpy as np

from sabre_pg.core import instant as I

from ..shared import common as C
from ..shared import errors as E
from . import estimate as S

TEXT_IMMUTABLE = ("text", "varchar", "bpchar", "name", "int2", "int4", "int8", "numeric", "bool", "uuid")
NUMBER_STABLE = ("timestamptz", "timetz")       # their float8 form is not immutable


@dataclass(frozen=True)
class ExpressionStatistics:
    """The MCV list over a node's groups: ``cells`` (items x QIs, group index at ``level``,
    0 for a QI at its top) and ``freqs``; ``facts`` for the run's record."""
    level: tuple
    cells: np.ndarray
    freqs: np.ndarray
    facts: dict


def expression(plpy, a, q: I.QILevels, level: int, hierarchy) -> str:
    """The SQL over the bare column of QI ``a`` giving its group at ``level`` (< top)."""
    column = C.ident(a.name)
    if q.intervals is not None:
        if level == 0:
            return column
        return "pg_catalog.floor((%s - %r::pg_catalog.float8) / %r::pg_catalog.float8)" % (
            C.numeric_expr(None, a.name, a.col), q.intervals.origin, q.intervals.widths[level - 1])
    if _as_itself(a):
        return column
    leaves = ", ".join(plpy.quote_literal(str(v)) for v in hierarchy.leaves)
    return "(ARRAY[%s]::pg_catalog.int4[])[pg_catalog.array_position(ARRAY[%s]::pg_catalog.text[], (%s)::pg_catalog.text)]" % (
        ", ".join(str(int(g)) for g in q.groups[level]), leaves, column)


def _as_itself(a) -> bool:
    """A categorical QI used as the bare column: its text form is not immutable, or it is read
    through its type's output function (safe_types: a cast of the type's owner is never
    written into an expression)."""
    return a.typname not in TEXT_IMMUTABLE or a.col.get("converted", False)


def allowed_levels(a, q: I.QILevels) -> tuple:
    """The levels with an immutable expression: all, or for a column used as it is 0 and ``*``."""
    itself = (q.intervals is None and _as_itself(a)) or \
        (q.intervals is not None and a.typname in NUMBER_STABLE)
    return (0, q.top) if itself else tuple(range(q.top + 1))


def statistics_target(plpy, given) -> int:
    if "statistics_target" not in given:
        return int(plpy.execute("SELECT pg_catalog.current_setting('default_statistics_target')::int4 AS t")[0]["t"])
    t = given["statistics_target"]
    if isinstance(t, bool) or not isinstance(t, int) or not 1 <= t <= S.MAX_STATISTICS_TARGET:
        raise E.invalid_parameter("options.statistics_target must be an integer in [1, %d]" % S.MAX_STATISTICS_TARGET,
                                  "The MCV list's length for 'create_expressions' (default: default_statistics_target).")
    return t


def chosen_level(req, levels, target: int) -> tuple:
    """``options.expression_level`` (one level per QI) or :func:`I.joint_level`."""
    allowed = [allowed_levels(a, q) for a, q in zip(req.qis, levels)]
    given = req.given.get("expression_level")
    if given is None:
        return I.joint_level(levels, target, allowed)
    if not isinstance(given, list) or len(given) != len(levels) or any(
            isinstance(j, bool) or not isinstance(j, int) or j not in allowed[i] + (q.top,)
            for i, (j, q) in enumerate(zip(given, levels))):
        raise E.invalid_parameter(
            "options.expression_level must list one level per quasi-identifier, each one its expressions allow",
            "Levels allowed, in QI order: %s (a QI whose values' text form is not immutable has only 0 and its top)."
            % json.dumps([list(x) for x in allowed]))
    if np.prod([len(q.lm[j]) for q, j in zip(levels, given)], dtype=np.float64) > S.MAX_STATISTICS_TARGET * 100:
        raise E.invalid_parameter("options.expression_level has more combinations than an MCV list can hold",
                                  "Choose higher levels, or leave the option out (the lowest node that fits).")
    return tuple(given)


def build(plpy, req, levels, hierarchies) -> ExpressionStatistics | None:
    """Create the expression statistics of the chosen node, ANALYZE, read its MCV list, drop
    it; None when fewer than two QIs are below their top there (no joint to learn)."""
    owner = plpy.execute(plpy.prepare("SELECT pg_catalog.pg_has_role(c.relowner, 'USAGE') AS ok FROM pg_catalog.pg_class "
                                      "AS c WHERE c.oid = $1", ["oid"]), [req.source["oid"]])[0]["ok"]
    if not owner:           # (CREATE STATISTICS, unlike ANALYZE, is the table owner's alone)
        raise E.insufficient_privilege("options.statistics = 'create_expressions': only the owner of %s can create "
                                       "statistics on it" % req.source["qname"],
                                       "Ask its owner to run it, or use 'marginals'.")
    target = statistics_target(plpy, req.given)
    level = chosen_level(req, levels, target)
    inside = [i for i, (q, j) in enumerate(zip(levels, level)) if j < q.top]
    if len(inside) < 2:
        return None
    exprs = [expression(plpy, req.qis[i], levels[i], level[i], hierarchies.get(req.qis[i].name)) for i in inside]
    xid = plpy.execute("SELECT pg_catalog.txid_current()::pg_catalog.text AS x")[0]["x"]
    name = "%s_sabre_expr_%s" % (req.source["relname"][:40],
                                 hashlib.md5(json.dumps([req.source["oid"], exprs, xid]).encode()).hexdigest()[:10])
    plpy.execute("CREATE STATISTICS pg_temp.%s (mcv) ON %s FROM %s" % (
        C.ident(name), ", ".join(e if e == C.ident(req.qis[i].name) else "(%s)" % e for i, e in zip(inside, exprs)),
        req.source["qname"]))
    if "statistics_target" in req.given:
        plpy.execute("ALTER STATISTICS pg_temp.%s SET STATISTICS %d" % (C.ident(name), target))
    plpy.execute("ANALYZE %s (%s)" % (req.source["qname"], ", ".join(C.ident(a.name) for a in req.attrs)))
    cells, freqs = read(plpy, req, levels, level, inside, exprs, name)
    plpy.execute("DROP STATISTICS pg_temp.%s" % C.ident(name))
    facts = {"level": list(level), "expressions": exprs, "statistics_target": target, "items": int(len(freqs)),
             "share": float(freqs.sum()), "dropped": True}
    return ExpressionStatistics(level, cells, freqs, facts)


READ_SQL = (
    "SELECT e.attnames::pg_catalog.text[] AS attnames, e.most_common_vals AS vals, e.most_common_val_nulls AS nulls, "
    "e.most_common_freqs AS freqs FROM pg_catalog.pg_stats_ext AS e WHERE e.statistics_schemaname = "
    "(SELECT n.nspname FROM pg_catalog.pg_namespace AS n WHERE n.oid = pg_catalog.pg_my_temp_schema()) "
    "AND e.statistics_name = $1 ORDER BY e.inherited DESC LIMIT 1")


def read(plpy, req, levels, level, inside, exprs, name) -> tuple:
    """(items x QIs groups at ``level``, frequencies) of the object's MCV list; items with a
    NULL, or a value outside the summary's groups, are left out (their mass is spread by
    independence).  A dimension's place in an item: the columns (attnum order), then the
    expressions (in the order given)."""
    found = plpy.execute(plpy.prepare(READ_SQL, ["name"]), [name])
    if not len(found) or found[0]["vals"] is None:
        return np.zeros((0, len(levels)), dtype=np.int64), np.zeros(0)
    r = found[0]
    attnames = list(r["attnames"] or [])
    place, nexpr = [], 0
    for i, e in zip(inside, exprs):
        if e == C.ident(req.qis[i].name):
            place.append(attnames.index(req.qis[i].name))
        else:
            place.append(len(attnames) + nexpr)
            nexpr += 1
    cells = np.zeros((len(r["freqs"]), len(levels)), dtype=np.int64)
    keep = np.array([not any(r["nulls"][n][p] for p in place) for n in range(len(r["freqs"]))], dtype=bool)
    for i, p in zip(inside, place):
        texts = [r["vals"][n][p] if keep[n] else None for n in range(len(keep))]
        cells[:, i] = groups_of(plpy, req.qis[i], levels[i], level[i], texts)
    keep &= (cells >= 0).all(axis=1)
    return cells[keep], np.asarray(r["freqs"], dtype=np.float64)[keep]


def groups_of(plpy, a, q: I.QILevels, level: int, texts) -> np.ndarray:
    """The groups at ``level`` of one dimension's item values (text; None left as -1)."""
    out = np.full(len(texts), -1, dtype=np.int64)
    given = [n for n, t in enumerate(texts) if t is not None]
    values = [texts[n] for n in given]
    if not given:
        return out
    if q.intervals is not None and level > 0:
        out[given] = I.bin_groups(q, level, [float(v) for v in values])
    elif q.intervals is not None:
        position = {v: c for c, v in enumerate(q.cells)}
        out[given] = [position.get(float(v), -1) for v in S.decode_list(plpy, a, values)]
    elif not _as_itself(a):
        out[given] = [int(v) for v in values]
    else:
        position = {v: c for c, v in enumerate(q.cells)}
        out[given] = [position.get(v, -1) for v in values]
    return out
