"""Shared helpers of the PL/Python entry points: identifiers, the installation's schema,
argument checks shared by every entry point, catalog look-ups.  Every function that talks to
the server takes ``plpy`` explicitly; the rest is pure and tested without a server.

Every entry point runs with ``search_path = pg_catalog, pg_temp`` (the SQL functions' SET
clause), so no object of the caller's schemas can capture a call in the SQL built here; user
names reach this code as OIDs or are resolved explicitly.
"""
from __future__ import annotations

import difflib
import hashlib
import json

from sabre_pg.core import limits, parameters
from sabre_pg.core.hierarchy import Hierarchy, HierarchyError, check_size

from .._installed import SCHEMA   # the schema sabre-pg was installed in (fixed at install time)
from . import errors as E
from . import safe_types
from .errors import (DATATYPE_MISMATCH, INVALID_PARAMETER, NULL_NOT_ALLOWED,  # noqa: F401 (used as C.*)
                     UNDEFINED_COLUMN, UNDEFINED_OBJECT)

NUMERICAL_CATEGORIES = ("N", "D", "T")   # numeric, date/time, timespan
CATEGORICAL_CATEGORIES = ("S", "B", "E")  # string, boolean, enum
INTEGER_TYPES = ("int2", "int4", "int8")


def fail(plpy, sqlstate: str, message: str, hint: str | None = None, detail: str | None = None):
    """Raise a PostgreSQL error with SQLSTATE, message, DETAIL and HINT."""
    E.raise_sql(plpy, E.SabreError(sqlstate, message, hint, detail))


ident = safe_types.ident


def qi(plpy, name: str) -> str:
    return ident(name)


def qname(plpy, schema: str, name: str) -> str:
    return "%s.%s" % (ident(schema), ident(name))


def catalog(name: str) -> str:
    """A qualified object of the sabre schema, e.g. catalog("runs")."""
    return "%s.%s" % (ident(SCHEMA), ident(name))


def check_t(t, hint: str):
    """The core's rule for t (0 < t <= 1; NaN refused) as a PostgreSQL error: NULL 22004,
    the rest 22023; one check for every entry point."""
    return _core_check("t", t, parameters.check_t, hint)


def check_k(k, hint: str):
    """The core's rule for k (an integer >= 1) as a PostgreSQL error, like :func:`check_t`."""
    return _core_check("k", k, parameters.check_k, hint)


def _core_check(name, value, check, hint):
    if value is None:
        raise E.null_not_allowed("%s must not be NULL" % name, hint)
    try:
        return check(value)
    except ValueError as e:
        raise E.invalid_parameter(str(e), hint)


def relation_info(plpy, oid: int) -> dict:
    """{nspname, relname, relkind, qname}: qname as the server quotes it (valid SQL and the
    form messages show), or None."""
    r = plpy.execute(plpy.prepare(
        "SELECT n.nspname, c.relname, c.relkind, pg_catalog.format('%I.%I', n.nspname, c.relname) AS qname "
        "FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace "
        "WHERE c.oid OPERATOR(pg_catalog.=) $1", ["oid"]), [oid])
    return dict(r[0]) if r else None


def resolve_relation(plpy, source, name: str | None = None) -> dict:
    """{oid, nspname, relname, relkind, qname} of a relation given as an OID (or a regclass's
    text, which the pinned search_path prints qualified); ``name`` is the caller's text when
    the relation was looked up by name (for the error when none exists)."""
    if source is None:
        if name is not None:
            raise E.undefined_table('relation "%s" does not exist' % name,
                                    "Check the name and your search_path; quote mixed-case names, "
                                    "e.g. 'public.\"MyTable\"'.")
        raise E.invalid_parameter("source must not be NULL",
                                  "Pass the table or view to anonymize, e.g. source => 'public.census'.")
    text = str(source)
    if text.isdigit():
        oid = int(text)
    else:
        oid = plpy.execute(plpy.prepare("SELECT pg_catalog.to_regclass($1)::pg_catalog.oid AS oid",
                                        ["text"]), [text])[0]["oid"]
    info = relation_info(plpy, oid) if oid is not None else None
    if info is None:
        raise E.undefined_table("relation %s does not exist" % (name or text),
                                "Check the name and your search_path.")
    info["oid"] = oid
    return info


