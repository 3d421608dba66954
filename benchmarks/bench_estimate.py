#!/usr/bin/env python3
"""Accuracy and speed of ``sabre_estimate`` against actual ``sabre_anonymize`` runs.

For each dataset:

1. ``sabre_anonymize`` (SABRE-AK) runs at t = 0.15, 0.25, 0.35, 0.45 with k = 6; its classes
   and buckets (``sabre.runs``) are what the estimates (``method => 'ak'``) are compared with;
2. ``--samples`` times (default 10): ``ANALYZE`` (default statistics target; each draws a new
   sample of 300 x target rows) and ``sabre_estimate`` at those t.  Per t: how many samples
   give the run's bucket count exactly, and the median and largest relative error of the
   classes (target: within 10%); how often the run's buckets and classes lie within the
   estimate's [min, max] over its resampled frequencies, how often it says unstable, and how
   often it says stable yet misses (a wrong bucket count or classes more than 10% off).
   ``--statistics-target N`` sets the SA column's target
   meanwhile (restored afterwards) to show what a larger sample buys;
3. in a fresh connection, after one ``sabre_selftest()`` (the session's cold start, reported
   apart), ``sabre_estimate`` for t = 0.15, 0.25, 0.35, 0.45 and k = 6 is called
   ``--repeat`` times; the client's wall time of each call is reported (fastest and median),
   with a single-t call, a call with ``options.lookahead = 0`` (the paper's bucketization
   rule) and a call with k beyond the rows (statistics and model only: no plan is computed)
   timed the same way;
4. the partitioning methods ('refine', sabre_anonymize's and sabre_estimate's default, and
   'mondrian') run at the same t: their classes against the estimate's bounds
   [classes_min, classes_max] for that method (it gives no point estimate for them).

Datasets: the census-like table ``public.bench_census_<rows>`` for each size in ``--rows``
(default 100000,1000000; generated like benchmarks/bench_db.py, all 7 QIs, SA salary with
50 values, which fit the statistics target: the MCV list is complete), and Adult
(``--adult DIR``, default ../shared/data/adult beside the project: loaded with ``sabre_pg.arx.load_arx``
when ``public.adult`` is missing; SA occupation with its ARX hierarchy).

    python benchmarks/bench_estimate.py [--dsn CONNINFO] [--rows 100000,1000000] [--adult DIR]
                                        [--repeat 5] [--samples 10] [--timing-only]
                                        [--statistics-target N] [--json out.json] [--study N]
                                        [--calibrate N] [--seeds 1,41]

``--calibrate N`` runs, instead, ``stable``'s calibration (docs/estimate.md): N real ANALYZE
samples per dataset, each sample's pg_stats through the estimate's model, against the table's
own plan; ``--seeds`` makes one census table per size and generator seed (seed 1 is
``bench_census_<rows>``), e.g. the held-out run of the docs:
``--calibrate 25 --rows 200000,300000,1000000,150000 --seeds 41`` (one seed per call).

``--study N`` runs, instead of steps 1-3, the offline study of docs/estimate.md ("The classes
reported"): the table's true SA counts (one GROUP BY), N simple random samples of 300 x the
statistics target rows drawn from them without replacement (MCV frequencies = sample counts /
sample size, as float4), then the estimate's model and the core's plans, without the
database: how often the point plan's and the reported (likeliest) classes are within 10% of
the table's own plan, and how often the bucket count is exact.

``--timing-only`` skips steps 1 and 2 (no anonymization, no re-sampling): step 3 alone, e.g.
on a 10M-row table (``--rows 10000000 --adult ''``); the table's statistics are those of its
last ANALYZE.

Without ``--dsn`` the connection is resolved like the CLI's ($DATABASE_URL, PG*, else the
embedded cluster, started on demand).
"""
from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import psycopg  # noqa: E402
from psycopg import sql  # noqa: E402

import bench_db  # noqa: E402,F401  (puts the repository on sys.path)
from sabre_pg.bench.speed import ensure_table  # noqa: E402
from sabre_pg.arx import load_arx  # noqa: E402
from sabre_pg.census import CENSUS_QIS, CENSUS_SENSITIVE  # noqa: E402
from sabre_pg.connect import resolve_dsn  # noqa: E402
from sabre_pg.core.emd import SADomain  # noqa: E402
from sabre_pg.core.hierarchy import Hierarchy  # noqa: E402
from sabre_pg.core.sabre import plan_counts  # noqa: E402
from shared_data import ADULT  # noqa: E402

