#!/usr/bin/env python3
"""End to end: a plain ``sabre_anonymize`` call against a plain copy of the same table (issue 26).

For each size in ``--rows`` (default 100000,1000000) and each method of ``--methods``
(default refine,ak,mondrian: the default method, SABRE-AK and t-Mondrian), on the census-like
table ``public.bench_census_<rows>`` (generated with ``sabre_pg.census_sql.generate_census``,
reused when it exists; ``--regenerate`` forces it), ``sabre_pg.bench.speed`` measures in a fresh
backend one plain call (t = 0.35, k = 6, the 7 QIs, SA salary; no options but the hierarchies):

- its wall time (client side, with the commit) and its own ``seconds``;
- right after, a plain ``CREATE TABLE AS SELECT *`` of the same table in another fresh backend,
  and the ratio run / copy (targets at 1M rows: 'refine' <= 5, 'ak' <= 4);
- each phase of ``sabre.runs.phases`` and ``sabre.runs.partitions`` (automatic partitions);
- the backend's VmHWM (``/proc/<pg_backend_pid()>/status``; 'n/a' when the server is not local),
  and the copy's;
- the load average (timings on a shared machine say so).

``--curve`` prints the markdown table of time and peak memory against rows (docs/evaluation.md,
"Speed of moving rows").

    python benchmarks/bench_db.py [--dsn CONNINFO] [--rows 100000,1000000,3000000,10000000]
                                  [--methods refine,ak,mondrian] [--repeat 1] [--regenerate]
                                  [--json out.json] [--curve]

Without ``--dsn`` the connection is resolved like the CLI's ($DATABASE_URL, PG*, else the
embedded cluster, started on demand).  ``sabre-pg bench --speed --sizes ...`` is the same.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_DIR))

import psycopg  # noqa: E402

from sabre_pg.bench import speed  # noqa: E402
from sabre_pg.connect import resolve_dsn  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", help="conninfo or URL (default: $DATABASE_URL, PG*, else the embedded cluster)")
    parser.add_argument("--schema", default="sabre", help="schema sabre-pg is installed in (default: sabre); without --dsn the embedded "
                        "cluster first installs this checkout's code into it when what it holds differs, so "
                        "give --dsn to measure another version installed there (an A/B)")
    parser.add_argument("--rows", default="100000,1000000", help="comma-separated sizes (default: 100000,1000000)")
    parser.add_argument("--methods", default=",".join(speed.METHODS),
                        help="comma-separated methods (default: %s)" % ",".join(speed.METHODS))
    parser.add_argument("--repeat", type=int, default=1, help="runs per size and method (all are shown)")
    parser.add_argument("--regenerate", action="store_true", help="regenerate the tables even if they exist")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--curve", action="store_true", help="also print the markdown table of the speed curve")
    options = parser.parse_args(argv)
    try:
        sizes = [int(x.replace("_", "")) for x in options.rows.split(",") if x.strip()]
    except ValueError:
        parser.error("--rows takes comma-separated integers")
    methods = [m.strip() for m in options.methods.split(",") if m.strip()]

    dsn = resolve_dsn(argparse.Namespace(dsn=options.dsn, sabre_schema=options.schema))
    with psycopg.connect(dsn) as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]
        where = f"{conn.info.host}:{conn.info.port}/{conn.info.dbname}"
        gucs = dict(conn.execute("SELECT name, setting FROM pg_settings WHERE name IN "
                                 "('wal_level', 'fsync', 'shared_buffers', 'work_mem')").fetchall())
    print(f"sabre-pg database benchmark: PostgreSQL {version} at {where}; t = {speed.T}, k = {speed.K}, "
          f"7 QIs; {os.cpu_count()} CPUs; load average {speed.load_average()}")
    print("server: " + ", ".join(f"{k} {gucs.get(k)}" for k in ("wal_level", "fsync", "shared_buffers", "work_mem"))
          + " (wall times include the client round trip and the commit)", flush=True)
    results = speed.run_speed(dsn, sizes, methods, options.repeat, options.schema, options.regenerate,
                              echo=lambda text: print(text, flush=True))
    if options.curve:
        print(speed.curve_table(results))
    if options.json:
        Path(options.json).write_text(json.dumps(results, indent=2, default=str) + "\n")
        print(f"wrote {options.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
