#!/usr/bin/env python3
"""Whether ``refine`` (the default method's core) still makes the classes of the code before
the core's speed work (issue 26): the hash of the class id of every row (sha256 of the int64
array, first 16 hex digits) on census-like data (``synthetic.census(n, seed=1)``, t = 0.35,
k = 6), against the hashes recorded from that code (main at 3d281cd).  Also prints the
seconds (wall and CPU) and the AIL.  tests/core/test_refine_identity.py pins Adult and 100k;
1M and 3M take too long for the tests.

    python benchmarks/refine_identity.py [--rows 1000000] [--threads 1]
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sabre_pg import synthetic  # noqa: E402
from sabre_pg.core import metrics  # noqa: E402
from sabre_pg.core.generalize import ECIndex  # noqa: E402
from sabre_pg.core.refine import refine  # noqa: E402
from sabre_pg.core.sabre import generalize_classes  # noqa: E402

RECORDED = {(100_000, 1): "f2d985f9b91be510", (100_000, 2): "af53ee48731abe66",
            (1_000_000, 1): "6435096c3f683566"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    qis, codes, dom = synthetic.census(a.rows, seed=1)
    wall, cpu = time.perf_counter(), time.process_time()
    ec = refine(qis, codes, dom, 0.35, 6, threads=a.threads)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    index = ECIndex(ec)
    il = generalize_classes(qis, index)[1]
    digest = hashlib.sha256(np.ascontiguousarray(ec, dtype=np.int64).tobytes()).hexdigest()[:16]
    want = RECORDED.get((a.rows, a.threads))
    print("census %d rows, %d thread(s): %.2f s (CPU %.2f s, load %.1f), AIL %.5f, %d classes, hash %s: %s"
          % (a.rows, a.threads, wall, cpu, os.getloadavg()[0], metrics.ail(il, index.sizes), index.n_classes,
             digest, "no recorded hash" if want is None else "identical" if digest == want else "DIFFERENT"))
    return 0 if want in (None, digest) else 1


if __name__ == "__main__":
    sys.exit(main())
