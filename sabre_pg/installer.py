"""Install sabre-pg into a database, entirely through a client connection.

Nothing is written on the database server's file system: the SQL in ``sql/*.sql``
is executed over the connection, and the Python code that PL/Python functions
need (``sabre_pg/core/**.py`` as ``sabre_pg.core.*`` and ``plpython/**.py`` as
``sabre_plpy.*``) is stored in the table ``<schema>.modules``.

Placeholders in the SQL files:

``@schema@``
    the quoted schema identifier, e.g. ``"sabre"``.
``@bootstrap@``
    a short PL/Python preamble (see :func:`bootstrap`) that goes first in every
    PL/Python function body. After it, ``import sabre_pg.core.emd`` or
    ``from sabre_plpy.batch import anonymize`` works inside the backend.
``@limit:NAME@``
    the number ``sabre_pg.core.limits.NAME`` (the caps live in that one module).

Install, upgrade and re-install are the same operation: every SQL file is
idempotent, the modules table is rewritten, and ``<schema>.meta`` records the
package version plus a fresh random ``build_id``. Backends compare that
``build_id`` on every call and reload their cached modules when it changed.

Nothing is adopted: install refuses a schema, or an object in it, that the installing
role does not own, or a schema others may create in. :func:`check` lists every departure
from what install writes (``tampered``), comparing the catalog with a reference install
made and rolled back in a savepoint. :func:`uninstall` refuses to drop others' dependent
objects unless asked to cascade; ``purge`` drops what ``<schema>.recorded_relations()``
returns.
"""
from __future__ import annotations

import functools
import hashlib
import re
import uuid
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus

import sabre_pg
from sabre_pg import citus
from sabre_pg.core import limits
from sabre_pg.errors import SabreError

PACKAGE_DIR = Path(sabre_pg.__file__).resolve().parent
REPO_DIR = PACKAGE_DIR.parent
CORE_DIR = PACKAGE_DIR / "core"


def source_dir(packaged: str, checkout: str) -> Path:
    """Where the SQL or PL/Python sources are: inside the package when it was installed from
    a wheel (``sabre_pg/_sql``, ``sabre_pg/_plpython``, copied there by setup.py's build
    hook), else the checkout's top-level folder (a source tree or an editable install)."""
    inside = PACKAGE_DIR / packaged
    return inside if inside.is_dir() else REPO_DIR / checkout


SQL_DIR = source_dir("_sql", "sql")
PLPYTHON_DIR = source_dir("_plpython", "plpython")

CORE_SQL = "00_core.sql"          # creates meta and modules; applied first
LOADER_MODULE = "_sabre_loader"   # reserved row in <schema>.modules, exec'd by the preamble
INSTALLED_MODULE = "sabre_plpy._installed"  # synthesized: SCHEMA = '<schema>'
MODULE_ROOTS = ("sabre_pg", "sabre_plpy")
SCHEMA_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class InstallError(SabreError):
    """sabre-pg cannot be installed, upgraded or removed in this database."""


class PrivilegeError(InstallError):
    """The connected role lacks the privilege the operation needs."""


# --------------------------------------------------------------------------------------
# What gets installed
# --------------------------------------------------------------------------------------
LOADER_SOURCE = '''\
# Executed by the @bootstrap@ preamble with globals plpy, GD, SCHEMA, BUILD.
import importlib.abc
import importlib.util
import linecache
import sys

ROOTS = ("sabre_pg", "sabre_plpy")


class SabreModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves sabre_pg.* and sabre_plpy.* from SCHEMA.modules (read once per build)."""

    _sabre_finder = True

    def __init__(self, schema, build, modules):
        self.schema, self.build, self.modules = schema, build, modules

    def find_spec(self, fullname, path=None, target=None):
        entry = self.modules.get(fullname)
        if entry is None:
            return None
        is_package = entry[1]
        origin = "%s.modules/%s%s.py" % (self.schema.strip('"'), fullname.replace(".", "/"),
                                         "/__init__" if is_package else "")
        return importlib.util.spec_from_loader(fullname, self, origin=origin, is_package=is_package)

    def create_module(self, spec):
        return None

    def get_source(self, fullname):
        return self.modules[fullname][0]

    def exec_module(self, module):
        spec = module.__spec__
        source = self.modules[spec.name][0]
        # Let tracebacks show the source lines.
        linecache.cache[spec.origin] = (len(source), None, source.splitlines(True), spec.origin)
        module.__file__ = spec.origin
        exec(compile(source, spec.origin, "exec"), module.__dict__)


def install_finder():
    for name in [n for n in sys.modules if n.split(".")[0] in ROOTS]:
        del sys.modules[name]
    sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "_sabre_finder", False)]
    rows = plpy.execute("SELECT name, source, is_package FROM %s.modules" % SCHEMA)
    modules = {r["name"]: (r["source"], r["is_package"]) for r in rows if r["name"].split(".")[0] in ROOTS}
    sys.meta_path.insert(0, SabreModuleFinder(SCHEMA, BUILD, modules))
    importlib.invalidate_caches()
    GD["sabre.build"] = (SCHEMA, BUILD)


install_finder()
'''


def check_schema_name(schema: str) -> str:
    if not SCHEMA_RE.match(schema or ""):
        raise InstallError(
            f"invalid schema name {schema!r}: use a lower-case identifier of letters, digits and '_'"
        )
    return schema


def quote_schema(schema: str) -> str:
    return '"%s"' % check_schema_name(schema)


def bootstrap(schema: str = "sabre") -> str:
    """The PL/Python preamble that ``@bootstrap@`` expands to (two lines, no indentation).

    It reads ``build_id`` from ``<schema>.meta`` (one cheap query per call). When the
    backend has no loader yet, or one for another schema or build, it executes the
    loader stored in ``<schema>.modules``: that drops cached ``sabre_pg*``/``sabre_plpy*``
    modules and puts a ``sys.meta_path`` finder serving ``<schema>.modules`` first.
    """
    q = quote_schema(schema)
    build_sql = f"SELECT value FROM {q}.meta WHERE key = 'build_id'"
    loader_sql = f"SELECT source FROM {q}.modules WHERE name = '{LOADER_MODULE}'"
    return (
        f"_sabre_build = plpy.execute({build_sql!r})[0]['value']\n"
        f"if GD.get('sabre.build') != ({q!r}, _sabre_build): "
        f"exec(plpy.execute({loader_sql!r})[0]['source'], "
        f"{{'plpy': plpy, 'GD': GD, 'SCHEMA': {q!r}, 'BUILD': _sabre_build}})\n"
    )


def _tree_modules(root: Path, package: str) -> list[tuple[str, str, bool]]:
    """Every .py below ``root`` as a module of ``package``; packages get an empty
    ``__init__`` when they have none."""
    found: dict[str, tuple[str, bool]] = {package: ("", True)}
    if root.is_dir():
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root)
            if "__pycache__" in rel.parts:
                continue
            parts = [package, *rel.with_suffix("").parts]
            for i in range(2, len(parts)):  # intermediate directories are packages
                found.setdefault(".".join(parts[:i]), ("", True))
            if parts[-1] == "__init__":
                found[".".join(parts[:-1])] = (path.read_text(encoding="utf-8"), True)
            else:
                found[".".join(parts)] = (path.read_text(encoding="utf-8"), False)
    return [(name, src, pkg) for name, (src, pkg) in sorted(found.items())]


def collect_modules(schema: str = "sabre") -> list[tuple[str, str, bool]]:
    """(name, source, is_package) rows for ``<schema>.modules``.

    The client's ``sabre_pg/__init__.py`` is not shipped (it may import client-only
    code); the backend gets a synthesized one holding just ``__version__``. The
    synthesized ``sabre_plpy._installed`` fixes the schema at install time:
    ``SCHEMA`` is its unquoted name, so no backend code looks the schema up by name.
    """
    check_schema_name(schema)
    rows = [("sabre_pg", f"__version__ = {sabre_pg.__version__!r}\n", True)]
    rows += _tree_modules(CORE_DIR, "sabre_pg.core")
    rows += _tree_modules(PLPYTHON_DIR, "sabre_plpy")
    if any(name == INSTALLED_MODULE for name, _, _ in rows):
        raise InstallError(f"{PLPYTHON_DIR} must not hold {INSTALLED_MODULE.split('.')[-1]}.py: "
                           "the installer synthesizes that module")
    rows.append((INSTALLED_MODULE, f"SCHEMA = {schema!r}\n", False))
    rows.append((LOADER_MODULE, LOADER_SOURCE, False))
    return rows


