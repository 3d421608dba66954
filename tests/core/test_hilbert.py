"""Hilbert keys: a bijection onto 0..2^(d*bits)-1 whose consecutive keys are adjacent cells."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from sabre_pg.core.hilbert import (MAX_DIMS, bits_per_dim, hilbert_index, hilbert_keys,
                                   qi_axes, scale_axis)


def all_cells(d, bits):
    side = 1 << bits
    return np.array(list(itertools.product(range(side), repeat=d)), dtype=np.uint64)


@pytest.mark.parametrize("d, bits", [(1, 1), (1, 5), (2, 1), (2, 2), (2, 3), (2, 5), (3, 1),
                                     (3, 2), (3, 3), (4, 2), (5, 2), (6, 1), (2, 7)])
def test_permutation_and_unit_steps(d, bits):
    cells = all_cells(d, bits)
    keys = hilbert_index(cells, bits)
    assert keys.dtype == np.int64
    n = 1 << (d * bits)
    assert np.array_equal(np.sort(keys), np.arange(n))
    path = cells[np.argsort(keys)].astype(np.int64)
    steps = np.abs(np.diff(path, axis=0)).sum(axis=1)
    assert np.all(steps == 1), "consecutive Hilbert keys must be adjacent cells"
    assert np.all(path[0] == 0)                   # the curve starts at the origin


def test_one_dimension_is_identity():
    c = np.array([[5], [0], [3]], dtype=np.uint64)
    assert hilbert_index(c, 3).tolist() == [5, 0, 3]
    k = hilbert_keys([np.array([2.0, 1.0, 3.0])])
    assert np.argsort(k).tolist() == [1, 0, 2]


@pytest.mark.parametrize("d", list(range(1, MAX_DIMS + 1)))
def test_keys_fit_int64(d):
    bits = bits_per_dim(d)
    assert d * bits <= 63
    rng = np.random.default_rng(d)
    top = (1 << bits) - 1
    pts = rng.integers(0, top + 1, size=(200, d), dtype=np.uint64)
    pts[0] = top
    pts[1] = 0
    pts[2, ::2] = top
    keys = hilbert_index(pts, bits)
    assert keys.dtype == np.int64
    assert np.all(keys >= 0)
    assert keys.max() < (1 << (d * bits))
    assert len(np.unique(keys)) == len(np.unique(pts, axis=0))


def test_seventeen_dims_raise():
    with pytest.raises(ValueError, match="at most 16"):
        bits_per_dim(17)
    cols = [np.arange(4.0)] * 17
    with pytest.raises(ValueError, match="at most 16"):
        hilbert_keys(cols)
    with pytest.raises(ValueError):
        bits_per_dim(0)
    with pytest.raises(ValueError, match="63-bit"):
        hilbert_index(np.zeros((1, 2), dtype=np.uint64), 32)


def test_bits_per_dim_follows_cardinality():
    assert bits_per_dim(1) == 31
    assert bits_per_dim(2) == 31
    assert bits_per_dim(3) == 21
    assert bits_per_dim(2, [2, 3]) == 2
    assert bits_per_dim(2, [1, 1]) == 1
    assert bits_per_dim(2, [1000, 5]) == 10


def test_scale_axis_and_grid():
    v = np.array([10.0, 20.0, 15.0])
    assert scale_axis(v, 2).tolist() == [0, 3, 2]       # rint(1.5) = 2
    assert scale_axis(np.array([4.0, 4.0]), 5).tolist() == [0, 0]
    g = np.column_stack(qi_axes([np.array([0.0, 1.0]), np.array([2, 0])], 3, ranges=[(0.0, 1.0), (0.0, 4.0)]))
    assert g.tolist() == [[0, 4], [7, 0]]


def test_hilbert_keys_preserve_locality():
    # in 2-D, points of the same quadrant get keys in one contiguous quarter of the range
    x = np.array([0.0, 1, 2, 3, 0, 1, 2, 3] * 2)
    y = np.repeat([0.0, 1, 2, 3], 4)
    k = hilbert_keys([x, y], bits=2)
    assert sorted(k.tolist()) == list(range(16))
    quad = (x >= 2).astype(int) * 2 + (y >= 2).astype(int)
    for qd in range(4):
        ks = np.sort(k[quad == qd])
        assert ks[-1] - ks[0] == 3
