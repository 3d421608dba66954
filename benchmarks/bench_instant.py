#!/usr/bin/env python3
"""S-INSTANT (``sabre_instant``) against the exhaustive optimal full-domain search, in the database.

The experiment of ``sabre-pg bench --instant`` (:mod:`sabre_pg.bench.instant`) at benchmark
sizes: the census-like data (``bench_census_<rows>``, all QIs from the census list) over k,
N, d and l, and Adult with its ARX hierarchies over k.  Per configuration: scans, the
server's seconds, the client's wall time and the LM of S-INSTANT on ``pg_stats`` marginals,
S-INSTANT on a ``pg_stats_ext`` MCV list, and the exhaustive search; the report checks the
issue's targets (instant.md) and plots time, scans and LM against k, N, d and l
(fig_instant_*.png).

    python benchmarks/bench_instant.py [--dsn CONNINFO | --data-dir DIR] [--rows 100000]
        [--sizes 100000,1000000] [--k 10,25,50,100] [--d 3,5,7] [--l 2,3,4,5]
        [--adult DIR | --no-adult] [--out bench-instant] [--keep]

Without ``--dsn`` a throwaway embedded cluster is started in ``--data-dir`` (default
/tmp/sabre-instant-bench) with this checkout's sabre installed, and stopped at the end.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg  # noqa: E402

from sabre_pg.arx import load_arx  # noqa: E402
from sabre_pg.bench import instant  # noqa: E402
from shared_data import ADULT  # noqa: E402

ADULT_QIS = ["age", "sex", "race", "marital-status", "education", "native-country"]


def numbers(text: str) -> list:
    return [int(x) for x in text.split(",") if x.strip()]


def adult(conn, directory: Path, schema: str):
    """(table, {column: hierarchy}, QIs) of public.adult, loaded when missing, analyzed."""
    if conn.execute("SELECT to_regclass('public.adult')").fetchone()[0] is None:
        load_arx(conn, directory / "adult.csv", table="adult", sabre_schema=schema)
    conn.execute("ANALYZE public.adult")
    names = {c: "adult_%s" % c for c in ADULT_QIS}
    return "adult", names, ADULT_QIS


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dsn")
    p.add_argument("--data-dir", default="/tmp/sabre-instant-bench")
    p.add_argument("--rows", type=int, default=instant.DEFAULT["rows"])
    p.add_argument("--sizes", default="100000,1000000")
    p.add_argument("--k", default="10,25,50,100")
    p.add_argument("--d", default="3,5,7")
    p.add_argument("--l", default="2,3,4,5")
    p.add_argument("--adult", default=str(ADULT))
    p.add_argument("--no-adult", action="store_true")
    p.add_argument("--out", default="bench-instant")
    p.add_argument("--schema", default="sabre")
    p.add_argument("--keep", action="store_true")
    opts = p.parse_args(argv)
    cfg = dict(instant.DEFAULT, rows=opts.rows, sizes=numbers(opts.sizes), k_values=numbers(opts.k),
               qi_counts=numbers(opts.d), l_values=numbers(opts.l))
    cluster = None
    dsn = opts.dsn
    if dsn is None:
        from sabre_pg.cluster import LocalCluster
        cluster = LocalCluster(data_dir=opts.data_dir, schema=opts.schema)
        cluster.start()
        dsn = cluster.dsn()
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SET search_path = public, %s" % opts.schema)
            data = None if opts.no_adult else adult(conn, Path(opts.adult), opts.schema)
            result = instant.run_instant_bench(conn, cfg, Path(opts.out), opts.schema, 1, opts.keep, data)
    finally:
        if cluster is not None:
            cluster.stop()
    print((Path(opts.out) / "instant.md").read_text())
    return 0 if result["runs"] else 1


if __name__ == "__main__":
    sys.exit(main())