def sql_files() -> list[Path]:
    files = sorted(SQL_DIR.glob("*.sql"))
    if not any(f.name == CORE_SQL for f in files):
        raise InstallError(
            f"{SQL_DIR / CORE_SQL} not found: this sabre-pg installation lacks its SQL files; "
            "install it from a wheel or sdist (pip install sabre-pg) or from a checkout (pip install -e .)"
        )
    # 00_core.sql first (it is also first lexically; keep that true).
    return sorted(files, key=lambda f: (f.name != CORE_SQL, f.name))


def render_sql(text: str, schema: str) -> str:
    text = _LIMIT.sub(lambda m: str(int(getattr(limits, m.group(1)))), text)
    text = _WRAP.sub(lambda m: wrapper(text[:m.start()], m.group(1), m.group(2)), text)
    text = _RECORD_FORM.sub(lambda m: DROP_RECORD_FORM % {"sig": m.group(1)}, text)
    return text.replace("@errors_driven@", ERRORS_DRIVEN.rstrip("\n")).replace("@errors@", ERRORS.rstrip("\n")).replace(
        "@bootstrap@", bootstrap(schema).rstrip("\n")).replace("@schema@", quote_schema(schema))


_LIMIT = re.compile(r"@limit:([A-Z0-9_]+)@")     # a cap of sabre_pg.core.limits, as a number
_RECORD_FORM = re.compile(r"@drop_record_form:([^@]+)@")
_WRAP = re.compile(r"^@wrap:(\w+)(?::(\w+))?@$", re.M)
_NOT_FN = r"(?:(?!\$fn\$).)"
_IMPL = (r"CREATE OR REPLACE FUNCTION @schema@\.%s_impl\((" + _NOT_FN + r"*?)\)\s*\nRETURNS (" + _NOT_FN
         + r"*?)\nLANGUAGE plpython3u (VOLATILE|STABLE) ")


def _parameters(text: str) -> list[str]:
    """A parameter list's parameters (split at commas outside brackets)."""
    out, depth, current = [], 0, ""
    for ch in text:
        depth += (ch in "([") - (ch in ")]")
        if ch == "," and depth == 0:
            out.append(current.strip())
            current = ""
        else:
            current += ch
    return out + ([current.strip()] if current.strip() else [])


def wrapper(before: str, name: str, result: str | None) -> str:
    """``@wrap:<name>[:<type>]@``: the PL/pgSQL function ``<name>`` over the PL/Python
    ``<name>_impl`` defined last in ``before``: the same parameters (and defaults), result and
    volatility, its errors reported by ``ERRORS``.  ``<type>``: return ``SETOF @schema@.<type>``
    instead of the implementation's ``TABLE (...)``, for a wrapper whose result columns are named
    like its parameters (PL/pgSQL refuses that), the ``TABLE`` form of an earlier install dropped."""
    found = list(re.finditer(_IMPL % name, before, re.S))
    if not found:
        raise InstallError(f"@wrap:{name}@ follows no PL/Python function {name}_impl")
    params, returns, volatility = found[-1].groups()
    parameters = _parameters(params)
    head = ""
    if result:
        types = ", ".join(p.split(" DEFAULT ")[0].split(None, 1)[1].strip() for p in parameters)
        head = "@drop_record_form:%s(%s)@\n" % (name, types)
        returns = "SETOF @schema@.%s" % result
    args = ", ".join("$%d" % (i + 1) for i in range(len(parameters)))
    call = ("RETURN QUERY SELECT * FROM @schema@.%s_impl(%s);" if returns.startswith(("TABLE", "SETOF"))
            else "RETURN @schema@.%s_impl(%s);") % (name, args)
    return ("%sCREATE OR REPLACE FUNCTION @schema@.%s(%s)\nRETURNS %s\nLANGUAGE plpgsql %s SET search_path = "
            "pg_catalog, pg_temp AS $fn$\nBEGIN\n    %s\n@errors@\nEND\n$fn$;" % (head, name, params, returns,
                                                                             volatility, call))

# ``@errors@``: the exception clause of every PL/pgSQL wrapper of a PL/Python entry point
# (docs/security.md, "Errors").  PL/Python reports an error as "plpy.Error: <message>" with its
# traceback as CONTEXT; the wrapper re-raises it as PostgreSQL reports its own: the message
# without the Python prefix, the same SQLSTATE, DETAIL and HINT, and a one-line CONTEXT (the
# wrapper's RAISE).  The traceback goes to the server log (LOG, never sent at the default
# client_min_messages).  A cancel (57014) is re-raised the same way.
_ERRORS_LOG = "        RAISE LOG USING MESSAGE = e_message, DETAIL = e_context;\n"
ERRORS = r"""EXCEPTION WHEN OTHERS OR query_canceled THEN
    DECLARE
        e_message pg_catalog.text; e_state pg_catalog.text; e_detail pg_catalog.text;
        e_hint pg_catalog.text; e_context pg_catalog.text;
    BEGIN
        GET STACKED DIAGNOSTICS e_message = MESSAGE_TEXT, e_state = RETURNED_SQLSTATE,
            e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT, e_context = PG_EXCEPTION_CONTEXT;
        RAISE LOG USING MESSAGE = e_message, DETAIL = e_context;
        e_message := pg_catalog.regexp_replace(e_message,
            '^(plpy[.](Error|SPIError|Fatal)|spiexceptions[.][A-Za-z]+): ', '');
        IF e_detail OPERATOR(pg_catalog.=) '' AND e_hint OPERATOR(pg_catalog.=) '' THEN
            RAISE EXCEPTION USING MESSAGE = e_message, ERRCODE = e_state;
        ELSIF e_detail OPERATOR(pg_catalog.=) '' THEN
            RAISE EXCEPTION USING MESSAGE = e_message, ERRCODE = e_state, HINT = e_hint;
        ELSIF e_hint OPERATOR(pg_catalog.=) '' THEN
            RAISE EXCEPTION USING MESSAGE = e_message, ERRCODE = e_state, DETAIL = e_detail;
        ELSE
            RAISE EXCEPTION USING MESSAGE = e_message, ERRCODE = e_state, DETAIL = e_detail, HINT = e_hint;
        END IF;
    END;
"""

# ``@errors_driven@``: ``@errors@`` for a wrapper that may drive a run (``sabre_driven_loop``,
# plpython/shared/driven.py): a failed statement of the run is first shown to the run, whose
# handlers may report another error instead (a lost Citus node: 08006 with a HINT).
ERRORS_DRIVEN = ERRORS.replace(_ERRORS_LOG, _ERRORS_LOG + """        SELECT COALESCE(d.state, e_state), COALESCE(d.message, e_message),
               CASE WHEN d.state IS NULL THEN e_detail ELSE COALESCE(d.detail, '') END,
               CASE WHEN d.state IS NULL THEN e_hint ELSE COALESCE(d.hint, '') END
            INTO e_state, e_message, e_detail, e_hint
            FROM @schema@.sabre_driven_failed(e_state, e_message, e_detail, e_hint, e_context) AS d;
""")

# ``@drop_record_form:<name(argument types)>@`` (of the sabre schema): drop that function when it still returns
# ``record`` (RETURNS TABLE, before its wrapper returned a composite type: a function's result
# type cannot be replaced in place).
DROP_RECORD_FORM = """DO $retype$
BEGIN
    IF (SELECT p.prorettype FROM pg_catalog.pg_proc AS p
        WHERE p.oid OPERATOR(pg_catalog.=) pg_catalog.to_regprocedure('@schema@.%(sig)s'))
       OPERATOR(pg_catalog.=) 'pg_catalog.record'::pg_catalog.regtype THEN
        DROP FUNCTION @schema@.%(sig)s;
    END IF;
END
$retype$;"""


def source_hash(schema: str = "sabre") -> str:
    """Digest of everything install() would write; used to tell whether a DB is current."""
    h = hashlib.sha256(sabre_pg.__version__.encode())
    for f in sql_files():
        h.update(f.name.encode() + b"\0" + render_sql(f.read_text(encoding="utf-8"), schema).encode() + b"\0")
    for name, src, pkg in collect_modules(schema):
        h.update(f"{name}\0{int(pkg)}\0".encode() + src.encode() + b"\0")
    return h.hexdigest()


