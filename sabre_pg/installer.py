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
    ``from sabre_plpy import anonymize`` works inside the backend.

Install, upgrade and re-install are the same operation: every SQL file is
idempotent, the modules table is rewritten, and ``<schema>.meta`` records the
package version plus a fresh random ``build_id``. Backends compare that
``build_id`` on every call and reload their cached modules when it changed.
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
from sabre_pg.errors import SabreError

PACKAGE_DIR = Path(sabre_pg.__file__).resolve().parent
REPO_DIR = PACKAGE_DIR.parent
SQL_DIR = REPO_DIR / "sql"
PLPYTHON_DIR = REPO_DIR / "plpython"
CORE_DIR = PACKAGE_DIR / "core"

CORE_SQL = "00_core.sql"          # creates meta and modules; applied first
LOADER_MODULE = "_sabre_loader"   # reserved row in <schema>.modules, exec'd by the preamble
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
    code); the backend gets a synthesized one holding just ``__version__``.
    """
    rows = [("sabre_pg", f"__version__ = {sabre_pg.__version__!r}\n", True)]
    rows += _tree_modules(CORE_DIR, "sabre_pg.core")
    rows += _tree_modules(PLPYTHON_DIR, "sabre_plpy")
    rows.append(("sabre_plpy._installed", "SCHEMA = %r\n" % check_schema_name(schema), False))
    rows.append((LOADER_MODULE, LOADER_SOURCE, False))
    return rows


def sql_files() -> list[Path]:
    files = sorted(SQL_DIR.glob("*.sql"))
    if not any(f.name == CORE_SQL for f in files):
        raise InstallError(
            f"{SQL_DIR / CORE_SQL} not found: sabre-pg must be installed from a source "
            "checkout (pip install -e .)"
        )
    # 00_core.sql first (it is also first lexically; keep that true).
    return sorted(files, key=lambda f: (f.name != CORE_SQL, f.name))


def render_sql(text: str, schema: str) -> str:
    return text.replace("@bootstrap@", bootstrap(schema).rstrip("\n")).replace("@schema@", quote_schema(schema))


def source_hash(schema: str = "sabre") -> str:
    """Digest of everything install() would write; used to tell whether a DB is current."""
    h = hashlib.sha256(sabre_pg.__version__.encode())
    for f in sql_files():
        h.update(f.name.encode() + b"\0" + render_sql(f.read_text(encoding="utf-8"), schema).encode() + b"\0")
    for name, src, pkg in collect_modules(schema):
        h.update(f"{name}\0{int(pkg)}\0".encode() + src.encode() + b"\0")
    return h.hexdigest()


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


@_tidy
def install(conn: psycopg.Connection, schema: str = "sabre") -> dict:
    """Install or upgrade sabre-pg in ``schema``, in one transaction. Returns version and build_id."""
    q = sql.Identifier(check_schema_name(schema))
    files = sql_files()
    modules = collect_modules(schema)
    digest = source_hash(schema)
    _require_superuser(conn, "install")
    if not conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'plpython3u'").fetchone():
        raise InstallError(
            "the server has no plpython3u: install the package postgresql-plpython3-<major> "
            "on the database server (Debian: apt-get install postgresql-plpython3-15)"
        )
    build_id = uuid.uuid4().hex
    with conn.transaction():
        # objects created below resolve names without the caller's schemas
        conn.execute("SET LOCAL search_path = pg_catalog, pg_temp")
        conn.execute("CREATE EXTENSION IF NOT EXISTS plpython3u")
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(q))
        for f in files:
            conn.execute(render_sql(f.read_text(encoding="utf-8"), schema))
            if f.name == CORE_SQL:
                conn.execute(sql.SQL("DELETE FROM {}.modules").format(q))
                meta = {"version": sabre_pg.__version__, "build_id": build_id, "source_hash": digest}
                with conn.cursor() as cur:
                    cur.executemany(
                        sql.SQL("INSERT INTO {}.modules (name, source, is_package) VALUES (%s, %s, %s)").format(q),
                        modules,
                    )
                    cur.executemany(
                        sql.SQL(
                            "INSERT INTO {}.meta (key, value) VALUES (%s, coalesce(%s, now()::text)) "
                            "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value"
                        ).format(q),
                        list(meta.items()) + [("installed_at", None)],
                    )
    return {"schema": schema, "version": sabre_pg.__version__, "build_id": build_id}


upgrade = install


def _relation_exists(conn: psycopg.Connection, schema: str, name: str) -> bool:
    qualified = f"{quote_schema(schema)}.{name}"
    return conn.execute("SELECT to_regclass(%s)", (qualified,)).fetchone()[0] is not None


@_tidy
def installed_meta(conn: psycopg.Connection, schema: str = "sabre") -> dict:
    """``<schema>.meta`` as a dict; empty when sabre-pg is not installed there."""
    if not _relation_exists(conn, schema, "meta"):
        return {}
    rows = conn.execute(sql.SQL("SELECT key, value FROM {}.meta").format(sql.Identifier(schema))).fetchall()
    return dict(rows)


def _meta_is_current(meta: dict, schema: str) -> bool:
    return meta.get("version") == sabre_pg.__version__ and meta.get("source_hash") == source_hash(schema)


@_tidy
def is_current(conn: psycopg.Connection, schema: str = "sabre") -> bool:
    """Whether ``schema`` holds exactly what install() would write now."""
    return _meta_is_current(installed_meta(conn, schema), schema)


_DROP_KIND = {"r": "TABLE", "p": "TABLE", "v": "VIEW", "m": "MATERIALIZED VIEW", "f": "FOREIGN TABLE"}


@_tidy
def recorded_outputs(conn: psycopg.Connection, schema: str = "sabre") -> list[tuple[str, str, str]]:
    """(schema, name, relkind) of existing relations listed in ``<schema>.runs``, if that
    table exists and has a ``relations`` (text[]), ``output`` or ``output_name`` column."""
    if not _relation_exists(conn, schema, "runs"):
        return []
    cols = dict(conn.execute(
        "SELECT attname, atttypid::regtype::text FROM pg_attribute "
        "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped",
        (f'"{schema}".runs',),
    ).fetchall())
    if cols.get("relations") == "text[]":        # every relation a run created
        return conn.execute(
            sql.SQL(
                "SELECT DISTINCT n.nspname, c.relname, c.relkind FROM {}.runs r "
                "CROSS JOIN LATERAL unnest(r.relations) AS rel(name) "
                "JOIN pg_class c ON c.oid = to_regclass(rel.name) "
                "JOIN pg_namespace n ON n.oid = c.relnamespace ORDER BY 1, 2"
            ).format(sql.Identifier(schema))
        ).fetchall()
    col = next((c for c in ("output", "output_name") if c in cols), None)
    if col is None:
        return []
    if cols[col] in ("regclass", "oid"):
        target = sql.SQL("r.{}::oid").format(sql.Identifier(col))
    else:
        target = sql.SQL("to_regclass(r.{}::text)").format(sql.Identifier(col))
    return conn.execute(
        sql.SQL(
            "SELECT DISTINCT n.nspname, c.relname, c.relkind FROM {}.runs r "
            "JOIN pg_class c ON c.oid = {} "
            "JOIN pg_namespace n ON n.oid = c.relnamespace ORDER BY 1, 2"
        ).format(sql.Identifier(schema), target)
    ).fetchall()


@_tidy
def uninstall(conn: psycopg.Connection, schema: str = "sabre", purge: bool = False) -> dict:
    """Drop the sabre schema (functions, catalog tables, modules).

    Anonymized outputs live in the users' schemas and are kept, unless ``purge``:
    then the relations recorded in ``<schema>.runs`` are dropped too.
    """
    q = sql.Identifier(check_schema_name(schema))
    _require_superuser(conn, "uninstall")
    dropped = []
    with conn.transaction():
        if purge:
            for nsp, rel, kind in recorded_outputs(conn, schema):
                if nsp == schema:
                    continue  # goes with the schema
                conn.execute(sql.SQL("DROP {} IF EXISTS {}.{} CASCADE").format(
                    sql.SQL(_DROP_KIND.get(kind, "TABLE")), sql.Identifier(nsp), sql.Identifier(rel)))
                dropped.append(f"{nsp}.{rel}")
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(q))
    return {"schema": schema, "dropped_outputs": dropped}


@_tidy
def check(conn: psycopg.Connection, schema: str = "sabre") -> dict:
    """A report on the server and the sabre-pg installation in ``schema``; ``ok`` sums it up."""
    check_schema_name(schema)
    one = lambda query, *params: conn.execute(query, params or None).fetchone()  # noqa: E731
    meta = installed_meta(conn, schema)
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
        "selftest": None,
        "selftest_error": None,
    }
    if meta:
        try:
            with conn.transaction():
                row = one(sql.SQL("SELECT {}.sabre_selftest()").format(sql.Identifier(schema)))
            report["selftest"] = row[0]
        except psycopg.Error as e:
            report["selftest_error"] = f"{e.sqlstate or ''} {e.diag.message_primary or e}".strip()
    st = report["selftest"] or {}
    report["backend_python"] = st.get("python")
    report["backend_numpy"] = st.get("numpy")
    report["ok"] = bool(report["plpython3u_installed"] and report["up_to_date"] and st.get("ok"))
    return report
