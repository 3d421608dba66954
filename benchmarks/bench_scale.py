#!/usr/bin/env python3
"""Partitioned runs end to end (docs/scale-out.md): time and peak backend memory by size.

For each size in ``--rows`` (default 1000000,10000000) the census-like table
``public.bench_census_<rows>`` is generated as ``bench_db.py`` does (reused when present), then
``--method`` (default 'refine', the product's default; or 'ak', 'mondrian', 'knn') with t = 0.35, k = 6,
the 7 QIs and SA salary runs partitioned into
the smallest power of two of parts >= rows / ``--part-rows``:

* ``server``: one call, ``sabre_anonymize(options => '{"partitions": P}')``, in one fresh
  backend, one part after another; its peak memory is that backend's ``VmHWM``
  (``/proc/<pid>/status``) read after the call, exactly;
* ``client``: ``sabre_pg.api.anonymize_partitioned`` with ``--parallel`` connections
  (``sabre-pg anonymize --parts P --parallel W``); the peak is the largest ``VmHWM`` seen
  by polling every backend of this run (seen with its application_name) every 0.1 s (a lower bound for a backend that grew
  in its last 0.1 s).

Every output is then checked by ``sabre_verify`` (exact EMD against the whole output, which
holds every source row once). Reported: wall time, the split's and the parts' seconds, parts,
classes, max EMD, violations, peak memory, and time(largest) / time(smallest) per mode.

    python benchmarks/bench_scale.py [--dsn CONNINFO] [--rows 1000000,10000000]
                                     [--part-rows 1000000] [--parallel 2] [--modes server,client]
                                     [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import threading
import time
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_DIR))
sys.path.insert(0, str(REPO_DIR / "benchmarks"))

import psycopg  # noqa: E402
from psycopg import sql  # noqa: E402

import bench_db  # noqa: E402,F401  (puts the repository on sys.path)
from sabre_pg.bench.speed import K, T, backend_memory, ensure_table, proc_memory  # noqa: E402
from sabre_pg import api  # noqa: E402
from sabre_pg.census import CENSUS_QIS, CENSUS_SENSITIVE  # noqa: E402
from sabre_pg.connect import resolve_dsn  # noqa: E402


class PeakMonitor:
    """The largest VmHWM of the database's other client backends, polled in a thread."""

    def __init__(self, dsn: str, interval: float = 0.1):
        self.dsn, self.interval, self.peaks = dsn, interval, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self):
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self._stop.is_set():
                # this run's backends: seen with this run's application_name when they connect
                # (a sabre call shows its progress there meanwhile), then followed by pid
                for (pid,) in conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                                           "AND backend_type = 'client backend' AND pid <> pg_backend_pid() "
                                           "AND application_name = current_setting('application_name')"):
                    self.peaks.setdefault(pid, 0.0)
                for pid in list(self.peaks):
                    mem = proc_memory(pid)
                    if mem and "VmHWM" in mem:
                        self.peaks[pid] = max(self.peaks[pid], mem["VmHWM"])
                self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def _phases(conn, schema, run_id) -> dict:
    return conn.execute(sql.SQL("SELECT phases FROM {}.runs WHERE run_id = %s").format(sql.Identifier(schema)),
                        (run_id,)).fetchone()[0]


def run_server(dsn, table, hierarchies, schema, parts, method) -> dict:
    with psycopg.connect(dsn, autocommit=True) as conn:
        qs = sql.Identifier(schema)
        conn.execute(sql.SQL("SELECT {}.sabre_selftest()").format(qs))
        t0 = time.perf_counter()
        row = conn.execute(sql.SQL(
            "SELECT run_id, rows, classes, min_class_size, max_emd, output::text FROM {}.sabre_anonymize("
            "%s::regclass, %s, %s, %s, %s, %s, %s, %s::jsonb)").format(qs),
            (f"public.{table}", CENSUS_QIS, CENSUS_SENSITIVE, T, K, method, f"public.{table}_parts",
             json.dumps({"hierarchies": hierarchies, "partitions": parts}))).fetchone()
        wall = time.perf_counter() - t0
        mem = backend_memory(conn)
        return {"wall": wall, "run_id": row[0], "rows": row[1], "classes": row[2], "min_class_size": row[3],
                "max_emd": row[4], "output": row[5], "peak_mb": mem and mem.get("VmHWM"),
                "phases": _phases(conn, schema, row[0])}