# --------------------------------------------------------------------------------------
# What the schema holds and who owns it
# --------------------------------------------------------------------------------------
# Every catalog whose rows live in a schema and have an owner: (catalog, namespace, owner).
SCHEMA_CATALOGS = (
    ("pg_class", "relnamespace", "relowner"),
    ("pg_proc", "pronamespace", "proowner"),
    ("pg_type", "typnamespace", "typowner"),
    ("pg_operator", "oprnamespace", "oprowner"),
    ("pg_opclass", "opcnamespace", "opcowner"),
    ("pg_opfamily", "opfnamespace", "opfowner"),
    ("pg_collation", "collnamespace", "collowner"),
    ("pg_conversion", "connamespace", "conowner"),
    ("pg_statistic_ext", "stxnamespace", "stxowner"),
    ("pg_ts_config", "cfgnamespace", "cfgowner"),
    ("pg_ts_dict", "dictnamespace", "dictowner"),
)

# (classid, objid, owner oid) of every object in the schema whose oid is %(nsp)s; objects
# that exist only as part of another (row types, array types) are left out.
_SCHEMA_OBJECTS_SQL = "SELECT o.classid, o.objid, o.owner FROM (" + " UNION ALL ".join(
    f"SELECT 'pg_catalog.{cat}'::pg_catalog.regclass AS classid, oid AS objid, {own} AS owner "
    f"FROM pg_catalog.{cat} WHERE {nsp} = %(nsp)s" for cat, nsp, own in SCHEMA_CATALOGS
) + (") o WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_depend d WHERE d.classid = o.classid "
     "AND d.objid = o.objid AND d.deptype = 'i')")


def _schema_row(conn: psycopg.Connection, schema: str):
    """(oid, owner name, owner is superuser) of ``schema``, or None."""
    return conn.execute(
        "SELECT n.oid, r.rolname, r.rolsuper FROM pg_catalog.pg_namespace n "
        "JOIN pg_catalog.pg_roles r ON r.oid = n.nspowner WHERE n.nspname = %s", (schema,)).fetchone()


def schema_objects(conn: psycopg.Connection, schema: str) -> list[tuple[str, str]]:
    """(description, owner) of every object in ``schema``, sorted."""
    row = _schema_row(conn, schema)
    if row is None:
        return []
    return conn.execute(
        "SELECT i.type || ' ' || i.identity, pg_catalog.pg_get_userbyid(o.owner) "
        f"FROM ({_SCHEMA_OBJECTS_SQL}) o, pg_catalog.pg_identify_object(o.classid, o.objid, 0) i "
        "ORDER BY 1", {"nsp": row[0]}).fetchall()


def _create_holders(conn: psycopg.Connection, schema: str) -> list[str]:
    """Roles other than the owner that hold CREATE on ``schema`` (PUBLIC included)."""
    return [r[0] for r in conn.execute(
        "SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE pg_catalog.pg_get_userbyid(a.grantee) END "
        "FROM pg_catalog.pg_namespace n, pg_catalog.aclexplode(n.nspacl) a "
        "WHERE n.nspname = %s AND a.privilege_type = 'CREATE' AND a.grantee <> n.nspowner ORDER BY 1",
        (schema,)).fetchall()]


def _refuse_foreign(conn: psycopg.Connection, schema: str) -> bool:
    """Raise InstallError unless ``schema`` is absent or wholly the installing role's:
    owned by it, nobody else may create in it, and every object in it is its own.
    Returns whether the schema exists."""
    me = conn.execute("SELECT current_user").fetchone()[0]
    row = _schema_row(conn, schema)
    if row is None:
        return False
    if row[1] != me:
        raise InstallError(
            f"schema {schema!r} already exists and is owned by role {row[1]!r}, not by {me!r}: "
            "sabre-pg installs only into a schema of its own, because the owner of the schema "
            "could replace the code that runs in the server. Inspect and drop that schema, or "
            f"install elsewhere with --schema; if it is an installation made by {row[1]!r}, "
            f"upgrade it as {row[1]!r}.")
    holders = _create_holders(conn, schema)
    if holders:
        raise InstallError(
            f"schema {schema!r} grants CREATE to {', '.join(holders)}: they could plant objects "
            f"that sabre-pg would adopt. Revoke it (REVOKE CREATE ON SCHEMA {schema} FROM "
            f"{', '.join(holders)}), check what they created there, and install again.")
    foreign = [f"{what} (owner {owner})" for what, owner in schema_objects(conn, schema) if owner != me]
    if foreign:
        raise InstallError(
            f"schema {schema!r} holds objects not owned by {me!r}: " + "; ".join(foreign)
            + ". sabre-pg does not adopt objects it did not create: inspect and drop them, then "
            "install again.")
    return True


# --------------------------------------------------------------------------------------
# Operations
# --------------------------------------------------------------------------------------
def _require_superuser(conn: psycopg.Connection, action: str) -> None:
    row = conn.execute("SELECT current_user, rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
    if not row or not row[1]:
        raise PrivilegeError(
            f"role {row[0] if row else '?'!r} lacks the SUPERUSER privilege needed to {action} sabre-pg: "
            "plpython3u is an untrusted language, so only a superuser may create it or functions "
            "written in it. Connect as a superuser (e.g. postgres) to install; analysts then need "
            "only USAGE on the schema and EXECUTE on its functions."
        )


def _tidy(fn):
    """Operations taking a connection leave it as they found it: on a non-autocommit
    connection that was idle, the transaction they started is committed (rolled back
    on error); inside a caller's open transaction they just take part in it."""
    @functools.wraps(fn)
    def wrapper(conn, *args, **kwargs):
        was_idle = not conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE
        try:
            result = fn(conn, *args, **kwargs)
        except BaseException:
            if was_idle and conn.info.transaction_status != TransactionStatus.IDLE and not conn.closed:
                conn.rollback()
            raise
        if was_idle and conn.info.transaction_status == TransactionStatus.INTRANS:
            conn.commit()
        return result
    return wrapper


def _run_sql_files(conn: psycopg.Connection, schema: str, after_core=None) -> None:
    """Execute every SQL file for ``schema`` (which must exist); ``after_core()`` runs
    right after the core file, which creates meta and modules."""
    for f in sql_files():
        conn.execute(render_sql(f.read_text(encoding="utf-8"), schema))
        if f.name == CORE_SQL and after_core is not None:
            after_core()


@_tidy
def install(conn: psycopg.Connection, schema: str = "sabre") -> dict:
    """Install or upgrade sabre-pg in ``schema``, in one transaction. Returns version and build_id.

    A schema that exists must be wholly the installing role's (see :func:`_refuse_foreign`)."""
    q = sql.Identifier(check_schema_name(schema))
    modules = collect_modules(schema)
    digest = source_hash(schema)
    _require_superuser(conn, "install")
    if not conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'plpython3u'").fetchone():
        raise InstallError(
            "the server has no plpython3u: install the package postgresql-plpython3-<major> "
            "on the database server (Debian: apt-get install postgresql-plpython3-15)"
        )
    build_id = uuid.uuid4().hex
    meta = {"version": sabre_pg.__version__, "build_id": build_id, "source_hash": digest}

    def fill_core():
        conn.execute(sql.SQL("DELETE FROM {}.modules").format(q))
        with conn.cursor() as cur:
            cur.executemany(
                sql.SQL("INSERT INTO {}.modules (name, source, is_package) VALUES (%s, %s, %s)").format(q),
                modules)
            cur.executemany(
                sql.SQL("INSERT INTO {}.meta (key, value) VALUES (%s, coalesce(%s, now()::text)) "
                        "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value").format(q),
                list(meta.items()) + [("installed_at", None)])

    with conn.transaction():
        # objects created below resolve names without the caller's schemas
        conn.execute("SET LOCAL search_path = pg_catalog, pg_temp")
        citus.keep_ddl_local(conn)  # on a Citus node: installs here only (sabre_pg.citus)
        conn.execute("CREATE EXTENSION IF NOT EXISTS plpython3u")
        if not _refuse_foreign(conn, schema):
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(q))  # fails if one appeared meanwhile
        _run_sql_files(conn, schema, fill_core)
    return {"schema": schema, "version": sabre_pg.__version__, "build_id": build_id}


upgrade = install


