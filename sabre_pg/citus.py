"""sabre-pg on a Citus cluster: install and check on every node.

A Citus cluster is a coordinator and workers, each an ordinary PostgreSQL server with the
``citus`` extension; ``pg_dist_node`` on the coordinator lists them. The sabre schema is
installed on *each* node as a node-local installation, exactly as on a plain server: its
catalog, its ``modules`` table (the code the import hook loads) and its functions. So a
PL/Python function that runs on a worker (a pushed-down query, ``run_command_on_shards``)
finds its code in the worker's own ``<schema>.modules``.

Citus would otherwise propagate part of an install made on the coordinator (the schema and
the functions, not the tables: a worker then has functions whose code it cannot load), so
every install runs with ``citus.enable_ddl_propagation`` off (:data:`LOCAL_DDL_SQL`) and
sabre-pg connects to each worker itself: with the coordinator connection's parameters
(user, password or password file, database, options) and the worker's host and port from
``pg_dist_node``. A node added later gets sabre by running ``sabre-pg install`` again.
``sabre-pg uninstall`` on the coordinator removes it from every worker too, after the
coordinator (whose purge drops the distributed outputs, their shards with them).
"""
from __future__ import annotations

import psycopg
from psycopg.conninfo import make_conninfo

# Keep an install's DDL on the node it runs on (a no-op where the citus extension is absent).
LOCAL_DDL_SQL = ("SELECT pg_catalog.set_config('citus.enable_ddl_propagation', 'off', true) "
                 "FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'citus'")

_NODES_SQL = """
SELECT n.groupid, n.nodename, n.nodeport, n.isactive
FROM pg_catalog.pg_dist_node n
WHERE n.noderole OPERATOR(pg_catalog.=) 'primary'
ORDER BY n.groupid, n.nodeid"""


def keep_ddl_local(conn: psycopg.Connection) -> None:
    """Inside a transaction: DDL of this transaction stays on this node (see module docstring)."""
    conn.execute(LOCAL_DDL_SQL)


def workers(conn: psycopg.Connection) -> list[dict] | None:
    """The primary worker nodes of the Citus cluster ``conn`` is the coordinator of, as
    ``{"node": "host:port", "host", "port", "active"}``; None when this is not a Citus
    coordinator (no citus extension, or a ``pg_dist_node`` without workers: a plain server, or a
    worker itself, whose metadata lists the others but which is not where one installs)."""
    if not conn.execute("SELECT 1 FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'citus'"
                        ).fetchone():
        return None
    if not conn.execute("SELECT pg_catalog.citus_is_coordinator()").fetchone()[0]:
        return None
    rows = [r for r in conn.execute(_NODES_SQL).fetchall() if r[0] != 0]  # group 0: the coordinator
    if not rows:
        return None
    return [{"node": f"{host}:{port}", "host": host, "port": port, "active": active}
            for _group, host, port, active in rows]


def worker_conninfo(conn: psycopg.Connection, host: str, port: int) -> str:
    """The coordinator connection's parameters (password included) with a worker's host and port."""
    params = conn.info.get_parameters()
    params.pop("hostaddr", None)
    if conn.info.password:
        params["password"] = conn.info.password
    return make_conninfo(**{**params, "host": host, "port": str(port)})


def _on_workers(conn: psycopg.Connection, action, what: str) -> list[dict]:
    """``action(worker_connection)`` on each worker, in node order; a worker that is inactive or
    cannot be reached raises an InstallError naming it."""
    from sabre_pg.installer import InstallError

    out = []
    for w in workers(conn) or []:
        if not w["active"]:
            raise InstallError(f"Citus worker {w['node']} is not active: cannot {what} there. Activate it "
                               "(SELECT citus_activate_node(...)) or remove it, then run the command again")
        try:
            wconn = psycopg.connect(worker_conninfo(conn, w["host"], w["port"]), connect_timeout=10)
        except psycopg.OperationalError as e:
            raise InstallError(f"cannot connect to Citus worker {w['node']} to {what} there: {e}. "
                               "sabre-pg connects with the coordinator's user, password and database") from None
        with wconn:
            out.append({"node": w["node"], "role": "worker", **action(wconn)})
    return out


def install_workers(conn: psycopg.Connection, schema: str) -> list[dict]:
    """Install sabre in ``schema`` on every worker of the cluster ``conn`` is the coordinator of
    (nothing when it is not one); each worker in its own transaction, as a plain install."""
    from sabre_pg import installer

    return _on_workers(conn, lambda w: installer.install(w, schema), "install sabre-pg")


def check_workers(conn: psycopg.Connection, schema: str) -> list[dict]:
    """installer.check on every worker (nothing when ``conn`` is not a Citus coordinator)."""
    from sabre_pg import installer

    return _on_workers(conn, lambda w: installer.check(w, schema), "check sabre-pg")


def uninstall_workers(conn: psycopg.Connection, schema: str, cascade: bool = False) -> list[dict]:
    """installer.uninstall on every worker (nothing when ``conn`` is not a Citus coordinator):
    a worker's sabre schema holds no outputs (runs are recorded on the coordinator), so no purge."""
    from sabre_pg import installer

    return _on_workers(conn, lambda w: installer.uninstall(w, schema, cascade=cascade), "uninstall sabre-pg")
