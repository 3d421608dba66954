"""``sabre-pg uninstall`` on a Citus coordinator removes sabre from every worker too; ``check``
still checks every node (tests/citus/conftest.py's cluster)."""
from __future__ import annotations

import json

import psycopg

from sabre_pg import cli, installer

SCHEMA = "sabre_un"


def _has_schema(dsn: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT count(*) FROM pg_catalog.pg_namespace WHERE nspname = %s", (SCHEMA,)).fetchone()[0] == 1


def test_uninstall_removes_sabre_from_every_node(citus_cluster, capsys):
    dsn = citus_cluster.dsn
    assert cli.main(["install", "--dsn", dsn, "--schema", SCHEMA]) == 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS public.ucensus CASCADE")
        conn.execute("CREATE TABLE public.ucensus (id bigint PRIMARY KEY, age int, salary int)")
        conn.execute("SELECT pg_catalog.create_distributed_table('public.ucensus', 'id', shard_count => 4)")
        conn.execute("INSERT INTO public.ucensus SELECT g, 20 + g % 50, g % 17 FROM pg_catalog.generate_series(1, 800) g")
        conn.execute(f"SELECT * FROM {SCHEMA}.sabre_anonymize('public.ucensus'::regclass, ARRAY['age'], 'salary', 0.4, 5, "
                     "output => 'public.ucensus_anon', options => '{\"keep\": [\"id\"]}')").fetchone()
        shards = conn.execute("SELECT count(*) FROM pg_catalog.citus_shards WHERE table_name = "
                              "'public.ucensus_anon'::regclass").fetchone()[0]
    assert shards == 4
    assert all(_has_schema(d) for d in [dsn] + citus_cluster.worker_dsns)
    capsys.readouterr()

    assert cli.main(["uninstall", "--dsn", dsn, "--schema", SCHEMA, "--purge"]) == 0
    out = capsys.readouterr().out
    assert f"schema {SCHEMA} dropped; dropped outputs:" in out and "ucensus_anon" in out
    for w in citus_cluster.workers:
        assert f"and on Citus worker 127.0.0.1:{w.port}" in out
    assert not any(_has_schema(d) for d in [dsn] + citus_cluster.worker_dsns)
    with psycopg.connect(dsn, autocommit=True) as conn:      # the purged output and its shards are gone
        assert conn.execute("SELECT pg_catalog.to_regclass('public.ucensus_anon')").fetchone()[0] is None
        assert conn.execute("SELECT count(*) FROM pg_catalog.pg_dist_partition "
                            "WHERE logicalrelid::text LIKE 'ucensus_anon%'").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM public.ucensus").fetchone()[0] == 800   # the source untouched
        conn.execute("DROP TABLE public.ucensus")
    # check checks every node, and each says it is not installed
    assert cli.main(["check", "--dsn", dsn, "--schema", SCHEMA, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["installed_version"] is None
    assert [(n["node"], n["installed_version"]) for n in report["citus_workers"]] == [
        (f"127.0.0.1:{w.port}", None) for w in citus_cluster.workers]


def test_uninstall_again_finishes_the_workers(citus_cluster, capsys):
    """A coordinator already uninstalled (by an older sabre-pg, or by hand) with workers that
    still have sabre: uninstall again removes it from the workers."""
    dsn = citus_cluster.dsn
    assert cli.main(["install", "--dsn", dsn, "--schema", SCHEMA]) == 0
    with psycopg.connect(dsn) as conn:
        installer.uninstall(conn, SCHEMA)                       # the coordinator alone
    assert not _has_schema(dsn) and all(_has_schema(d) for d in citus_cluster.worker_dsns)
    assert cli.main(["uninstall", "--dsn", dsn, "--schema", SCHEMA]) == 0
    assert not any(_has_schema(d) for d in citus_cluster.worker_dsns)
    capsys.readouterr()