def columns(plpy, oid: int) -> dict:
    """name -> {type, category (pg_type.typcategory), typname, notnull, declared, read,
    unsafe}, in column order: each column as sabre reads and writes it, a type whose casts
    and constraints are a superuser's (:mod:`.safe_types`; ``declared`` is its own type)."""
    rows = plpy.execute(prepared(plpy, safe_types.COLUMNS_SQL, ["oid"]), [oid])
    return {r["attname"]: safe_types.column(r) for r in rows}


def read_sql(info: dict, cols: dict, used=()) -> str:
    """The ``FROM`` item reading relation ``info`` (:func:`resolve_relation`) with ``cols``
    (:func:`columns`) converted to their safe types (:func:`safe_types.read_sql`)."""
    return safe_types.read_sql(info["qname"], cols, used)


def kind_of(col: dict) -> str | None:
    if col["category"] in NUMERICAL_CATEGORIES:
        return "numerical"
    if col["category"] in CATEGORICAL_CATEGORIES:
        return "categorical"
    return None


# a numeric beyond float8's range, clamped to these for the engine's geometry (``clamp``)
NUMERIC_FLOAT_MAX, NUMERIC_FLOAT_MIN = "1e300", "1e-300"


def numeric_expr(plpy, name: str, col: dict, prefix: str = "", clamp: bool = False, immutable: bool = False) -> str:
    """SQL expression giving a numerical column as float8 (dates as days, times as seconds).

    ``clamp``: a ``numeric`` beyond float8 (1e400, 1e-400: the cast fails with 22003) becomes
    +-1e300 or 0, its order kept but not its distances -- for reads whose floats only place rows
    (the engine's keys and cuts), where the published ranges are the source's own values.
    ``immutable``: only immutable functions (Citus runs no other in a ``VALUES`` list): a
    ``timestamptz`` as the seconds of its distance to the epoch (``date_part`` of a
    ``timestamptz`` is stable), the same instants in the same order."""
    c = prefix + qi(plpy, name)
    if immutable and col["typname"] == "timestamptz":
        return ("pg_catalog.date_part('epoch', %s OPERATOR(pg_catalog.-) '1970-01-01 00:00:00+00'::pg_catalog.timestamptz)"
                "::pg_catalog.float8" % c)
    if clamp and col["typname"] == "numeric":
        return ("(CASE WHEN %s IN ('NaN'::pg_catalog.numeric, 'Infinity'::pg_catalog.numeric, "
                "'-Infinity'::pg_catalog.numeric) OR pg_catalog.abs(%s) OPERATOR(pg_catalog.<=) %s::pg_catalog.numeric "
                "AND pg_catalog.abs(%s) OPERATOR(pg_catalog.>=) %s::pg_catalog.numeric OR %s OPERATOR(pg_catalog.=) 0 "
                "THEN %s::pg_catalog.float8 WHEN pg_catalog.abs(%s) OPERATOR(pg_catalog.>) 1 "
                "THEN pg_catalog.sign(%s)::pg_catalog.float8 OPERATOR(pg_catalog.*) %s::pg_catalog.float8 "
                "ELSE 0::pg_catalog.float8 END)" % (c, c, NUMERIC_FLOAT_MAX, c, NUMERIC_FLOAT_MIN, c, c, c, c,
                                                    NUMERIC_FLOAT_MAX))
    if col["typname"] == "date":      # (date - date refuses infinite dates)
        return ("(CASE WHEN pg_catalog.isfinite(%s) THEN (%s OPERATOR(pg_catalog.-) '1970-01-01'::pg_catalog.date)"
                "::pg_catalog.float8 WHEN %s OPERATOR(pg_catalog.>) '1970-01-01'::pg_catalog.date "
                "THEN 'Infinity'::pg_catalog.float8 ELSE '-Infinity'::pg_catalog.float8 END)" % (c, c, c))
    if col["typname"] == "interval":
        # seconds in PostgreSQL's own interval order (a month is 30 days, a day 24 hours),
        # not extract(epoch), which counts a year as 365.25 days
        return ("((pg_catalog.date_part('year', %s) * 360 + pg_catalog.date_part('month', %s) * 30 "
                "+ pg_catalog.date_part('day', %s)) * 86400 + pg_catalog.date_part('hour', %s) * 3600 "
                "+ pg_catalog.date_part('minute', %s) * 60 + pg_catalog.date_part('second', %s))::float8"
                % ((c,) * 6))
    if col["category"] in ("D", "T"):
        return "pg_catalog.date_part('epoch', %s)::pg_catalog.float8" % c
    return "%s::pg_catalog.float8" % c


