"""SA bucketization (§4.2): bucketCat, bucketNum and the upper bounds of Theorems 2 and 3.

A bucket is a contiguous range ``[lo, hi)`` of SA codes (pre-order leaf positions for a
categorical SA, indices of sorted distinct values for a numerical SA), so each bucket is a
hierarchy node or a value interval.  ``q`` is the whole table's SA distribution.

* CET^U of a categorical bucket (Theorem 2): ``h(LCA)/h(H) * (sum q - min q)`` over the
  bucket's values present in the table (q > 0).
* CET^U of a numerical bucket (Theorem 3): ``max_l sum_i d(l, i) q_i``; the sum is convex in
  l, so the maximum is at the bucket's first or last value and costs O(1) with prefix sums.
* U = sum of CET^U over the buckets.  Both greedy algorithms split the bucket whose split
  reduces U the most (``dv``) until ``U < t``.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import numpy as np

from .checkpoint import checkpoint
from .emd import SADomain
from .parameters import check_t


@dataclass
class Bucket:
    lo: int                   # first SA code (inclusive)
    hi: int                   # last SA code + 1
    bound: float              # CET^U
    node: int | None = None   # hierarchy node (categorical SA)

    @property
    def codes(self) -> range:
        return range(self.lo, self.hi)


@dataclass
class Split:
    """One greedy step: ``parent`` replaced by ``children``; U after the step."""
    parent: Bucket
    children: list
    dv: float
    U: float


@dataclass
class Bucketization:
    buckets: list               # Bucket, sorted by lo
    U: float
    domain: SADomain
    q: np.ndarray
    trace: list = field(default_factory=list)   # list[Split]

    @property
    def n_buckets(self) -> int:
        return len(self.buckets)

    def bucket_of_code(self) -> np.ndarray:
        """Bucket index of every SA code; -1 for codes of empty subtrees left out of all buckets."""
        out = np.full(self.domain.m, -1, dtype=np.int64)
        for b, bk in enumerate(self.buckets):
            out[bk.lo:bk.hi] = b
        return out

    def counts(self, code_counts: np.ndarray) -> np.ndarray:
        return np.array([code_counts[b.lo:b.hi].sum() for b in self.buckets], dtype=np.int64)


# --------------------------------------------------------------------------- bounds
class _Prefix:
    """Prefix sums of q and i*q for O(1) range sums."""

    def __init__(self, q: np.ndarray):
        idx = np.arange(len(q), dtype=np.float64)
        self.Q0 = np.concatenate(([0.0], np.cumsum(q)))
        self.Q1 = np.concatenate(([0.0], np.cumsum(idx * q)))

    def lists(self):
        """Q0 and Q1 as Python lists (for scalar loops), made once."""
        if not hasattr(self, "_lists"):
            self._lists = (self.Q0.tolist(), self.Q1.tolist())
        return self._lists

    def sums(self, a, b):
        """sum q and sum i*q over inclusive code ranges [a, b] (vectorized)."""
        return self.Q0[np.asarray(b) + 1] - self.Q0[a], self.Q1[np.asarray(b) + 1] - self.Q1[a]


def cet_numerical(q, lo: int, hi: int, m: int | None = None) -> float:
    """Theorem 3 bound of the numerical bucket [lo, hi) (codes with q > 0 assumed)."""
    q = np.asarray(q, dtype=np.float64)
    m = len(q) if m is None else m
    if hi - lo <= 1 or m <= 1:
        return 0.0
    pre = _Prefix(q)
    s0, s1 = pre.sums(lo, hi - 1)
    return float(max(s1 - lo * s0, (hi - 1) * s0 - s1) / (m - 1))


def cet_categorical(q, lo: int, hi: int, hierarchy) -> float:
    """Theorem 2 bound of the categorical bucket made of leaves [lo, hi)."""
    q = np.asarray(q, dtype=np.float64)
    present = np.flatnonzero(q[lo:hi] > 0) + lo
    if len(present) <= 1 or hierarchy.height == 0:
        return 0.0
    h = int(hierarchy.lca_level(present[0], present[-1]))
    s = q[present]
    return float(h / hierarchy.height * (s.sum() - s.min()))


def upper_bound(buckets) -> float:
    """U of Theorem 4: the sum of the buckets' CET^U."""
    return float(sum(b.bound for b in buckets))


# --------------------------------------------------------------------------- bucketNum
def _best_num_split(pre: _Prefix, lo: int, hi: int, m: int):
    """Best split point of [lo, hi): returns (s, cet1, cet2) with c1=[lo,s), c2=[s,hi); O(hi-lo)."""
    if hi - lo <= SMALL_BUCKET:
        return _best_small_split(pre, lo, hi, m)
    s = np.arange(lo + 1, hi)                    # c1 = [lo, s-1], c2 = [s, hi-1]
    a0, a1 = pre.sums(lo, s - 1)
    b0, b1 = pre.sums(s, hi - 1)
    c1 = np.where(s - lo > 1, np.maximum(a1 - lo * a0, (s - 1) * a0 - a1), 0.0) / (m - 1)
    c2 = np.where(hi - s > 1, np.maximum(b1 - s * b0, (hi - 1) * b0 - b1), 0.0) / (m - 1)
    i = int(np.argmin(c1 + c2))
    return int(s[i]), float(c1[i]), float(c2[i])


SMALL_BUCKET = 24      # narrower buckets are split in plain Python (numpy's call overhead dominates)


