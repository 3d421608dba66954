"""Several sensitive attributes: the study that chose the method (docs/multiple-sa.md) and the
speed of the SQL overload.

``study`` (core, numpy, no database): on the census-like data with a second numerical SA
``hours`` (correlated with salary and age; ``sabre_pg.census.HOURS_*``) and on Adult with
occupation and education (both hierarchical), for each t vector: AIL, classes and time of

* ``fragments``  -- joint bucketization (the thesis's fragments, generalized; core.fragments),
* ``merge``      -- SABRE §7: SABRE on the most constraining SA, then neighbour merges,
* ``auto``       -- ``merge``, the fragments where merging collapsed (SABRE-AK's strategies),
* ``refine``     -- the SQL array form's default: the cut search checking every SA
  (core.multi_refine),
* ``single:<sa>`` -- the default method on each SA alone (its t), which need not hold for the
  other SAs,
* ``mondrian``   -- the product's t-Mondrian with every SA checked (core.mondrian.joint_mondrian), a cut kept only
  if both halves keep >= k rows and are t_i-close on every SA (``sabre_pg.bench.multi_sa``,
  shared with ``sabre-pg bench --multi-sa``, which runs this comparison in the database),

and every multi-SA result checked on every SA by emd.py (``violations``).  The cost of the
second SA is the AIL above the worse single-SA run.

``db`` (needs a server): sabre_anonymize with two SAs against each SA alone on the census
table with ``hours``, at each size; the target is two SAs <= 1.5 x the single-SA time.

    python benchmarks/bench_multi_sa.py study [--rows 100000] [--adult DIR]
    python benchmarks/bench_multi_sa.py db [--dsn CONNINFO] [--rows 100000,1000000]
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))      # this checkout's sabre_pg

from sabre_pg import census as domain  # noqa: E402
from sabre_pg.bench import multi_sa as bench  # noqa: E402
from sabre_pg.core import metrics  # noqa: E402
from sabre_pg.core.emd import SADomain  # noqa: E402
from sabre_pg.core.hierarchy import Hierarchy, parse_arx  # noqa: E402
from sabre_pg.core.multi_sa import anonymize_multi  # noqa: E402
from sabre_pg.core.sabre import QuasiIdentifier, anonymize, encode_numerical  # noqa: E402
from sabre_pg.synthetic import census  # noqa: E402
from shared_data import ADULT  # noqa: E402

K = 5


# ---------------------------------------------------------------------------- data
def census_hours(salary_values, age, seed=7):
    """The census's hours worked (sabre_pg.census.HOURS_*), in numpy."""
    rng = np.random.default_rng(seed)
    u1, u2 = rng.random(len(age)), rng.random(len(age))
    value = (domain.HOURS_BASE + domain.HOURS_PER_SALARY * salary_values
             + domain.HOURS_PER_AGE * np.maximum(age - 50, 0) + domain.HOURS_NOISE * (u1 + u2 - 1))
    return np.clip(np.rint(value), domain.HOURS_MIN, domain.HOURS_MAX)


def census_data(n):
    qis, salary, salary_domain = census(n, seed=1)
    age = qis[domain.CENSUS_QIS.index("age")].values
    hours, distinct = encode_numerical(census_hours(salary + domain.SALARY_MIN, age))
    return qis, np.column_stack([salary, hours]), [salary_domain, SADomain("numerical", m=len(distinct))], \
        ["salary", "hours"]


def adult_data(directory: Path):
    with open(directory / "adult.csv", newline="") as f:
        rows = list(csv.reader(f, delimiter=";"))
    header, rows = rows[0], rows[1:]
    column = {name: [r[i] for r in rows] for i, name in enumerate(header)}
    h = {name: Hierarchy(parse_arx((directory / ("adult_hierarchy_%s.csv" % name)).read_text()), name=name)
         for name in ("sex", "race", "marital-status", "native-country", "occupation", "education")}
    workclass = sorted(set(column["workclass"]))
    h["workclass"] = Hierarchy.flat(workclass, name="workclass")
    qis = [QuasiIdentifier("age", np.array(column["age"], dtype=np.float64))]
    for name in ("sex", "race", "marital-status", "native-country", "workclass"):
        qis.append(QuasiIdentifier(name, np.array([h[name].leaf_pos[v] for v in column[name]]), h[name]))
    codes = np.column_stack([[h[sa].leaf_pos[v] for v in column[sa]] for sa in ("occupation", "education")])
    domains = [SADomain("categorical", hierarchy=h["occupation"]), SADomain("categorical", hierarchy=h["education"])]
    return qis, codes.astype(np.int64), domains, ["occupation", "education"]


