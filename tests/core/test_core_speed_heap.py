"""The core's kept heap (issue 26, the core's speed): freed memory stays in the process while
refine works, glibc's defaults come back after it, also after an error, and refine's classes
do not depend on it (tests/core/test_refine_identity.py pins them with it on)."""
from __future__ import annotations

import numpy as np
import pytest

from sabre_pg.core import heap
from sabre_pg.core.refine import refine
from sabre_pg.synthetic import census


def test_kept_inside_restored_after_nested_and_after_an_error():
    assert not heap.active()
    with heap.kept_heap():
        assert heap.active()
        with heap.kept_heap():
            assert heap.active()
        assert heap.active()           # the outer block still runs
    assert not heap.active()
    with pytest.raises(ZeroDivisionError):
        with heap.kept_heap():
            1 / 0
    assert not heap.active()


def test_refine_runs_in_it_and_without_glibc_gives_the_same_classes(monkeypatch):
    qis, codes, dom = census(3_000, seed=4)
    seen = []
    real = heap.kept_heap

    def spy():
        seen.append(True)
        return real()
    monkeypatch.setattr("sabre_pg.core.refine.kept_heap", spy)
    with_heap = refine(qis, codes, dom, 0.3, 5)
    assert seen and not heap.active()
    monkeypatch.setattr(heap, "_libc", False)         # a C library without mallopt
    assert heap._glibc() is None
    assert np.array_equal(refine(qis, codes, dom, 0.3, 5), with_heap) and not heap.active()
