#!/usr/bin/env python3
"""Core-only SABRE benchmark (no database): the engine on census-like numpy data.

Configurations (each in a fresh subprocess, so peak RSS figures do not mix):

* ``ak-sweep``   SABRE-AK, default takeout (seeds in Hilbert order), ``--rows`` tuples
* ``ak-random``  SABRE-AK, the paper's random seeds (``takeout='random'``), ``--rows`` tuples
* ``knn``        SABRE-KNN, ``--knn-rows`` tuples
* ``refine``     the default method (t-Mondrian with a searched cut, :mod:`sabre_pg.core.refine`),
                 each of ``--refine-rows`` (default 1M and 3M tuples); its ``refine`` phase is
                 the core (issue 26: the core's speed, docs/evaluation.md "Speed of the core")

Data: ``sabre_pg.synthetic.census(n)``: 7 QIs (age, sex, education, marital, race,
workclass, birthplace), numerical SA salary with 50 values; t = 0.35, k = 6.

Per configuration it prints the per-phase seconds of ``sabre_pg.core.sabre.anonymize``
(bucketize, redistribute, hilbert, takeout, generalize, metrics, total) of the fastest of
``--repeat`` runs, AIL, classes, max EMD, and memory from ``getrusage(RUSAGE_SELF).ru_maxrss``:
``rss_data`` after the data is generated, ``rss_peak`` after the runs (MB).

    python benchmarks/bench_core.py [--rows 1000000] [--knn-rows 100000] [--repeat 1]
                                    [--refine-rows 1000000,3000000]
                                    [--t 0.35] [-k 6] [--only ak-sweep,knn] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_DIR))

from sabre_pg.core.stopwatch import ENGINE_PHASES  # noqa: E402

PHASES = ENGINE_PHASES + ("total",)
CONFIGS = {
    "ak-sweep": {"method": "ak", "takeout": "sweep", "rows_flag": "rows"},
    "ak-random": {"method": "ak", "takeout": "random", "rows_flag": "rows"},
    "knn": {"method": "knn", "takeout": "sweep", "rows_flag": "knn_rows"},
    "refine": {"method": "refine", "takeout": "sweep", "rows_flag": "refine_rows"},
}


def _maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0   # KiB on Linux


def worker(spec: dict) -> dict:
    """Run one configuration in this process; returns the result dict."""
    sys.path.insert(0, str(REPO_DIR))
    from sabre_pg import synthetic
    from sabre_pg.core.sabre import anonymize

    rss_start = _maxrss_mb()
    t0 = time.perf_counter()
    qis, codes, domain = synthetic.census(spec["rows"], seed=spec["seed"])
    gen_seconds = time.perf_counter() - t0
    rss_data = _maxrss_mb()
    runs = []
    for _ in range(spec["repeat"]):
        cpu = time.process_time()
        res = anonymize(qis, codes, domain, spec["t"], spec["k"], method=spec["method"],
                        takeout=spec["takeout"], seed=spec["seed"])
        cpu = time.process_time() - cpu
        s = res.metrics()
        runs.append({"phases": dict(res.phases), "cpu_seconds": cpu, "ail": s["ail"], "classes": s["classes"],
                     "max_emd": s["max_emd"], "min_class_size": s["min_class_size"],
                     "max_class_size": s["max_class_size"], "buckets": s["buckets"]})
        del res
    best = min(runs, key=lambda r: r["phases"]["total"])
    return {**spec, "sa_values": int(domain.m), "gen_seconds": gen_seconds,
            "rss_start_mb": rss_start, "rss_data_mb": rss_data, "rss_peak_mb": _maxrss_mb(),
            "totals": [r["phases"]["total"] for r in runs], "load": os.getloadavg()[0], **best}


def run_config(name: str, spec: dict) -> dict:
    """One configuration in a fresh interpreter."""
    proc = subprocess.run([sys.executable, __file__, "--_worker", json.dumps(spec)],
                          capture_output=True, text=True, cwd=REPO_DIR)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["config"] = name
    return out


def report(r: dict) -> str:
    ph = r["phases"]
    lines = [
        f"== {r['config']}: "
        + ("refine (the default method)" if r["method"] == "refine" else f"SABRE-{r['method'].upper()}")
        + (f" takeout={r['takeout']}" if r["method"] == "ak" else "")
        + f", {r['rows']:,} tuples, 7 QIs, {r['sa_values']} SA values, t = {r['t']}, k = {r['k']}",
        "   phases (s)  " + "  ".join(f"{p} {ph[p]:.3f}" for p in PHASES if p in ph)
        + f"   CPU {r['cpu_seconds']:.3f} s   load {r['load']:.1f}",
        f"   AIL {r['ail']:.4f}   classes {r['classes']:,} (sizes {r['min_class_size']}..{r['max_class_size']},"
        f" {r['buckets']} buckets)   max EMD {r['max_emd']:.4f}",
        f"   RSS MB: start {r['rss_start_mb']:.0f}, after data {r['rss_data_mb']:.0f}, "
        f"peak {r['rss_peak_mb']:.0f} (peak - data {r['rss_peak_mb'] - r['rss_data_mb']:.0f})"
        f"   data gen {r['gen_seconds']:.2f} s",
    ]
    if len(r["totals"]) > 1:
        lines.append("   totals of the repeats (s): " + ", ".join(f"{x:.3f}" for x in r["totals"])
                     + "  (phases shown: the fastest)")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000, help="tuples for SABRE-AK (default 1000000)")
    p.add_argument("--knn-rows", type=int, default=100_000, help="tuples for SABRE-KNN (default 100000)")
    p.add_argument("--refine-rows", default="1000000,3000000",
                   help="comma-separated tuple counts for the default method (default 1000000,3000000)")
    p.add_argument("--repeat", type=int, default=1, help="runs per configuration; the fastest is shown")
    p.add_argument("--t", type=float, default=0.35)
    p.add_argument("-k", type=int, default=6)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", default=",".join(CONFIGS), help="comma-separated subset of " + ", ".join(CONFIGS))
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--_worker", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a._worker:
        print(json.dumps(worker(json.loads(a._worker))))
        return 0

    names = [n.strip() for n in a.only.split(",") if n.strip()]
    bad = [n for n in names if n not in CONFIGS]
    if bad:
        p.error(f"unknown configuration(s) {', '.join(bad)}; choose from {', '.join(CONFIGS)}")
    import numpy
    print(f"sabre-pg core benchmark: python {sys.version.split()[0]}, numpy {numpy.__version__}, "
          f"{os.cpu_count()} CPUs, repeat {a.repeat}")
    results = []
    for name in names:
        c = CONFIGS[name]
        rows = getattr(a, c["rows_flag"])
        for n in ([int(x) for x in rows.split(",") if x.strip()] if isinstance(rows, str) else [rows]):
            spec = {"method": c["method"], "takeout": c["takeout"], "rows": n,
                    "t": a.t, "k": a.k, "seed": a.seed, "repeat": max(1, a.repeat)}
            r = run_config(name, spec)
            print(report(r), flush=True)
            results.append(r)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
