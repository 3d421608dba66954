"""Every example of the README and of ``docs/*.md`` runs as written (docs/README conventions).

Each page gets a fresh database of the test cluster (sabre installed, nothing else: no
``search_path`` beyond PostgreSQL's default) and its fenced blocks run in the order written:

* ``sql``: ``psql -X -v ON_ERROR_STOP=1`` as the superuser (or as the role a
  ``<!-- doc-test: as ROLE -->`` marker names), one session per block;
* ``sh``: ``bash -euo pipefail`` in a scratch directory, with the ``sabre-pg`` of this checkout
  first on ``PATH`` and ``DATABASE_URL``/``PG*`` naming the page's database;
* ``python``: one interpreter namespace per page, so later blocks see earlier ones' names.

A block that is not meant to run is preceded by ``<!-- doc-test: skip: REASON -->`` (it needs
Docker, builds a wheel, runs the test suite itself, ...); the test counts these and requires a
reason.  Untagged fences are sample output or file contents, not code.  A page lists the LOGIN
roles its examples connect as with ``<!-- doc-test: roles NAME ... -->`` (roles are
cluster-wide, so the harness creates them when missing rather than the page).

The examples connect to placeholder servers; :data:`PLACEHOLDERS` maps each one to the page's
database on the test cluster (the only rewriting done to any block).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

REPO = Path(__file__).resolve().parents[2]
PAGES = ["README.md"] + sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))
RUNNABLE = {"sql", "sh", "python"}
MARKER = re.compile(r"^\s*<!--\s*doc-test:\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^\s*```\s*([\w-]*)\s*$")

# placeholder connection -> role it connects as (the test substitutes that role's conninfo
# of the page's database; URLs keep their scheme)
PLACEHOLDERS = {
    '"host=db.example user=postgres dbname=analytics"': ("conninfo", None),
    '"host=db user=analyst dbname=analytics"': ("conninfo", "analyst"),
    '"host=... dbname=..."': ("conninfo", None),
    '"postgresql+psycopg://analyst@db/analytics"': ("sqlalchemy", "analyst"),
    '"postgresql+psycopg://postgres@db/analytics"': ("sqlalchemy", None),
}


@dataclass
class Block:
    page: str
    line: int
    lang: str
    text: str
    skip: str | None = None
    role: str | None = None


@dataclass
class Page:
    path: str
    blocks: list = field(default_factory=list)
    roles: list = field(default_factory=list)

    @property
    def runnable(self):
        return [b for b in self.blocks if b.lang in RUNNABLE and b.skip is None]

    @property
    def skipped(self):
        return [b for b in self.blocks if b.lang in RUNNABLE and b.skip is not None]


def parse(path: str) -> Page:
    """The page's fenced blocks with the markers just above each fence."""
    page = Page(path)
    lines = (REPO / path).read_text().splitlines()
    pending: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        marker = MARKER.match(line)
        if marker:
            text = marker.group(1)
            if text.startswith("roles "):
                page.roles += text.split()[1:]
            else:
                pending.append(text)
            i += 1
            continue
        fence = FENCE.match(line)
        if fence:
            start, body = i + 1, []
            i += 1
            while i < len(lines) and not FENCE.match(lines[i]):
                body.append(lines[i])
                i += 1
            block = Block(path, start, fence.group(1).lower(), "\n".join(body) + "\n")
            for text in pending:
                if text.startswith("skip:"):
                    block.skip = text[len("skip:"):].strip()
                elif text.startswith("as "):
                    block.role = text[3:].strip()
                else:
                    raise AssertionError(f"{path}:{start}: unknown doc-test marker {text!r}")
            page.blocks.append(block)
            pending = []
        elif line.strip():
            pending = []
        i += 1
    return page


def test_every_page_marks_what_it_does_not_run():
    """Each runnable-language block runs or is skipped with a reason; the counts are printed."""
    total_run = total_skipped = 0
    for path in PAGES:
        page = parse(path)
        for block in page.skipped:
            assert block.skip, f"{path}:{block.line}: a skipped block needs a reason"
        total_run += len(page.runnable)
        total_skipped += len(page.skipped)
        print(f"{path}: {len(page.runnable)} run, {len(page.skipped)} skipped "
              + "; ".join(f"line {b.line}: {b.skip}" for b in page.skipped))
    print(f"total: {total_run} run, {total_skipped} skipped")
    assert total_run >= 30 and total_skipped < total_run // 2      # most examples run


