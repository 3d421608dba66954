#!/usr/bin/env python3
"""SABRE_W inside PostgreSQL (docs/streams.md; the paper's §6, Figs 15-16).

A census-like stream (``sabre_pg.census_sql``, all 7 QIs with their hierarchies, SA salary,
t = 0.35, k = 6) arrives in arrival order: the source table starts empty and receives the
census rows I at a time; after each batch ``sabre_stream_advance`` runs in its own
transaction (the client's wall time of that call is the advance's time; inserting the batch is
not counted).  Per configuration: advances, seconds per advance (mean, median, max; and for
the advances that ran SABRE), the total, AIL of the output (``sabre_utility`` against the
whole census table, so every AIL here shares one normalization) and ``sabre_stream_verify``.

* **main**: ``--rows`` rows (default 500,000) with omega = 20,000 and I = 5,000, against the
  two **tumbling-window baselines**: ``sabre_anonymize`` on each block of I rows alone and on
  each block of omega rows alone (AIL over all blocks; time summed);
* **sweeps** on ``--sweep-rows`` rows: omega = 20,000 with I in ``--steps``, and I = 5,000 with
  omega in ``--windows`` (plots with ``--plots DIR`` when matplotlib is installed).

Targets: an advance with I = 5,000 and omega = 20,000 <= 0.3 s; the 500k stream <= 40 s.

    python benchmarks/bench_stream.py [--dsn CONNINFO] [--rows 500000] [--sweep-rows 100000]
        [--steps 1000,2000,5000,10000,20000] [--windows 5000,10000,20000,50000]
        [--no-sweeps] [--no-baselines] [--plots DIR] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_DIR))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg  # noqa: E402
from psycopg import sql  # noqa: E402

from bench_db import ensure_table  # noqa: E402
from sabre_pg.census import CENSUS_QIS, CENSUS_SENSITIVE  # noqa: E402
from sabre_pg.connect import resolve_dsn  # noqa: E402

T, K = 0.35, 6
SOURCE = "bench_stream_src"


def progress(label: str, done: int, total: int):
    width = 30
    filled = int(width * done / max(total, 1))
    sys.stderr.write("\r%-28s [%s%s] %d/%d" % (label, "#" * filled, "." * (width - filled), done, total))
    if done >= total:
        sys.stderr.write("\n")
    sys.stderr.flush()


def utility_ail(conn, output: str, census: str, hierarchies: dict) -> float:
    return conn.execute("SELECT ail FROM sabre.sabre_utility(%s::regclass, %s::regclass, %s::text[], %s, %s::jsonb)",
                        (output, census, CENSUS_QIS, CENSUS_SENSITIVE,
                         json.dumps({"hierarchies": hierarchies}))).fetchone()[0]


def run_stream(dsn, census, hierarchies, rows, omega, step, label, verify=False) -> dict:
    """The stream over the first ``rows`` census rows arriving I at a time."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT sabre.sabre_selftest()")               # warm the interpreter
        for name in (SOURCE, SOURCE + "_sabre_w", SOURCE + "_sabre_w_classes", SOURCE + "_sabre_w_keys"):
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(name)))
        if conn.execute("SELECT 1 FROM sabre.streams WHERE name = 'bench_w'").fetchone():
            conn.execute("SELECT sabre.sabre_stream_drop('bench_w')")
        conn.execute(sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING ALL)").format(
            sql.Identifier(SOURCE), sql.Identifier(census)))
        conn.execute("SELECT * FROM sabre.sabre_stream_create(name => 'bench_w', source => %s::regclass, "
                     "arrival => 'id', quasi_identifiers => %s::text[], sensitive => %s, t => %s, k => %s, "
                     "window_size => %s, step => %s, options => %s::jsonb)",
                     (SOURCE, CENSUS_QIS, CENSUS_SENSITIVE, T, K, omega, step,
                      json.dumps({"hierarchies": hierarchies})))
        per, calls, loaded = [], [], 0
        total_batches = rows // step
        for b in range(total_batches):
            conn.execute(sql.SQL("INSERT INTO {} SELECT * FROM {} WHERE id > %s AND id <= %s").format(
                sql.Identifier(SOURCE), sql.Identifier(census)), (loaded, loaded + step))
            loaded += step
            started = time.perf_counter()
            got = conn.execute("SELECT case_no, seconds, rows FROM sabre.sabre_stream_advance('bench_w')").fetchall()
            elapsed = time.perf_counter() - started
            if got:
                calls.append(elapsed)
                per.extend(got)
            progress(label, b + 1, total_batches)
        out = summarize(per, calls)
        out.update(rows=rows, window_size=omega, step=step,
                   ail=utility_ail(conn, SOURCE + "_sabre_w", census, hierarchies))
        if verify:
            v = conn.execute("SELECT * FROM sabre.sabre_stream_verify('bench_w')").fetchone()
            out["verify"] = dict(zip(("advances", "classes", "rows", "violations", "max_emd", "min_class_size",
                                      "published_twice", "expired_unpublished", "updated", "deleted", "late"), v))
    return out


