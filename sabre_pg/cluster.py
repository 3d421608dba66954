"""The embedded PostgreSQL cluster sabre-pg uses when no server is given.

A ``LocalCluster`` is an ordinary PostgreSQL 15 cluster in a directory of its own::

    <root>/pgdata         PGDATA (initdb --encoding=UTF8; pg_hba.conf and pg_ident.conf below)
    <root>/run            the Unix socket directory (mode 0700, the server's OS user)
    <root>/pgpass         libpq password file of the superuser (mode 0600, the invoking user)
    <root>/cluster.json   port and superuser role, chosen once and remembered
    <root>/server.log     the server log

It listens on its own Unix socket and on 127.0.0.1 only, on port 54329 or the
first free port above it. ``start()`` is idempotent: it initialises the cluster
if needed, starts the server if it is not running, and makes sure database
``sabre`` exists with the sabre schema installed and current.

Every connection authenticates (no ``trust``): on the Unix socket the superuser by
``peer``, mapped (pg_ident.conf) from the invoking OS user and the server's OS user
only; other roles, and every connection over TCP, by ``scram-sha-256``. The
superuser's password is random and kept in ``pgpass``, which :meth:`LocalCluster.dsn`
names (``passfile=``). Only the server's OS user can enter the socket directory (and
root, which the server runs beside as ``postgres``). A cluster made by an older
version with ``trust`` lines gets these files on its next start (then a reload).
"""
from __future__ import annotations

import getpass
import json
import os
import pwd
import re
import secrets
import shutil
import socket
import subprocess
from pathlib import Path

from sabre_pg.errors import SabreError

DEFAULT_PORT = 54329
DEFAULT_DBNAME = "sabre"
SERVER_USER_WHEN_ROOT = "postgres"
ROOT_CLUSTER_DIR = Path("/var/lib/sabre-pg/cluster")

# Written once into postgresql.conf at initdb time.
SERVER_SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "shared_preload_libraries": "''",
    "max_connections": "50",
    "shared_buffers": "'256MB'",
    "work_mem": "'64MB'",
    # A private single-user cluster: no replication or archiving, so the minimal WAL level,
    # with which tables created and filled in one transaction (every output of a run) are
    # written once instead of twice (~1 s of a 1M-row run).  ALTER SYSTEM overrides it.
    "wal_level": "minimal",
    "max_wal_senders": "0",
    "log_line_prefix": "'%m [%p] %q%u@%d '",
}


def cron_settings(dbname: str) -> dict:
    """pg_cron's settings when its library is installed (Debian postgresql-15-cron): preloaded,
    its jobs (``sabre_stream_schedule``, ``sabre_schedule_refresh``) run in the cluster's
    database as background workers, so their connections need no password."""
    try:
        installed = (find_bindir().parent / "lib" / "pg_cron.so").is_file()
    except ClusterError:
        installed = False
    if not installed:
        return {}
    return {"shared_preload_libraries": "'pg_cron'", "cron.database_name": "'%s'" % dbname,
            "cron.use_background_workers": "on"}


IDENT_MAP = "sabre"
HBA_TEMPLATE = """\
# sabre-pg embedded cluster (written by sabre_pg.cluster): every connection authenticates.
# TYPE  DATABASE  USER          ADDRESS        METHOD
local   all       {superuser}                  peer map={map}
local   all       all                          scram-sha-256
host    all       all           127.0.0.1/32   scram-sha-256
"""
IDENT_HEADER = "# sabre-pg embedded cluster: OS users that may connect as the superuser by peer.\n"
_TRUST_LINE = re.compile(r"^\s*(local|host\w*)\s.*\btrust\b", re.M)


def hba_allows_trust(text: str) -> bool:
    """Whether pg_hba.conf text has a line (not a comment) with the trust method."""
    return bool(_TRUST_LINE.search("\n".join(line.split("#", 1)[0] for line in text.splitlines())))


class ClusterError(SabreError):
    """The embedded cluster could not be created, started or stopped."""


def _running_as_root() -> bool:
    return os.geteuid() == 0


def default_cluster_dir() -> Path:
    """Where the embedded cluster lives.

    Normally ``$XDG_DATA_HOME/sabre-pg/cluster`` (``~/.local/share/sabre-pg/cluster``).
    PostgreSQL refuses to run as root, so when we are root the server runs as
    ``postgres``; that user cannot traverse ``/root`` (mode 700), so a cluster
    under root's home could never start. Root therefore gets
    ``/var/lib/sabre-pg/cluster``, owned by ``postgres``.
    """
    if _running_as_root():
        return ROOT_CLUSTER_DIR
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "sabre-pg" / "cluster"


