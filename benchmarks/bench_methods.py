"""SABRE-AK, SABRE-KNN, t-Mondrian and 'refine' side by side, in the core (no database).

Every run is checked by the exact EMD (``exact_emd.domain_class_emds``) and reports AIL (ours,
(L-1)/(N-1)), the paper's AIL (L/N), real closeness, classes, seconds and violations.
The t sweep is t in {0.15, 0.25, 0.35} by k in {2, 6, 10, 20}.

  python benchmarks/bench_methods.py adult              # Adult, occupation SA, t = 0.2, k = 5
  python benchmarks/bench_methods.py census --rows 100000 [--flat]
  python benchmarks/bench_methods.py speed --rows 1000000   # AK vs refine time
  --methods ak,knn,mondrian,refine,refine-w,refine-t,refine-0,refine-r,partition-first[-256|-4096]
      # refine-w: emd_weight 0.2; refine-t: search 'thorough' (4 merge passes at any size);
      # refine-0: the cut search alone (no rescue, no merge passes: 'refine' before them);
      # refine-r: the cut search and the stratified rescue (no merge passes);
      # partition-first: t-Mondrian parts of >= 1024 (256, 4096) rows, SABRE-AK inside

Seconds are wall time and, in brackets, the process's CPU time (the machine is shared).
'refine' runs in ``--threads`` threads (default 1, the server's default).

Adult is read from ``$SABRE_DATA`` (default: ../shared/data beside the project)/adult with its ARX hierarchies.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sabre_pg.core.emd import SADomain  # noqa: E402
from sabre_pg.core import metrics  # noqa: E402
from sabre_pg.core.exact_emd import domain_class_emds  # noqa: E402
from sabre_pg.core.generalize import ECIndex  # noqa: E402
from sabre_pg.core.hierarchy import Hierarchy  # noqa: E402
from sabre_pg.core.partition_first import partition_first  # noqa: E402
from sabre_pg.core.refine import refine  # noqa: E402
from sabre_pg.core.sabre import anonymize, generalize_classes  # noqa: E402
from sabre_pg.synthetic import adult, census  # noqa: E402
from shared_data import SHARED_DATA  # noqa: E402

LABEL = {"ak": "SABRE-AK", "knn": "SABRE-KNN", "mondrian": "t-Mondrian", "refine": "refine",
         "refine-w": "refine, emd_weight 0.2", "refine-t": "refine, search thorough",
         "refine-0": "refine, search only", "refine-r": "refine, search + rescue",
         "partition-first": "partition first, parts >= 1024",
         "partition-first-256": "partition first, parts >= 256",
         "partition-first-4096": "partition first, parts >= 4096"}
# core-only variants of 'refine': keyword arguments of core.refine.refine
VARIANTS = {"refine-t": {"search": "thorough"}, "refine-0": {"rescue": False, "merges": 0},
            "refine-r": {"merges": 0}}
EMD_WEIGHT = 0.2         # 'refine-w': refine's cut search with this EMD weight (core only)


def flat(domain: SADomain) -> SADomain:
    return SADomain("categorical", hierarchy=Hierarchy.flat(["s%05d" % i for i in range(domain.m)]))


def run(qis, codes, domain, t, k, method, threads=1) -> dict:
    tic, cpu = time.perf_counter(), time.process_time()
    if method == "refine-w":
        ec = refine(qis, codes, domain, t, k, emd_weight=EMD_WEIGHT, threads=threads)
    elif method in VARIANTS:
        ec = refine(qis, codes, domain, t, k, threads=threads, **VARIANTS[method])
    elif method.startswith("partition-first"):
        ec = partition_first(qis, codes, domain, t, k, int(method[16:] or 1024))
    else:
        ec = anonymize(qis, codes, domain, t, k, method=method, with_emds=False, threads=threads).ec
    seconds, cpu = time.perf_counter() - tic, time.process_time() - cpu
    index = ECIndex(ec)
    _, il, il_paper = generalize_classes(qis, index, paper=True)
    exact = domain_class_emds(ec, codes, np.ones(len(codes), dtype=np.int64), domain)
    return {"method": method, "t": t, "k": k, "ail": metrics.ail(il, index.sizes),
            "ail_paper": metrics.ail(il_paper, index.sizes), "closeness": exact.max_emd,
            "classes": index.n_classes, "seconds": seconds, "cpu": cpu,
            "violations": exact.violations(t, k)}


def table(records, title) -> str:
    lines = ["### " + title, "", "| t | k | method | AIL | AIL (paper L/N) | real closeness | classes | s (CPU s) "
             "| violations |", "|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        lines.append("| %g | %d | %s | %.3f | %.3f | %.3f | %d | %.2f (%.2f) | %d |" % (
            r["t"], r["k"], LABEL[r["method"]], r["ail"], r["ail_paper"], r["closeness"], r["classes"],
            r["seconds"], r["cpu"], r["violations"]))
    return "\n".join(lines)


def versus_mondrian(records, method="refine") -> str:
    """``method``'s AIL against t-Mondrian's per configuration."""
    by = {(r["t"], r["k"], r["method"]): r["ail"] for r in records}
    gains = [(t, k, 1 - by[(t, k, method)] / by[(t, k, "mondrian")])
             for (t, k, m) in by if m == method and (t, k, "mondrian") in by]
    ten = sum(g >= 0.10 for _, _, g in gains)
    worse = sum(g < 0 for _, _, g in gains)
    return ("%s vs t-Mondrian: AIL lower by %s; >= 10%% lower in %d of %d; higher in %d"
            % (LABEL[method], ", ".join("%.1f%% (t=%g,k=%d)" % (100 * g, t, k) for t, k, g in gains),
               ten, len(gains), worse))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data", choices=["adult", "census", "speed"])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--flat", action="store_true", help="census: salary as a flat categorical SA")
    ap.add_argument("--methods", default=None, help="default: ak,knn,mondrian,refine (speed: ak,refine)")
    ap.add_argument("--threads", type=int, default=1,
                    help="threads of 'refine' (default 1, the server's default)")
    a = ap.parse_args(argv)
    methods = (a.methods or ("ak,refine" if a.data == "speed" else "ak,knn,mondrian,refine")).split(",")
    if a.data == "adult":
        qis, codes, dom = adult(SHARED_DATA / "adult")
        configs, title = [(0.2, 5)], "Adult, occupation (hierarchical SA), 8 QIs"
    else:
        qis, codes, dom = census(a.rows, seed=1)
        if a.flat:
            dom = flat(dom)
        configs = [(t, k) for t in (0.15, 0.25, 0.35) for k in (2, 6, 10, 20)]
        title = "census-like, %d rows, salary %s SA" % (a.rows, "flat" if a.flat else "numerical")
        if a.data == "speed":
            configs = [(0.35, 6)]
            methods = [m for m in methods if m in ("ak", "mondrian") or m.startswith("refine")
                       or m.startswith("partition-first")] or ["ak", "refine"]
    records = [run(qis, codes, dom, t, k, m, a.threads) for t, k in configs for m in methods]
    print(table(records, title + ("; refine in %d threads" % a.threads)))
    for m in methods:
        if m not in ("ak", "knn", "mondrian") and "mondrian" in methods:
            print("\n" + versus_mondrian(records, m))
    return 0


if __name__ == "__main__":
    sys.exit(main())