def _plain_table(conn: psycopg.Connection, schema: str, name: str) -> bool:
    """Whether ``<schema>.<name>`` is an ordinary table: reading one runs nothing of
    others (a view or foreign table could)."""
    return conn.execute(
        "SELECT c.relkind FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass(%s)",
        (f"{quote_schema(schema)}.{name}",)).fetchone() in (("r",),)


@_tidy
def installed_meta(conn: psycopg.Connection, schema: str = "sabre") -> dict:
    """``<schema>.meta`` as a dict; empty when sabre-pg is not installed there."""
    if not _plain_table(conn, schema, "meta"):
        return {}
    rows = conn.execute(sql.SQL("SELECT key, value FROM {}.meta").format(sql.Identifier(schema))).fetchall()
    return dict(rows)


def _meta_is_current(meta: dict, schema: str) -> bool:
    return meta.get("version") == sabre_pg.__version__ and meta.get("source_hash") == source_hash(schema)


@_tidy
def is_current(conn: psycopg.Connection, schema: str = "sabre") -> bool:
    """Whether ``schema`` holds exactly what install() would write now."""
    return _meta_is_current(installed_meta(conn, schema), schema)


# --------------------------------------------------------------------------------------
# Uninstall and purge
# --------------------------------------------------------------------------------------
_DROP_KIND = {"r": "TABLE", "p": "TABLE", "v": "VIEW", "m": "MATERIALIZED VIEW", "f": "FOREIGN TABLE"}

# The schema an object of the walk below lives in: its own namespace, or its relation's
# for the parts of a table (constraints, triggers, policies, defaults); NULL for objects
# outside any schema (casts, event triggers, ...).
_HOME_NSP_SQL = "CASE w.classid " + " ".join(
    f"WHEN 'pg_catalog.{cat}'::pg_catalog.regclass THEN (SELECT {nsp} FROM pg_catalog.{cat} WHERE oid = w.objid)"
    for cat, nsp, _ in SCHEMA_CATALOGS) + " " + " ".join(
    f"WHEN 'pg_catalog.{cat}'::pg_catalog.regclass THEN (SELECT c.relnamespace FROM pg_catalog.{cat} x "
    f"JOIN pg_catalog.pg_class c ON c.oid = x.{rel} WHERE x.oid = w.objid)"
    for cat, rel in (("pg_constraint", "conrelid"), ("pg_trigger", "tgrelid"), ("pg_policy", "polrelid"),
                     ("pg_attrdef", "adrelid"))) + " END"

# Objects that depend on the roots (a query of (classid, objid)), directly or through
# other dependents; a view's rule stands for the view, so the walk goes on through views.
# Objects that go automatically with a dropped one (its indexes, constraints, owned
# sequences: deptype 'a') are its parts, not dependents; nor is anything in the schema.
_DEPENDENTS_SQL = """
WITH RECURSIVE roots AS ({roots}),
walk(classid, objid, part) AS (
    SELECT r.classid, r.objid, true FROM roots r
    UNION
    SELECT CASE WHEN d.classid = 'pg_catalog.pg_rewrite'::pg_catalog.regclass
                THEN 'pg_catalog.pg_class'::pg_catalog.regclass ELSE d.classid END,
           coalesce(rw.ev_class, d.objid), w.part AND d.deptype = 'a'
    FROM walk w
    JOIN pg_catalog.pg_depend d ON d.refclassid = w.classid AND d.refobjid = w.objid
    LEFT JOIN pg_catalog.pg_rewrite rw
           ON d.classid = 'pg_catalog.pg_rewrite'::pg_catalog.regclass AND rw.oid = d.objid
    WHERE d.deptype IN ('n', 'a')
)
SELECT DISTINCT i.type || ' ' || i.identity
FROM walk w, pg_catalog.pg_identify_object(w.classid, w.objid, 0) i
WHERE NOT w.part AND ({home}) IS DISTINCT FROM %(nsp)s
  AND NOT EXISTS (SELECT 1 FROM roots r WHERE r.classid = w.classid AND r.objid = w.objid)
  AND w.classid <> 'pg_catalog.pg_default_acl'::pg_catalog.regclass
ORDER BY 1
"""


def _outside_dependents(conn: psycopg.Connection, nsp: int, relations: list[int]) -> list[str]:
    """Objects outside the schema (oid ``nsp``) that dropping it and ``relations`` would
    drop or change: analysts' views on the catalog, views on purged outputs, ..."""
    roots = (f"SELECT o.classid, o.objid FROM ({_SCHEMA_OBJECTS_SQL}) o "
             "UNION SELECT 'pg_catalog.pg_namespace'::pg_catalog.regclass, %(nsp)s "
             "UNION SELECT 'pg_catalog.pg_class'::pg_catalog.regclass, rel "
             "FROM pg_catalog.unnest(%(rels)s::pg_catalog.oid[]) AS rel")
    rows = conn.execute(_DEPENDENTS_SQL.format(roots=roots, home=_HOME_NSP_SQL),
                        {"nsp": nsp, "rels": relations}).fetchall()
    return [r[0] for r in rows]


def purge_candidates(conn: psycopg.Connection, schema: str) -> list[tuple[int, str, str]]:
    """(oid, qualified name, relkind) of the relations ``<schema>.recorded_relations()``
    returns: those a recorded run created that still carry that run's identity."""
    fn = conn.execute("SELECT pg_catalog.to_regprocedure(%s)",
                      (f"{quote_schema(schema)}.recorded_relations()",)).fetchone()[0]
    if fn is None:
        raise InstallError(
            f"{schema}.recorded_relations() does not exist: this catalog cannot tell which relations "
            "its runs created, so --purge would have to guess. Upgrade first (sabre-pg upgrade), "
            "or uninstall without --purge.")
    return conn.execute(sql.SQL(
        "SELECT DISTINCT c.oid::pg_catalog.int8, pg_catalog.format('%%I.%%I', n.nspname, c.relname), c.relkind "
        "FROM {}.recorded_relations() r JOIN pg_catalog.pg_class c ON c.oid = r.relation "
        "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE n.oid <> %s ORDER BY 2").format(sql.Identifier(schema)),
        (_schema_row(conn, schema)[0],)).fetchall()


def _lock_schema_relations(conn: psycopg.Connection, nsp: int, relations: list[int]) -> None:
    """ACCESS EXCLUSIVE on the schema's tables and views and on ``relations``: nobody
    creates a view on them between the dependency check and the drop."""
    rels = conn.execute(
        "SELECT c.oid::pg_catalog.regclass::pg_catalog.text FROM pg_catalog.pg_class c "
        "WHERE (c.relnamespace = %s OR c.oid = ANY(%s::pg_catalog.oid[])) AND c.relkind IN ('r','p','v','m','f') "
        "ORDER BY c.oid", (nsp, relations)).fetchall()
    if rels:
        conn.execute("LOCK TABLE " + ", ".join(r[0] for r in rels) + " IN ACCESS EXCLUSIVE MODE")


@_tidy
def uninstall(conn: psycopg.Connection, schema: str = "sabre", purge: bool = False,
              cascade: bool = False) -> dict:
    """Drop the sabre schema (functions, catalog tables, modules).

    Anonymized outputs live in the users' schemas and are kept, unless ``purge``: then
    the relations ``<schema>.recorded_relations()`` returns are dropped too (only those
    a recorded run created and that still carry its identity). Objects of others that
    depend on any of this (a view on ``<schema>.runs`` or on an output) make it refuse,
    listing them, unless ``cascade``: then they are dropped as well.
    """
    q = sql.Identifier(check_schema_name(schema))
    _require_superuser(conn, "uninstall")
    with conn.transaction():
        row = _schema_row(conn, schema)
        if row is None:
            return {"schema": schema, "dropped_outputs": [], "dropped_dependents": []}
        nsp = row[0]
        outputs = purge_candidates(conn, schema) if purge else []
        _lock_schema_relations(conn, nsp, [o[0] for o in outputs])
        dependents = _outside_dependents(conn, nsp, [o[0] for o in outputs])
        if dependents and not cascade:
            raise InstallError(
                "other objects depend on what uninstall would drop: " + "; ".join(dependents)
                + ". Drop or change them first, or uninstall with --cascade to drop them too.")
        how = sql.SQL(" CASCADE" if cascade else "")
        for kind in ("VIEW", "MATERIALIZED VIEW", "FOREIGN TABLE", "TABLE"):  # views before their tables
            names = [sql.SQL(o[1]) for o in outputs if _DROP_KIND.get(o[2], "TABLE") == kind]
            if names:
                conn.execute(sql.SQL("DROP {} IF EXISTS {}{}").format(sql.SQL(kind), sql.SQL(", ").join(names), how))
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(q))
    return {"schema": schema, "dropped_outputs": [o[1] for o in outputs],
            "dropped_dependents": dependents}