TS = [0.15, 0.25, 0.35, 0.45]
K = 6
CLASSES_TARGET = 0.10
ADULT_QIS = ["age", "sex", "race", "marital-status", "education", "native-country", "workclass"]
ADULT_SA = "occupation"


def adult_table(dsn: str, directory: Path, schema: str) -> tuple[str, dict]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        if conn.execute("SELECT to_regclass('public.adult')").fetchone()[0] is None:
            load_arx(conn, directory / "adult.csv", table="adult", sabre_schema=schema)
        names = [r[0] for r in conn.execute(sql.SQL("SELECT name FROM {}.hierarchies WHERE name LIKE 'adult\\_%%'")
                                            .format(sql.Identifier(schema))).fetchall()]
    return "adult", {n[len("adult_"):]: n for n in names}


def call_estimate(conn, schema, table, qis, sa, t, options, k=K, method="ak") -> tuple[list, float]:
    started = time.perf_counter()
    rows = conn.execute(
        sql.SQL("SELECT t, buckets, classes, ec_size, seconds, buckets_min, buckets_max, classes_min, classes_max, "
                "stable, sample_rows FROM {}.sabre_estimate(source => %s::regclass, "
                "quasi_identifiers => %s, sensitive => %s, t => %s, k => %s, options => %s::jsonb, method => %s)")
        .format(sql.Identifier(schema)), (f"public.{table}", qis, sa, t, k, json.dumps(options), method)).fetchall()
    return rows, time.perf_counter() - started


def time_estimate(dsn, schema, table, qis, sa, options, repeat) -> dict:
    with psycopg.connect(dsn, autocommit=True) as conn:
        started = time.perf_counter()
        conn.execute(sql.SQL("SELECT {}.sabre_selftest()").format(sql.Identifier(schema)))
        cold = time.perf_counter() - started
        walls, single, paper, statistics_only = [], [], [], []
        for _ in range(max(1, repeat)):
            rows, wall = call_estimate(conn, schema, table, qis, sa, TS, options)
            walls.append(wall)
            single.append(call_estimate(conn, schema, table, qis, sa, TS[-1], options)[1])
            paper.append(call_estimate(conn, schema, table, qis, sa, TS, dict(options, lookahead=0))[1])
            # k beyond any table: every row is infeasible, so no plan is computed
            statistics_only.append(call_estimate(conn, schema, table, qis, sa, TS, options, 2 ** 31 - 1)[1])
        stats = conn.execute("SELECT array_length(most_common_vals::text::text[], 1), "
                             "histogram_bounds IS NULL FROM pg_stats WHERE tablename = %s AND attname = %s",
                             (table, sa)).fetchone()
    return {"rows": rows, "walls": walls, "single": single, "paper": paper, "statistics_only": statistics_only,
            "cold": cold, "mcv": stats[0],
            "complete": stats[1]}


def actual_runs(dsn, schema, table, qis, sa, options, method="ak") -> list:
    out = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        for t in TS:
            run_id, classes = conn.execute(
                sql.SQL("SELECT run_id, classes FROM {}.sabre_anonymize(source => %s::regclass, "
                        "quasi_identifiers => %s, sensitive => %s, t => %s, k => %s, method => %s, "
                        "options => %s::jsonb)")
                .format(sql.Identifier(schema)), (f"public.{table}", qis, sa, t, K, method,
                                                  json.dumps(options))).fetchone()
            buckets = conn.execute(sql.SQL("SELECT buckets FROM {}.runs WHERE run_id = %s")
                                   .format(sql.Identifier(schema)), (run_id,)).fetchone()[0]
            out.append((t, buckets, classes))
    return out


