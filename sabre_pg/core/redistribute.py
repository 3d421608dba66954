"""Redistribution (§4.3): ECSize / dichotomize and the bucket-level EMD of Theorem 4.

The table's bucket counts are halved recursively (``dichotomize``); a node is split only if
both children satisfy ``EMD(d(G, phi), d(DB, phi)) + U <= t`` and keep at least k tuples.
The leaves of this EC-size tree are the EC *templates*: how many tuples each EC takes from
each bucket.  Theorem 4 then guarantees EMD(EC) <= t for every EC that takes exactly those
counts, whatever tuples inside the buckets it takes.

The bucket-level EMD uses the bucket ground distance d^u_ij, the largest ground distance
between a value of bucket i and a value of bucket j:

* categorical SA: buckets are disjoint hierarchy nodes, so d^u_ij = h(LCA)/h(H) is again a
  tree distance and the hierarchical formula is exact (computed on a hierarchy reduced to
  one representative leaf per bucket);
* numerical SA: buckets are disjoint value intervals, d^u_ij = (max hi - min lo)/(m-1), which
  is not a line metric, so the cumulative-sum formula could underestimate.  We use the cost
  of a feasible flow instead -- keep min(x, y) in place, then move the residual excess to the
  residual deficit in north-west-corner (monotone) order -- a provable upper bound on the
  exact EMD (and exact whenever that residual coupling is optimal, which the tests check
  against a linear program).

The tree is built level by level with numpy, never by recursion, and each level evaluates
only its distinct count vectors, so 10M tuples take a few dozen small steps.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .buckets import Bucketization
from .emd import hierarchical_emd
from .hierarchy import Hierarchy

EPS = 1e-12


def dichotomize(V: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Halve count vectors (rows of V); odd counts give their extra tuple alternately to the
    first and the second child, so the children's sizes differ by at most one."""
    V = np.asarray(V, dtype=np.int64)
    V2 = np.atleast_2d(V)
    odd = V2 & 1
    rank = np.cumsum(odd, axis=1) - odd           # 0-based rank of each odd entry in its row
    extra = odd * ((rank & 1) == 0)
    c1 = (V2 >> 1) + extra
    c2 = V2 - c1
    if V.ndim == 1:
        return c1[0], c2[0]
    return c1, c2


class BucketEMD:
    """EMD between bucket-count vectors and the table's bucket distribution under d^u."""

    def __init__(self, bz: Bucketization, table_counts: np.ndarray):
        self.bz = bz
        y = np.asarray(table_counts, dtype=np.float64)
        self.y = y / y.sum()
        self.B = len(bz.buckets)
        dom = bz.domain
        if dom.numerical:
            lo = np.array([b.lo for b in bz.buckets], dtype=np.float64)
            hi = np.array([b.hi - 1 for b in bz.buckets], dtype=np.float64)
            span = max(dom.m - 1, 1)
            D = (np.maximum(hi[:, None], hi[None, :]) - np.minimum(lo[:, None], lo[None, :])) / span
            np.fill_diagonal(D, 0.0)
            self.D = D
            self.tree = None
        else:
            h = dom.hierarchy
            q = bz.q
            reps = []
            for b in bz.buckets:
                present = np.flatnonzero(q[b.lo:b.hi] > 0)
                reps.append(b.lo + (int(present[0]) if len(present) else 0))
            self.tree = Hierarchy([h.rows[r] for r in reps]) if h.height else None
            idx = np.arange(self.B)
            if self.tree is not None:
                self.D = self.tree.lca_level(idx[:, None], idx[None, :]) / h.height
            else:
                self.D = np.zeros((self.B, self.B))

    def distribution_emd(self, X: np.ndarray) -> np.ndarray:
        """EMD of distributions X (rows over buckets) against the table's."""
        X = np.atleast_2d(np.asarray(X, dtype=np.float64))
        if self.B == 1:
            return np.zeros(len(X))
        if self.tree is not None:
            return np.atleast_1d(hierarchical_emd(X, self.y[None, :], self.tree))
        if not self.bz.domain.numerical:
            return np.zeros(len(X))
        return _residual_nw_cost(X, self.y, self.D)

    def __call__(self, counts: np.ndarray) -> np.ndarray:
        """EMD of count vectors (rows) against the table's bucket distribution."""
        C = np.atleast_2d(np.asarray(counts, dtype=np.float64))
        tot = C.sum(axis=1, keepdims=True)
        return self.distribution_emd(C / np.maximum(tot, 1.0))


def _residual_nw_cost(X: np.ndarray, y: np.ndarray, D: np.ndarray) -> np.ndarray:
    """Cost of a feasible flow X -> y: keep min(x, y), move the residual in monotone order."""
    n, B = X.shape
    e = np.maximum(X - y[None, :], 0.0)           # residual supply
    f = np.maximum(y[None, :] - X, 0.0)           # residual demand
    E = np.cumsum(e, axis=1)
    F = np.cumsum(f, axis=1)
    tot = np.minimum(E[:, -1], F[:, -1])          # equal up to rounding
    pts = np.sort(np.concatenate((np.zeros((n, 1)), E, F), axis=1), axis=1)
    pts = np.minimum(pts, tot[:, None])
    length = np.diff(pts, axis=1)                 # (n, 2B)
    mid = (pts[:, :-1] + pts[:, 1:]) / 2.0
    off = 4.0 * np.arange(n)[:, None]             # rows shifted apart: one global search
    src = np.searchsorted((E + off).ravel(), (mid + off).ravel(), side="right").reshape(n, -1)
    dst = np.searchsorted((F + off).ravel(), (mid + off).ravel(), side="right").reshape(n, -1)
    src = np.clip(src - B * np.arange(n)[:, None], 0, B - 1)
    dst = np.clip(dst - B * np.arange(n)[:, None], 0, B - 1)
    return (length * D[src, dst]).sum(axis=1)