# --------------------------------------------------------------------------------------
# Check: the installation against the package and against a reference install
# --------------------------------------------------------------------------------------
SEARCH_PATH_PIN = "search_path=pg_catalog, pg_temp"
# Functions allowed without SEARCH_PATH_PIN: thin SQL wrappers that must run with the
# caller's search_path and name every object in their body with its schema (see
# sql/20_api.sql). Entries are "name(argument types)" without the schema.
QUALIFIED_WRAPPERS: tuple[str, ...] = (
    "sabre_anonymize(text,text[],text,double precision,integer,text,text,jsonb)",
    "sabre_refresh(text)",
)
# Catalog tables that must have row-level security enabled.
RLS_TABLES = ("runs", "hierarchies", "output_locks", "run_tokens", "streams")
# Grants the README tells the DBA to make to analysts, beyond what the SQL grants, by object
# as check's findings name it: USAGE on the schema; editing hierarchies (row-level security
# keeps each role to its own). A role may also be granted what the SQL gives PUBLIC.
_HIERARCHY_EDITING = ("INSERT", "UPDATE", "DELETE")
DBA_GRANTS = {"schema": ("USAGE",), "relation hierarchies": _HIERARCHY_EDITING,
              "relation hierarchy_rows": _HIERARCHY_EDITING}

# The catalog fingerprint: one row per object of the schema whose oid is %(nsp)s, and per
# part of one (column, constraint, trigger, rule, policy) and per cast on one of its types
# (the internal triggers that enforce a constraint, with their enabled state, are the
# constraint's, since their names carry OIDs):
# (kind, name relative to the schema, owner oid or NULL for parts, ACL items
# "grantee=privilege[*]" with the owner written "owner", attributes as jsonb). It reads
# pg_catalog alone: nothing of the schema it describes runs. Run it with search_path =
# pg_catalog, pg_temp, so every name it prints is schema-qualified; names of the reference
# install's schema are then replaced by the installed one's (see _rename_schema).
_ACL_ITEMS = """(SELECT coalesce(array_agg(CASE WHEN a.grantee = {owner} THEN 'owner'
        WHEN a.grantee = 0 THEN 'PUBLIC' ELSE pg_get_userbyid(a.grantee) END
        || '=' || a.privilege_type || CASE WHEN a.is_grantable THEN '*' ELSE '' END), '{{}}')
    FROM aclexplode(coalesce({acl}, acldefault({kind}, {owner}))) a)"""
_REL_ACL = _ACL_ITEMS.format(owner="c.relowner", acl="c.relacl",
                             kind="(CASE c.relkind WHEN 'S' THEN 's' ELSE 'r' END)::\"char\"")
_NO_ACL = "'{}'::text[]"
# roles of a policy, PUBLIC by name
_ROLE_NAMES = ("(SELECT array_agg(g ORDER BY g) FROM (SELECT CASE WHEN r = 0 THEN 'PUBLIC' "
               "ELSE pg_get_userbyid(r) END AS g FROM unnest({}) r) s)")
# Catalogs of objects with a schema that the fingerprint has no detailed part for: only
# that they exist, and their owner (parsers and templates have none).
_OTHER_CATALOGS = tuple((cat, nsp, own) for cat, nsp, own in SCHEMA_CATALOGS if cat in (
    "pg_collation", "pg_conversion", "pg_statistic_ext", "pg_ts_config", "pg_ts_dict")) + (
    ("pg_ts_parser", "prsnamespace", "NULL::oid"), ("pg_ts_template", "tmplnamespace", "NULL::oid"),
    ("pg_extension", "extnamespace", "extowner"))