def method_bounds(dsn, schema, table, qis, sa, options) -> list:
    """The partitioning methods ('refine', the default, and 'mondrian'): per t, the run's
    classes against the estimate's bounds [classes_min, classes_max] (no point estimate)."""
    out = []
    for method in ("refine", "mondrian"):
        runs = actual_runs(dsn, schema, table, qis, sa, options, method)
        with psycopg.connect(dsn, autocommit=True) as conn:
            rows = call_estimate(conn, schema, table, qis, sa, TS, options, method=method)[0]
        for (t, _, classes), r in zip(runs, rows):
            out.append({"method": method, "t": t, "run_classes": classes, "classes_min": r[7], "classes_max": r[8],
                        "within": r[7] <= classes <= r[8], "share_of_max": classes / r[8]})
            print(f"   {method} t {t:.2f}: run {classes:,} classes; bounds [{r[7]:,}, {r[8]:,}] "
                  f"({'holds' if r[7] <= classes <= r[8] else 'VIOLATED'}; the run makes "
                  f"{100 * classes / r[8]:.1f}% of the upper bound)")
    return out


def sample_estimates(dsn, schema, table, qis, sa, options, samples, target) -> list:
    """One sabre_estimate call after each of ``samples`` ANALYZEs (each draws a new sample),
    with the SA column's statistics target set to ``target`` meanwhile (-1: the default)."""
    out = []
    relation = sql.SQL("public.{}").format(sql.Identifier(table))
    set_target = sql.SQL("ALTER TABLE {} ALTER COLUMN {} SET STATISTICS {}")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(set_target.format(relation, sql.Identifier(sa), sql.Literal(target)))
        try:
            for _ in range(max(1, samples)):
                conn.execute(sql.SQL("ANALYZE {}").format(relation))
                out.append(call_estimate(conn, schema, table, qis, sa, TS, options)[0])
        finally:
            conn.execute(set_target.format(relation, sql.Identifier(sa), sql.Literal(-1)))
            conn.execute(sql.SQL("ANALYZE {}").format(relation))
    return out


def compare(name, n, estimated, samples, actual) -> list:
    walls = estimated["walls"]
    print(f"== {name}: {n:,} rows; SA statistics (default target): {estimated['mcv']} most common values, "
          f"{'no histogram (MCV list complete)' if estimated['complete'] else 'and a histogram'}")
    print(f"   sabre_estimate, 4 t: {1000 * min(walls):.1f} ms fastest, {1000 * statistics.median(walls):.1f} ms "
          f"median of {len(walls)}; one t: {1000 * min(estimated['single']):.1f} ms fastest "
          f"(session cold start before them {estimated['cold']:.2f} s)")
    print(f"   of which statistics and model (k beyond the rows: no plan) "
          f"{1000 * min(estimated['statistics_only']):.1f} ms; 4 t with options.lookahead = 0 "
          f"(the paper's bucketization rule) {1000 * min(estimated['paper']):.1f} ms")
    results = []
    for i, (t, real_buckets, real_classes) in enumerate(actual):
        rows = [r[i] for r in samples]
        buckets = [r[1] for r in rows]
        errors = [abs(r[2] - real_classes) / real_classes for r in rows]
        exact = sum(b == real_buckets for b in buckets)
        within = sum(e <= CLASSES_TARGET for e in errors)
        buckets_in = sum(r[5] <= real_buckets <= r[6] for r in rows)
        classes_in = sum(r[7] <= real_classes <= r[8] for r in rows)
        unstable = sum(r[9] is False for r in rows)
        # said stable, yet the bucket count or the classes missed the target
        stable_missed = sum(r[9] is True and (r[1] != real_buckets or e > CLASSES_TARGET) for r, e in zip(rows, errors))
        width = [(r[8] - r[7]) / r[2] for r in rows]
        results.append({"t": t, "actual_buckets": real_buckets, "actual_classes": real_classes,
                        "buckets": buckets, "classes": [r[2] for r in rows], "classes_error": errors,
                        "buckets_range": [[r[5], r[6]] for r in rows], "classes_range": [[r[7], r[8]] for r in rows],
                        "stable": [r[9] for r in rows], "stable_missed": stable_missed,
                        "sample_rows": [r[10] for r in rows]})
        print(f"   t {t:.2f}: run {real_buckets} buckets, {real_classes:,} classes; over {len(samples)} ANALYZE "
              f"samples: buckets exact {exact}/{len(samples)} (predicted {sorted(set(buckets))}), classes error "
              f"median {100 * statistics.median(errors):.1f}% max {100 * max(errors):.1f}%, within 10% "
              f"{within}/{len(samples)}; run within [min, max]: buckets {buckets_in}/{len(samples)}, classes "
              f"{classes_in}/{len(samples)}; unstable {unstable}/{len(samples)} (stable yet missed {stable_missed}); "
              f"classes range width median "
              f"{100 * statistics.median(width):.1f}% of the point")
    return results


