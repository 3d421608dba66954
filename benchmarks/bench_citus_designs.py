#!/usr/bin/env python3
"""The two Citus class designs of issue #27, side by side on one distributed table.

On a Citus coordinator (``--dsn``), the default census call (the 7 QIs with the census
hierarchies, SA salary, t = 0.35, k = 6, method 'refine', ``keep: ["id"]``) on a copy of
``bench_census_<rows>`` distributed by id (``--shards``, default 32), once per design
(``options.citus_design``: 'qi_local' with its default parts, 'qi_local' with ``--parts`` parts
(e.g. one per shard), 'shard_local'), each in a fresh coordinator backend. Per run: wall time,
the load average, classes, AIL, max EMD, ``sabre_verify``'s violations from the coordinator, the
run's ``sabre.runs.partitions`` (the design used, parts, rows per part), and the bytes the
coordinator backend received from and sent to the workers on its sockets
(``sabre_pg.bench.netio.SocketBytes``) against the table's size, and the bytes over the
loopback interface during the call (on a one-machine cluster: all traffic between the nodes,
worker to worker included, plus whatever else the machine sends over 127.0.0.1: an upper
bound; counting the sockets of the workers' backends that serve the session instead missed
most of it: Citus fetches the repartitions' intermediate results over connections of their
own), and each worker's peak memory (the largest VmHWM of its backends serving Citus's
connections, read after the call while they are cached). One JSON line per run.

    python benchmarks/bench_citus_designs.py --dsn CONNINFO [--rows 100000] [--shards 32] [--parts 32]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_DIR))

import psycopg  # noqa: E402
from psycopg import sql  # noqa: E402

from sabre_pg.bench.citus import ensure_distributed, table_bytes  # noqa: E402
from sabre_pg.bench.netio import SocketBytes  # noqa: E402
from sabre_pg.bench.speed import K, T, ensure_table, load_average  # noqa: E402
from sabre_pg.census import CENSUS_QIS, CENSUS_SENSITIVE  # noqa: E402


def loopback_bytes() -> int | None:
    """Bytes received on the loopback interface so far (/proc/net/dev): all the local cluster's
    traffic between its nodes, worker to worker included (and whatever else this machine sends
    over 127.0.0.1 meanwhile: an upper bound)."""
    try:
        for line in Path("/proc/net/dev").read_text().splitlines():
            name, _, fields = line.partition(":")
            if name.strip() == "lo":
                return int(fields.split()[0])
    except OSError:
        pass
    return None


def worker_peaks(dsn: str, conn) -> dict | None:
    """{worker: the largest VmHWM (MB) of its backends serving Citus connections}, read while
    the coordinator session that ran the call is still open (Citus caches one connection per
    worker for it, the one that anonymized the worker's parts or shards); None when the workers'
    /proc is not readable from here (a cluster on other machines)."""
    peaks = {}
    for host, port in _workers(conn):
        with psycopg.connect(psycopg.conninfo.make_conninfo(dsn, host=host, port=port), autocommit=True) as w:
            pids = [p for (p,) in w.execute("SELECT pid FROM pg_catalog.pg_stat_activity WHERE application_name "
                                            "LIKE 'citus_internal%%' AND pid <> pg_catalog.pg_backend_pid()")]
        hwm = []
        for pid in pids:
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                return None
            hwm += [int(line.split()[1]) // 1024 for line in status.splitlines() if line.startswith("VmHWM:")]
        peaks[f"{host}:{port}"] = max(hwm, default=None)
    return peaks


def _workers(conn) -> list:
    return conn.execute("SELECT nodename, nodeport FROM pg_catalog.pg_dist_node WHERE groupid <> 0 "
                        "AND noderole = 'primary' ORDER BY nodeport").fetchall()


def one_run(dsn: str, schema: str, table: str, hierarchies: dict, options: dict) -> dict:
    qs = sql.Identifier(schema)
    output = f"public.{table}_{options['citus_design']}_{options.get('partitions', 'auto')}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("SELECT {}.sabre_selftest()").format(qs))
        size = table_bytes(conn, table)
        pid = conn.execute("SELECT pg_catalog.pg_backend_pid()").fetchone()[0]
        ports = [p for (p,) in conn.execute("SELECT nodeport FROM pg_catalog.pg_dist_node WHERE groupid <> 0")]
        load, lo = load_average(), loopback_bytes()
        t0 = time.perf_counter()
        with SocketBytes(pid, ports) as sockets:
            run_id, classes, ail, seconds = conn.execute(sql.SQL(
                "SELECT run_id, classes, ail, seconds FROM {}.sabre_anonymize(source => %s::regclass, "
                "quasi_identifiers => %s, sensitive => %s, t => %s, k => %s, output => %s, options => %s::jsonb)"
            ).format(qs), (f"public.{table}", CENSUS_QIS, CENSUS_SENSITIVE, T, K, output,
                           json.dumps({"hierarchies": hierarchies, "keep": ["id"], **options}))).fetchone()
        wall = time.perf_counter() - t0
        lo = None if lo is None else loopback_bytes() - lo
        peaks = worker_peaks(dsn, conn)
        parts = conn.execute(sql.SQL("SELECT partitions FROM {}.runs WHERE run_id = %s").format(qs),
                             (run_id,)).fetchone()[0]
        checked = conn.execute(sql.SQL("SELECT violations, max_emd, min_class_size FROM {}.sabre_verify("
                                       "%s::regclass, %s, %s, %s)").format(qs), (output, CENSUS_SENSITIVE, T, K)).fetchone()
        conn.execute(sql.SQL("DROP TABLE {} CASCADE").format(sql.SQL(output)))
    got = sockets.result() or {}
    return {"options": options, "design": parts.get("citus_design"), "parts": parts.get("parts"),
            "part_rows": parts.get("part_rows"), "workers": parts.get("workers"), "classes": classes,
            "ail": round(ail, 4), "violations": checked[0], "max_emd": checked[1], "min_class_size": checked[2],
            "wall": round(wall, 1), "seconds": round(seconds, 1), "load": load, "table_bytes": size,
            "received": got.get("received"), "sent": got.get("sent"), "loopback_bytes": lo,
            "worker_vmhwm_mb": peaks,
            "received_share": round(got["received"] / size, 4) if got.get("received") is not None else None}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", required=True, help="the Citus coordinator")
    parser.add_argument("--schema", default="sabre")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--shards", type=int, default=32)
    parser.add_argument("--parts", default="", help="comma-separated part counts for further qi_local runs")
    options = parser.parse_args(argv)
    table, hierarchies, note = ensure_table(options.dsn, options.rows, options.schema)
    dist = ensure_distributed(options.dsn, table, options.shards)
    print(f"{dist} ({note}; {options.shards} shards); t = {T}, k = {K}", flush=True)
    runs = [{"citus_design": "qi_local"}] + [{"citus_design": "qi_local", "partitions": int(p)}
                                             for p in options.parts.split(",") if p.strip()]
    for opts in runs + [{"citus_design": "shard_local"}]:
        print(json.dumps(one_run(options.dsn, options.schema, dist, dict(hierarchies), opts)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