_FINGERPRINT_SQL = f"""
SELECT 'schema', ''::text, n.nspowner,
       {_ACL_ITEMS.format(owner='n.nspowner', acl='n.nspacl', kind="'n'")},
       jsonb_build_object('comment', obj_description(n.oid, 'pg_namespace'),
           'default_privileges', (SELECT array_agg(pg_get_userbyid(d.defaclrole) || ' ' || d.defaclobjtype::text
                                                   || ' ' || d.defaclacl::text ORDER BY 1)
                                  FROM pg_default_acl d WHERE d.defaclnamespace = n.oid),
           'publications', (SELECT array_agg(p.pubname::text ORDER BY 1) FROM pg_publication_namespace pn
                            JOIN pg_publication p ON p.oid = pn.pnpubid WHERE pn.pnnspid = n.oid))
FROM pg_namespace n WHERE n.oid = %(nsp)s
UNION ALL
SELECT CASE WHEN c.relkind = 'S' THEN 'sequence' WHEN c.relkind IN ('v', 'm') THEN 'view'
            WHEN c.relkind IN ('i', 'I') THEN 'index' ELSE 'relation' END,
       c.relname::text, c.relowner, {_REL_ACL},
       jsonb_build_object('relkind', c.relkind::text, 'row_security', c.relrowsecurity,
           'force_row_security', c.relforcerowsecurity,
           'view', CASE WHEN c.relkind IN ('v', 'm') THEN pg_get_viewdef(c.oid) END,
           'index', CASE WHEN c.relkind IN ('i', 'I') THEN pg_get_indexdef(c.oid) END,
           'index_state', (SELECT jsonb_build_object('valid', x.indisvalid, 'ready', x.indisready,
                                                     'live', x.indislive, 'clustered', x.indisclustered)
                           FROM pg_index x WHERE x.indexrelid = c.oid),
           'persistence', c.relpersistence::text, 'options', c.reloptions,
           'replica_identity', c.relreplident::text,
           'access_method', (SELECT am.amname::text FROM pg_am am WHERE am.oid = c.relam),
           'partition_key', CASE WHEN c.relkind = 'p' THEN pg_get_partkeydef(c.oid) END,
           'partition_bound', pg_get_expr(c.relpartbound, c.oid),
           'inherits', (SELECT array_agg(i.inhparent::regclass::text ORDER BY i.inhseqno)
                        FROM pg_inherits i WHERE i.inhrelid = c.oid),
           'inherited_by', (SELECT array_agg(i.inhrelid::regclass::text ORDER BY 1)
                            FROM pg_inherits i WHERE i.inhparent = c.oid),
           'sequence', (SELECT jsonb_build_object('type', format_type(s.seqtypid, NULL), 'start', s.seqstart,
                                   'increment', s.seqincrement, 'min', s.seqmin, 'max', s.seqmax,
                                   'cache', s.seqcache, 'cycle', s.seqcycle)
                        FROM pg_sequence s WHERE s.seqrelid = c.oid),
           'owned_by', CASE WHEN c.relkind = 'S' THEN
                           (SELECT array_agg(d.refobjid::regclass::text || '.' || quote_ident(a.attname) ORDER BY 1)
                            FROM pg_depend d JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
                            WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
                              AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i')) END,
           'publications', (SELECT array_agg(p.pubname::text ORDER BY 1) FROM pg_publication_rel pr
                            JOIN pg_publication p ON p.oid = pr.prpubid WHERE pr.prrelid = c.oid),
           'comment', obj_description(c.oid, 'pg_class'))
FROM pg_class c WHERE c.relnamespace = %(nsp)s AND c.relkind <> 't'
UNION ALL
SELECT 'column', c.relname::text || '.' || a.attname::text, NULL::oid,
       {_ACL_ITEMS.format(owner='c.relowner', acl='a.attacl', kind="'c'")},
       jsonb_build_object('type', format_type(a.atttypid, a.atttypmod), 'not_null', a.attnotnull,
           'default', pg_get_expr(d.adbin, d.adrelid), 'identity', a.attidentity::text,
           'generated', a.attgenerated::text, 'collation', a.attcollation::regcollation::text,
           'storage', a.attstorage::text,
           'comment', col_description(c.oid, a.attnum))
FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
WHERE c.relnamespace = %(nsp)s AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'c')
UNION ALL
SELECT 'constraint', coalesce(c.relname, t.typname)::text || '.' || k.conname::text, NULL::oid, {_NO_ACL},
       jsonb_build_object('definition', pg_get_constraintdef(k.oid), 'type', k.contype::text,
           'deferrable', k.condeferrable, 'deferred', k.condeferred, 'validated', k.convalidated,
           'index', k.conindid::regclass::text, 'comment', obj_description(k.oid, 'pg_constraint'),
           'internal_triggers', (SELECT array_agg(t.tgrelid::regclass::text || ' ' || f.proname::text || ' '
                                                  || t.tgtype::text || ' enabled=' || t.tgenabled::text ORDER BY 1)
                                 FROM pg_trigger t JOIN pg_proc f ON f.oid = t.tgfoid
                                 WHERE t.tgconstraint = k.oid AND t.tgisinternal))
FROM pg_constraint k LEFT JOIN pg_class c ON c.oid = k.conrelid LEFT JOIN pg_type t ON t.oid = k.contypid
WHERE k.connamespace = %(nsp)s
UNION ALL
SELECT 'trigger', c.relname::text || '.' || CASE WHEN t.tgisinternal  -- of a constraint of another schema
           THEN (SELECT 'internal ' || f.proname::text FROM pg_proc f WHERE f.oid = t.tgfoid) || ' of constraint '
                || coalesce(k.conrelid::regclass::text || '.', '') || coalesce(k.conname::text, '')
           ELSE t.tgname::text END, NULL::oid, {_NO_ACL},
       jsonb_build_object('definition', pg_get_triggerdef(t.oid), 'enabled', t.tgenabled::text,
           'comment', obj_description(t.oid, 'pg_trigger'))
FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid LEFT JOIN pg_constraint k ON k.oid = t.tgconstraint
WHERE c.relnamespace = %(nsp)s AND NOT (t.tgisinternal AND k.connamespace IS NOT DISTINCT FROM %(nsp)s)
UNION ALL
SELECT 'rule', c.relname::text || '.' || r.rulename::text, NULL::oid, {_NO_ACL},
       jsonb_build_object('definition', pg_get_ruledef(r.oid), 'enabled', r.ev_enabled::text,
           'comment', obj_description(r.oid, 'pg_rewrite'))
FROM pg_rewrite r JOIN pg_class c ON c.oid = r.ev_class
WHERE c.relnamespace = %(nsp)s AND NOT (r.rulename = '_RETURN' AND c.relkind IN ('v', 'm'))
UNION ALL
SELECT 'policy', c.relname::text || '.' || p.polname::text, NULL::oid, {_NO_ACL},
       jsonb_build_object('command', p.polcmd::text, 'permissive', p.polpermissive,
           'roles', {_ROLE_NAMES.format('p.polroles')},
           'using', pg_get_expr(p.polqual, p.polrelid), 'check', pg_get_expr(p.polwithcheck, p.polrelid))
FROM pg_policy p JOIN pg_class c ON c.oid = p.polrelid WHERE c.relnamespace = %(nsp)s
UNION ALL
SELECT 'function', p.proname::text || '(' || coalesce((SELECT string_agg(format_type(t, NULL), ',' ORDER BY i)
                                        FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY AS a(t, i)), '') || ')',
       p.proowner, {_ACL_ITEMS.format(owner='p.proowner', acl='p.proacl', kind="'f'")},
       jsonb_build_object('config', p.proconfig, 'security_definer', p.prosecdef, 'language', l.lanname,
           'volatility', p.provolatile, 'source', p.prosrc, 'sql_body', pg_get_function_sqlbody(p.oid),
           'binary', p.probin, 'result', pg_get_function_result(p.oid),
           'arguments', pg_get_function_arguments(p.oid), 'kind', p.prokind::text, 'strict', p.proisstrict,
           'leakproof', p.proleakproof, 'parallel', p.proparallel::text, 'returns_set', p.proretset,
           'cost', p.procost, 'rows', p.prorows, 'support', p.prosupport::text,
           'aggregate', (SELECT jsonb_build_object('kind', g.aggkind::text, 'transition', g.aggtransfn::text,
                                   'final', g.aggfinalfn::text, 'combine', g.aggcombinefn::text,
                                   'state', format_type(g.aggtranstype, NULL), 'initial', g.agginitval,
                                   'sort_operator', g.aggsortop::regoperator::text)
                         FROM pg_aggregate g WHERE g.aggfnoid = p.oid),
           'comment', obj_description(p.oid, 'pg_proc'))
FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang WHERE p.pronamespace = %(nsp)s
UNION ALL
SELECT 'operator', o.oprname::text || '(' || CASE WHEN o.oprleft = 0 THEN 'NONE' ELSE format_type(o.oprleft, NULL) END
                   || ',' || format_type(o.oprright, NULL) || ')', o.oprowner, {_NO_ACL},
       jsonb_build_object('function', o.oprcode::regprocedure::text, 'result', format_type(o.oprresult, NULL),
           'commutator', o.oprcom::regoperator::text, 'negator', o.oprnegate::regoperator::text,
           'restrict', o.oprrest::text, 'join', o.oprjoin::text, 'hashes', o.oprcanhash,
           'merges', o.oprcanmerge, 'comment', obj_description(o.oid, 'pg_operator'))
FROM pg_operator o WHERE o.oprnamespace = %(nsp)s
UNION ALL
SELECT 'type', t.typname::text, t.typowner, {_ACL_ITEMS.format(owner='t.typowner', acl='t.typacl', kind="'T'")},
       jsonb_build_object('kind', t.typtype::text,
           'base', CASE WHEN t.typbasetype <> 0 THEN format_type(t.typbasetype, t.typtypmod) END,
           'not_null', t.typnotnull, 'default', t.typdefault, 'collation', t.typcollation::regcollation::text,
           'labels', (SELECT array_agg(e.enumlabel::text ORDER BY e.enumsortorder) FROM pg_enum e
                      WHERE e.enumtypid = t.oid),
           'range', (SELECT jsonb_build_object('subtype', format_type(r.rngsubtype, NULL),
                                'canonical', r.rngcanonical::text, 'difference', r.rngsubdiff::text,
                                'opclass', r.rngsubopc::regclass::text)
                     FROM pg_range r WHERE r.rngtypid = t.oid),
           'functions', jsonb_build_array(t.typinput::text, t.typoutput::text, t.typreceive::text,
                                          t.typsend::text, t.typmodin::text, t.typmodout::text,
                                          t.typanalyze::text, t.typsubscript::text),
           'comment', obj_description(t.oid, 'pg_type'))
FROM pg_type t WHERE t.typnamespace = %(nsp)s AND t.typrelid = 0
  AND NOT EXISTS (SELECT 1 FROM pg_type e WHERE e.typarray = t.oid)
UNION ALL
SELECT 'cast', '(' || format_type(k.castsource, NULL) || ' AS ' || format_type(k.casttarget, NULL) || ')',
       NULL::oid, {_NO_ACL},
       jsonb_build_object('function', CASE WHEN k.castfunc <> 0 THEN k.castfunc::regprocedure::text END,
           'context', k.castcontext::text, 'method', k.castmethod::text)
FROM pg_cast k
WHERE EXISTS (SELECT 1 FROM pg_type t WHERE t.oid IN (k.castsource, k.casttarget) AND t.typnamespace = %(nsp)s)
   OR EXISTS (SELECT 1 FROM pg_proc p WHERE p.oid = k.castfunc AND p.pronamespace = %(nsp)s)
UNION ALL
SELECT 'transform', format_type(x.trftype, NULL) || ' LANGUAGE ' || l.lanname::text, NULL::oid, {_NO_ACL},
       jsonb_build_object('from_sql', x.trffromsql::text, 'to_sql', x.trftosql::text)
FROM pg_transform x JOIN pg_language l ON l.oid = x.trflang
WHERE EXISTS (SELECT 1 FROM pg_type t WHERE t.oid = x.trftype AND t.typnamespace = %(nsp)s)
   OR EXISTS (SELECT 1 FROM pg_proc p WHERE p.oid IN (x.trffromsql, x.trftosql) AND p.pronamespace = %(nsp)s)
UNION ALL
SELECT 'operator class', c.opcname::text || ' USING ' || am.amname::text, c.opcowner, {_NO_ACL},
       jsonb_build_object('type', format_type(c.opcintype, NULL), 'default', c.opcdefault,
           'family', c.opcfamily::text, 'storage', c.opckeytype::text)
FROM pg_opclass c JOIN pg_am am ON am.oid = c.opcmethod WHERE c.opcnamespace = %(nsp)s
UNION ALL
SELECT 'operator family', f.opfname::text || ' USING ' || am.amname::text, f.opfowner, {_NO_ACL},
       jsonb_build_object(
           'operators', (SELECT array_agg(o.amopstrategy::text || ' ' || o.amopopr::regoperator::text ORDER BY 1)
                         FROM pg_amop o WHERE o.amopfamily = f.oid),
           'functions', (SELECT array_agg(p.amprocnum::text || ' ' || p.amproc::regprocedure::text ORDER BY 1)
                         FROM pg_amproc p WHERE p.amprocfamily = f.oid))
FROM pg_opfamily f JOIN pg_am am ON am.oid = f.opfmethod WHERE f.opfnamespace = %(nsp)s
UNION ALL
SELECT i.type, coalesce(i.name, i.identity), o.owner, {_NO_ACL}, '{{}}'::jsonb
FROM (""" + " UNION ALL ".join(
    f"SELECT '{cat}'::regclass AS classid, oid AS objid, {own} AS owner FROM {cat} WHERE {nsp} = %(nsp)s"
    for cat, nsp, own in _OTHER_CATALOGS) + """) o, pg_identify_object(o.classid, o.objid, 0) i
"""


