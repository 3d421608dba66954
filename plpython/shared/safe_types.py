"""How sabre reads a column so that no other role's code runs (issue 25, finding 1).

PostgreSQL looks casts up in ``pg_cast`` whatever the ``search_path``, and the owner of a
type may ``CREATE CAST`` from or to it (an enum, a composite, a range or its array type); a
domain's ``CHECK`` runs whenever a value is coerced *to* the domain.  So sabre never casts a
value of a type another role owns, and never writes one.  Each column is decided once, here,
from the catalog (by OID, never by name), in one of three ways:

* its type, after unwrapping domains (``typbasetype``/``typtypmod``, like PostgreSQL's
  ``getBaseTypeAndTypmod``), is owned by a superuser (every built-in type, extension types):
  the column is read as that base type -- ``(x)::integer`` for a domain over integer, a
  relabel that runs no CHECK -- and the existing fast paths (casts between superusers'
  types) apply;
* the base type is owned by another role: it is read as ``text`` through its output
  function alone, ``pg_catalog.textin(pg_catalog.enum_out(x))`` (strict: NULL stays NULL),
  provided that function is owned by a superuser -- no cast, operator or CHECK of its owner;
  a domain over such a type is relabelled to it first, ``enum_out((x)::owner.mood)``;
* otherwise the column cannot be read safely: :func:`refuse` raises 42804 with a HINT.

A column's collation (``attcollation``, a domain's ``COLLATE`` included) is kept only when it
is a deterministic collation of ``pg_catalog``; any other -- another role's, which its owner
may ``DROP ... CASCADE``, or a nondeterministic one, under which SQL's DISTINCT merges values
Python keeps apart -- is replaced: ``(x COLLATE pg_catalog."default")``.

Every relation sabre creates takes these safe types and collations, so its columns never
depend on a type or collation another role owns.  :func:`column` is pure; :func:`read_sql`
gives the ``FROM`` item that reads a relation with every column converted (the relation
itself when none needs it).
"""
from __future__ import annotations

from . import errors as E

NUMERICAL_CATEGORIES = ("N", "D", "T")

COLUMNS_SQL = (
    "WITH RECURSIVE chain AS ("
    "SELECT a.attnum, a.atttypid AS typid, a.atttypmod AS typmod, 0 AS depth FROM pg_catalog.pg_attribute AS a "
    "WHERE a.attrelid OPERATOR(pg_catalog.=) $1 AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped "
    "UNION ALL SELECT c.attnum, t.typbasetype, t.typtypmod, c.depth OPERATOR(pg_catalog.+) 1 FROM chain AS c "
    "JOIN pg_catalog.pg_type AS t ON t.oid OPERATOR(pg_catalog.=) c.typid WHERE t.typtype OPERATOR(pg_catalog.=) 'd'), "
    "base AS (SELECT DISTINCT ON (c.attnum) c.attnum, c.typid, c.typmod, c.depth FROM chain AS c "
    "ORDER BY c.attnum, c.depth DESC) "
    "SELECT a.attname, a.attnotnull, pg_catalog.format_type(a.atttypid, a.atttypmod) AS declared, "
    "b.depth OPERATOR(pg_catalog.>) 0 AS domain, pg_catalog.format_type(b.typid, b.typmod) AS type, "
    "t.typname::pg_catalog.text AS typname, t.typcategory::pg_catalog.text AS category, "
    "COALESCE((SELECT r.rolsuper FROM pg_catalog.pg_roles AS r WHERE r.oid OPERATOR(pg_catalog.=) t.typowner), "
    "false) AS trusted, pg_catalog.format('%I.%I', pn.nspname, p.proname) AS output, "
    "COALESCE((SELECT r.rolsuper FROM pg_catalog.pg_roles AS r WHERE r.oid OPERATOR(pg_catalog.=) p.proowner), "
    "false) AS output_trusted, a.attcollation OPERATOR(pg_catalog.<>) 0 AND NOT COALESCE(("
    "SELECT co.collisdeterministic AND cn.nspname OPERATOR(pg_catalog.=) 'pg_catalog' "
    "FROM pg_catalog.pg_collation AS co "
    "JOIN pg_catalog.pg_namespace AS cn ON cn.oid OPERATOR(pg_catalog.=) co.collnamespace "
    "WHERE co.oid OPERATOR(pg_catalog.=) a.attcollation), false) AS recollate "
    "FROM pg_catalog.pg_attribute AS a JOIN base AS b ON b.attnum OPERATOR(pg_catalog.=) a.attnum "
    "JOIN pg_catalog.pg_type AS t ON t.oid OPERATOR(pg_catalog.=) b.typid "
    "LEFT JOIN pg_catalog.pg_proc AS p ON p.oid OPERATOR(pg_catalog.=) t.typoutput "
    "LEFT JOIN pg_catalog.pg_namespace AS pn ON pn.oid OPERATOR(pg_catalog.=) p.pronamespace "
    "WHERE a.attrelid OPERATOR(pg_catalog.=) $1 ORDER BY a.attnum")