def run_client(dsn, table, hierarchies, schema, parts, parallel, method) -> dict:
    with PeakMonitor(dsn) as monitor:
        t0 = time.perf_counter()
        run = api.anonymize_partitioned(dsn, f"public.{table}", CENSUS_QIS, CENSUS_SENSITIVE, T, K, method,
                                        output=f"public.{table}_parts", hierarchies=hierarchies, schema=schema,
                                        partitions=parts, parallel=parallel)
        wall = time.perf_counter() - t0
    with psycopg.connect(dsn, autocommit=True) as conn:
        phases = _phases(conn, schema, run.run_id)
    return {"wall": wall, "run_id": run.run_id, "rows": run.rows, "classes": run.n_classes,
            "min_class_size": run.min_class_size, "max_emd": run.max_emd, "output": run.output_name,
            "peak_mb": max(monitor.peaks.values(), default=None), "backends": len(monitor.peaks), "phases": phases}


def check(dsn, schema, output) -> dict:
    with psycopg.connect(dsn, autocommit=True) as conn:
        t0 = time.perf_counter()
        r = conn.execute(sql.SQL("SELECT classes, violations, max_emd, min_class_size FROM {}.sabre_verify("
                                 "%s::regclass, %s, %s, %s)").format(sql.Identifier(schema)),
                         (output, CENSUS_SENSITIVE, T, K)).fetchone()
        return {"verify_classes": r[0], "violations": r[1], "verify_max_emd": r[2], "verify_min_class": r[3],
                "verify_seconds": time.perf_counter() - t0}


def largest_part(dsn, schema, table, hierarchies, parts, method) -> int:
    """Rows of the largest part, from the run's plan (``sabre_partitions`` without staging
    makes nothing; the one-call mode records no run per part)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(sql.SQL(
            "SELECT max(p.rows) FROM {}.sabre_partitions(%s::regclass, %s, %s, %s, %s, %s, %s, %s::jsonb) AS p").format(
            sql.Identifier(schema)), (f"public.{table}", CENSUS_QIS, CENSUS_SENSITIVE, T, K, method,
                                      f"public.{table}_parts", json.dumps({"hierarchies": hierarchies,
                                                                           "partitions": parts}))).fetchone()[0]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn")
    parser.add_argument("--schema", default="sabre")
    parser.add_argument("--rows", default="1000000,10000000")
    parser.add_argument("--part-rows", type=int, default=1_000_000)
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--modes", default="server,client")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--method", default="refine", help="refine (default), ak, mondrian or knn")
    o = parser.parse_args(argv)
    sizes = [int(x.replace("_", "")) for x in o.rows.split(",") if x.strip()]
    modes = [m for m in o.modes.split(",") if m]
    dsn = resolve_dsn(argparse.Namespace(dsn=o.dsn, sabre_schema=o.schema))
    dsn = psycopg.conninfo.make_conninfo(dsn, application_name="sabre_bench_scale_%d" % os.getpid())
    print(f"sabre-pg partitioned runs: method {o.method!r}, t = {T}, k = {K}, 7 QIs, SA salary; parts of <= ~{o.part_rows:,} "
          f"rows; client mode with {o.parallel} connections")
    results = []
    for rows in sizes:
        t0 = time.perf_counter()
        table, hierarchies, note = ensure_table(dsn, rows, o.schema, False)
        print(f"== {rows:,} rows (table {note}, {time.perf_counter() - t0:.1f} s)", flush=True)
        # median cuts halve: a power of two keeps every part near rows / parts <= --part-rows
        parts = 1 << max(0, math.ceil(math.log2(rows / o.part_rows)))
        for mode in modes:
            r = run_server(dsn, table, hierarchies, o.schema, parts, o.method) if mode == "server" else \
                run_client(dsn, table, hierarchies, o.schema, parts, o.parallel, o.method)
            r.update(check(dsn, o.schema, r["output"]), mode=mode, size=rows, partitions=parts,
                     largest_part=largest_part(dsn, o.schema, table, hierarchies, parts, o.method))
            results.append(r)
            ph = r["phases"]
            print(f"   {mode:6s} {r['wall']:8.1f} s wall; split {ph.get('summary', 0):.1f} s, rows to parts "
                  f"{ph.get('read', 0):.1f} s, parts "
                  f"{ph.get('partition', 0):.1f} s, publish+check {ph.get('build_output', 0) + ph.get('check', 0):.1f} s;"
                  f" {parts} parts (largest {r['largest_part']:,} rows), {r['classes']:,} classes (smallest {r['min_class_size']}), max EMD "
                  f"{r['max_emd']:.4f}; sabre_verify: {r['violations']} violations ({r['verify_seconds']:.1f} s); "
                  f"peak backend VmHWM {r['peak_mb'] and round(r['peak_mb'])} MB", flush=True)
    for mode in modes:
        mine = [r for r in results if r["mode"] == mode]
        if len(mine) >= 2:
            print(f"   {mode}: time({mine[-1]['size']:,}) / time({mine[0]['size']:,}) = "
                  f"{mine[-1]['wall'] / mine[0]['wall']:.2f}")
    if o.json:
        Path(o.json).write_text(json.dumps(results, indent=2, default=str))
    return 0 if all(r["violations"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