def _snapshot(conn: psycopg.Connection, nsp: int) -> dict:
    """{(kind, name): (owner oid or None, ACL items, attributes)} of the schema with oid
    ``nsp``: its catalog fingerprint (needs search_path = pg_catalog, pg_temp)."""
    rows = conn.execute(_FINGERPRINT_SQL, {"nsp": nsp}).fetchall()
    return {(kind, name): (owner, sorted(acl), attrs) for kind, name, owner, acl, attrs in rows}


def _rename_schema(value, old: str, new_quoted: str, new_ident: str):
    """``value`` (str / list / dict) with the reference schema's name replaced by the
    installed one: ``"old"`` as the SQL files quote it, bare ``old`` as the server does."""
    if isinstance(value, str):
        return value.replace(f'"{old}"', new_quoted).replace(old, new_ident)
    if isinstance(value, list):
        return [_rename_schema(v, old, new_quoted, new_ident) for v in value]
    if isinstance(value, dict):
        return {k: _rename_schema(v, old, new_quoted, new_ident) for k, v in value.items()}
    return value


def _reference(conn: psycopg.Connection, schema: str, nsp: int) -> tuple[dict, dict]:
    """Snapshots of ``schema`` and of a fresh install of this package, made in a
    savepoint that is rolled back (so nothing of the reference stays)."""
    ref = "sabre_check_" + uuid.uuid4().hex[:16]
    with conn.transaction(force_rollback=True):
        conn.execute("SET LOCAL search_path = pg_catalog, pg_temp")
        # no event trigger (or other trigger or rule left enabled for origin sessions)
        # runs while the reference is installed
        conn.execute("SET LOCAL session_replication_role = replica")
        citus.keep_ddl_local(conn)  # the reference install is not sent to Citus workers
        ident = conn.execute("SELECT quote_ident(%s)", (schema,)).fetchone()[0]
        got = _snapshot(conn, nsp)
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(ref)))
        _run_sql_files(conn, ref)
        ref_nsp = conn.execute("SELECT oid FROM pg_namespace WHERE nspname = %s", (ref,)).fetchone()[0]
        names = (ref, quote_schema(schema), ident)
        want = {tuple(_rename_schema(list(key), *names)): tuple(_rename_schema(list(value[1:]), *names))
                for key, value in _snapshot(conn, ref_nsp).items()}
    return got, want


def _acl_findings(label: str, want: list[str], have: list[str]) -> list[str]:
    public = {item.split("=", 1)[1] for item in want if item.startswith("PUBLIC=")}
    allowed = public | set(DBA_GRANTS.get(label, ()))
    extra = [i for i in have if i not in want and i.split("=", 1)[1] not in allowed]
    missing = [i for i in want if i not in have]
    out = []
    if extra:
        out.append(f"{label}: privileges the SQL does not grant: {', '.join(extra)}")
    if missing:
        out.append(f"{label}: privileges the SQL grants are missing: {', '.join(missing)}")
    return out


def _catalog_findings(got: dict, want: dict, owner: int) -> list[str]:
    """Differences between the installed schema and the reference install, ownership by
    the schema owner, the search_path pin and row-level security."""
    out = []
    for key in sorted(set(got) | set(want)):
        label = f"{key[0]} {key[1]}".strip()
        if key not in got:
            out.append(f"{label} is missing")
            continue
        have_owner, have_acl, have_attrs = got[key]
        if have_owner is not None and have_owner != owner:  # parts (columns, rules, ...) have none
            out.append(f"{label} is not owned by the schema owner")
        if key not in want:
            out.append(f"{label} is not part of sabre-pg")
            continue
        want_acl, want_attrs = want[key]
        out += _acl_findings(label, want_acl, have_acl)
        out += [f"{label}: {attr} differs from the package's" for attr in sorted(want_attrs)
                if have_attrs.get(attr) != want_attrs[attr]]
    for (kind, name), (_, _, attrs) in sorted(got.items()):
        if kind == "function" and name not in QUALIFIED_WRAPPERS and SEARCH_PATH_PIN not in (attrs["config"] or []):
            out.append(f"function {name} does not pin {SEARCH_PATH_PIN.replace('=', ' = ')}")
        if kind == "relation" and name in RLS_TABLES and not attrs["row_security"]:
            out.append(f"relation {name} does not have row-level security enabled")
    return out


def _module_findings(conn: psycopg.Connection, schema: str) -> list[str]:
    """Rows of ``<schema>.modules`` that are not exactly what this package ships."""
    want = {name: (src, pkg) for name, src, pkg in collect_modules(schema)}
    have = {name: (src, pkg) for name, src, pkg in conn.execute(
        sql.SQL("SELECT name, source, is_package FROM {}.modules").format(sql.Identifier(schema)))}
    out = []
    for name in sorted(set(want) | set(have)):
        if name not in have:
            out.append(f"module {name} is missing")
        elif name not in want:
            out.append(f"module {name} is not shipped by sabre-pg {sabre_pg.__version__}")
        elif have[name][0] != want[name][0]:
            out.append(f"module {name}: source differs from the package's")
        elif have[name][1] != want[name][1]:
            out.append(f"module {name}: is_package differs from the package's")
    return out


META_KEYS = ("version", "build_id", "source_hash", "installed_at")


def _meta_findings(meta: dict, schema: str) -> list[str]:
    out = [f"meta: {key} is missing" for key in META_KEYS if key not in meta]
    out += [f"meta: unexpected key {key!r}" for key in sorted(meta) if key not in META_KEYS]
    want = {"version": sabre_pg.__version__, "source_hash": source_hash(schema)}
    out += [f"meta: {key} {meta[key]!r} is not this package's ({value!r}): upgrade, or find out who changed it"
            for key, value in want.items() if key in meta and meta[key] != value]
    return out


def tampering(conn: psycopg.Connection, schema: str) -> list[str]:
    """Human-readable findings where the installation in ``schema`` departs from what
    install() writes, one per difference: the schema's whole catalog state (every object
    and part of one, owners, privileges, settings and definitions, anything extra, casts
    on its types; see _FINGERPRINT_SQL), then module rows and meta. Empty for an intact
    installation. The catalog part compares with a reference install made and rolled back
    here, so it needs a superuser; it reads pg_catalog alone, and the schema's own tables
    are read only when they are plain tables."""
    row = _schema_row(conn, schema)
    if row is None:
        return [f"schema {schema} does not exist"]
    nsp, owner, owner_is_super = row
    out = [] if owner_is_super else [
        f"schema {schema} is owned by {owner!r}, which is not a superuser: that role controls the code "
        "the server runs"]
    if not conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()[0]:
        catalog = ["ownership and privileges not verified: check needs a superuser to compare "
                   "with a reference install"]
    else:
        try:
            got, want = _reference(conn, schema, nsp)
            owner_oid = conn.execute("SELECT nspowner FROM pg_namespace WHERE oid = %s", (nsp,)).fetchone()[0]
            catalog = _catalog_findings(got, want, owner_oid)
        except psycopg.Error as e:  # e.g. a read-only standby
            catalog = [f"ownership and privileges not verified: the reference install failed: "
                       f"{e.sqlstate or ''} {e.diag.message_primary or e}"]
    out += _meta_findings(installed_meta(conn, schema), schema)
    out += _module_findings(conn, schema) if _plain_table(conn, schema, "modules") else [
        f"relation modules is not a table of {schema}: module rows not verified"]
    return out + catalog


