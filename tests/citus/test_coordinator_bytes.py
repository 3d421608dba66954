"""The coordinator-bytes measurement of ``sabre-pg bench --citus`` and tests/citus
(sabre_pg/bench/netio.py) against Citus's own count: a coordinator backend pulling rows of a
distributed table receives at least the tuple data Citus says it received from the workers (its
EXPLAIN ANALYZE "Tuple data received from nodes"), on its sockets, including the connections
Citus opens per shard task and closes; /proc/<pid>/io rchar does not count these (libpq recv())."""
from __future__ import annotations

import re

import psycopg

from sabre_pg.bench.netio import SocketBytes


def test_socket_bytes_count_what_citus_says_the_workers_sent(citus_cluster):
    with psycopg.connect(citus_cluster.dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS public.netio")
        conn.execute("CREATE TABLE public.netio (id int, pad text)")
        conn.execute("SELECT pg_catalog.create_distributed_table('public.netio', 'id', shard_count => 4)")
        conn.execute("INSERT INTO public.netio SELECT g, pg_catalog.repeat('x', 100) "
                     "FROM pg_catalog.generate_series(1, 20000) g")
        try:
            pid = conn.execute("SELECT pg_catalog.pg_backend_pid()").fetchone()[0]
            ports = [p for (p,) in conn.execute("SELECT nodeport FROM pg_catalog.pg_dist_node WHERE groupid <> 0")]
            # in a transaction: Citus keeps its connections to the workers open until the end of
            # the transaction, so SocketBytes's last snapshot sees every one (in autocommit they
            # close with the statement, and under load a poll of ss -p, slow with many
            # processes, can miss a socket opened and closed between two polls: then its bytes
            # are only "unattributed")
            with conn.transaction(), SocketBytes(pid, ports) as sockets:
                plan = [r[0] for r in conn.execute("EXPLAIN (ANALYZE) SELECT * FROM public.netio")]
            got = sockets.result()
            assert got is not None, "ss cannot see the coordinator backend's sockets"
            line = next(x for x in plan if "Tuple data received from nodes" in x)
            value, unit = re.search(r"received from nodes: (\d+) (bytes|kB|MB)", line).groups()
            citus = int(value) * {"bytes": 1, "kB": 1024, "MB": 1024 ** 2}[unit]
            print("sockets:", got, "Citus:", citus)
            assert citus > 2_000_000
            # the tuple data plus the protocol's framing (about 20 bytes per row here), no more
            assert citus <= got["received"] < 1.5 * citus
        finally:
            conn.execute("DROP TABLE public.netio")
