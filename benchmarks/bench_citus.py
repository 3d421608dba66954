#!/usr/bin/env python3
"""Issue 27's Citus benchmark: the default call on a hash-distributed census table, with each class
design, against the same table on one node, in the same run (``sabre_pg.bench.citus``; the same
as ``sabre-pg bench --citus``).

For each size of ``--rows`` (default 1000000; the issue asks 1000000,10000000) on a Citus
coordinator (``--dsn``) whose nodes run on this machine: ``public.bench_census_<rows>`` (generated
once in bulk, reused) and its copy distributed by id (``--shards``, default Citus's
``citus.shard_count``); one plain call (t = 0.35, k = 6, the 7 QIs, SA salary, default method)
on the local table, then on the distributed one for each design of ``--designs`` (default
shard_local,qi_local; ``options.citus_design``: a design the server refuses is reported "not
available"). Each run reports the wall time, classes, AIL, max EMD, ``sabre_verify``'s
violations; per node (coordinator, each worker) the largest VmHWM of its backends that worked
and their CPU seconds, the rows each worker holds per CPU second of its backends; the bytes the
coordinator backend received and sent, and the bytes that crossed between the nodes (in total and
per node) per source row. Timings on a shared machine are under load: the load average is printed.

    python benchmarks/bench_citus.py --dsn CONNINFO [--rows 1000000,10000000] [--designs shard_local,qi_local]
                                     [--shards N] [--out DIR]

Writes ``citus.json`` and ``citus.md`` to ``--out`` (default bench-out).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_DIR))

from sabre_pg.bench import citus  # noqa: E402
from sabre_pg.bench.speed import load_average  # noqa: E402
from sabre_pg.connect import resolve_dsn  # noqa: E402


def sizes(text: str) -> list:
    """``--rows``: comma-separated row counts (1000000 or 1_000_000)."""
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", help="the Citus coordinator: conninfo or URL (default: $DATABASE_URL, PG*)")
    parser.add_argument("--schema", default="sabre", help="schema sabre-pg is installed in (default: sabre)")
    parser.add_argument("--rows", type=sizes, default=[1_000_000], help="comma-separated sizes (default: 1000000)")
    parser.add_argument("--designs", default=",".join(citus.DESIGNS),
                        help="comma-separated class designs (default: %s)" % ",".join(citus.DESIGNS))
    parser.add_argument("--shards", type=int, help="shards of the distributed copy (default: citus.shard_count)")
    parser.add_argument("--out", default="bench-out", help="folder for citus.json and citus.md")
    options = parser.parse_args(argv)
    designs = [d.strip() for d in options.designs.split(",") if d.strip()]
    dsn = resolve_dsn(argparse.Namespace(dsn=options.dsn, sabre_schema=options.schema))
    print(f"sabre-pg Citus benchmark: {os.cpu_count()} CPUs; load average {load_average()}", flush=True)
    try:
        results = citus.run_citus(dsn, options.rows, options.schema, echo=lambda text: print(text, flush=True),
                                  shards=options.shards, designs=designs, out=options.out)
    except citus.NotCitus as e:
        print(f"bench_citus.py: {e}", file=sys.stderr)
        return 2
    citus.write(results, options.out)
    print(citus.table_md(results))
    print(f"wrote {options.out}/citus.json, {options.out}/citus.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