def column(row: dict) -> dict:
    """One column's entry of ``common.columns()`` from its :data:`COLUMNS_SQL` row (pure):
    ``type`` (the SQL type sabre reads, compares and writes it as), ``typname``,
    ``category``, ``notnull``, ``declared`` (the column's own type, for messages), ``read``
    (the conversion, relabel and collation: SQL to put before and after the column; None when
    read as it is),
    ``converted`` (read as text through its output function) and ``unsafe`` (why it cannot be
    read, or None)."""
    entry = {"declared": row["declared"], "notnull": row["attnotnull"],
             "read": None, "unsafe": None, "converted": False}
    # a domain is first relabelled to its base type: no CHECK runs, and the base type's
    # functions apply (enum_out(anyenum) does not take a domain over an enum)
    base = ("(", ")::%s" % row["type"]) if row["domain"] else ("", "")
    if row["trusted"]:
        entry.update(type=row["type"], typname=row["typname"], category=row["category"])
        if row.get("recollate"):
            # a collation outside pg_catalog (another role's, which it may drop with CASCADE)
            # or a nondeterministic one: read with the database's default collation, so
            # nothing sabre makes depends on it and SQL and Python see the same distinct values
            entry["read"] = ("(" + base[0], base[1] + " COLLATE pg_catalog.%s)" % ident("default"))
        elif row["domain"]:
            entry["read"] = base
        return entry
    category = "U" if row["category"] in NUMERICAL_CATEGORIES else row["category"]
    entry.update(type="text", typname="text", category=category, converted=True)
    if row["output"] is None or not row["output_trusted"]:
        entry["unsafe"] = "type %s is owned by a role that is not a superuser and its output function %s is too" % (
            row["type"], row["output"])
        return entry
    # (textin's result takes the default collation whatever the column's)
    entry["read"] = ("pg_catalog.textin(%s(%s" % (row["output"], base[0]), "%s))" % base[1])
    return entry


def refuse(name: str, col: dict) -> E.SabreError:
    """The error for a column that cannot be read without another role's code."""
    return E.datatype_mismatch(
        'column "%s" of type %s cannot be read safely: %s' % (name, col["declared"], col["unsafe"]),
        "sabre reads a type another role owns only through a superuser's output function, so that no code of "
        "that role runs as you. Convert the column in a view you own (e.g. to text), or ask a superuser to "
        "own the type's output function.")


def check(columns: dict, used):
    """:func:`refuse` the first column of ``used`` that cannot be read safely."""
    for name in used:
        if name in columns and columns[name]["unsafe"]:
            raise refuse(name, columns[name])


def read_sql(qname: str, columns: dict, used=()) -> str:
    """The ``FROM`` item reading relation ``qname`` with ``columns`` (``common.columns()``)
    in their safe types, under the same column names; ``qname`` itself when no column needs
    converting.  A column of ``used`` that cannot be read safely raises :func:`refuse`; other
    such columns are left out."""
    check(columns, used)
    if all(c["read"] is None and not c["unsafe"] for c in columns.values()):
        return qname
    select = []
    for name, col in columns.items():
        if col["unsafe"]:
            continue
        ref = "r.%s" % ident(name)
        select.append("%s AS %s" % (ref.join(col["read"]) if col["read"] else ref, ident(name)))
    return "(SELECT %s FROM %s AS r)" % (", ".join(select), qname)


def ident(name: str) -> str:
    """A quoted SQL identifier (always quoted: the same text as quote_ident for any name)."""
    return '"%s"' % str(name).replace('"', '""')
