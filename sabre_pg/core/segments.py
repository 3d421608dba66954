"""Rows grouped in segments, one per partition, in partition order: the linear-time steps the
top-down partitioners share (:mod:`.cut_search` and :mod:`.mondrian`'s rounds): the indices
and ids of segments, a stable split of every segment in two, and (group, SA code) counts
without a sort."""
from __future__ import annotations

import numpy as np

from .checkpoint import checkpoint

__all__ = ["split_segments", "segment_indices", "segment_ids", "grouped", "lower_bound", "slot_ids",
           "carried", "GROUP_CELLS"]

GROUP_CELLS = 1 << 22      # (group, SA code) cells counted at once by grouped's bincount


def split_segments(orders, owners, right, sizes, n_right, new_owner, present, pmap=map, K=None, keep=None):
    """Every order (rows grouped by partition: ``owners``, each partition of ``present[j]``
    with all of its ``sizes`` rows, in partition order) with each partition's rows split
    stably, those with ``right[row] == 0`` first (``n_right`` of them are not): value order
    is kept inside both parts, in linear time, by sequential passes only (no sort, no
    scatter).  The order's left rows and its right rows, each taken in order, are two blocks;
    the output is, per partition, its run of the left block then its run of the right one,
    gathered by one ``take`` whose index is the output position plus a shift per run.
    Returns the orders and the new partition of their rows, ``new_owner[2 * owner + side]``.
    ``K``: the compiled kernels (one pass per order, leaving out the rows of new partitions
    not ``keep``), or None."""
    n_left = sizes - n_right

    def split(o, owner, here):
        if not len(o):
            return o, owner
        if K is not None:
            return K.split_order(o, owner, right, sizes, n_left, new_owner, keep)
        r = right[o].view(bool)
        q = np.flatnonzero(here)
        nl, nr = n_left[q], n_right[q]
        runs = np.stack((nl, nr), axis=1).ravel()          # per partition: left run, right run
        src = np.stack((np.cumsum(nl) - nl, np.cumsum(nr) - nr + int(nl.sum())), axis=1).ravel()
        run = segment_ids(runs)
        at = (src - (np.cumsum(runs) - runs))[run]
        at += np.arange(len(o))
        out = np.concatenate((o[~r], o[r]))[at]
        return out, new_owner[np.stack((2 * q, 2 * q + 1), axis=1).ravel()][run]

    return tuple(list(x) for x in zip(*pmap(split, orders, owners, present))) if orders else ([], [])


def segment_indices(starts, sizes) -> np.ndarray:
    """The indices starts[i] .. starts[i] + sizes[i] - 1 of every segment, concatenated."""
    sizes = np.asarray(sizes, dtype=np.int64)
    return (np.asarray(starts, np.int64) - np.cumsum(sizes) + sizes)[segment_ids(sizes)] + np.arange(sizes.sum())


def segment_ids(sizes) -> np.ndarray:
    """``np.repeat(np.arange(len(sizes)), sizes)`` by a running sum (np.repeat keeps the
    interpreter lock, which the threads share)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    steps = np.zeros(int(sizes.sum()), dtype=np.int64)
    nonempty = np.flatnonzero(sizes)
    steps[(np.cumsum(sizes) - sizes)[nonempty]] = np.diff(nonempty, prepend=0)
    return np.cumsum(steps)


def grouped(labels, codes, m):
    """(group, code, count) of rows labelled by group (``labels`` non-decreasing), sorted by
    (group, code): counted without a sort, by bincounts over at most :data:`GROUP_CELLS`
    (group, code) cells at a time."""
    n_groups = int(labels[-1]) + 1 if len(labels) else 0
    per = max(GROUP_CELLS // m, 1)
    found = []
    for first in range(0, n_groups, per):
        checkpoint()
        a, b = np.searchsorted(labels, (first, first + per))
        hist = np.bincount((labels[a:b] - first) * m + codes[a:b], minlength=min(per, n_groups - first) * m)
        key = np.flatnonzero(hist)
        found.append((key // m + first, key % m, hist[key].astype(np.int64)))
    if len(found) == 1:
        return found[0]
    return tuple(np.concatenate([f[i] for f in found]) if found else np.zeros(0, np.int64) for i in range(3))


def lower_bound(v, first, last, x, inclusive: bool = False, at=None) -> np.ndarray:
    """Per query i, the first index in ``first[i] .. last[i] - 1`` where the value (``v[j]``, or
    ``v[at[j]]`` read through the positions ``at``; sorted there) is >= ``x[i]`` (> with
    ``inclusive``), else ``last[i]``: a binary search of all the queries at once, in
    log2(longest range) steps over the queries only, reading only the values it visits."""
    lo, hi = first.astype(np.int64), last.astype(np.int64)
    end = (len(v) if at is None else len(at)) - 1
    while True:
        open_ = lo < hi
        if not open_.any():
            return lo
        mid = (lo + hi) >> 1
        j = np.minimum(mid, end)
        value = v[j] if at is None else v[at[j]]
        below = open_ & ((value <= x) if inclusive else (value < x))
        lo = np.where(below, mid + 1, lo)
        hi = np.where(open_ & ~below, mid, hi)


def slot_ids(has: np.ndarray, counts: np.ndarray):
    """(number of new partitions, ``new_id`` of each old one) after a round's cuts (``has[q]``:
    q was cut; ``counts[q]``: its rows): in partition order, q's slots are 3q (q not cut, kept
    while it has rows), 3q + 1 and 3q + 2 (its two parts, ``new_id[q]`` and ``new_id[q] + 1``),
    so the orders stay grouped by partition id and a cut only splits its partition's segment."""
    n_parts = len(has)
    slots = np.zeros((n_parts, 3), dtype=bool)
    slots[:, 0], slots[:, 1], slots[:, 2] = ~has & (counts > 0), has, has
    flat = slots.ravel()
    return int(flat.sum()), (np.cumsum(flat) - 1)[3 * np.arange(n_parts) + has]


def carried(a: np.ndarray, new_id: np.ndarray, kept: np.ndarray, n_new: int) -> np.ndarray:
    """Per-partition values ``a`` (one row per old partition) under the :func:`slot_ids`
    numbering: the partitions ``kept`` (not cut) keep theirs, new parts get zeros."""
    b = np.zeros((n_new,) + a.shape[1:], dtype=a.dtype)
    b[new_id[kept]] = a[kept]
    return b