def leaf_position_join(alias: str, param: int, value_sql: str) -> str:
    """``LEFT JOIN`` giving each value (text) its leaf position, 1-based, as ``<alias>.pos``
    (NULL for a value that is no leaf), from the leaves in the text array parameter ``$param``."""
    return ("LEFT JOIN pg_catalog.unnest($%d::pg_catalog.text[]) WITH ORDINALITY AS %s(leaf, pos) "
            "ON %s.leaf OPERATOR(pg_catalog.=) %s" % (param, alias, alias, value_sql))


HIERARCHY_CAP_HINT = ("Generalize the leaves first (for example codes to their first characters) or split "
                      "the hierarchy; the caps are listed in docs/hierarchies.md.")


def check_hierarchy_size(name: str, leaves: int, height: int, cells: int, text_bytes: int = 0):
    """54000 when a caller's hierarchy exceeds the caps of ``sabre_pg.core.limits``."""
    try:
        check_size(leaves, height, cells, text_bytes)
    except limits.LimitExceeded as e:
        raise E.program_limit_exceeded('hierarchy "%s" is too large: %s' % (name, e), HIERARCHY_CAP_HINT)


HINT_CANDIDATES = 5   # names a HINT suggests at most


def nearest(name, candidates, n: int = HINT_CANDIDATES, cutoff: float = 0.0) -> list:
    """Up to ``n`` of ``candidates`` (distinct), nearest to ``name`` first: by difflib's
    similarity ratio of the lower-cased names (at least ``cutoff``), then by name.  Pure."""
    target = str(name if name is not None else "").lower()
    scored = sorted((-difflib.SequenceMatcher(None, target, str(c).lower()).ratio(), str(c))
                    for c in set(candidates))
    return [c for score, c in scored if -score >= cutoff][:n]


def nearest_text(name, candidates, n: int = HINT_CANDIDATES) -> str:
    """``nearest`` as a HINT's list: "a, b, c", "... (5 of 12)" when there are more, "none"."""
    names = set(candidates)
    shown = nearest(name, names, n)
    if not shown:
        return "none"
    return ", ".join(shown) + (" (%d of %d)" % (len(shown), len(names)) if len(names) > len(shown) else "")


# how long a run waits for a lock on sabre.hierarchies / hierarchy_rows (issue 25, finding 7(3)):
# a role with write rights on them can LOCK them; a run fails fast instead of waiting forever
HIERARCHY_LOCK_TIMEOUT = "3s"


def load_hierarchy(plpy, name: str, purpose: str) -> Hierarchy:
    """One hierarchy of the catalog (:func:`load_hierarchies` of one use)."""
    return load_hierarchies(plpy, [(name, purpose)])[name]


def load_hierarchies(plpy, uses) -> dict:
    """{name: Hierarchy} of the hierarchies a call uses, ``uses`` a list of (name, purpose), one
    per attribute (a name several attributes use is loaded once and the object shared).

    Capped per hierarchy (:func:`check_hierarchy_size`) and over the call: the labels of every
    use summed (``limits.HIERARCHY_CALL_CELLS``), checked from the catalog's counts before any
    row is read, then again on the rows actually read (a commit in between cannot slip more in).
    Each Hierarchy carries ``fingerprint`` = {owner, sha256 of its rows}: what a run records so
    that a refresh can refuse a hierarchy redefined since (docs/security.md).  The catalog is
    read under a short lock_timeout: a session holding a lock on it makes the call fail with
    55P03 instead of waiting."""
    uses = list(uses)
    names = sorted({n for n, _ in uses})
    if not names:
        return {}
    try:
        with settings(plpy, lock_timeout=HIERARCHY_LOCK_TIMEOUT):
            sizes = {r["hierarchy"]: r for r in plpy.execute(prepared(
                plpy, "SELECT r.hierarchy, pg_catalog.count(*) AS leaves, "
                "COALESCE(pg_catalog.max(pg_catalog.cardinality(r.path)), 1) AS width, "
                "COALESCE(pg_catalog.sum(pg_catalog.cardinality(r.path)), 0) AS cells, COALESCE(pg_catalog.sum("
                "pg_catalog.octet_length(pg_catalog.array_to_string(r.path, ''))), 0) AS bytes FROM %s AS h "
                "JOIN %s AS r ON r.hierarchy OPERATOR(pg_catalog.=) h.name "
                "WHERE h.name OPERATOR(pg_catalog.=) ANY ($1) GROUP BY r.hierarchy"
                % (catalog("hierarchies"), catalog("hierarchy_rows")), ["text[]"]), [names])}
            _check_uses(plpy, uses, sizes)
            read = _read_rows(plpy, names)
    except plpy.SPIError as e:
        if getattr(e, "sqlstate", None) != E.LOCK_NOT_AVAILABLE:
            raise
        raise E.lock_not_available(
            "could not read the hierarchies %s: another session holds a lock on %s or %s"
            % (", ".join('"%s"' % n for n in names), catalog("hierarchies"), catalog("hierarchy_rows")),
            "A session holds a lock on sabre.hierarchies (see pg_locks and pg_stat_activity for who); run again "
            "when it is released. Only trusted roles should have write rights on the hierarchy catalog "
            "(docs/security.md).")
    # what was actually read, checked again (one statement: one snapshot)
    _check_uses(plpy, uses, {n: {"leaves": len(p), "width": max(len(x) for x in p),
                                 "cells": sum(len(x) for x in p), "bytes": sum(len("".join(v for v in x if v is not None).encode()) for x in p)}
                             for n, (_, p) in read.items()})
    found = {}
    for name, (owner, paths) in read.items():
        h = built_hierarchy(paths, name, stored=True)
        h.fingerprint = {"owner": owner, "sha256": hierarchy_hash(paths)}
        found[name] = h
    return found


