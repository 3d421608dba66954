"""sabre_define_hierarchy / sabre_drop_hierarchy: parse, validate (core.hierarchy), store.

A hierarchy belongs to the role that defined it: row-level security on the catalog lets a
role write only its own (docs/hierarchies.md, "Who may define hierarchies"); a superuser may
replace or drop any.  Roles need INSERT, UPDATE, DELETE on the two catalog tables, which the
DBA grants.
"""
from __future__ import annotations

from sabre_pg.core import limits
from sabre_pg.core.hierarchy import parse_arx

from ..shared import common as C
from ..shared import errors as E

GRANT_HINT = ("Ask the DBA to allow it: GRANT INSERT, UPDATE, DELETE ON %s, %s TO <role>; "
              "each role then writes only the hierarchies it owns.")


@E.entry_point
def define(plpy, name, csv, delimiter=";"):
    _check_arguments(name, csv, delimiter)
    text_bytes = len(csv)                      # characters: a lower bound of the bytes
    if text_bytes <= limits.HIERARCHY_TEXT_BYTES:
        text_bytes = len(csv.encode("utf-8"))
    C.check_hierarchy_size(name, 0, 0, 0, text_bytes)
    rows = parse_arx(csv.lstrip("\ufeff"), delimiter)
    C.check_hierarchy_size(name, len(rows), max((len(r) for r in rows), default=1) - 1, sum(len(r) for r in rows))
    h = C.built_hierarchy(rows, name, delimiter)
    _check_writable(plpy, name)
    plpy.execute(plpy.prepare("DELETE FROM %s WHERE name OPERATOR(pg_catalog.=) $1"
                              % C.catalog("hierarchies"), ["text"]), [name])
    plpy.execute(plpy.prepare(
        "INSERT INTO %s (name, height, leaves, root) VALUES ($1, $2, $3, $4)" % C.catalog("hierarchies"),
        ["text", "int", "int", "text"]), [name, h.height, h.n_leaves, h.labels[h.root]])
    width = h.height + 1
    flat = [v for r in h.rows for v in r]          # rows in pre-order, width labels each
    # rows cut from the flat array by grouping its elements (a slice $2[a:b] per row walks the
    # array from its start each time: quadratic in the leaves, 17 s for 20,000)
    plpy.execute(plpy.prepare(
        "INSERT INTO %s (hierarchy, ord, path) SELECT $1, ((u.o OPERATOR(pg_catalog.-) 1) OPERATOR(pg_catalog./) $3)"
        "::pg_catalog.int4, pg_catalog.array_agg(u.v ORDER BY u.o) FROM pg_catalog.unnest($2::pg_catalog.text[]) "
        "WITH ORDINALITY AS u(v, o) GROUP BY (u.o OPERATOR(pg_catalog.-) 1) OPERATOR(pg_catalog./) $3"
        % C.catalog("hierarchy_rows"), ["text", "text[]", "int8"]), [name, flat, width])
    return [(name, h.n_leaves, h.height)]


@E.entry_point
def drop(plpy, name):
    """True when the hierarchy existed and was dropped, false when none has that name."""
    if name is None:
        raise E.invalid_parameter("hierarchy name must not be NULL", "Name the hierarchy to drop.")
    if not _check_writable(plpy, name):
        return False
    plpy.execute(plpy.prepare("DELETE FROM %s WHERE name OPERATOR(pg_catalog.=) $1"
                              % C.catalog("hierarchies"), ["text"]), [name])
    return True


def _check_arguments(name, csv, delimiter):
    if name is None or str(name).strip() == "":
        raise E.invalid_parameter("hierarchy name must not be empty",
                                  "Name the hierarchy, e.g. sabre_define_hierarchy('marital_h', csv).")
    if csv is None or csv.strip() == "":
        raise E.invalid_parameter('hierarchy "%s" has no rows' % name,
                                  "Pass ARX-format text: one row per leaf, leaf;level1;...;root.")
    if delimiter is None or len(delimiter) == 0:
        raise E.invalid_parameter("the delimiter must not be empty", "The ARX format uses ';'.")


def _check_writable(plpy, name) -> bool:
    """Whether a hierarchy of that name exists; raises unless the caller may write it."""
    r = plpy.execute(plpy.prepare(
        "SELECT (SELECT h.owner FROM %s h WHERE h.name OPERATOR(pg_catalog.=) $1) AS owner, "
        "CURRENT_USER AS me, (SELECT rolsuper FROM pg_catalog.pg_roles "
        "WHERE rolname OPERATOR(pg_catalog.=) CURRENT_USER) AS superuser, "
        "pg_catalog.has_table_privilege(%s, 'INSERT, DELETE') "
        "AND pg_catalog.has_table_privilege(%s, 'INSERT, DELETE') AS granted" % (
            C.catalog("hierarchies"), plpy.quote_literal(C.catalog("hierarchies")),
            plpy.quote_literal(C.catalog("hierarchy_rows"))), ["text"]), [name])[0]
    if not r["granted"]:
        raise E.insufficient_privilege(
            "role %s may not define or drop hierarchies" % r["me"],
            GRANT_HINT % (C.catalog("hierarchies"), C.catalog("hierarchy_rows")))
    if r["owner"] is not None and r["owner"] != r["me"] and not r["superuser"]:
        raise E.insufficient_privilege(
            'hierarchy "%s" belongs to %s' % (name, r["owner"]),
            "Choose another name; only its owner or a superuser may replace or drop it.")
    return r["owner"] is not None