def _writable_by_others(conn: psycopg.Connection, names: list[str]) -> dict[str, list[str]]:
    """{schema: roles other than superusers that may create in it (PUBLIC included)} for
    those of ``names`` that have any; ``public`` owned by pg_database_owner counts the
    database's owner."""
    rows = conn.execute("""
        SELECT n.nspname::text, array_agg(DISTINCT w.who ORDER BY w.who)
        FROM pg_catalog.pg_namespace n,
             LATERAL (SELECT CASE WHEN h.grantee OPERATOR(pg_catalog.=) 'pg_database_owner'::pg_catalog.regrole
                                  THEN (SELECT d.datdba FROM pg_catalog.pg_database d
                                        WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
                                  ELSE h.grantee END AS grantee
                      FROM (SELECT n.nspowner AS grantee
                            UNION ALL
                            SELECT a.grantee FROM pg_catalog.aclexplode(n.nspacl) a
                            WHERE a.privilege_type OPERATOR(pg_catalog.=) 'CREATE') h) g,
             LATERAL (SELECT CASE WHEN g.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                                  ELSE pg_catalog.pg_get_userbyid(g.grantee)::pg_catalog.text END AS who) w
        WHERE n.nspname OPERATOR(pg_catalog.=) ANY (%s::pg_catalog.text[])
          AND (g.grantee OPERATOR(pg_catalog.=) 0 OR NOT (SELECT r.rolsuper FROM pg_catalog.pg_roles r
                                                         WHERE r.oid OPERATOR(pg_catalog.=) g.grantee))
        GROUP BY 1""", (names,)).fetchall()
    return dict(rows)


def _search_path_schemas(value: str) -> list[str]:
    """The schema names of a search_path setting, unquoted."""
    out = []
    for item in value.split(","):
        item = item.strip()
        out.append(item[1:-1].replace('""', '"') if len(item) > 1 and item[0] == item[-1] == '"' else item.lower())
    return out


def environment_warnings(conn: psycopg.Connection, schema: str) -> list[str]:
    """Risks around the installation that are not departures from it: search_path settings
    (of roles and databases) that list ``schema`` and a schema others may create in, wherever
    it stands, so a function planted there captures unqualified calls (issue 25, finding 9:
    PostgreSQL weighs overloads of other argument types equally across the path); event
    triggers that run code a non-superuser owns whenever anyone, install included, runs DDL."""
    settings = conn.execute("""
        SELECT coalesce('role ' || pg_catalog.quote_ident(r.rolname), 'every role')
               || coalesce(' in database ' || pg_catalog.quote_ident(d.datname), ''),
               pg_catalog.substr(c, pg_catalog.length('search_path=') + 1), r.rolname::pg_catalog.text
        FROM pg_catalog.pg_db_role_setting s
        LEFT JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) s.setrole
        LEFT JOIN pg_catalog.pg_database d ON d.oid OPERATOR(pg_catalog.=) s.setdatabase,
        pg_catalog.unnest(s.setconfig) c
        WHERE pg_catalog.starts_with(c, 'search_path=')
          AND (s.setdatabase OPERATOR(pg_catalog.=) 0 OR d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
        ORDER BY 1""").fetchall()
    listed = []  # (who, role or None, schemas on the path but sabre's, "$user" as the role's name)
    for who, value, role in settings:
        path = _search_path_schemas(value)
        if schema in path:
            listed.append((who, role, [role if n == "$user" and role else n for n in path
                                       if n != schema and (n != "$user" or role)]))
    writable = _writable_by_others(conn, sorted({n for _, _, path in listed for n in path}))
    out = []
    for who, role, path in listed:
        for name in path:
            writers = [w for w in writable.get(name, ()) if w != role]  # a role's own schema is its own
            if writers:
                out.append(
                    f"search_path of {who} lists schema {name} with {schema}, and {', '.join(writers)} "
                    f"may create in {name}: a function planted there captures unqualified calls of sabre "
                    f"functions wherever {name} stands on the path (an overload whose argument types match "
                    f"better wins). HINT: list only schemas no other role may create in "
                    f"(ALTER ROLE ... SET search_path = \"$user\", {schema}), or call sabre functions "
                    f"schema-qualified ({schema}.sabre_anonymize(...)); docs/security.md, Which search_path to use.")
    out += [f"event trigger {name} (owner {owner!r}) runs {fn} (owner {fn_owner!r}): {who} not a superuser, "
            "yet its code runs as whoever runs DDL, install and upgrade included. HINT: make a superuser own "
            "the event trigger and its function, or drop the event trigger."
            for name, owner, fn, fn_owner, who in conn.execute("""
                SELECT e.evtname::pg_catalog.text, pg_catalog.pg_get_userbyid(e.evtowner)::pg_catalog.text,
                       pg_catalog.format('%I.%I(%s)', n.nspname, p.proname, pg_catalog.pg_get_function_identity_arguments(p.oid)),
                       pg_catalog.pg_get_userbyid(p.proowner)::pg_catalog.text,
                       CASE WHEN NOT fo.rolsuper AND NOT eo.rolsuper THEN 'neither owner is'
                            WHEN NOT fo.rolsuper THEN 'the function''s owner is' ELSE 'the event trigger''s owner is' END
                FROM pg_catalog.pg_event_trigger e JOIN pg_catalog.pg_proc p ON p.oid OPERATOR(pg_catalog.=) e.evtfoid
                JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
                JOIN pg_catalog.pg_roles fo ON fo.oid OPERATOR(pg_catalog.=) p.proowner
                JOIN pg_catalog.pg_roles eo ON eo.oid OPERATOR(pg_catalog.=) e.evtowner
                WHERE e.evtenabled OPERATOR(pg_catalog.<>) 'D' AND NOT (fo.rolsuper AND eo.rolsuper) ORDER BY 1""")]
    return out


@_tidy
def check(conn: psycopg.Connection, schema: str = "sabre") -> dict:
    """A report on the server and the sabre-pg installation in ``schema``; ``ok`` sums it up.

    ``tampered`` lists every departure from what install() writes (see :func:`tampering`);
    the self-test, which runs the installed code, is skipped when that list is not empty.
    ``warnings`` lists risks around the installation (see :func:`environment_warnings`); they do not
    change ``ok``."""
    check_schema_name(schema)
    one = lambda query, *params: conn.execute(query, params or None).fetchone()  # noqa: E731
    meta = installed_meta(conn, schema)
    installed = bool(meta) or _schema_row(conn, schema) is not None
    report = {
        "server_version": one("SHOW server_version")[0],
        "current_user": one("SELECT current_user")[0],
        "superuser": bool(one("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")[0]),
        "plpython3u_available": one("SELECT 1 FROM pg_available_extensions WHERE name = 'plpython3u'") is not None,
        "plpython3u_installed": one("SELECT 1 FROM pg_extension WHERE extname = 'plpython3u'") is not None,
        "schema": schema,
        "package_version": sabre_pg.__version__,
        "installed_version": meta.get("version"),
        "build_id": meta.get("build_id"),
        "up_to_date": _meta_is_current(meta, schema),
        "tampered": tampering(conn, schema) if installed else [],
        "warnings": environment_warnings(conn, schema),
        "selftest": None,
        "selftest_error": None,
    }
    if installed and report["tampered"]:
        report["selftest_error"] = "not run: the installation departs from the package (see tampered)"
    elif meta:
        try:
            with conn.transaction():
                row = one(sql.SQL("SELECT {}.sabre_selftest()").format(sql.Identifier(schema)))
            report["selftest"] = row[0]
        except psycopg.Error as e:
            report["selftest_error"] = f"{e.sqlstate or ''} {e.diag.message_primary or e}".strip()
    st = report["selftest"] or {}
    report["backend_python"] = st.get("python")
    report["backend_numpy"] = st.get("numpy")
    report["ok"] = bool(report["plpython3u_installed"] and report["up_to_date"] and not report["tampered"]
                        and st.get("ok"))
    return report
