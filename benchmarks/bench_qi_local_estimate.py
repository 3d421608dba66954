#!/usr/bin/env python3
"""The expected quality of issue #27's QI-local design, measured without Citus.

QI-local (not built when this was written; now plpython/batch/citus_qi_local.py, measured by
benchmarks/bench_citus_designs.py) would repartition the rows once by the split the partitioned runs compute
and anonymize each part with its budget on a worker. A single-node partitioned run
(``options.partitions = N``, plpython/batch/partition.py) builds the same classes: the same
split into N parts, each part anonymized with its budget, the exact check against the whole
table. So its AIL at N = the cluster's workers or shards is what QI-local would give; the
shard-local AIL to compare with comes from ``sabre-pg bench --citus`` on the same table
(``bench_census_<rows>``, seed 1, t = 0.35, k = 6, the 7 QIs, SA salary, default method).

A partitioned run reports no AIL (``ail`` NULL), so the AIL is computed here from the output's
classes with the engine's own measure (``sabre_pg.core.multi_refine.ail_of`` over the table's
encoding, ``sabre_pg.bench.multi_sa.load_arrays``); for the unpartitioned run it is printed
beside the reported one as a check.

    python benchmarks/bench_qi_local_estimate.py [--dsn CONNINFO] [--rows 100000] [--parts 2,32]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_DIR))

import numpy as np  # noqa: E402
import psycopg  # noqa: E402
from psycopg import sql  # noqa: E402

from sabre_pg.bench.multi_sa import load_arrays  # noqa: E402
from sabre_pg.bench.speed import K, T, ensure_table  # noqa: E402
from sabre_pg.census import CENSUS_QIS, CENSUS_SENSITIVE  # noqa: E402
from sabre_pg.connect import resolve_dsn  # noqa: E402
from sabre_pg.core.multi_refine import ail_of  # noqa: E402


def one_run(dsn, schema, table, hierarchies, qis, parts) -> dict:
    output = f"public.{table}_qil_{parts or 1}"
    options = {"hierarchies": hierarchies, "keep": ["id"], **({"partitions": parts} if parts else {})}
    qs = sql.Identifier(schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        t0 = time.perf_counter()
        run_id, rows, classes, reported = conn.execute(sql.SQL(
            "SELECT run_id, rows, classes, ail FROM {}.sabre_anonymize(source => %s::regclass, "
            "quasi_identifiers => %s, sensitive => %s, t => %s, k => %s, output => %s, options => %s::jsonb)"
        ).format(qs), (f"public.{table}", CENSUS_QIS, CENSUS_SENSITIVE, T, K, output, json.dumps(options))).fetchone()
        wall = time.perf_counter() - t0
        used = conn.execute(sql.SQL("SELECT partitions FROM {}.runs WHERE run_id = %s").format(qs), (run_id,)).fetchone()[0]
        checked = conn.execute(sql.SQL("SELECT violations, max_emd, min_class_size FROM {}.sabre_verify("
                                       "%s::regclass, %s, %s, %s)").format(qs), (output, CENSUS_SENSITIVE, T, K)).fetchone()
        ec = np.asarray([e for (e,) in conn.execute(
            sql.SQL("SELECT ec_id FROM {} ORDER BY id").format(sql.SQL(output)))], dtype=np.int64)
    _, ec = np.unique(ec, return_inverse=True)
    return {"partitions": (used or {}).get("parts", 1), "rows": rows, "classes": classes, "wall": round(wall, 1),
            "ail": float(ail_of(qis, ec.reshape(-1))), "reported_ail": reported,
            "violations": checked[0], "max_emd": checked[1], "min_class_size": checked[2]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", help="conninfo or URL (default: $DATABASE_URL, PG*, else the embedded cluster)")
    parser.add_argument("--schema", default="sabre")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--parts", default="2,32", help="comma-separated part counts (workers, shards)")
    options = parser.parse_args(argv)
    dsn = resolve_dsn(argparse.Namespace(dsn=options.dsn, sabre_schema=options.schema))
    table, hierarchies, note = ensure_table(dsn, options.rows, options.schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        qis = load_arrays(conn, {"qis": list(CENSUS_QIS), "sas": [CENSUS_SENSITIVE], "hierarchies": dict(hierarchies),
                                 "table": table}, options.schema)[0]
    print(f"{table} ({note}); t = {T}, k = {K}")
    for parts in [None] + [int(p) for p in options.parts.split(",") if p.strip()]:
        print(json.dumps(one_run(dsn, options.schema, table, dict(hierarchies), qis, parts)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
