#!/usr/bin/env python3
"""End-to-end benchmark of ``sabre_anonymize`` (SABRE-AK) inside PostgreSQL.

For each size in ``--rows`` (default 100000,1000000):

1. the census-like table ``public.bench_census_<rows>`` is generated with
   ``sabre_pg.census_sql.generate_census`` (reused when it exists with the right row count
   and its hierarchies are registered; ``--regenerate`` forces it);
2. in a fresh connection, after one ``sabre_selftest()`` (the session's first PL/Python
   call starts the interpreter and imports numpy and sabre's modules; that cold start is
   reported apart), ``sabre_anonymize`` runs with t = 0.35, k = 6, all 7 QIs
   (age, sex, education, marital, race, workclass, birthplace), SA salary; the
   client-side wall time (including the commit), the function's own ``seconds`` and the
   per-phase seconds recorded in ``sabre.runs.phases`` are reported (in the order of
   ``sabre_pg.core.stopwatch.PHASES``), and the backend's peak memory
   (``VmHWM`` in ``/proc/<pg_backend_pid()>/status``; 'n/a' when the server is not
   local or /proc is not readable);
3. in another fresh connection, the baseline
   ``CREATE TABLE tmp AS SELECT * FROM <table> ORDER BY <the 7 QIs>`` is timed (then
   dropped), with its backend's VmHWM; the ratio anonymize / sort is reported.

Targets shown beside the numbers: 100k rows <= 1 s; 1M rows <= 5 s with ratio <= 6.

``--methods ak,refine`` (issue #11's speed target): at every size and repetition each method
runs in its own fresh backend on the same table, one after the other (the sort baseline is
skipped), and each method's wall time over SABRE-AK's in the same repetition is reported,
with the target <= 2 for the default method 'refine' at 1M rows.

    python benchmarks/bench_db.py [--dsn CONNINFO] [--rows 100000,1000000] [--repeat 1]
                                  [--regenerate] [--json out.json]

Without ``--dsn`` the connection is resolved like the CLI's ($DATABASE_URL, PG*, else the
embedded cluster, started on demand).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_DIR))

import psycopg  # noqa: E402
from psycopg import sql  # noqa: E402

from sabre_pg.bench.report import phase_order  # noqa: E402
from sabre_pg.census import CENSUS_CATEGORICAL, CENSUS_QIS, CENSUS_SENSITIVE  # noqa: E402
from sabre_pg.census_sql import generate_census  # noqa: E402
from sabre_pg.connect import resolve_dsn  # noqa: E402

T, K = 0.35, 6
# rows -> (max anonymize seconds, max ratio anonymize / sort or None)
TARGETS = {100_000: (1.0, None), 1_000_000: (5.0, 6.0)}


def proc_memory(pid: int) -> dict | None:
    """VmHWM / VmRSS / RssAnon / RssShmem (MB) of a local postgres process, else None."""
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    if not comm.startswith("postgres"):
        return None              # same pid on this machine, but not a postgres backend
    out = {}
    for line in status.splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmHWM", "VmRSS", "RssAnon", "RssShmem"):
            out[key] = int(rest.split()[0]) / 1024.0   # kB -> MB
    return out or None


def _server_is_local(conn) -> bool:
    host = conn.info.host or ""
    return host.startswith("/") or host in ("localhost", "127.0.0.1", "::1", "")


def backend_memory(conn) -> dict | None:
    if not _server_is_local(conn):
        return None
    pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    return proc_memory(pid)


def ensure_table(dsn: str, rows: int, schema: str, regenerate: bool) -> tuple[str, dict, str]:
    """(table, hierarchies, note): the census table of this size, generated when needed."""
    table = f"bench_census_{rows}"
    names = {c: f"{table}_{c}" for c in CENSUS_CATEGORICAL}
    with psycopg.connect(dsn, autocommit=True) as conn:
        if not regenerate:
            exists = conn.execute("SELECT to_regclass(%s)", (f"public.{table}",)).fetchone()[0]
            if exists:
                n = conn.execute(sql.SQL("SELECT count(*) FROM public.{}").format(sql.Identifier(table))).fetchone()[0]
                have = conn.execute(sql.SQL("SELECT count(*) FROM {}.hierarchies WHERE name = ANY(%s)")
                                    .format(sql.Identifier(schema)), (list(names.values()),)).fetchone()[0]
                if n == rows and have == len(names):
                    return table, names, "reused"
        res = generate_census(conn, table=table, rows=rows, seed=1, replace=True, sabre_schema=schema)
        return table, res["hierarchies"], f"generated in {res['seconds']:.2f} s"


def time_anonymize(dsn: str, table: str, hierarchies: dict, schema: str, method: str = "ak") -> dict:
    with psycopg.connect(dsn, autocommit=True) as conn:       # fresh backend: its peak is this run's
        qs = sql.Identifier(schema)
        # warm up: the first PL/Python call of a session starts the interpreter and imports
        # numpy and sabre's modules; timed apart as the session's cold start
        t0 = time.perf_counter()
        conn.execute(sql.SQL("SELECT {}.sabre_selftest()").format(qs))
        cold = time.perf_counter() - t0
        before = backend_memory(conn)
        t0 = time.perf_counter()
        row = conn.execute(
            sql.SQL("SELECT run_id, rows, classes, min_class_size, max_emd, ail, seconds FROM "
                    "{}.sabre_anonymize(source => %s::regclass, quasi_identifiers => %s, sensitive => %s, "
                    "t => %s, k => %s, method => %s, options => %s::jsonb)").format(qs),
            (f"public.{table}", CENSUS_QIS, CENSUS_SENSITIVE, T, K, method,
             json.dumps({"hierarchies": hierarchies, "keep": []})),
        ).fetchone()
        wall = time.perf_counter() - t0
        after = backend_memory(conn)
        run_id = row[0]
        phases = conn.execute(sql.SQL("SELECT phases FROM {}.runs WHERE run_id = %s").format(qs),
                              (run_id,)).fetchone()[0]
    return {"run_id": run_id, "rows": row[1], "classes": row[2], "min_class_size": row[3],
            "max_emd": row[4], "ail": row[5], "seconds": row[6], "wall": wall, "cold_start": cold,
            "phases": phases,
            "mem_before": before, "mem_after": after}


def time_sort(dsn: str, table: str) -> dict:
    tmp = f"bench_sort_tmp_{os.getpid()}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS public.{}").format(sql.Identifier(tmp)))
        t0 = time.perf_counter()
        conn.execute(sql.SQL("CREATE TABLE public.{} AS SELECT * FROM public.{} ORDER BY {}").format(
            sql.Identifier(tmp), sql.Identifier(table), sql.SQL(", ").join(map(sql.Identifier, CENSUS_QIS))))
        wall = time.perf_counter() - t0
        mem = backend_memory(conn)
        work_mem = conn.execute("SHOW work_mem").fetchone()[0]
        conn.execute(sql.SQL("DROP TABLE public.{}").format(sql.Identifier(tmp)))
    return {"wall": wall, "mem": mem, "work_mem": work_mem}


def _mb(mem: dict | None, key: str = "VmHWM") -> str:
    return "n/a" if not mem or key not in mem else f"{mem[key]:.0f} MB"


def _verdict(ok: bool) -> str:
    return "OK" if ok else "MISSED"


def report(rows: int, note: str, anonymized: dict, sort: dict) -> str:
    ratio = anonymized["wall"] / sort["wall"] if sort["wall"] > 0 else float("inf")
    max_seconds, max_ratio = TARGETS.get(rows, (None, None))
    seconds_target = ratio_target = ""
    if max_seconds is not None:
        seconds_target = f"   [target <= {max_seconds:g} s: {_verdict(anonymized['wall'] <= max_seconds)}]"
    if max_ratio is not None:
        ratio_target = f"   [target <= {max_ratio:g}: {_verdict(ratio <= max_ratio)}]"
    phases = anonymized["phases"]
    before, after = anonymized["mem_before"], anonymized["mem_after"]
    lines = [
        f"== {rows:,} rows (table {note})",
        f"   sabre_anonymize  {anonymized['wall']:.3f} s wall ({anonymized['seconds']:.3f} s inside)"
        f"{seconds_target}; the session's first PL/Python call before it (interpreter, numpy, modules) "
        f"took {anonymized['cold_start']:.3f} s",
        f"   sort baseline    {sort['wall']:.3f} s   (CREATE TABLE AS ... ORDER BY 7 QIs, work_mem {sort['work_mem']})",
        f"   ratio            {ratio:.2f}{ratio_target}",
        "   phases (s)       " + "  ".join(f"{p} {phases[p]:.3f}" for p in phase_order(phases)),
        f"   result           run {anonymized['run_id']}: {anonymized['classes']:,} classes "
        f"(smallest {anonymized['min_class_size']}), AIL {anonymized['ail']:.4f}, max EMD {anonymized['max_emd']:.4f}",
        f"   backend memory   anonymize VmHWM {_mb(after)} (backend before it {_mb(before)}; after: RssAnon "
        f"{_mb(after, 'RssAnon')}, RssShmem {_mb(after, 'RssShmem')});  sort VmHWM {_mb(sort['mem'])}",
    ]
    return "\n".join(lines)


def compare_methods(dsn, rows, table, hierarchies, options) -> list:
    """Each method of ``options.methods`` in turn, ``options.repeat`` times, on one table: wall
    times, phases and each method's ratio to 'ak' in the same repetition."""
    methods = [m.strip() for m in options.methods.split(",") if m.strip()]
    results = []
    for repetition in range(max(1, options.repeat)):
        runs = {m: time_anonymize(dsn, table, hierarchies, options.schema, m) for m in methods}
        print(f"== {rows:,} rows, repetition {repetition + 1}", flush=True)
        for m, r in runs.items():
            ratio = r["wall"] / runs["ak"]["wall"] if "ak" in runs else float("nan")
            target = f"   [target <= 2: {_verdict(ratio <= 2)}]" if m == "refine" and rows >= 1_000_000 else ""
            print(f"   {m:9s} {r['wall']:7.2f} s wall ({r['seconds']:.2f} s inside), x{ratio:.2f} SABRE-AK{target}; "
                  f"{r['classes']:,} classes, AIL {r['ail']:.4f}, max EMD {r['max_emd']:.4f}, VmHWM {_mb(r['mem_after'])}")
            print("             phases (s) " + "  ".join(f"{p} {r['phases'][p]:.2f}" for p in phase_order(r["phases"])),
                  flush=True)
            results.append({"rows": rows, "table": table, "method": m, "anonymize": r, "ratio_to_ak": ratio})
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", help="conninfo or URL (default: $DATABASE_URL, PG*, else the embedded cluster)")
    parser.add_argument("--schema", default="sabre", help="schema sabre-pg is installed in (default: sabre)")
    parser.add_argument("--rows", default="100000,1000000", help="comma-separated sizes (default: 100000,1000000)")
    parser.add_argument("--repeat", type=int, default=1, help="anonymize + sort runs per size (all are shown)")
    parser.add_argument("--regenerate", action="store_true", help="regenerate the tables even if they exist")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--methods", help="compare methods end to end, e.g. ak,refine (ratios to 'ak')")
    options = parser.parse_args(argv)
    try:
        sizes = [int(x.replace("_", "")) for x in options.rows.split(",") if x.strip()]
    except ValueError:
        parser.error("--rows takes comma-separated integers")

    dsn = resolve_dsn(argparse.Namespace(dsn=options.dsn, sabre_schema=options.schema))
    with psycopg.connect(dsn) as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]
        where = f"{conn.info.host}:{conn.info.port}/{conn.info.dbname}"
        gucs = dict(conn.execute("SELECT name, setting FROM pg_settings WHERE name IN "
                                 "('wal_level', 'fsync', 'shared_buffers', 'work_mem')").fetchall())
    print(f"sabre-pg database benchmark: PostgreSQL {version} at {where}; SABRE-AK, t = {T}, k = {K}, "
          f"QIs {', '.join(CENSUS_QIS)}; {os.cpu_count()} CPUs")
    print("server: " + ", ".join(f"{k} {gucs.get(k)}" for k in ("wal_level", "fsync", "shared_buffers", "work_mem"))
          + " (wall times include the client round trip and the commit)")
    results = []
    for rows in sizes:
        table, hierarchies, note = ensure_table(dsn, rows, options.schema, options.regenerate)
        if options.methods:
            results += compare_methods(dsn, rows, table, hierarchies, options)
            continue
        for repetition in range(max(1, options.repeat)):
            anonymized = time_anonymize(dsn, table, hierarchies, options.schema)
            sort = time_sort(dsn, table)
            print(report(rows, note if repetition == 0 else "reused", anonymized, sort), flush=True)
            results.append({"rows": rows, "table": table, "anonymize": anonymized, "sort": sort,
                            "ratio": anonymized["wall"] / sort["wall"]})
    if options.json:
        Path(options.json).write_text(json.dumps(results, indent=2, default=str) + "\n")
        print(f"wrote {options.json}")
    return 0

if __name__ == "__main__":
    sys.exit(main())