def estimate_module():
    """plpython/preflight/estimate.py as the installer ships it (package ``sabre_plpy``), client-side."""
    if "sabre_plpy" not in sys.modules:
        package = type(sys)("sabre_plpy")
        package.__path__ = [str(Path(__file__).resolve().parents[1] / "plpython")]
        installed = type(sys)("sabre_plpy._installed")
        installed.SCHEMA = "sabre"
        sys.modules.update({"sabre_plpy": package, "sabre_plpy._installed": installed})
    return importlib.import_module("sabre_plpy.preflight.estimate")


def true_counts(dsn, schema, table, sa, hierarchy_name) -> tuple:
    """(values, counts, SADomain) of the table's SA: numerical in value order, categorical in
    its hierarchy's leaf order."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        found = dict(conn.execute(sql.SQL("SELECT {0}::text, count(*) FROM public.{1} WHERE {0} IS NOT NULL GROUP BY 1")
                                  .format(sql.Identifier(sa), sql.Identifier(table))).fetchall())
        if hierarchy_name is None:
            values = sorted(found, key=float)
            return values, np.array([found[v] for v in values]), SADomain("numerical", m=len(values))
        paths = [r[0] for r in conn.execute(sql.SQL("SELECT path FROM {}.hierarchy_rows WHERE hierarchy = %s ORDER BY ord")
                                            .format(sql.Identifier(schema)), (hierarchy_name,)).fetchall()]
    hierarchy = Hierarchy(paths, name=hierarchy_name)
    return hierarchy.leaves, np.array([found.get(v, 0) for v in hierarchy.leaves]), \
        SADomain("categorical", hierarchy=hierarchy)


def study(dsn, schema, table, sa, hierarchy_name, samples, sample_rows=300 * 100, seed=1) -> dict:
    """The offline study of one dataset (module docstring): per t, the samples whose point plan
    has the table's bucket count, and whose point and reported classes are within 10%."""
    est = estimate_module()
    values, counts, domain = true_counts(dsn, schema, table, sa, hierarchy_name)
    rows, hierarchy = int(counts.sum()), domain.hierarchy
    attr = argparse.Namespace(name=sa, numerical=hierarchy is None, typname="int4")
    truth = plan_counts([(counts, domain)], TS, K)[0]
    hits = np.zeros((len(TS), 3), dtype=int)          # buckets exact, point classes, reported classes
    rng = np.random.default_rng(seed)
    for _ in range(samples):
        drawn = rng.multivariate_hypergeometric(counts, min(sample_rows, rows))
        seen = drawn > 0
        freqs = (drawn[seen] / min(sample_rows, rows)).astype(np.float32).astype(np.float64)
        stats = est.ColumnStatistics(float(rows), 0.0, float(seen.sum()),
                                     tuple(float(v) if hierarchy is None else v for v, s in zip(values, seen) if s),
                                     tuple(freqs.tolist()), (), sample_rows // 300)
        point = plan_counts([est.sa_counts(stats, rows, attr, hierarchy)], TS, K)[0]
        for i, e in enumerate(est.estimate_all(stats, rows, attr, hierarchy, TS, K, 4)):
            hits[i] += (e.buckets == truth[i].buckets.n_buckets,
                        abs(point[i].classes - truth[i].classes) <= CLASSES_TARGET * truth[i].classes,
                        abs(e.classes - truth[i].classes) <= CLASSES_TARGET * truth[i].classes)
    print(f"== study {table} ({rows:,} rows, {samples} simulated samples of {min(sample_rows, rows):,} rows)")
    for i, t in enumerate(TS):
        print(f"   t {t:.2f}: table's plan {truth[i].buckets.n_buckets} buckets, {truth[i].classes:,} classes; "
              f"buckets exact {hits[i, 0]}/{samples}; classes within 10%: point plan {hits[i, 1]}/{samples}, "
              f"reported (likeliest) {hits[i, 2]}/{samples}")
    return {"table": table, "samples": samples, "hits": hits.tolist()}


def seeded_table(dsn, rows, seed, schema) -> tuple[str, dict]:
    """The census table of ``rows`` rows from generator seed ``seed`` (``cal_census_<rows>_<seed>``;
    ``bench_census_<rows>`` is seed 1), generated when missing."""
    from sabre_pg.census import CENSUS_CATEGORICAL
    from sabre_pg.census_sql import generate_census
    table = f"cal_census_{rows}_{seed}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        if conn.execute("SELECT to_regclass(%s)", (f"public.{table}",)).fetchone()[0] is None:
            return table, generate_census(conn, table=table, rows=rows, seed=seed, replace=True,
                                          sabre_schema=schema)["hierarchies"]
    return table, {c: f"{table}_{c}" for c in CENSUS_CATEGORICAL}


def calibrate(dsn, schema, table, sa, hierarchy_name, samples, target=-1) -> dict:
    """``stable``'s calibration on one table (docs/estimate.md, "stable, calibrated"):
    ``samples`` real ANALYZEs (the SA column's statistics target ``target`` meanwhile), after
    each the SA's pg_stats row through the estimate's model offline (``estimate_all``, the code
    sabre_estimate runs), against the table's own plan (its true counts: the run's classes).
    Per t: estimates said stable, and those more than 10% off."""
    est = estimate_module()
    values, counts, domain = true_counts(dsn, schema, table, sa, hierarchy_name)
    truth = plan_counts([(counts, domain)], TS, K)[0]
    numerical = domain.hierarchy is None
    attr = argparse.Namespace(name=sa, numerical=numerical, typname="int4")
    relation = sql.SQL("public.{}").format(sql.Identifier(table))
    set_target = sql.SQL("ALTER TABLE {} ALTER COLUMN {} SET STATISTICS {}")
    said, wrong = np.zeros(len(TS), dtype=int), np.zeros(len(TS), dtype=int)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(set_target.format(relation, sql.Identifier(sa), sql.Literal(target)))
        try:
            for _ in range(samples):
                conn.execute(sql.SQL("ANALYZE {} ({})").format(relation, sql.Identifier(sa)))
                nf, nd, mcv, freqs, hist, target_used, reltuples = conn.execute(
                    "SELECT s.null_frac, s.n_distinct, s.most_common_vals::text::text[], s.most_common_freqs, "
                    "s.histogram_bounds::text::text[], COALESCE(NULLIF(a.attstattarget, -1), "
                    "current_setting('default_statistics_target')::int), c.reltuples FROM pg_stats s "
                    "JOIN pg_class c ON c.relname = s.tablename JOIN pg_attribute a ON a.attrelid = c.oid "
                    "AND a.attname = s.attname WHERE s.schemaname = 'public' AND s.tablename = %s "
                    "AND s.attname = %s", (table, sa)).fetchone()
                cast = float if numerical else str
                stats = est.ColumnStatistics(float(reltuples), nf, nd, tuple(map(cast, mcv or ())), tuple(freqs or ()),
                                             tuple(map(cast, hist or ())), int(target_used))
                rows = int(round(reltuples * (1 - nf)))
                for i, e in enumerate(est.estimate_all(stats, rows, attr, domain.hierarchy, TS, K, 4)):
                    if e.spread.stable:
                        said[i] += 1
                        wrong[i] += abs(e.classes - truth[i].classes) > CLASSES_TARGET * truth[i].classes
        finally:
            conn.execute(set_target.format(relation, sql.Identifier(sa), sql.Literal(-1)))
            conn.execute(sql.SQL("ANALYZE {}").format(relation))
    print(f"== calibration {table} ({int(counts.sum()):,} rows, {samples} ANALYZE samples, target {target}): "
          f"stable {said.sum()}/{samples * len(TS)}, wrong when stable {wrong.sum()} "
          f"({100 * wrong.sum() / max(said.sum(), 1):.1f}%); per t " +
          ", ".join(f"{t:.2f}: {w}/{s}" for t, s, w in zip(TS, said, wrong)))
    return {"table": table, "samples": samples, "target": target, "stable": said.tolist(), "wrong": wrong.tolist()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", help="conninfo or URL (default: $DATABASE_URL, PG*, else the embedded cluster)")
    parser.add_argument("--schema", default="sabre", help="schema sabre-pg is installed in (default: sabre)")
    parser.add_argument("--rows", default="100000,1000000", help="census sizes (default: 100000,1000000)")
    parser.add_argument("--adult", default=str(ADULT), help="Adult's ARX folder ('' skips it)")
    parser.add_argument("--repeat", type=int, default=5, help="timed sabre_estimate calls per dataset")
    parser.add_argument("--samples", type=int, default=10, help="ANALYZE samples the accuracy is measured on")
    parser.add_argument("--statistics-target", type=int, default=-1,
                        help="the SA column's statistics target while sampling (default -1: the server's; "
                             "ANALYZE samples 300 x target rows); restored afterwards")
    parser.add_argument("--timing-only", action="store_true",
                        help="time sabre_estimate only: no sabre_anonymize runs and no ANALYZE samples "
                             "(for tables too large to anonymize here, e.g. --rows 10000000 --adult '')")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--study", type=int, default=0, metavar="N",
                        help="instead: the offline study with N simulated ANALYZE samples per dataset (no runs)")
    parser.add_argument("--calibrate", type=int, default=0, metavar="N",
                        help="instead: stable's calibration, N real ANALYZE samples per dataset (Adult at target "
                             "20, where the default target's sample is the whole table)")
    parser.add_argument("--seeds", default="1", help="census generator seeds, one table per size and seed (default 1)")
    options = parser.parse_args(argv)
    dsn = resolve_dsn(argparse.Namespace(dsn=options.dsn, sabre_schema=options.schema))
    datasets = []
    for rows in [int(x.replace("_", "")) for x in options.rows.split(",") if x.strip()]:
        for seed in [int(x) for x in options.seeds.split(",") if x.strip()]:
            table, hierarchies = ensure_table(dsn, rows, options.schema, False)[:2] if seed == 1 else \
                seeded_table(dsn, rows, seed, options.schema)
            datasets.append((table, CENSUS_QIS, CENSUS_SENSITIVE, {"hierarchies": hierarchies}))
    if options.adult:
        table, hierarchies = adult_table(dsn, Path(options.adult), options.schema)
        used = {c: h for c, h in hierarchies.items() if c in ADULT_QIS + [ADULT_SA]}
        datasets.append((table, ADULT_QIS, ADULT_SA, {"hierarchies": used}))
    report = []
    if options.calibrate:
        for table, _, sa, opts in datasets:
            report.append(calibrate(dsn, options.schema, table, sa, opts["hierarchies"].get(sa), options.calibrate,
                                    20 if table == "adult" else -1))
        datasets = []
    if options.study:
        report = [study(dsn, options.schema, table, sa, opts["hierarchies"].get(sa), options.study)
                  for table, _, sa, opts in datasets]
        datasets = []
    for table, qis, sa, opts in datasets:
        with psycopg.connect(dsn, autocommit=True) as conn:
            n = conn.execute(sql.SQL("SELECT count(*) FROM public.{}").format(sql.Identifier(table))).fetchone()[0]
        actual = [] if options.timing_only else actual_runs(dsn, options.schema, table, qis, sa, opts)
        samples = [] if options.timing_only else sample_estimates(
            dsn, options.schema, table, qis, sa, opts, options.samples, options.statistics_target)
        estimated = time_estimate(dsn, options.schema, table, qis, sa, opts, options.repeat)
        report.append({"table": table, "rows": n, "estimate_ms": [1000 * w for w in estimated["walls"]],
                       "single_t_ms": [1000 * w for w in estimated["single"]],
                       "statistics_only_ms": [1000 * w for w in estimated["statistics_only"]],
                       "lookahead_0_ms": [1000 * w for w in estimated["paper"]],
                       "per_t": compare(table, n, estimated, samples, actual),
                       "partitioning": [] if options.timing_only else method_bounds(
                           dsn, options.schema, table, qis, sa, opts)})
    if options.json:
        Path(options.json).write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {options.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
