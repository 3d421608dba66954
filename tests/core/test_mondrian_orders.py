"""t-Mondrian's rounds on kept per-QI orders (:func:`sabre_pg.core.mondrian.split_all`) give the
classes, ids included, of the sort-based rounds they replaced (one sort of the live rows per
round, :func:`sabre_pg.core.mondrian.cut_round`), on random tables of every shape: numerical and
categorical QIs, ties, several SAs, a starting partition, the compiled split forced."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from sabre_pg import synthetic
from sabre_pg.core import kernels
from sabre_pg.core.emd import SADomain
from sabre_pg.core.hierarchy import Hierarchy
from sabre_pg.core.mondrian import Partitioner, _compact, joint_mondrian, mondrian
from tests.core.mondrian_reference import sorted_rounds

REPO = Path(__file__).resolve().parents[2]
SERVER_PYTHON = "/usr/bin/python3"
from sabre_pg.core.sabre import QuasiIdentifier


def random_table(rng, n):
    qis = []
    hierarchies = synthetic.census_hierarchies()
    for j in range(int(rng.integers(1, 6))):
        kind = rng.integers(0, 3)
        if kind == 0:       # integers with many ties
            qis.append(QuasiIdentifier("i%d" % j, rng.integers(0, int(rng.integers(1, 60)), n).astype(np.float64)))
        elif kind == 1:     # continuous
            qis.append(QuasiIdentifier("f%d" % j, rng.normal(0, 1, n)))
        else:               # categorical, leaf positions of a hierarchy
            h = hierarchies["birthplace"]
            qis.append(QuasiIdentifier("c%d" % j, rng.integers(0, h.n_leaves, n), h))
    return qis


def codes_of(rng, n):
    m = int(rng.integers(1, 12))
    _, codes = np.unique(rng.integers(0, m, n), return_inverse=True)
    return codes.reshape(-1), SADomain("numerical", m=int(codes.max()) + 1)


@pytest.mark.parametrize("seed", range(6))
def test_kept_orders_give_the_sorted_rounds_classes(seed):
    rng = np.random.default_rng(seed)
    for _ in range(25):
        n = int(rng.integers(1, 2500))
        qis = random_table(rng, n)
        codes, dom = codes_of(rng, n)
        if rng.random() < 0.3:      # equal distance, or a 2-level hierarchy
            leaves = [["s%d" % i, "g%d" % (i // 3), "*"] for i in range(dom.m)]
            dom = SADomain("categorical", hierarchy=Hierarchy.flat(["s%d" % i for i in range(dom.m)])
                           if rng.random() < 0.5 else Hierarchy(leaves))
        t, k = float(rng.uniform(0.02, 0.6)), int(rng.integers(1, 15))
        part = rng.integers(0, int(rng.integers(1, 5)), n) if rng.random() < 0.3 else None
        want = sorted_rounds(Partitioner(qis, codes, dom, t, k),
                             np.zeros(n, dtype=np.int64) if part is None else _compact(part))
        assert np.array_equal(mondrian(qis, codes, dom, t, k, part=part), want)


def test_several_sas_give_the_sorted_rounds_classes():
    rng = np.random.default_rng(11)
    for _ in range(15):
        n = int(rng.integers(50, 2000))
        qis = random_table(rng, n)
        (a, da), (b, db) = codes_of(rng, n), codes_of(rng, n)
        ts, k = [float(rng.uniform(0.1, 0.5)), float(rng.uniform(0.1, 0.5))], int(rng.integers(1, 8))
        p = Partitioner(qis, a, da, ts[0], k)
        p.add_sa(b, db, ts[1])
        want = sorted_rounds(p, np.zeros(n, dtype=np.int64))
        assert np.array_equal(joint_mondrian(qis, np.stack((a, b), axis=1), [da, db], ts, k), want)


def test_the_compiled_split_gives_the_same_classes():
    """The compiled split (numba, on tables of kernels.MIN_ROWS rows or more), forced on a small
    table in the server's Python (Debian's python3-numba; the project's .venv has none): the
    same classes as the sort-based rounds."""
    if subprocess.run([SERVER_PYTHON, "-c", "import numba"], capture_output=True).returncode:
        pytest.skip("numba is not importable by %s: only the numpy split is tested" % SERVER_PYTHON)
    script = """
import numpy as np
from sabre_pg import synthetic
from sabre_pg.core import kernels
from sabre_pg.core.mondrian import Partitioner, mondrian
from tests.core.mondrian_reference import sorted_rounds
kernels.MIN_ROWS = 0
assert kernels.for_rows(1) is not None
qis, codes, dom = synthetic.census(20000, seed=4)
for t, k in [(0.15, 4), (0.35, 6)]:
    want = sorted_rounds(Partitioner(qis, codes, dom, t, k), np.zeros(len(codes), dtype=np.int64))
    assert np.array_equal(mondrian(qis, codes, dom, t, k), want), (t, k)
print("same")
"""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop(kernels.ENV_DISABLE, None)
    out = subprocess.run([SERVER_PYTHON, "-c", script], capture_output=True, text=True, cwd=REPO, env=env)
    assert out.returncode == 0 and out.stdout.strip() == "same", out.stderr[-2000:]