def _unique_rows(V: np.ndarray):
    """Distinct rows of V and the inverse index.  All nodes of one tree level come from
    repeated halving of one vector, so each component takes at most two adjacent values and a
    row is a bitmask over the components: a 1-D unique instead of a lexicographic row sort."""
    lo = V.min(axis=0)
    D = V - lo
    B = V.shape[1]
    if B <= 62 and D.max(initial=0) <= 1:
        key = D @ (np.int64(1) << np.arange(B, dtype=np.int64))
        ukey, first, inv = np.unique(key, return_index=True, return_inverse=True)
        return V[first], np.asarray(inv).reshape(-1)
    uniq, inv = np.unique(V, axis=0, return_inverse=True)
    return uniq, np.asarray(inv).reshape(-1)


@dataclass
class ECPlan:
    """The leaves of the EC-size tree, in depth-first order: ``templates[c, b]`` tuples of
    bucket b go to EC c.  ``tree`` maps each distinct count vector to its two children, or
    None if it is a leaf (for inspection and tests)."""
    templates: np.ndarray
    depth: int
    tree: dict

    @property
    def n_classes(self) -> int:
        return len(self.templates)

    @property
    def sizes(self) -> np.ndarray:
        return self.templates.sum(axis=1)


def _splits(V: np.ndarray, bucket_emd: BucketEMD, U: float, t: float, k: int):
    """Dichotomize every count vector of V; ok[i]: Theorem 4 allows splitting V[i] (both
    halves keep >= k tuples and EMD(half) + U <= t)."""
    c1, c2 = dichotomize(V)
    ok = (c2.sum(axis=1) >= k) & (c1.sum(axis=1) >= k)
    if ok.any():
        e1 = bucket_emd(c1[ok])
        e2 = bucket_emd(c2[ok])
        good = (e1 + U <= t + EPS) & (e2 + U <= t + EPS)
        ok[np.flatnonzero(ok)[~good]] = False
    return c1, c2, ok


def ec_count(counts, bucket_emd: BucketEMD, U: float, t: float, k: int = 1) -> int:
    """The number of ECs ``ec_size`` would make, without building its templates: which
    vectors split is decided on the distinct vectors of each level, and a vector's leaf count
    is 1 or the sum of its halves'."""
    counts = np.asarray(counts, dtype=np.int64)
    halves: dict = {}
    level = counts[None, :]
    while len(level):
        c1, c2, ok = _splits(level, bucket_emd, U, t, k)
        kids = []
        for i in range(len(level)):
            key = level[i].tobytes()
            if ok[i]:
                halves[key] = (c1[i].tobytes(), c2[i].tobytes())
                kids += [c1[i], c2[i]]
            else:
                halves[key] = None
        fresh = [v for v in kids if v.tobytes() not in halves]
        level = np.unique(np.array(fresh), axis=0) if fresh else np.empty((0, len(counts)), np.int64)
    leaves: dict = {}

    def n_leaves(key):
        if key not in leaves:
            h = halves[key]
            leaves[key] = 1 if h is None else n_leaves(h[0]) + n_leaves(h[1])
        return leaves[key]

    return n_leaves(counts.tobytes())


def ec_size(counts, bucket_emd: BucketEMD, U: float, t: float, k: int = 1,
            record_tree: bool = False) -> ECPlan:
    """ECSize: split the table's bucket counts with dichotomize while Theorem 4 allows it.

    Level by level.  Whether a node splits depends only on its count vector, so each level
    keeps its distinct vectors (few: halving makes every component take one of two adjacent
    values) and, per node, the index of its vector; a node's children index the distinct
    children of its vector.  Dichotomize and the bucket EMDs run on distinct vectors only, and
    no per-level sort of all nodes is needed.
    """
    counts = np.asarray(counts, dtype=np.int64)
    if k < 1:
        raise ValueError("k must be >= 1")
    if counts.sum() < k:
        raise ValueError("the table has %d tuples, fewer than k = %d" % (counts.sum(), k))
    uniq = counts[None, :]                        # distinct count vectors of the current level
    inv = np.zeros(1, dtype=np.int64)             # per node: its vector's row in uniq
    pos = np.zeros(1)                             # dyadic position of each node, for DFS order
    width = 1.0
    leaves, leaf_pos = [], []
    tree: dict = {}
    depth = 0
    while len(inv):
        c1, c2, ok = _splits(uniq, bucket_emd, U, t, k)
        for i in range(len(uniq) if record_tree else 0):
            key = tuple(int(v) for v in uniq[i])
            tree[key] = (tuple(int(v) for v in c1[i]), tuple(int(v) for v in c2[i])) if ok[i] else None
        split = ok[inv]
        leaves.append(uniq[inv[~split]])
        leaf_pos.append(pos[~split])
        width /= 2.0
        parents = np.flatnonzero(split)
        if len(parents) == 0:
            break
        oks = np.flatnonzero(ok)
        kids, kinv = _unique_rows(np.concatenate((c1[oks], c2[oks])))
        left = np.zeros(len(uniq), dtype=np.int64)
        right = np.zeros(len(uniq), dtype=np.int64)
        left[oks] = kinv[:len(oks)]
        right[oks] = kinv[len(oks):]
        pi = inv[parents]
        inv = np.empty(2 * len(parents), dtype=np.int64)
        inv[0::2] = left[pi]
        inv[1::2] = right[pi]
        uniq = kids
        pos = np.repeat(pos[parents], 2)
        pos[1::2] += width
        depth += 1
    templates = np.concatenate(leaves)
    order = np.argsort(np.concatenate(leaf_pos), kind="stable")
    return ECPlan(templates[order], depth, tree)
