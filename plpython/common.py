"""Shared helpers of the PL/Python entry points: errors with SQLSTATE + HINT, identifiers,
catalog look-ups and bulk column reads.  Every function takes ``plpy`` explicitly."""
from __future__ import annotations

import json

import numpy as np

from sabre_pg.core.hierarchy import Hierarchy, HierarchyError  # noqa: F401 (re-export)

# SQLSTATEs used by sabre-pg
INVALID_PARAMETER = "22023"
NULL_NOT_ALLOWED = "22004"
BAD_FILE_FORMAT = "22P04"
UNDEFINED_TABLE = "42P01"
UNDEFINED_COLUMN = "42703"
UNDEFINED_OBJECT = "42704"
DUPLICATE_COLUMN = "42701"
DUPLICATE_TABLE = "42P07"
DATATYPE_MISMATCH = "42804"
INVALID_NAME = "42602"

NUMERICAL_CATEGORIES = ("N", "D", "T")   # numeric, date/time, timespan
CATEGORICAL_CATEGORIES = ("S", "B", "E")  # string, boolean, enum


def fail(plpy, sqlstate: str, message: str, hint: str | None = None, detail: str | None = None):
    """Raise a PostgreSQL error with SQLSTATE, message, DETAIL and HINT."""
    kw = {"sqlstate": sqlstate}
    if hint:
        kw["hint"] = hint
    if detail:
        kw["detail"] = detail
    plpy.error(message, **kw)


def qi(plpy, name: str) -> str:
    return plpy.quote_ident(name)


def qname(plpy, schema: str, name: str) -> str:
    return "%s.%s" % (plpy.quote_ident(schema), plpy.quote_ident(name))


def sabre_schema(plpy) -> str:
    """The schema this installation lives in (where the running function is defined)."""
    return plpy.execute(
        "SELECT n.nspname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
        "WHERE p.proname = 'sabre_anonymize' AND EXISTS (SELECT 1 FROM pg_class c "
        "WHERE c.relnamespace = n.oid AND c.relname = 'modules') LIMIT 1")[0]["nspname"]


def relation_info(plpy, oid: int) -> dict:
    r = plpy.execute(plpy.prepare(
        "SELECT n.nspname, c.relname, c.relkind FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1", ["oid"]), [oid])
    return dict(r[0]) if r else None


def resolve_relation(plpy, source) -> dict:
    """Resolve a regclass (oid) or a text name to {oid, nspname, relname, relkind}."""
    if source is None:
        fail(plpy, INVALID_PARAMETER, "source must not be NULL",
             "Pass the table or view to anonymize, e.g. source => 'public.census'.")
    src = str(source)
    if src.isdigit():
        oid = int(src)
    else:
        r = plpy.execute(plpy.prepare("SELECT to_regclass($1)::oid AS oid", ["text"]), [src])
        oid = r[0]["oid"]
        if oid is None:
            fail(plpy, UNDEFINED_TABLE, 'relation "%s" does not exist' % src,
                 "Check the name and the search_path; quote mixed-case names, e.g. 'public.\"MyTable\"'.")
    info = relation_info(plpy, oid)
    if info is None:
        fail(plpy, UNDEFINED_TABLE, "relation with OID %s does not exist" % oid,
             "Check the name and the search_path.")
    info["oid"] = oid
    info["qname"] = qname(plpy, info["nspname"], info["relname"])
    return info


def columns(plpy, oid: int) -> dict:
    """name -> {type (format_type), category (pg_type.typcategory), typname}, in column order."""
    rows = plpy.execute(plpy.prepare(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod) AS type, t.typcategory, "
        "t.typname, a.attnotnull FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
        "WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        ["oid"]), [oid])
    return {r["attname"]: {"type": r["type"], "category": r["typcategory"],
                           "typname": r["typname"], "notnull": r["attnotnull"]} for r in rows}


def kind_of(col: dict) -> str | None:
    if col["category"] in NUMERICAL_CATEGORIES:
        return "numerical"
    if col["category"] in CATEGORICAL_CATEGORIES:
        return "categorical"
    return None


def numeric_expr(plpy, name: str, col: dict, prefix: str = "") -> str:
    """SQL expression giving a numerical column as float8 (dates as days, times as seconds)."""
    c = prefix + qi(plpy, name)
    if col["typname"] == "date":      # (date - date refuses infinite dates)
        return ("(CASE WHEN isfinite(%s) THEN (%s - date '1970-01-01')::float8 WHEN %s > date '1970-01-01' "
                "THEN 'Infinity'::float8 ELSE '-Infinity'::float8 END)" % (c, c, c))
    if col["category"] in ("D", "T"):
        return "extract(epoch FROM %s)::float8" % c
    return "%s::float8" % c


def load_hierarchy(plpy, schema: str, name: str, purpose: str) -> Hierarchy:
    rows = plpy.execute(plpy.prepare(
        "SELECT path FROM %s.hierarchy_rows WHERE hierarchy = $1 ORDER BY ord"
        % plpy.quote_ident(schema), ["text"]), [name])
    if not len(rows):
        known = [r["name"] for r in plpy.execute(
            "SELECT name FROM %s.hierarchies ORDER BY name LIMIT 20" % plpy.quote_ident(schema))]
        fail(plpy, UNDEFINED_OBJECT, 'hierarchy "%s" (%s) does not exist' % (name, purpose),
             "Define it with sabre_define_hierarchy(name, csv); known hierarchies: %s"
             % (", ".join(known) if known else "none"))
    return Hierarchy([list(r["path"]) for r in rows], name=name)


def to_array(values, dtype) -> np.ndarray:
    return np.asarray(values, dtype=dtype)


class settings:
    """Context manager: transaction-local GUC values, restored on exit.  With
    ``optional=True`` a value the caller may not set (e.g. a superuser-only one) is skipped."""

    def __init__(self, plpy, optional: bool = False, **values):
        self.plpy, self.optional, self.values, self.saved = plpy, optional, values, {}

    def _set(self, name, value):
        r = self.plpy.execute(self.plpy.prepare(
            "SELECT current_setting($1) AS old, set_config($1, $2, true)", ["text", "text"]),
            [name, str(value)])
        self.saved[name] = r[0]["old"]

    def __enter__(self):
        for name, value in self.values.items():
            if not self.optional:
                self._set(name, value)
                continue
            try:
                with self.plpy.subtransaction():
                    self._set(name, value)
            except self.plpy.SPIError:
                pass
        return self

    def __exit__(self, *exc):
        for name, old in self.saved.items():
            self.plpy.execute(self.plpy.prepare("SELECT set_config($1, $2, true)", ["text", "text"]),
                              [name, old])
        return False


def parse_options(plpy, options, known, example: str) -> dict:
    """The jsonb ``options`` argument as a dict; unknown keys are an error (typos must not pass)."""
    if options is None:
        return {}
    try:
        opts = json.loads(options) if isinstance(options, str) else dict(options)
    except ValueError as e:
        fail(plpy, INVALID_PARAMETER, "options is not valid JSON: %s" % e,
             "Pass a JSON object, e.g. options => '%s'." % example)
    if not isinstance(opts, dict):
        fail(plpy, INVALID_PARAMETER, "options must be a JSON object",
             "For example options => '%s'." % example)
    unknown = sorted(set(opts) - set(known))
    if unknown:
        fail(plpy, INVALID_PARAMETER, "unknown option(s): %s" % ", ".join(unknown),
             "Known options: %s." % ", ".join(known))
    return opts