def find_bindir() -> Path:
    """PostgreSQL server binaries: $SABRE_PG_BINDIR, else Debian's 15, else PATH."""
    env = os.environ.get("SABRE_PG_BINDIR")
    candidates = [Path(env)] if env else []
    candidates.append(Path("/usr/lib/postgresql/15/bin"))
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(Path(on_path).parent)
    for c in candidates:
        if (c / "pg_ctl").is_file() and (c / "initdb").is_file():
            return c
    raise ClusterError(
        "PostgreSQL 15 server binaries not found (looked in "
        + ", ".join(str(c) for c in candidates)
        + "). Install postgresql-15 and postgresql-plpython3-15 (./dev.sh does), "
        "or set SABRE_PG_BINDIR."
    )


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # Like the server itself: TIME_WAIT leftovers do not count, a listener does.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def first_free_port(start: int = DEFAULT_PORT, tries: int = 200) -> int:
    for port in range(start, start + tries):
        if _port_free(port):
            return port
    raise ClusterError(f"no free TCP port in {start}..{start + tries - 1} on 127.0.0.1")


class LocalCluster:
    """A private PostgreSQL cluster; see the module docstring for the layout."""

    def __init__(self, data_dir: str | os.PathLike | None = None, port: int | None = None,
                 *, fsync: bool = True, dbname: str = DEFAULT_DBNAME, schema: str = "sabre"):
        self.root = Path(data_dir) if data_dir else default_cluster_dir()
        self.pgdata = self.root / "pgdata"
        self.socket_dir = self.root / "run"
        self.passfile = self.root / "pgpass"
        self.state_file = self.root / "cluster.json"
        self.log_file = self.root / "server.log"
        self.fsync = fsync  # False only for throwaway test clusters
        self.dbname = dbname
        self.schema = schema
        self.run_as = SERVER_USER_WHEN_ROOT if _running_as_root() else None
        state = self._read_state()
        self.superuser = state.get("superuser") or (self.run_as or getpass.getuser())
        self.port = int(port or state.get("port") or first_free_port())

    # -- helpers ---------------------------------------------------------------
    def _read_state(self) -> dict:
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}

    def _write_state(self) -> None:
        self.state_file.write_text(json.dumps({"port": self.port, "superuser": self.superuser}, indent=1) + "\n")

    def _cmd(self, *argv: str) -> list[str]:
        prog = str(find_bindir() / argv[0])
        if self.run_as:
            return ["runuser", "-u", self.run_as, "--", prog, *argv[1:]]
        return [prog, *argv[1:]]

    def _run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run(self._cmd(*argv), stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if check and proc.returncode != 0:
            raise ClusterError(
                f"{argv[0]} failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}".rstrip()
                + (f"\nserver log: {self.log_file}" if argv[0] == "pg_ctl" else "")
            )
        return proc

    def _chown(self, path: Path) -> None:
        if self.run_as:
            pw = pwd.getpwnam(self.run_as)
            os.chown(path, pw.pw_uid, pw.pw_gid)

    def _private_dir(self, path: Path) -> None:
        """``path`` exists, belongs to the server's OS user and only it may enter (0700)."""
        path.mkdir(parents=True, exist_ok=True)
        self._chown(path)
        path.chmod(0o700)

    def _write_private(self, path: Path, text: str, server_owned: bool) -> None:
        """Write ``text`` to ``path`` (mode 0600, created so from the start), owned by the
        server's OS user or by the invoking user."""
        tmp = path.with_name(path.name + ".new")
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        if server_owned:
            self._chown(tmp)
        os.replace(tmp, path)

    # -- authentication ----------------------------------------------------------
    @property
    def password(self) -> str | None:
        """The superuser's password, from the password file (None before init)."""
        try:
            line = self.passfile.read_text().splitlines()[0]
        except (OSError, IndexError):
            return None
        return line.rsplit(":", 1)[1]  # token_urlsafe: no ':' or '\\' to unescape

    def _new_password(self) -> str:
        """A fresh random password, written to the password file (``*:*:*:<superuser>:``)."""
        password = secrets.token_urlsafe(24)
        user = self.superuser.replace("\\", "\\\\").replace(":", "\\:")
        self._write_private(self.passfile, f"*:*:*:{user}:{password}\n", server_owned=False)
        return password

    def _write_auth_files(self) -> None:
        """pg_hba.conf (see HBA_TEMPLATE) and pg_ident.conf mapping the invoking OS user and
        the server's OS user to the superuser."""
        me = pwd.getpwuid(os.geteuid()).pw_name  # what peer authentication sees, whatever $USER says
        os_users = dict.fromkeys([me, self.run_as or me])
        ident = IDENT_HEADER + "".join(f"{IDENT_MAP}  {u}  {self.superuser}\n" for u in os_users)
        self._write_private(self.pgdata / "pg_ident.conf", ident, server_owned=True)
        self._write_private(self.pgdata / "pg_hba.conf",
                            HBA_TEMPLATE.format(superuser=self.superuser, map=IDENT_MAP), server_owned=True)

    def _secure_auth(self) -> bool:
        """Give a cluster of an older version (trust in pg_hba.conf) the authentication
        described in the module docstring, reloading a running server. Returns whether the
        superuser's password must be set: the password file was missing."""
        if hba_allows_trust((self.pgdata / "pg_hba.conf").read_text()):
            self._write_auth_files()
            if self.is_running():
                self._run("pg_ctl", "reload", "-D", str(self.pgdata))
        return self.password is None

    def _set_password(self, password: str) -> None:
        """ALTER ROLE ... PASSWORD over the socket (peer), sent already SCRAM-hashed."""
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            hashed = conn.pgconn.encrypt_password(password.encode(), self.superuser.encode(), b"scram-sha-256")
            conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(
                sql.Identifier(self.superuser), sql.Literal(hashed.decode())))

    # -- public API ------------------------------------------------------------
    @property
    def initialized(self) -> bool:
        return (self.pgdata / "PG_VERSION").is_file()

    def init(self) -> None:
        """initdb (UTF8; peer and scram-sha-256 authentication, a random superuser password)
        if not done yet."""
        if self.initialized:
            return
        self._private_dir(self.root)
        self._private_dir(self.socket_dir)
        if self.pgdata.exists() and any(self.pgdata.iterdir()):
            raise ClusterError(f"{self.pgdata} exists, is not empty and is not a PostgreSQL cluster")
        password = self._new_password()
        pwfile = self.root / "initdb.pw"
        self._write_private(pwfile, password + "\n", server_owned=True)
        try:
            self._run("initdb", "-D", str(self.pgdata), "-U", self.superuser, "--encoding=UTF8",
                      "--locale=C.UTF-8", "--auth-local=peer", "--auth-host=scram-sha-256",
                      f"--pwfile={pwfile}")
        finally:
            pwfile.unlink(missing_ok=True)
        self._write_auth_files()
        with open(self.pgdata / "postgresql.conf", "a") as f:
            f.write("\n# sabre-pg embedded cluster\n")
            for key, value in {**SERVER_SETTINGS, **cron_settings(self.dbname)}.items():
                f.write(f"{key} = {value}\n")
        self._write_state()

    def is_running(self) -> bool:
        if not self.initialized:
            return False
        return self._run("pg_ctl", "status", "-D", str(self.pgdata), check=False).returncode == 0

    def start(self, ensure_database: bool = True) -> "LocalCluster":
        """Init and start if needed; then ensure database ``sabre`` with sabre installed."""
        self.init()
        needs_password = self._secure_auth()
        self._private_dir(self.root)  # also for clusters of older versions
        self._private_dir(self.socket_dir)
        if not self.is_running():
            socket_path = self.socket_dir / f".s.PGSQL.{self.port}"
            if len(str(socket_path).encode()) > 107:
                raise ClusterError(f"socket path {socket_path} is too long for a Unix socket; "
                                   "choose a shorter cluster directory (--data-dir or $XDG_DATA_HOME)")
            if not _port_free(self.port):
                raise ClusterError(f"port {self.port} on 127.0.0.1 is taken by another program; "
                                   f"start with another port (--port), it is then remembered in {self.state_file}")
            if not self.log_file.exists():
                self.log_file.touch()
                self._chown(self.log_file)
            opts = f"-c port={self.port} -c unix_socket_directories='{self.socket_dir}'"
            if not self.fsync:
                opts += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
            self._run("pg_ctl", "start", "-w", "-t", "60", "-D", str(self.pgdata), "-l", str(self.log_file), "-o", opts)
            self._write_state()
        if needs_password:
            self._set_password(self._new_password())
        if ensure_database:
            self.ensure_database()
        return self

    def ensure_database(self, dbname: str | None = None) -> None:
        """Create ``dbname`` if missing and install or upgrade sabre in it when stale."""
        import psycopg
        from psycopg import sql

        from sabre_pg import installer

        dbname = dbname or self.dbname
        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (dbname,)).fetchone():
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
        with psycopg.connect(self.dsn(dbname)) as conn:
            if not installer.is_current(conn, self.schema):
                installer.install(conn, self.schema)
            preloaded = conn.execute("SELECT current_setting('cron.database_name', true) = current_database()"
                                     ).fetchone()[0]
            if preloaded:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_cron")

    def stop(self) -> bool:
        """Stop the server (fast shutdown). Returns False if it was not running."""
        if not self.is_running():
            return False
        self._run("pg_ctl", "stop", "-w", "-m", "fast", "-D", str(self.pgdata))
        return True

    def status(self) -> dict:
        return {
            "data_dir": str(self.root),
            "initialized": self.initialized,
            "running": self.is_running(),
            "port": self.port,
            "socket_dir": str(self.socket_dir),
            "superuser": self.superuser,
            "passfile": str(self.passfile),
            "dsn": self.dsn(),
        }

    def dsn(self, dbname: str | None = None, *, tcp: bool = False) -> str:
        """Conninfo of ``dbname`` as the superuser: over the Unix socket (peer), or with
        ``tcp`` over 127.0.0.1 (the password, from the password file it names)."""
        from psycopg.conninfo import make_conninfo

        return make_conninfo(host="127.0.0.1" if tcp else str(self.socket_dir), port=self.port,
                             user=self.superuser, dbname=dbname or self.dbname, passfile=str(self.passfile))

    @property
    def conninfo(self) -> str:
        return self.dsn()