def _best_small_split(pre: _Prefix, lo: int, hi: int, m: int):
    """:func:`_best_num_split` with Python floats, the same formulas and the same first-minimum tie."""
    q0, q1 = pre.lists()
    best = None
    for s in range(lo + 1, hi):
        a0, a1 = q0[s] - q0[lo], q1[s] - q1[lo]
        b0, b1 = q0[hi] - q0[s], q1[hi] - q1[s]
        c1 = max(a1 - lo * a0, (s - 1) * a0 - a1) / (m - 1) if s - lo > 1 else 0.0
        c2 = max(b1 - s * b0, (hi - 1) * b0 - b1) / (m - 1) if hi - s > 1 else 0.0
        if best is None or c1 + c2 < best[1] + best[2]:
            best = (s, c1, c2)
    return best


def bucket_num(q, t: float, lookahead: int = 0):
    """bucketNum: greedy best-point splits of the sorted SA domain until U < t.

    With ``lookahead`` > 0, returns a list: the paper's bucketization and up to ``lookahead``
    further greedy splits (all with U < t)."""
    q = np.asarray(q, dtype=np.float64)
    m = len(q)
    pre = _Prefix(q)

    def candidate(b: Bucket):
        if b.hi - b.lo < 2 or m < 2:
            return None
        s, c1, c2 = _best_num_split(pre, b.lo, b.hi, m)
        return (b.bound - (c1 + c2), [Bucket(b.lo, s, c1), Bucket(s, b.hi, c2)])

    out = _greedy(Bucket(0, m, cet_numerical(q, 0, m)), candidate, t, SADomain("numerical", m=m), q,
                  lookahead)
    return out if lookahead else out[0]


def _greedy(root: Bucket, candidate, t: float, dom: SADomain, q: np.ndarray, lookahead: int):
    """The greedy loop shared by bucketNum and bucketCat: split the bucket with the largest
    reduction dv of U (``candidate(b)`` -> (dv, children) or None) until U < t, then go on
    for up to ``lookahead`` more splits.  Returns every bucketization with U < t on the way.

    The candidates wait in a heap (largest dv first, ties to the earlier bucket), so a split
    costs O(log B), not a scan of every bucket.  U is updated by each split's change and
    summed afresh (``math.fsum`` of the bounds) whenever it comes near t, so the ``U < t``
    decision never rests on accumulated rounding."""
    t = check_t(t)
    live = {root.lo: root}                       # buckets by first code (they are disjoint)
    heap: list = []
    _push(heap, root, candidate(root))
    U = root.bound
    trace: list[Split] = []
    out: list[Bucketization] = []
    while True:
        checkpoint()
        if U < t + NEAR:
            U = math.fsum(b.bound for b in live.values())
        if U < t:
            out.append(Bucketization(_in_order(live), U, dom, q, list(trace)))
            if len(out) > lookahead:
                break
        if not heap:                              # every bucket is a single value: U == 0
            if not out:
                out.append(Bucketization(_in_order(live), U, dom, q, list(trace)))
            break
        _, _, b, (dv, kids) = heapq.heappop(heap)
        del live[b.lo]
        for kb in kids:
            live[kb.lo] = kb
            _push(heap, kb, candidate(kb))
        U += sum(kb.bound for kb in kids) - b.bound
        trace.append(Split(b, kids, dv, U))
    return out


NEAR = 1e-9            # U is summed exactly (math.fsum) once the running U is this close to t


def _push(heap: list, b: Bucket, c) -> None:
    if c is not None:
        heapq.heappush(heap, (-c[0], b.lo, b, c))


def _in_order(live: dict) -> list:
    return [live[lo] for lo in sorted(live)]


# --------------------------------------------------------------------------- bucketCat
def bucket_cat(q, hierarchy, t: float, lookahead: int = 0):
    """bucketCat: split hierarchy nodes into their (non-empty) children, largest dv first
    (``lookahead`` as for bucket_num)."""
    q = np.asarray(q, dtype=np.float64)
    h = hierarchy
    if len(q) != h.n_leaves:
        raise ValueError("q has %d values, hierarchy has %d leaves" % (len(q), h.n_leaves))
    mass = np.concatenate(([0.0], np.cumsum(q)))
    kids_of: dict[int, list[int]] = {}
    for nid in range(h.n_nodes):
        checkpoint()
        p = int(h.parent[nid])
        if p >= 0:
            kids_of.setdefault(p, []).append(nid)

    def nonempty_children(nid):
        return [c for c in kids_of.get(nid, []) if mass[h.hi[c]] - mass[h.lo[c]] > 0]

    def descend(nid):
        # a node with a single non-empty child is that child, as far as the SA is concerned
        while True:
            kids = nonempty_children(nid)
            if len(kids) != 1:
                return nid
            nid = kids[0]

    def make(nid):
        return Bucket(int(h.lo[nid]), int(h.hi[nid]),
                      cet_categorical(q, int(h.lo[nid]), int(h.hi[nid]), h), nid)

    def candidate(b: Bucket):
        kids = nonempty_children(b.node)
        if len(kids) < 2:
            return None
        made = [make(descend(c)) for c in kids]
        return (b.bound - sum(k.bound for k in made), made)

    out = _greedy(make(descend(h.root)), candidate, t, SADomain("categorical", hierarchy=h), q, lookahead)
    return out if lookahead else out[0]


def bucketize(q, t: float, domain: SADomain, lookahead: int = 0):
    """Dispatch on the SA kind: bucketNum for numerical, bucketCat for categorical.
    With ``lookahead`` > 0, a list of candidate bucketizations (see ``_greedy``)."""
    if domain.numerical:
        return bucket_num(q, t, lookahead)
    return bucket_cat(q, domain.hierarchy, t, lookahead)
