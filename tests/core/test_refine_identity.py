"""The speed work on the cut search (issue 26, "the core") keeps the method identical: the
classes of ``refine`` on Adult and on census-like data are those of the code before it,
recorded as hashes of the class id of every row (sha256 of the int64 array, first 16 hex
digits).  A change that alters the classes on purpose must re-record them and say why."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from sabre_pg.core.refine import refine
from sabre_pg.synthetic import adult, census

# recorded from the code before the speed work (main at 3d281cd)
# census(100_000, seed=1), t = 0.35, k = 6, per threads (same classes, numbered differently)
CENSUS = {1: "f2d985f9b91be510", 2: "af53ee48731abe66"}
ADULT = "4e7e3c2c4548adb2"


def digest(ec) -> str:
    return hashlib.sha256(np.ascontiguousarray(ec, dtype=np.int64).tobytes()).hexdigest()[:16]


def test_adult_classes_unchanged(shared_dir):
    qis, codes, dom = adult(shared_dir / "adult")
    assert digest(refine(qis, codes, dom, 0.2, 5)) == ADULT


@pytest.mark.parametrize("threads", [1, 2])
def test_census_100k_classes_unchanged(threads):
    qis, codes, dom = census(100_000, seed=1)
    assert digest(refine(qis, codes, dom, 0.35, 6, threads=threads)) == CENSUS[threads]
