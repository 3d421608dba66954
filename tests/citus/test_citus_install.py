"""sabre-pg on a Citus cluster (coordinator + 2 workers, tests/citus/conftest.py): the cluster
itself, then ``sabre-pg install`` and ``check`` on every node."""
from __future__ import annotations

import psycopg


def test_cluster_has_citus_and_two_workers(citus_cluster):
    with psycopg.connect(citus_cluster.dsn, autocommit=True) as conn:
        assert conn.execute("SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'citus'"
                            ).fetchone()[0].startswith("13.2")
        ports = sorted(r[0] for r in conn.execute(
            "SELECT nodeport FROM pg_catalog.pg_dist_node WHERE groupid OPERATOR(pg_catalog.<>) 0"))
        assert ports == sorted(w.port for w in citus_cluster.workers)
        # a distributed table spreads over both workers, and Citus's own node-to-node connections work
        conn.execute("CREATE TABLE public.t_smoke (id int, v int)")
        conn.execute("SELECT pg_catalog.create_distributed_table('public.t_smoke', 'id')")
        conn.execute("INSERT INTO public.t_smoke SELECT g, g FROM pg_catalog.generate_series(1, 100) g")
        assert conn.execute("SELECT count(*), sum(v) FROM public.t_smoke").fetchone() == (100, 5050)
        nodes = conn.execute("SELECT count(DISTINCT nodeport) FROM pg_catalog.citus_shards "
                             "WHERE table_name = 'public.t_smoke'::regclass").fetchone()[0]
        assert nodes == 2
        conn.execute("DROP TABLE public.t_smoke")
