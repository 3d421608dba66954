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
from .checkpoint import checkpoint
from .emd import hierarchical_emd
from .hierarchy import Hierarchy
from .parameters import check_k, check_t

# Splits are accepted only with a margin on the safe side: EMD(half) + U <= t - margin, where
# margin bounds the float64 rounding of the bucket EMD and of U (sums and prefix-sum differences
# of at most B + m terms, each at most 1).  No class is accepted above t by rounding.
ROUNDING = 16 * np.finfo(np.float64).eps


def margin(bucket_emd) -> float:
    """The safety margin of the Theorem-4 test for this bucketization (see ``ROUNDING``).
    Any other bound ECSize runs on (``fragments.JointBound``) states its own ``terms``: how
    many terms of at most 1 its rounding accumulates."""
    return ROUNDING * (bucket_emd.terms + 4)


def dichotomize(vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Halve count vectors (one, or the rows of a matrix); odd counts give their extra tuple
    alternately to the first and the second child, so the children's sizes differ by at most one."""
    vectors = np.asarray(vectors, dtype=np.int64)
    rows = np.atleast_2d(vectors)
    odd = rows & 1
    rank = np.cumsum(odd, axis=1) - odd           # 0-based rank of each odd entry in its row
    extra = odd * ((rank & 1) == 0)
    c1 = (rows >> 1) + extra
    c2 = rows - c1
    if vectors.ndim == 1:
        return c1[0], c2[0]
    return c1, c2


class BucketEMD:
    """EMD between bucket-count vectors and the table's bucket distribution under d^u.

    ``pair_distance(i, j)`` is d^u between buckets i and j (vectorized); ``distance`` the
    whole B x B matrix, built only when asked for (inspection and tests): the EMD never needs
    it -- the categorical path runs the tree formula on a hierarchy reduced to one leaf per
    bucket, the numerical path looks up only the pairs its flow uses.
    ``table_distribution`` is the table's share of tuples per bucket."""

    def __init__(self, bucketization: Bucketization, table_counts: np.ndarray):
        self.bucketization = bucketization
        table_counts = np.asarray(table_counts, dtype=np.float64)
        self.table_distribution = table_counts / table_counts.sum()
        buckets = bucketization.buckets
        self.n_buckets = len(buckets)
        domain = bucketization.domain
        self.terms = self.n_buckets + domain.m    # sums the margin bounds (``margin``)
        self.tree = None
        self._distance = None
        if domain.numerical:
            self.lo = np.array([b.lo for b in buckets], dtype=np.float64)
            self.hi = np.array([b.hi - 1 for b in buckets], dtype=np.float64)
            self.span = max(domain.m - 1, 1)
            # buckets in code order: the union of two spans is hi[max] - lo[min] (two lookups, not four)
            self._ordered = bool(np.all(np.diff(self.lo) >= 0) and np.all(np.diff(self.hi) >= 0))
            return
        h = domain.hierarchy
        representatives = []                      # one present leaf per bucket
        for b in buckets:
            present = np.flatnonzero(bucketization.q[b.lo:b.hi] > 0)
            representatives.append(b.lo + (int(present[0]) if len(present) else 0))
        if h.height:
            self.tree = Hierarchy([h.rows[r] for r in representatives], empty_leaves=getattr(h, "empty_leaves", False))

    def pair_distance(self, i, j) -> np.ndarray:
        """d^u between buckets i and j (arrays of bucket indices, broadcast)."""
        i, j = np.asarray(i), np.asarray(j)
        if self.bucketization.domain.numerical:
            if self._ordered:
                d = (self.hi[np.maximum(i, j)] - self.lo[np.minimum(i, j)]) / self.span
            else:
                d = (np.maximum(self.hi[i], self.hi[j]) - np.minimum(self.lo[i], self.lo[j])) / self.span
            return np.where(i == j, 0.0, d)
        if self.tree is None:
            return np.zeros(np.broadcast(i, j).shape)
        return self.tree.lca_level(i, j) / self.bucketization.domain.hierarchy.height

    @property
    def distance(self) -> np.ndarray:
        """The B x B matrix of d^u (O(B^2) memory: for inspection, never used by the EMD)."""
        if self._distance is None:
            idx = np.arange(self.n_buckets)
            self._distance = self.pair_distance(idx[:, None], idx[None, :])
        return self._distance

    def distribution_emd(self, distributions: np.ndarray, tables=None) -> np.ndarray:
        """EMD of distributions (rows over buckets) against the table's (or, row by row,
        against ``tables``: one bucket distribution per row, for :func:`ec_counts`)."""
        distributions = np.atleast_2d(np.asarray(distributions, dtype=np.float64))
        table = self.table_distribution[None, :] if tables is None else tables
        if self.n_buckets == 1:
            return np.zeros(len(distributions))
        if self.tree is not None:
            return np.atleast_1d(hierarchical_emd(distributions, table, self.tree))
        if not self.bucketization.domain.numerical:
            return np.zeros(len(distributions))
        return _residual_nw_cost(distributions, table, self.pair_distance)

    def __call__(self, counts: np.ndarray) -> np.ndarray:
        """EMD of count vectors (rows) against the table's bucket distribution."""
        counts = np.atleast_2d(np.asarray(counts, dtype=np.float64))
        sizes = counts.sum(axis=1, keepdims=True)
        return self.distribution_emd(counts / np.maximum(sizes, 1.0))


def _residual_nw_cost(x: np.ndarray, y: np.ndarray, pair_distance) -> np.ndarray:
    """Cost of a feasible flow x -> y (rows of x, each against y or its row of y): keep min(x, y) in place and
    move the residual supply to the residual demand in monotone (north-west corner) order.
    ``pair_distance(src, dst)``: the ground distance of bucket pairs.

    Each row's cumulative residual supply and demand, merged in order (a stable sort of both,
    with 0 first), cut the moved mass into segments; a segment's source bucket is the number of
    supply cumulants at or before it in the merged order (clipped to the last bucket), its
    destination the number of demand cumulants -- the buckets whose mass it carries.  (Counting
    in the merged order, not by a binary search of every segment's midpoint, is linear per row:
    10^5 SA values at t = 1e-5, 33,618 buckets: the plan 56 -> 36 s, the same EMDs to the bit.)"""
    n, n_buckets = x.shape
    y = np.broadcast_to(y, x.shape)               # one table distribution, or one per row
    supply = np.cumsum(np.maximum(x - y, 0.0), axis=1)     # cumulative residuals
    demand = np.cumsum(np.maximum(y - x, 0.0), axis=1)
    moved = np.minimum(supply[:, -1], demand[:, -1])                # equal up to rounding
    merged = np.concatenate((np.zeros((n, 1)), supply, demand), axis=1)
    order = np.argsort(merged, axis=1, kind="stable")
    pts = np.minimum(np.take_along_axis(merged, order, axis=1), moved[:, None])
    del merged
    length = np.diff(pts, axis=1)                 # (n, 2 n_buckets)
    del pts
    # segment p lies after sorted position p: the supply cumulants at positions 0..p are the buckets
    # it has passed; the 0 sorts first (no cumulant is below it, and it is first among equals), so the
    # other p - passed of those positions are demand cumulants
    passed = np.cumsum((order >= 1) & (order <= n_buckets), axis=1, dtype=np.int64)[:, :-1]
    del order
    dst = np.minimum(np.arange(2 * n_buckets)[None, :] - passed, n_buckets - 1)
    src = np.minimum(passed, n_buckets - 1)
    return (length * pair_distance(src, dst)).sum(axis=1)


def _unique_rows(vectors: np.ndarray):
    """Distinct rows of ``vectors`` and the inverse index.  All nodes of one tree level come
    from repeated halving of one vector, so each component takes at most two adjacent values
    and a row is a bitmask over the components: a 1-D unique instead of a lexicographic sort."""
    offsets = vectors - vectors.min(axis=0)
    n_buckets = vectors.shape[1]
    if n_buckets <= 62 and offsets.max(initial=0) <= 1:
        key = offsets @ (np.int64(1) << np.arange(n_buckets, dtype=np.int64))
        _, first, inv = np.unique(key, return_index=True, return_inverse=True)
        return vectors[first], np.asarray(inv).reshape(-1)
    first: dict = {}                              # row bytes -> first row (no B-field structured sort)
    inv = np.fromiter((first.setdefault(v.tobytes(), i) for i, v in enumerate(vectors)),
                      dtype=np.int64, count=len(vectors))
    rows, inv = np.unique(inv, return_inverse=True)
    return vectors[rows], np.asarray(inv).reshape(-1)


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


def _splits(vectors: np.ndarray, bucket_emd: BucketEMD, U: float, t: float, k: int):
    """Dichotomize every count vector (row); ok[i]: Theorem 4 allows splitting row i (both
    halves keep >= k tuples and EMD(half) + U <= t)."""
    c1, c2 = dichotomize(vectors)
    ok = (c2.sum(axis=1) >= k) & (c1.sum(axis=1) >= k)
    if ok.any():
        both = bucket_emd(np.concatenate((c1[ok], c2[ok])))    # one call for both halves
        e1, e2 = both[:int(ok.sum())], both[int(ok.sum()):]
        limit = t - margin(bucket_emd)
        good = (e1 + U <= limit) & (e2 + U <= limit)
        ok[np.flatnonzero(ok)[~good]] = False
    return c1, c2, ok


def ec_count(counts, bucket_emd: BucketEMD, U: float, t: float, k: int = 1) -> int:
    """The number of ECs ``ec_size`` would make, without building its templates.

    Which vectors split is decided as ``ec_size`` decides it (both halves keep >= k tuples
    and EMD(half) + U <= t - margin), on distinct vectors, and a vector's leaf count is 1 or
    the sum of its halves'.  The bound is evaluated speculatively: the tree is expanded as
    far as k alone allows, for up to ``SPECULATE`` vectors, and all their halves go to one
    ``bucket_emd`` call; expansion then resumes from the vectors reachable through the splits
    allowed.  (Each level has at most B + 1 distinct vectors, so this replaces a call per
    level by a call per chunk; vectors evaluated but unreachable only cost their EMD.)"""
    counts = np.asarray(counts, dtype=np.int64)
    t, k = check_t(t), check_k(k, counts.sum())
    limit = t - margin(bucket_emd)
    halves: dict = {}                             # vector bytes -> (half bytes, half bytes) | None
    level = counts[None, :]
    reached = {counts.tobytes()}
    while len(level):
        checkpoint()
        parents, firsts, seconds, level = _expand(level, k, halves)
        if len(parents):
            e = bucket_emd(np.concatenate((firsts, seconds)))     # one call for the chunk
            e1, e2 = e[:len(parents)], e[len(parents):]
            ok = (e1 + U <= limit) & (e2 + U <= limit)
            for p, a, b, good in zip(parents, firsts, seconds, ok.tolist()):
                checkpoint()
                key = p.tobytes()
                halves[key] = (a.tobytes(), b.tobytes()) if good else None
                if good and key in reached:       # parents come level by level
                    reached.update(halves[key])
        level = np.array([v for v in level if v.tobytes() in reached]).reshape(-1, len(counts))
    leaves: dict = {}

    def n_leaves(key):
        if key not in leaves:
            h = halves[key]
            leaves[key] = 1 if h is None else n_leaves(h[0]) + n_leaves(h[1])
        return leaves[key]

    return n_leaves(counts.tobytes())


def ec_counts(roots, k: int = 1) -> list:
    """:func:`ec_count` of many EC-size trees at once: ``roots`` are (bucket EMD, bucket
    counts, U, t), each with its own bucketization and table (the bucket EMD gives the
    ground distance, and may be shared by trees of the same bucketization: each tree's
    table distribution is its own bucket counts').  The trees grow level by level
    together: one dichotomize of every tree's distinct vectors per level, and one bound
    evaluation per level (:func:`_split_allowed`).  A tree's nodes are kept as distinct
    vectors with their multiplicity; a vector whose split is refused (the rule of
    ``ec_count``: both halves keep >= k tuples and EMD(half) + U <= t - margin) adds its
    multiplicity to its tree's leaves.  sabre_estimate evaluates its resampled plans with it."""
    k = max(int(k), 1)
    bounds = _RootBounds(roots)
    vectors, root, base = bounds.counts, np.arange(len(roots)), bounds.counts
    many = np.ones(len(roots))                    # float64: exact below 2^53 nodes
    leaves = np.zeros(len(roots))
    while len(vectors):
        checkpoint()
        c1, c2 = dichotomize(vectors)
        ok = (c1.sum(axis=1) >= k) & (c2.sum(axis=1) >= k)
        tried = np.flatnonzero(ok)
        if len(tried):
            ok[tried] = _split_allowed(bounds, c1[tried], c2[tried], root[tried])
        leaves += np.bincount(root[~ok], weights=many[~ok], minlength=len(roots))
        if not ok.any():
            break
        base = base >> 1
        root, vectors, many = _merge_rows(np.concatenate((root[ok], root[ok])), np.concatenate((c1[ok], c2[ok])),
                                          np.concatenate((many[ok], many[ok])), base)
    return [int(x) for x in leaves]


def _split_allowed(bounds, c1: np.ndarray, c2: np.ndarray, root: np.ndarray) -> np.ndarray:
    """Theorem 4 for the halves c1, c2 of trees ``root``: EMD(half) + U <= t - margin for
    both.  Both ground distances are at most 1, so the EMD is at most the total variation
    distance (the mass that must move); a pair whose total variation passes with room to
    spare (``TV_ROOM`` above rounding) passes, and only the others are given to the EMD."""
    U, limit = bounds.U[root], bounds.limit[root]
    tables = bounds.tables[root]
    both = np.concatenate((c1[None], c2[None]))
    tv = 0.5 * np.abs(both / np.maximum(both.sum(axis=2, keepdims=True), 1) - tables).sum(axis=2)
    ok = (tv.max(axis=0) + U <= limit - TV_ROOM)
    exact = np.flatnonzero(~ok)
    if len(exact):
        e = bounds(np.concatenate((c1[exact], c2[exact])), np.concatenate((root[exact], root[exact])))
        ok[exact] = (e[:len(exact)] + U[exact] <= limit[exact]) & (e[len(exact):] + U[exact] <= limit[exact])
    return ok


TV_ROOM = 1e-9         # far above the float64 rounding of a total variation or an EMD of <= 2B terms


def _merge_rows(root: np.ndarray, vectors: np.ndarray, many: np.ndarray, base: np.ndarray) -> tuple:
    """The distinct (tree, vector) rows and their summed multiplicities.  Halving keeps a
    tree's level within two adjacent values per component: if every vector's component is
    a or a + 1, every half's is floor(a/2) or floor(a/2) + 1.  So with ``base`` (per tree,
    the root's counts halved once per level, rounding down) a row is its tree and a bitmask
    over the components (a 1-D unique); a lexicographic unique is the fallback."""
    offsets = vectors - base[root]
    width = vectors.shape[1]
    if width + int(root.max()).bit_length() <= 62 and offsets.min() >= 0 and offsets.max() <= 1:
        key = (root << width) + offsets @ (np.int64(1) << np.arange(width, dtype=np.int64))
        _, first, where = np.unique(key, return_index=True, return_inverse=True)
    else:
        _, first, where = np.unique(np.column_stack((root, vectors)), axis=0, return_index=True, return_inverse=True)
    total = np.bincount(np.asarray(where).reshape(-1), weights=many, minlength=len(first))
    return root[first], vectors[first], total


class _RootBounds:
    """The Theorem-4 bound of :func:`ec_counts`' trees: EMD of count vectors (rows, padded
    with zero buckets to the widest tree) against their own tree's table distribution.
    Numerical trees are evaluated together, row by row with their own bucket ranges (one
    flow computation per call); categorical trees one call per bucketization."""

    def __init__(self, roots):
        width = max(len(counts) for _, counts, _, _ in roots)
        self.counts = np.zeros((len(roots), width), dtype=np.int64)
        self.tables = np.zeros((len(roots), width))
        self.lo, self.hi, self.span = np.zeros((len(roots), width)), np.zeros((len(roots), width)), np.ones(len(roots))
        self.U = np.array([U for _, _, U, _ in roots], dtype=np.float64)
        self.limit = np.array([check_t(t) - margin(emd) for emd, _, _, t in roots])
        self.emds = [emd for emd, _, _, _ in roots]
        self.numerical = np.array([emd.bucketization.domain.numerical and emd.n_buckets > 1 for emd in self.emds])
        self.width = np.array([emd.n_buckets for emd in self.emds])
        for i, (emd, counts, _, _) in enumerate(roots):
            b = len(counts)
            self.counts[i, :b] = counts
            self.tables[i, :b] = np.asarray(counts, dtype=np.float64) / np.sum(counts)
            if self.numerical[i]:
                self.lo[i, :b], self.hi[i, :b], self.span[i] = emd.lo, emd.hi, emd.span

    def __call__(self, vectors: np.ndarray, root: np.ndarray) -> np.ndarray:
        """EMD(vector, its tree's table) of each row; ``root`` gives each row's tree."""
        x = vectors / np.maximum(vectors.sum(axis=1, keepdims=True), 1)
        out = np.zeros(len(vectors))
        rows = np.flatnonzero(self.numerical[root])
        if len(rows):
            r = root[rows]
            lo, hi, span = self.lo[r], self.hi[r], self.span[r][:, None]

            def pair_distance(i, j):
                line = np.arange(len(rows))[:, None]
                d = (np.maximum(hi[line, i], hi[line, j]) - np.minimum(lo[line, i], lo[line, j])) / span
                return np.where(i == j, 0.0, d)

            out[rows] = _residual_nw_cost(x[rows], self.tables[r], pair_distance)
        other = np.flatnonzero(~self.numerical[root])
        groups: dict = {}
        for i in other.tolist():
            checkpoint()
            groups.setdefault(bucketization_key(self.emds[root[i]].bucketization), []).append(i)
        for rows in groups.values():
            rows = np.asarray(rows)
            emd, b = self.emds[root[rows[0]]], self.width[root[rows[0]]]
            out[rows] = emd.distribution_emd(x[rows, :b], self.tables[root[rows], :b])
        return out


def bucketization_key(bz) -> tuple:
    """Bucketizations with equal keys have equal bucket ground distances: the same domain
    (kind, size, hierarchy) and bucket ranges (a categorical SA's buckets are disjoint
    hierarchy nodes, so the LCA of two of them does not depend on the leaf that represents
    each)."""
    d = bz.domain
    return d.kind, d.m, id(d.hierarchy), tuple((b.lo, b.hi) for b in bz.buckets)


SPECULATE = 256        # vectors whose halves ec_count sends to one bound call


def _expand(level: np.ndarray, k: int, halves: dict) -> tuple:
    """Dichotomize ``level`` and the distinct halves after it, level by level, as far as k
    allows and up to ``SPECULATE`` vectors.  Vectors too small to split are recorded as
    leaves in ``halves``.  Returns (parents, their first halves, their second halves, the
    distinct vectors of the next level, not yet dichotomized)."""
    n_buckets = level.shape[1]
    parts: list = []
    total = 0
    while len(level) and total < SPECULATE:
        checkpoint()
        c1, c2 = dichotomize(level)
        fits = (c2.sum(axis=1) >= k) & (c1.sum(axis=1) >= k)
        for v in level[~fits]:
            checkpoint()
            halves[v.tobytes()] = None
        parts.append((level[fits], c1[fits], c2[fits]))
        total += int(fits.sum())
        kids = np.concatenate((c1[fits], c2[fits]))
        level = _unique_rows(kids)[0] if len(kids) else np.empty((0, n_buckets), np.int64)
    if not parts:
        empty = np.empty((0, n_buckets), np.int64)
        return empty, empty, empty, level
    return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
            np.concatenate([p[2] for p in parts]), level)