def summarize(per, calls) -> dict:
    seconds = [s for _, s, _ in per]
    direct = [s for c, s, _ in per if c != 1]
    return {"advances": len(per), "cases": {c: sum(1 for x, _, _ in per if x == c) for c in (1, 2, 3)},
            "published": sum(r for _, _, r in per), "total_seconds": round(sum(calls), 3),
            "advance_mean": round(statistics.mean(calls), 4) if calls else None,
            "advance_median": round(statistics.median(calls), 4) if calls else None,
            "advance_max": round(max(calls), 4) if calls else None,
            "server_mean": round(statistics.mean(seconds), 4) if seconds else None,
            "server_mean_sabre": round(statistics.mean(direct), 4) if direct else None}


def tumbling(dsn, census, hierarchies, rows, block, label) -> dict:
    """sabre_anonymize on each block of ``block`` rows alone; AIL over all blocks."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_tumbling_all")
        seconds, blocks = 0.0, rows // block
        for b in range(blocks):
            conn.execute("DROP VIEW IF EXISTS bench_block CASCADE")
            conn.execute(sql.SQL("CREATE VIEW bench_block AS SELECT * FROM {} WHERE id > {} AND id <= {}").format(
                sql.Identifier(census), sql.Literal(b * block), sql.Literal((b + 1) * block)))
            started = time.perf_counter()
            conn.execute("SELECT * FROM sabre.sabre_anonymize('bench_block'::regclass, %s::text[], %s, %s, %s, "
                         "'ak', 'bench_block_out', %s::jsonb)", (CENSUS_QIS, CENSUS_SENSITIVE, T, K,
                                                                 json.dumps({"hierarchies": hierarchies, "key": "id"})))
            seconds += time.perf_counter() - started
            if b == 0:
                conn.execute("CREATE TABLE bench_tumbling_all AS SELECT * FROM bench_block_out WITH NO DATA")
                rest = [sql.Identifier(r[0]) for r in conn.execute(
                    "SELECT attname FROM pg_attribute WHERE attrelid = 'bench_block_out'::regclass AND attnum > 1 "
                    "AND NOT attisdropped ORDER BY attnum").fetchall()]
            # ec_ids made distinct across blocks, so no two blocks' classes merge
            conn.execute(sql.SQL("INSERT INTO bench_tumbling_all SELECT ec_id + {}, {} FROM bench_block_out").format(
                sql.Literal(b * block), sql.SQL(", ").join(rest)))
            progress(label, b + 1, blocks)
        ail = utility_ail(conn, "bench_tumbling_all", census, hierarchies)
        conn.execute("DROP TABLE bench_tumbling_all")
    return {"block": block, "blocks": blocks, "total_seconds": round(seconds, 3),
            "per_block": round(seconds / max(blocks, 1), 4), "ail": ail}


def plots(results: dict, directory: Path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plots", file=sys.stderr)
        return
    directory.mkdir(parents=True, exist_ok=True)
    for key, x, title in (("sweep_step", "step", "omega = 20,000"), ("sweep_window", "window_size", "I = 5,000")):
        runs = results.get(key) or []
        if not runs:
            continue
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
        xs = [r[x] for r in runs]
        axes[0].plot(xs, [r["advance_mean"] for r in runs], marker="o")
        axes[0].set_xlabel(x), axes[0].set_ylabel("seconds per advance"), axes[0].set_title(title)
        axes[1].plot(xs, [r["ail"] for r in runs], marker="o")
        axes[1].set_xlabel(x), axes[1].set_ylabel("AIL"), axes[1].set_title(title)
        fig.tight_layout()
        fig.savefig(directory / ("stream_%s.png" % key))
        plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dsn")
    p.add_argument("--rows", type=int, default=500_000)
    p.add_argument("--sweep-rows", type=int, default=None, help="rows of the sweeps (default --rows)")
    p.add_argument("--steps", default="1000,2000,5000,10000,20000")
    p.add_argument("--windows", default="5000,10000,20000,50000")
    p.add_argument("--no-sweeps", action="store_true")
    p.add_argument("--no-baselines", action="store_true")
    p.add_argument("--plots", type=Path)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    dsn = resolve_dsn(argparse.Namespace(dsn=args.dsn, sabre_schema="sabre"))
    census, hierarchies, note = ensure_table(dsn, args.rows, "sabre", False)
    print("census table %s (%d rows): %s" % (census, args.rows, note))
    results = {"t": T, "k": K, "main": run_stream(dsn, census, hierarchies, args.rows, 20_000, 5_000,
                                                  "main omega=20000 I=5000", verify=True)}
    if not args.no_baselines:
        results["tumbling_I"] = tumbling(dsn, census, hierarchies, args.rows, 5_000, "tumbling 5000")
        results["tumbling_omega"] = tumbling(dsn, census, hierarchies, args.rows, 20_000, "tumbling 20000")
    if not args.no_sweeps:
        n = args.sweep_rows or args.rows
        results["sweep_step"] = [run_stream(dsn, census, hierarchies, n, 20_000, s, "omega=20000 I=%d" % s)
                                 for s in map(int, args.steps.split(","))]
        results["sweep_window"] = [run_stream(dsn, census, hierarchies, n, w, 5_000, "omega=%d I=5000" % w)
                                   for w in map(int, args.windows.split(","))]
    print(json.dumps(results, indent=1, default=str))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    if args.plots:
        plots(results, args.plots)


if __name__ == "__main__":
    main()
