"""Hilbert-curve keys over the QI space (§4.4, SABRE-AK).

Each QI becomes one axis: a numerical QI by its value, a categorical QI by the pre-order
position of its leaf in the hierarchy; every axis is scaled to a common bit width chosen so
that d * bits <= 63 and the key fits a PostgreSQL bigint.  The index is computed with
Skilling's transform ("Programming the Hilbert curve", AIP Conf. Proc. 707, 2004),
vectorized over all tuples: O(d * bits) numpy passes.
"""
from __future__ import annotations

import numpy as np

from .checkpoint import checkpoint

MAX_KEY_BITS = 63
MAX_DIMS = 16


def bits_per_dim(d: int, cardinalities=None) -> int:
    """Bits per axis: as many as the bigint allows (63 // d), no more than any axis needs."""
    if d < 1:
        raise ValueError("need at least one dimension")
    if d > MAX_DIMS:
        raise ValueError("Hilbert keys support at most %d quasi-identifiers, got %d" % (MAX_DIMS, d))
    b = min(MAX_KEY_BITS // d, 31)
    if cardinalities is not None and len(cardinalities):
        need = max(1, int(np.ceil(np.log2(max(2, int(max(cardinalities)))))))
        b = min(b, need)
    return max(b, 1)


def _word(bits: int):
    """The narrowest unsigned dtype the transform can work in for ``bits`` bits per axis."""
    return np.uint16 if bits <= 16 else np.uint32 if bits <= 31 else np.uint64


def scale_axis(values: np.ndarray, bits: int, lo: float | None = None, hi: float | None = None,
               dtype=np.uint64) -> np.ndarray:
    """Scale values linearly onto 0 .. 2**bits - 1."""
    v = np.asarray(values, dtype=np.float64)
    lo = float(v.min()) if lo is None else lo
    hi = float(v.max()) if hi is None else hi
    top = (1 << bits) - 1
    if hi <= lo:
        return np.zeros(len(v), dtype=dtype)
    return np.rint((v - lo) * (top / (hi - lo))).astype(dtype)


def _spread_table(bits: int, d: int) -> np.ndarray:
    """LUT: value v (< 2**chunk) -> its bits spread with stride d (bit j -> bit j*d)."""
    v = np.arange(1 << bits, dtype=np.uint64)
    out = np.zeros(1 << bits, dtype=np.uint64)
    for j in range(bits):
        out |= ((v >> np.uint64(j)) & np.uint64(1)) << np.uint64(j * d)
    return out


def hilbert_index(coords, bits: int) -> np.ndarray:
    """Hilbert index of integer points with ``bits`` bits per axis -> int64.

    ``coords`` is an (n, d) array or a list of d axis arrays of length n (not modified)."""
    if isinstance(coords, (list, tuple)):
        cols = [np.asarray(c) for c in coords]
    else:
        points = np.asarray(coords)
        if points.ndim != 2:
            raise ValueError("coords must be (n, d)")
        cols = [points[:, i] for i in range(points.shape[1])]
    d = len(cols)
    n = len(cols[0]) if d else 0
    if d > MAX_DIMS:
        raise ValueError("Hilbert keys support at most %d dimensions, got %d" % (MAX_DIMS, d))
    if d * bits > MAX_KEY_BITS:
        raise ValueError("%d dims x %d bits exceeds a 63-bit key" % (d, bits))
    if d == 1:
        return cols[0].astype(np.int64)
    dt = _word(bits)
    # X (the coordinates) and P (the low-bit mask) as in Skilling's AxesToTranspose
    X = [np.array(c, dtype=dt) for c in cols]            # copies: transformed in place
    one = dt(1)
    t = np.empty(n, dtype=dt)
    m = np.empty(n, dtype=dt)
    # inverse undo, from the top bit down (all in place)
    for s in range(bits - 1, 0, -1):
        P = dt((1 << s) - 1)
        for i in range(d):
            np.right_shift(X[i], dt(s), out=m)
            np.bitwise_and(m, one, out=m)
            np.negative(m, out=m)                 # all ones where bit s of X[i] is set
            if i:
                np.bitwise_xor(X[0], X[i], out=t)
                np.bitwise_and(t, P, out=t)
                np.bitwise_and(t, np.invert(m), out=t)   # exchange low bits where not set
                np.bitwise_xor(X[i], t, out=X[i])
                np.bitwise_and(m, P, out=m)
                np.bitwise_or(m, t, out=m)
                np.bitwise_xor(X[0], m, out=X[0])
            else:
                np.bitwise_and(m, P, out=m)      # i == 0: invert where set, else no-op
                np.bitwise_xor(X[0], m, out=X[0])
    # Gray encode
    for i in range(1, d):
        np.bitwise_xor(X[i], X[i - 1], out=X[i])
    t[:] = 0
    for s in range(bits - 1, 0, -1):
        np.right_shift(X[d - 1], dt(s), out=m)
        np.bitwise_and(m, one, out=m)
        np.negative(m, out=m)
        np.bitwise_and(m, dt((1 << s) - 1), out=m)
        np.bitwise_xor(t, m, out=t)
    for i in range(d):
        np.bitwise_xor(X[i], t, out=X[i])
    # interleave the transposed bits (MSB of X[0] first) with spread look-up tables
    chunk = min(bits, 11)
    lut = _spread_table(chunk, d)
    key = np.zeros(n, dtype=np.uint64)
    mask = dt((1 << chunk) - 1)
    for c0 in range(0, bits, chunk):
        checkpoint()
        for i in range(d):
            part = lut[(X[i] >> dt(c0)) & mask] if c0 else lut[X[i] & mask]
            key |= part << np.uint64(c0 * d + (d - 1 - i))
    return key.astype(np.int64)


def qi_axes(columns, bits: int, ranges=None) -> list:
    """Scale QI axes (list of 1-D arrays: values or leaf positions) onto the bit grid, each in
    the transform's word type."""
    return [scale_axis(col, bits, *((None, None) if ranges is None else ranges[j]), dtype=_word(bits))
            for j, col in enumerate(columns)]


def hilbert_keys(columns, ranges=None, bits: int | None = None) -> np.ndarray:
    """Hilbert key (int64) of every tuple from its QI axes."""
    d = len(columns)
    if bits is None:
        card = [len(np.unique(c)) if len(c) <= 100_000 else (1 << 31) for c in columns]
        bits = bits_per_dim(d, card)
    axes = qi_axes(columns, bits, ranges)
    return hilbert_index(axes, bits)
