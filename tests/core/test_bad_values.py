"""Bad QI values and SA codes in the core's Python API: a clear ValueError naming the QI and
the row, never a NaN AIL or a bare numpy/Python error."""
from __future__ import annotations

import numpy as np
import pytest

from sabre_pg.core.emd import SADomain
from sabre_pg.core.hierarchy import Hierarchy
from sabre_pg.core.sabre import QuasiIdentifier, anonymize

H = Hierarchy.flat(["a", "b", "c"])
CODES = np.array([0, 1, 2, 0, 1, 2, 0, 1])
DOMAIN = SADomain("categorical", hierarchy=Hierarchy.flat(["x", "y", "z"]))


def run(values, hierarchy=None, codes=CODES):
    return anonymize([QuasiIdentifier("q", values, hierarchy)], codes, DOMAIN, 0.5, 2)


@pytest.mark.parametrize("values, match", [
    ([1.0, 2.0, np.nan, 4, 5, 6, 7, 8], r"QI q has a non-finite value \(nan\) at row 2"),
    ([1.0, 2.0, 3, np.inf, 5, 6, 7, 8], r"QI q has a non-finite value \(inf\) at row 3"),
    ([1, 2, 3, 4, None, 6, 7, 8], r"QI q has a missing value \(None\) at row 4"),
    (["1", "2", "x", "4", "5", "6", "7", "8"], "QI q has values that are not numbers"),
    ([1, 2, 3], "QI q has 3 values for 8 tuples"),
])
def test_bad_numerical_qi(values, match):
    with pytest.raises(ValueError, match=match):
        run(np.array(values, dtype=object) if None in values else values)


@pytest.mark.parametrize("values, match", [
    ([0, 1, 2, 3, 0, 1, 2, 0], r"QI q: 3 at row 3 is not a leaf position of its hierarchy \(integers 0..2\)"),
    ([0, 1, -1, 2, 0, 1, 2, 0], r"QI q: -1 at row 2 is not a leaf position"),
    ([0, 1, 1.5, 2, 0, 1, 2, 0], r"QI q: 1.5 at row 2 is not a leaf position"),
    ([0, None, 1, 2, 0, 1, 2, 0], r"QI q has a missing value \(None\) at row 1"),
    ([0, np.nan, 1, 2, 0, 1, 2, 0], r"QI q has a non-finite value \(nan\) at row 1"),
])
def test_bad_categorical_qi(values, match):
    with pytest.raises(ValueError, match=match):
        run(np.array(values, dtype=object), H)


@pytest.mark.parametrize("codes, match", [
    (np.array([0, 1, 2, 3, 0, 1, 2, 0]), "SA code 3 at row 3 is outside 0..2"),
    (np.array([0, 1, -2, 0, 0, 1, 2, 0]), "SA code -2 at row 2 is outside 0..2"),
    (np.array([0, None, 2, 0, 0, 1, 2, 0], dtype=object), "the SA codes must be integers 0..2"),
])
def test_bad_sa_codes(codes, match):
    with pytest.raises(ValueError, match=match):
        run(np.arange(8.0), codes=codes)


def test_good_values_of_any_numeric_dtype_are_accepted():
    ok = run(np.array([1, 2, 3, 4, 5, 6, 7, 8], dtype=object))
    assert np.isfinite(ok.metrics()["ail"])
    ints = run(np.arange(8, dtype=np.int32))
    assert ints.generalization[0].lo.dtype.kind == "i"
    cat = run(np.array([0, 1, 2, 0, 1, 2, 0, 1], dtype=np.float64), H)
    assert cat.n_classes >= 1