# ---------------------------------------------------------------------------- study
def record(name, tic, ec, il, sizes, codes, domains, ts):
    return bench.measure(name, time.perf_counter() - tic, ec, metrics.ail(il, sizes), codes, domains, ts)


def study(data, t_vectors):
    qis, codes, domains, names = data
    out = []
    for ts in t_vectors:
        rows = []
        for strategy in ("fragments", "merge", "auto", "refine"):
            tic = time.perf_counter()
            if strategy == "refine":         # the array form's default method
                r = anonymize_multi(qis, codes, domains, ts, K, method="refine")
            else:
                r = anonymize_multi(qis, codes, domains, ts, K, strategy=strategy)
            rows.append(record(strategy, tic, r.ec, r.il, r.sizes, codes, domains, ts))
        for i, name in enumerate(names):
            tic = time.perf_counter()
            r = anonymize(qis, codes[:, i], domains[i], ts[i], K, method="refine", with_emds=False)
            rows.append(record("single:" + name, tic, r.ec, r.il, r.sizes, codes, domains, ts))
        tic = time.perf_counter()
        ec, index, il = bench.mondrian(qis, codes, domains, ts, K)
        rows.append(record(bench.REFERENCE, tic, ec, il, index.sizes, codes, domains, ts))
        out += bench.add_cost_of_second_sa(rows)
    return out


# ---------------------------------------------------------------------------- db
def db(dsn, sizes, t=(0.2, 0.2), repeat=1):
    import psycopg

    out = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET search_path = public, sabre")
        for n in sizes:
            data = bench.create_census_hours(conn, "census_hours", n)
            qis = data["qis"]
            options = json.dumps({"hierarchies": data["hierarchies"]})
            calls = [("single:salary", "'salary'", "%g" % t[0]), ("single:hours", "'hours'", "%g" % t[1]),
                     ("salary+hours", "ARRAY['salary','hours']", "ARRAY[%g,%g]" % t)]
            for name, sensitive, ts in [c for r in range(repeat) for c in calls[r % 3:] + calls[:r % 3]]:
                row = conn.execute("SELECT classes, max_emd, ail, seconds, run_id FROM sabre_anonymize("
                                   "'public.census_hours'::regclass, %%s, %s, %s, %d, options => %%s::jsonb)"
                                   % (sensitive, ts, K), (qis, options)).fetchone()
                phases = conn.execute("SELECT phases FROM sabre.runs WHERE run_id = %s", (row[4],)).fetchone()[0]
                out.append({"rows": n, "run": name, "classes": row[0], "max_emd": row[1], "ail": round(row[2], 4),
                            "seconds": round(row[3], 2), "phases": phases})
                print(json.dumps(out[-1]), file=sys.stderr)
    return out


def db_markdown(rows):
    lines = ["| rows | run | classes | AIL | seconds (median) | all runs | max EMD |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append("| %d | %s | %d | %.4f | %.2f | %s | %s |" % (
            r["rows"], r["run"], r["classes"], r["ail"], r["seconds"], ", ".join("%.2f" % v for v in r["all"]),
            r["max_emd"]))
    return "\n".join(lines)


def medians(rows):
    """One row per (rows, run): the median seconds of its repeats (the rest from the first)."""
    out = {}
    for r in rows:
        out.setdefault((r["rows"], r["run"]), dict(r, all=[]))["all"].append(r["seconds"])
    for r in out.values():
        r["seconds"] = float(np.median(r["all"]))
    return list(out.values())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=("study", "db"))
    parser.add_argument("--rows", default="100000")
    parser.add_argument("--adult", default=str(ADULT), help="Adult's ARX folder ('' skips it)")
    parser.add_argument("--dsn", default=None)
    parser.add_argument("--repeat", type=int, default=3, help="db: runs of each call, interleaved (median)")
    options = parser.parse_args(argv)
    sizes = [int(s) for s in options.rows.split(",")]
    if options.what == "db":
        from sabre_pg.connect import resolve_dsn
        print(db_markdown(medians(db(resolve_dsn(options), sizes, repeat=options.repeat))))
        return 0
    print(bench.markdown("census-like, %d rows, SAs salary + hours (numerical), k = %d" % (sizes[0], K),
                   study(census_data(sizes[0]), [(0.1, 0.1), (0.2, 0.15), (0.3, 0.3)])))
    if options.adult:
        print()
        print(bench.markdown("Adult, SAs occupation + education (hierarchical), k = %d" % K,
                       study(adult_data(Path(options.adult)), [(0.1, 0.1), (0.2, 0.2), (0.3, 0.2)])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