def built_hierarchy(rows, name, delimiter=";", stored=False) -> Hierarchy:
    """The validated Hierarchy of ``rows``; a malformed one (ragged rows, two roots, a label
    naming two different sets of leaves, ...) is 22P04 naming the hierarchy and the label or
    row.  ``stored``: read from the catalog (defined before a check existed)."""
    try:
        return Hierarchy(rows, name=name)
    except HierarchyError as e:
        hint = ("Every row must be leaf%slevel1%s...%sroot with the same number of fields, one root, one "
                "parent per node and unique leaves; every label names one node (an internal node is not "
                "labelled like a leaf or like another node with other leaves)." % ((delimiter,) * 3))
        if stored:
            hint += " Redefine it with sabre_define_hierarchy."
        raise E.SabreError(E.BAD_FILE_FORMAT, "malformed hierarchy: %s" % e, hint)


def _read_rows(plpy, names) -> dict:
    """{name: (owner, [path, ...] in order)} of the named hierarchies, in one statement."""
    found = {}
    for r in plpy.execute(prepared(
            plpy, "SELECT h.name, h.owner::pg_catalog.text AS owner, r.path FROM %s AS h JOIN %s AS r "
            "ON r.hierarchy OPERATOR(pg_catalog.=) h.name WHERE h.name OPERATOR(pg_catalog.=) ANY ($1) "
            "ORDER BY h.name, r.ord" % (catalog("hierarchies"), catalog("hierarchy_rows")), ["text[]"]), [names]):
        found.setdefault(r["name"], (r["owner"], []))[1].append(list(r["path"]))
    return found


def hierarchy_hash(paths) -> str:
    """The content hash of a hierarchy's rows (in order) that a run records."""
    return hashlib.sha256(json.dumps(paths, ensure_ascii=False, separators=(",", ":")).encode()).hexdigest()


def hierarchy_fingerprints(plpy, names) -> dict:
    """{name: {owner, sha256}} of the named hierarchies as they are now (absent: undefined),
    read like :func:`load_hierarchies` (same lock_timeout; no size caps: only hashed)."""
    with settings(plpy, lock_timeout=HIERARCHY_LOCK_TIMEOUT):
        read = _read_rows(plpy, sorted(set(names)))
    return {n: {"owner": owner, "sha256": hierarchy_hash(paths)} for n, (owner, paths) in read.items()}


def changed_hierarchies(recorded: dict, current: dict) -> list:
    """What changed between two {name: {owner, sha256}}: e.g. ['"h" (redefined)'] (empty: none)."""
    changed = []
    for name, was in sorted(recorded.items()):
        now = current.get(name)
        if now is None:
            changed.append('"%s" (dropped)' % name)
        elif now.get("owner") != was.get("owner"):
            changed.append('"%s" (owner %s, was %s)' % (name, now.get("owner"), was.get("owner")))
        elif now.get("sha256") != was.get("sha256"):
            changed.append('"%s" (redefined)' % name)
    return changed


