#!/usr/bin/env python3
"""SABRE_W inside PostgreSQL (docs/streams.md; the paper's §6, Figs 15-16): a thin command
line over :mod:`sabre_pg.bench.stream` (which ``sabre-pg bench --stream`` also runs).

A census-like stream arrives I rows at a time; after each batch ``sabre_stream_advance`` runs
in its own transaction.  The main stream (``--rows``, omega = 20,000, I = 5,000) is checked
by ``sabre_stream_verify`` and compared with the tumbling-window baselines; the sweeps run on
``--sweep-rows`` rows: omega = 20,000 with I in ``--steps``, I = 5,000 with omega in
``--windows``; the main stream and the default-method omega baseline also run at each t of
``--ts``.  Targets: an advance with I = 5,000 and omega = 20,000 <= 0.3 s; the 500k
stream <= 40 s.

    python benchmarks/bench_stream.py [--dsn CONNINFO] [--rows 500000] [--sweep-rows N]
        [--steps 1000,2000,5000,10000,20000] [--windows 5000,10000,20000,50000]
        [--no-sweeps] [--no-baselines] [--ts 0.1,0.2] [--engine window|refine|sabre] [--plots DIR]
        [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg  # noqa: E402

from sabre_pg.bench import stream  # noqa: E402
from sabre_pg.connect import resolve_dsn  # noqa: E402


def progress(total: int):
    done = [0]

    def tick():
        done[0] += 1
        width = 30
        filled = int(width * done[0] / max(total, 1))
        sys.stderr.write("\r[%s%s] %d/%d batches" % ("#" * filled, "." * (width - filled), done[0], total))
        if done[0] >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()
    return tick


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dsn")
    p.add_argument("--rows", type=int, default=500_000)
    p.add_argument("--sweep-rows", type=int, default=None, help="rows of the sweeps (default --rows)")
    p.add_argument("--steps", default=",".join(map(str, stream.STEPS)))
    p.add_argument("--windows", default=",".join(map(str, stream.WINDOWS)))
    p.add_argument("--no-sweeps", action="store_true")
    p.add_argument("--no-baselines", action="store_true")
    p.add_argument("--ts", default=",".join("%g" % t for t in stream.OTHER_T),
                   help="other t for the main stream and the default-method omega baseline ('' for none)")
    p.add_argument("--engine", choices=("window", "refine", "sabre"),
                   help="record this engine for the bench's streams (default: the one a new stream gets)")
    p.add_argument("--plots", type=Path, help="directory for stream.md, fig15.png, fig16.png")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    dsn = resolve_dsn(argparse.Namespace(dsn=args.dsn, sabre_schema="sabre"))
    cfg = dict(rows=args.rows, sweep_rows=args.sweep_rows or args.rows, baselines=not args.no_baselines,
               steps=[] if args.no_sweeps else [int(s) for s in args.steps.split(",")],
               windows=[] if args.no_sweeps else [int(w) for w in args.windows.split(",")],
               ts=[float(t) for t in args.ts.split(",") if t.strip()], engine=args.engine)
    with psycopg.connect(dsn, autocommit=True) as conn:
        results = stream.run(conn, cfg, "sabre", progress(stream.planned_steps(cfg)))
    print(json.dumps(results, indent=1, default=str))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    if args.plots:
        stream.write(results, args.plots)


if __name__ == "__main__":
    main()
