"""Which database the client talks to.

Order: ``--dsn``; else ``$DATABASE_URL``; else, when any libpq variable (PGHOST,
PGPORT, PGDATABASE, PGUSER, PGSERVICE, ...) is set, libpq's own defaults (empty
conninfo); else the embedded :class:`~sabre_pg.cluster.LocalCluster`, started on
demand with sabre installed in its database ``sabre``.
"""
from __future__ import annotations

import os
from collections.abc import Mapping

LIBPQ_TARGET_VARS = ("PGHOST", "PGHOSTADDR", "PGPORT", "PGDATABASE", "PGUSER", "PGSERVICE", "PGSERVICEFILE")


def dsn_source(args=None, env: Mapping[str, str] | None = None) -> tuple[str, str | None]:
    """(source, dsn) without side effects: source is 'arg', 'env', 'libpq' or 'embedded'
    (dsn None: the embedded cluster must be started to know it)."""
    env = os.environ if env is None else env
    dsn = getattr(args, "dsn", None)
    if dsn:
        return "arg", dsn
    if env.get("DATABASE_URL"):
        return "env", env["DATABASE_URL"]
    if any(env.get(v) for v in LIBPQ_TARGET_VARS):
        return "libpq", ""
    return "embedded", None


def resolve_dsn(args=None, env: Mapping[str, str] | None = None) -> str:
    """The conninfo/URL to connect with; starts the embedded cluster when that is the answer."""
    source, dsn = dsn_source(args, env)
    if source != "embedded":
        return dsn
    from sabre_pg.cluster import LocalCluster

    cluster = LocalCluster(schema=getattr(args, "sabre_schema", None) or "sabre")
    cluster.start()
    return cluster.dsn()


def connect(args=None, **kwargs):
    """A psycopg connection to the resolved database."""
    import psycopg

    return psycopg.connect(resolve_dsn(args), **kwargs)