def _check_uses(plpy, uses, sizes):
    """Each hierarchy used exists and is within the per-hierarchy caps; the labels of every use
    summed are within the per-call cap."""
    for name, purpose in uses:
        if name not in sizes:
            known = [r["name"] for r in plpy.execute("SELECT name FROM %s" % catalog("hierarchies"))]
            fail(plpy, UNDEFINED_OBJECT, 'hierarchy "%s" (%s) does not exist' % (name, purpose),
                 "Define it with sabre_define_hierarchy(name, csv); known hierarchies, nearest first: %s"
                 % nearest_text(name, known))
    for name in sorted({n for n, _ in uses}):
        s = sizes[name]
        check_hierarchy_size(name, s["leaves"], s["width"] - 1, s["cells"], s["bytes"])
    total = sum(int(sizes[n]["cells"]) for n, _ in uses)
    message = limits.over("hierarchy labels over the call's %d hierarchical attributes" % len(uses), total,
                          limits.HIERARCHY_CALL_CELLS)
    if message:
        raise E.program_limit_exceeded(
            "the call's hierarchies are too large together: %s" % message,
            "Each attribute naming a hierarchy counts its labels (leaves x levels), even when several name the "
            "same one: name fewer or smaller hierarchies (generalize the leaves first), or use fewer "
            "categorical quasi-identifiers; the caps are listed in docs/security.md.")


_PREPARED = {}


def prepared(plpy, sql, types):
    """``plpy.prepare`` of a statement run again and again, kept for the session: only for
    statements whose text interpolates no values (the text is the key)."""
    if getattr(plpy, "standin", False):     # a driven run's plpy (driven.py): its own plans
        return plpy.prepare(sql, types)
    key = (sql, tuple(types))
    plan = _PREPARED.get(key)
    if plan is None:
        plan = _PREPARED[key] = plpy.prepare(sql, types)
    return plan


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
        if not self.optional and self.values:
            # every value in one statement (a context is entered for a few statements)
            r = self.plpy.execute(prepared(
                self.plpy, "SELECT u.n, pg_catalog.current_setting(u.n) AS old, pg_catalog.set_config(u.n, u.v, true) "
                "FROM ROWS FROM (pg_catalog.unnest($1::text[]), pg_catalog.unnest($2::text[])) AS u(n, v)",
                ["text[]", "text[]"]), [list(self.values), [str(v) for v in self.values.values()]])
            self.saved = {row["n"]: row["old"] for row in r}
            return self
        if getattr(self.plpy, "standin", False):     # a driven run (driven.py) cannot catch an error:
            r = self.plpy.execute(prepared(           # set only what the caller may set
                self.plpy, "SELECT s.name AS n, pg_catalog.current_setting(s.name) AS old, pg_catalog.set_config("
                "s.name, u.v, true) FROM ROWS FROM (pg_catalog.unnest($1::text[]), pg_catalog.unnest($2::text[])) "
                "AS u(n, v) JOIN pg_catalog.pg_settings AS s ON s.name OPERATOR(pg_catalog.=) u.n "
                "WHERE s.context OPERATOR(pg_catalog.=) 'user' OR pg_catalog.has_parameter_privilege(s.name, 'SET')",
                ["text[]", "text[]"]), [list(self.values), [str(v) for v in self.values.values()]])
            self.saved = {row["n"]: row["old"] for row in r}
            return self
        for name, value in self.values.items():
            try:
                with self.plpy.subtransaction():
                    self._set(name, value)
            except self.plpy.SPIError as e:
                E.reraise_canceled(e)   # an optional setting may fail, a cancel must not be lost
        return self

    def __exit__(self, *exc):
        if self.saved:
            self.plpy.execute(prepared(
                self.plpy, "SELECT pg_catalog.set_config(u.n, u.v, true) FROM ROWS FROM (pg_catalog.unnest($1::text[]), "
                "pg_catalog.unnest($2::text[])) AS u(n, v)", ["text[]", "text[]"]),
                [list(self.saved), list(self.saved.values())])
        return False


def quietly(plpy):
    """:class:`settings` for internal statements that may send a NOTICE the caller has no use for
    (``DROP ... IF EXISTS``: 'does not exist, skipping'): ``client_min_messages`` raised to warning
    around them, restored after."""
    return settings(plpy, client_min_messages="warning")


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
             "Known options, nearest first: %s." % nearest_text(unknown[0], known))
    return opts