class _Env:
    """Connections of one page's database, by role."""

    def __init__(self, pg_conn, pg_role_dsn, roles):
        self.conn = pg_conn
        self.dbname = pg_conn.info.dbname
        self.role_dsn = pg_role_dsn
        for role in roles:
            exists = pg_conn.execute("SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = %s", (role,)).fetchone()
            if not exists:
                pg_conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        # nothing beyond PostgreSQL's default path: examples say what they need
        pg_conn.execute(sql.SQL("ALTER DATABASE {} RESET search_path").format(sql.Identifier(self.dbname)))

    def dsn(self, role=None) -> str:
        d = conninfo_to_dict(self.role_dsn(role) if role else self.conn.info.dsn)
        # only what any libpq understands (psql is the server's libpq, psycopg bundles a newer one)
        return make_conninfo(**{key: d[key] for key in ("host", "port", "user", "dbname", "password") if d.get(key)})

    def url(self, role=None) -> str:
        d = conninfo_to_dict(self.dsn(role))
        password = (":" + d["password"]) if d.get("password") else ""
        return (f"postgresql+psycopg://{d['user']}{password}@/{d['dbname']}"
                f"?host={d['host']}&port={d['port']}")

    def environ(self, role=None) -> dict:
        d = conninfo_to_dict(self.dsn(role))
        env = dict(os.environ)
        env.update(DATABASE_URL=self.dsn(role), DSN=self.dsn(role), PGHOST=d["host"], PGPORT=str(d["port"]),
                   PGUSER=d["user"], PGDATABASE=d["dbname"], PGPASSWORD=d.get("password", "") or "",
                   PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
                   PYTHONUNBUFFERED="1")
        env.pop("PGSERVICE", None)
        return env

    def substitute(self, text: str) -> str:
        for placeholder, (kind, role) in PLACEHOLDERS.items():
            if placeholder in text:
                value = self.dsn(role) if kind == "conninfo" else self.url(role)
                text = text.replace(placeholder, repr(value) if placeholder.startswith('"postgresql') else
                                    "'" + value.replace("'", "'\\''") + "'")
        return text


def _fail(block, what, out):
    pytest.fail(f"{block.page}:{block.line}: the {block.lang} example failed ({what}):\n"
                f"--- example ---\n{block.text}--- output ---\n{out[-4000:]}", pytrace=False)


def _run_sql(env, block):
    dsn = env.dsn(block.role)
    proc = subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-f", "-"],
                          input=env.substitute(block.text), capture_output=True, text=True, timeout=600,
                          env=env.environ(block.role))
    if proc.returncode != 0:
        _fail(block, f"psql exit status {proc.returncode}", proc.stdout + proc.stderr)


def _run_sh(env, block, workdir):
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", env.substitute(block.text)], cwd=workdir,
                          capture_output=True, text=True, timeout=600, env=env.environ(block.role))
    if proc.returncode != 0:
        _fail(block, f"exit status {proc.returncode}", proc.stdout + proc.stderr)


def _run_python(env, block, namespace, workdir):
    code = compile(env.substitute(block.text), f"{block.page}:{block.line}", "exec")
    here = os.getcwd()
    os.chdir(workdir)
    try:
        exec(code, namespace)                                     # noqa: S102 (the docs' own code)
    except Exception as e:                                        # noqa: BLE001
        _fail(block, f"{type(e).__name__}", str(e))
    finally:
        os.chdir(here)


@pytest.mark.parametrize("path", PAGES)
def test_page_examples_run_as_written(path, pg_conn, pg_role_dsn):
    page = parse(path)
    if not page.runnable:
        assert not page.skipped or all(b.skip for b in page.skipped)
        return
    env = _Env(pg_conn, pg_role_dsn, page.roles)
    workdir = tempfile.mkdtemp(prefix="sabre-docs-")
    namespace: dict = {"__name__": "__doc_example__"}
    try:
        for block in page.runnable:
            started = time.perf_counter()
            if block.lang == "sql":
                _run_sql(env, block)
            elif block.lang == "sh":
                _run_sh(env, block, workdir)
            else:
                _run_python(env, block, namespace, workdir)
            print(f"{block.page}:{block.line} {block.lang} {time.perf_counter() - started:.1f} s")
    finally:
        for value in namespace.values():                          # engines the examples opened
            dispose = getattr(value, "dispose", None)
            if callable(dispose) and type(value).__module__.startswith("sqlalchemy"):
                dispose()
        shutil.rmtree(workdir, ignore_errors=True)