def max_classes(n: int, k: int = 1) -> int:
    """The leaves of the EC-size tree of ``n`` tuples when only k limits the splits.

    Dichotomize halves a node of s tuples into ceil(s/2) and floor(s/2) tuples (the odd
    counts' extra tuples alternate), and a split needs floor(s/2) >= k.  The tree of
    :func:`ec_size` / :func:`ec_count` is this tree with some splits refused by Theorem 4,
    so its class count is at most this, for every bucketization and every t."""
    k = max(int(k), 1)
    level = {int(n): 1}                           # node size -> how many nodes have it
    leaves = 0
    while level:
        checkpoint()
        below: dict = {}
        for size, many in level.items():
            if size // 2 >= k:
                for half in ((size + 1) // 2, size // 2):
                    below[half] = below.get(half, 0) + many
            else:
                leaves += many
        level = below
    return leaves


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
    t, k = check_t(t), check_k(k, counts.sum())
    uniq = counts[None, :]                        # distinct count vectors of the current level
    inv = np.zeros(1, dtype=np.int64)             # per node: its vector's row in uniq
    pos = np.zeros(1)                             # dyadic position of each node, for DFS order
    width = 1.0
    leaves, leaf_pos = [], []
    tree: dict = {}
    depth = 0
    while len(inv):
        checkpoint()
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
