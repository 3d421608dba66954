"""Joint bucketization of several sensitive attributes: the thesis's fragments, generalized.

The thesis on t-closeness with several numerical SAs (docs/multiple-sa.md) cuts the joint
SA count matrix M (its *multiplicity matrix*) into rectangular *fragments*; a class that takes
from every fragment F exactly its share |F|/T of the table (it *conforms*) is within
``X_hat = sum_F Delta(R_F)`` of the table on the SA X (its Proposition 7 and Theorem 2), where
R_F is F's marginal on X.  Here, for any number of SAs of any kind:

* a **fragment** is a set of joint cells (distinct SA value combinations) that is a product
  of one SA range per attribute: a value interval (ordered SA) or a hierarchy node
  (hierarchical or equal-distance SA).  Per SA it keeps its smallest and largest *present*
  code (``lo``, ``hi``) -- only values the fragment holds can be drawn from it;
* its **bound** on SA i, Delta_i(F), is SABRE's CET^U of F's marginal on i under **global
  normalization** (ground distances of the whole domain: ``|a - b| / (m_i - 1)``, or
  ``h(LCA) / h(H)``): Theorem 3 (the thesis's ``alpha max(g - 1, k - g) / (k - 1)`` with
  the domain's m - 1 as denominator) or Theorem 2.  ``U_i = sum_F Delta_i(F)``;
* **FIND-FRAGMENTATION**: greedy splits of one fragment along one SA (an interval at its best
  point for that SA's own bound, a node into its children) minimizing the thesis's
  ``Psi = sum_i max(U_i - t_i, 0)`` (here each term over t_i, so the SAs weigh alike),
  ties by ``sum_i U_i / t_i``, until every ``U_i < t_i``.  A split may raise another SA's
  bound (the thesis's Figure 15), which Psi accounts for;
* **relaxed sizing** (the thesis's section 4.1.3, left to future work there): a class taking
  ``n_F`` tuples of each fragment, ``s`` in all, has on every SA i
  ``EMD_i <= U_i + cost_i(n / s -> |F| / T)``, the cost of a feasible flow moving its excess
  fragment mass to its deficits at the largest ground distance between the two fragments'
  values on i (``<= 1/2 sum_F |n_F / s - |F| / T|``, the thesis's relaxed bound).  The proof
  is SABRE's Theorem 4: first the class is moved to the conforming class of the same shapes
  within fragments (that flow), then that one to the table (``<= U_i``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .checkpoint import checkpoint
from .emd import SADomain
from .parameters import check_k, check_t
from .redistribute import ECPlan, _residual_nw_cost, ec_count, ec_size, margin

PSI_TOLERANCE = 1e-12
CHUNK = 4096                       # classes whose bounds are evaluated at once


@dataclass(frozen=True)
class JointCounts:
    """The multiplicity matrix, sparse: distinct SA code combinations (``cells``, one row
    per cell, one column per SA) and the number of tuples of each."""
    cells: np.ndarray
    counts: np.ndarray

    @property
    def n(self) -> int:
        return int(self.counts.sum())

    def marginal(self, i: int, m: int) -> np.ndarray:
        """Tuples per code of SA i."""
        return np.bincount(self.cells[:, i], weights=self.counts, minlength=m).astype(np.int64)


def joint_counts(codes) -> tuple[JointCounts, np.ndarray]:
    """(the joint counts of per-tuple codes (n x d), each tuple's cell)."""
    codes = np.asarray(codes, dtype=np.int64)
    cells, inverse, counts = np.unique(codes, axis=0, return_inverse=True, return_counts=True)
    return JointCounts(cells, counts.astype(np.int64)), np.asarray(inverse).reshape(-1)


def cell_of(cells: np.ndarray, codes: np.ndarray, sizes) -> np.ndarray:
    """The cell (row of ``cells``) of every tuple's codes; -1 where no cell matches.
    ``sizes``: the SAs' domain sizes (mixed-radix keys)."""
    cells, codes = np.asarray(cells, dtype=np.int64), np.asarray(codes, dtype=np.int64)
    stride = np.cumprod([1] + [int(s) for s in sizes[:0:-1]])[::-1]
    if float(np.prod([float(s) for s in sizes])) >= 2.0 ** 62:
        raise ValueError("the joint SA domain is too large (product of domain sizes >= 2^62)")
    ckeys, tkeys = cells @ stride, codes @ stride
    order = np.argsort(ckeys, kind="stable")
    pos = np.clip(np.searchsorted(ckeys[order], tkeys), 0, len(order) - 1)
    found = order[pos]
    return np.where(ckeys[found] == tkeys, found, -1)


def marginal_bound(domain: SADomain, codes: np.ndarray, weights: np.ndarray, n: int):
    """(lo, hi, Delta) of a fragment's marginal on one SA: its smallest and largest present
    code and the largest EMD (global normalization) between it and any distribution of the
    same mass over those values (Theorems 2 and 3 of SABRE)."""
    lo, hi = int(codes.min()), int(codes.max())
    if lo == hi:
        return lo, hi, 0.0
    if domain.numerical:
        s0, s1 = float(weights.sum()), float((codes * weights).sum())
        return lo, hi, max(s1 - lo * s0, hi * s0 - s1) / n / (domain.m - 1)
    h = domain.hierarchy
    level = int(h.lca_level(lo, hi))
    if level == 0 or h.height == 0:
        return lo, hi, 0.0
    per_code = np.bincount(codes - lo, weights=weights)
    return lo, hi, level / h.height * (float(per_code.sum()) - float(per_code[per_code > 0].min())) / n


@dataclass
class Fragment:
    cells: np.ndarray              # rows of the joint counts
    lo: np.ndarray                 # per SA: smallest present code
    hi: np.ndarray                 # per SA: largest present code
    bounds: np.ndarray             # per SA: Delta_i (global normalization)
    size: int                      # tuples


def make_fragment(joint: JointCounts, cells: np.ndarray, domains) -> Fragment:
    w = joint.counts[cells]
    n = joint.n
    parts = [marginal_bound(d, joint.cells[cells, i], w, n) for i, d in enumerate(domains)]
    lo, hi, bounds = (np.array(v) for v in zip(*parts))
    return Fragment(cells, lo.astype(np.int64), hi.astype(np.int64), bounds.astype(np.float64), int(w.sum()))


def split(joint: JointCounts, f: Fragment, i: int, domains) -> list | None:
    """F split along SA i: an interval at the point minimizing SA i's bound, a hierarchy
    node into its non-empty children.  None when F holds one value (or leaf group) of i."""
    if f.lo[i] == f.hi[i]:
        return None
    codes = joint.cells[f.cells, i]
    d = domains[i]
    if d.numerical:
        values = np.unique(codes)
        w = np.bincount(np.searchsorted(values, codes), weights=joint.counts[f.cells])
        v = values.astype(np.float64)
        c0, c1 = np.cumsum(w), np.cumsum(w * v)
        j = np.arange(1, len(values))               # left = values[:j], right = values[j:]
        left = np.maximum(c1[j - 1] - v[0] * c0[j - 1], v[j - 1] * c0[j - 1] - c1[j - 1])
        r0, r1 = c0[-1] - c0[j - 1], c1[-1] - c1[j - 1]
        right = np.maximum(r1 - v[j] * r0, v[-1] * r0 - r1)
        cut = values[int(j[np.argmin(left + right)])]
        groups = (codes >= cut).astype(np.int64)
    else:
        h = d.hierarchy
        level = int(h.lca_level(int(f.lo[i]), int(f.hi[i])))
        if level == 0:
            return None
        groups = h.anc[codes, level - 1]
    keys, inverse = np.unique(groups, return_inverse=True)
    if len(keys) < 2:
        return None
    inverse = np.asarray(inverse).reshape(-1)
    order = np.argsort(inverse, kind="stable")
    bounds = np.searchsorted(inverse[order], np.arange(len(keys) + 1))
    return [make_fragment(joint, f.cells[order[bounds[g]:bounds[g + 1]]], domains) for g in range(len(keys))]


@dataclass
class Fragmentation:
    """A set of fragments covering the table's SA combinations, with ``U`` per SA."""
    fragments: list
    domains: list
    joint: JointCounts
    trace: list = field(default_factory=list)      # (fragment split, SA, U after)

    @property
    def n_fragments(self) -> int:
        return len(self.fragments)

    @property
    def U(self) -> np.ndarray:
        return np.sum([f.bounds for f in self.fragments], axis=0)

    def counts(self) -> np.ndarray:
        return np.array([f.size for f in self.fragments], dtype=np.int64)

    def fragment_of_cell(self) -> np.ndarray:
        out = np.full(len(self.joint.counts), -1, dtype=np.int64)
        for j, f in enumerate(self.fragments):
            out[f.cells] = j
        return out


def psi(U: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """The thesis's split criterion, each SA's excess over its t relative to t (rows of U)."""
    return (np.maximum(U - ts, 0.0) / ts).sum(axis=-1)


def satisfied(U, ts) -> bool:
    return bool(np.all(np.asarray(U) < np.asarray(ts)))


def find_fragmentation(joint: JointCounts, domains, ts, lookahead: int = 0) -> list:
    """FIND-FRAGMENTATION: greedy splits from the single fragment until every U_i < t_i, and
    up to ``lookahead`` further splits.  Returns every fragmentation with all U_i < t_i met on
    the way (the first is the thesis's)."""
    ts = np.array([check_t(t) for t in ts], dtype=np.float64)
    if len(ts) != len(domains) or joint.cells.shape[1] != len(domains):
        raise ValueError("one t per SA is needed: %d SAs, %d t" % (len(domains), len(ts)))
    frags = [make_fragment(joint, np.arange(len(joint.counts)), domains)]
    cand = [_candidates(joint, frags[0], domains)]
    U = frags[0].bounds.copy()
    out, trace = [], []
    while True:
        checkpoint()
        if satisfied(U, ts):
            out.append(Fragmentation(list(frags), domains, joint, list(trace)))
            if len(out) > lookahead:
                return out
        best = _best(cand, U, ts)
        if best is None:                   # every fragment is one cell: U = 0
            if not out:
                out.append(Fragmentation(list(frags), domains, joint, list(trace)))
            return out
        j, i = best
        parts = cand[j][i][0]
        frags[j:j + 1] = parts
        cand[j:j + 1] = [_candidates(joint, p, domains) for p in parts]
        U = np.sum([f.bounds for f in frags], axis=0)     # as Fragmentation.U sums (no drift)
        trace.append((j, i, U.copy()))


def _candidates(joint, f, domains) -> list:
    """Per SA: (parts, change of U) of splitting f along it, or None."""
    out = []
    for i in range(len(domains)):
        parts = split(joint, f, i, domains)
        out.append(None if parts is None else (parts, np.sum([p.bounds for p in parts], axis=0) - f.bounds))
    return out


def _best(cand, U, ts):
    """(fragment, SA) of the split with the least Psi after it, ties by sum U_i / t_i."""
    where, deltas = [], []
    for j, per_sa in enumerate(cand):
        for i, c in enumerate(per_sa):
            if c is not None:
                where.append((j, i))
                deltas.append(c[1])
    if not where:
        return None
    after = U[None, :] + np.array(deltas)
    p = np.round(psi(after, ts) / PSI_TOLERANCE) * PSI_TOLERANCE
    order = np.lexsort(((after / ts).sum(axis=1), p))
    return where[int(order[0])]


class JointBound:
    """The relaxed bound of the module doc for classes given as fragment counts (rows),
    as the largest ratio ``bound_i / t_i`` over the SAs: a class is allowed iff <= 1."""

    def __init__(self, fragmentation: Fragmentation, ts):
        self.ts = np.asarray(ts, dtype=np.float64)
        self.U = fragmentation.U
        counts = fragmentation.counts().astype(np.float64)
        # the rounding of a bound / t: the residual flow over the fragments, U, and the ratio
        self.terms = 2 * len(counts) + sum(d.m for d in fragmentation.domains)
        self.table = counts / counts.sum()
        lo = np.array([f.lo for f in fragmentation.fragments]).reshape(-1, len(self.ts))
        hi = np.array([f.hi for f in fragmentation.fragments]).reshape(-1, len(self.ts))
        self.per_sa = []
        for i, d in enumerate(fragmentation.domains):
            order = np.lexsort((hi[:, i], lo[:, i]))      # monotone order for the flow
            a = np.minimum(lo[order, i][:, None], lo[order, i][None, :])
            b = np.maximum(hi[order, i][:, None], hi[order, i][None, :])
            distance = d.distance(a, b)
            np.fill_diagonal(distance, 0.0)
            self.per_sa.append((order, distance))

    def bounds(self, counts) -> np.ndarray:
        """Per class (row) and SA: the upper bound of its EMD."""
        counts = np.atleast_2d(np.asarray(counts, dtype=np.float64))
        x = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1.0)
        out = np.empty((len(x), len(self.ts)))
        for i, (order, distance) in enumerate(self.per_sa):
            flow = _residual_nw_cost(x[:, order], self.table[order], _pairs(distance)) if len(order) > 1 \
                else np.zeros(len(x))
            out[:, i] = self.U[i] + flow
        return out

    def __call__(self, counts) -> np.ndarray:
        return (self.bounds(counts) / self.ts).max(axis=1)


def _pairs(distance: np.ndarray):
    """The pair lookup ``_residual_nw_cost`` takes, over a full distance matrix."""
    return lambda src, dst: distance[src, dst]


# --------------------------------------------------------------------------- sizing
def even_templates(counts, s: int, first: int = 0, last: int | None = None) -> np.ndarray:
    """Classes ``first..last-1`` of the even split of the fragment counts into s classes:
    each takes ``count // s`` of every fragment and the remainders go round-robin (fragment
    j's extra tuples to the classes following fragment j-1's), so sizes differ by at most one
    and a split where s divides every count conforms exactly (the thesis's GCD sizing)."""
    counts = np.asarray(counts, dtype=np.int64)
    last = s if last is None else last
    r = counts % s
    offset = (np.cumsum(r) - r) % s
    j = np.arange(first, last, dtype=np.int64)[:, None]
    return counts[None, :] // s + (((j - offset[None, :]) % s) < r[None, :])


def even_split_fits(counts, s: int, bound, k: int) -> bool:
    """Every class of the even split into s classes has >= k tuples and bound <= 1."""
    if int(np.sum(counts)) // s < k:
        return False
    for first in range(0, s, CHUNK):
        checkpoint()
        if (bound(_distinct_rows(even_templates(counts, s, first, min(s, first + CHUNK)))) > 1.0 - margin(bound)).any():
            return False
    return True


def _distinct_rows(rows: np.ndarray) -> np.ndarray:
    """The distinct rows of an even split's templates: each entry is ``count // s`` or one
    more, so a row is a bitmask over the fragments (a 1-D unique when they are <= 62)."""
    extra = rows - rows.min(axis=0)
    if rows.shape[1] > 62 or extra.max(initial=0) > 1:
        return np.unique(rows, axis=0)
    _, first = np.unique(extra @ (np.int64(1) << np.arange(rows.shape[1], dtype=np.int64)), return_index=True)
    return rows[first]


def even_split_classes(counts, bound, k: int) -> int:
    """The most classes of an even split found: a binary search over s (the bound grows
    with s, mostly), and the GCD of the counts (or its largest divisor leaving >= k tuples
    per class), which conforms exactly."""
    counts = np.asarray(counts, dtype=np.int64)
    n = int(counts.sum())
    lo, hi = 1, max(1, n // k)
    while lo < hi:
        checkpoint()
        mid = (lo + hi + 1) // 2
        if even_split_fits(counts, mid, bound, k):
            lo = mid
        else:
            hi = mid - 1
    g = int(np.gcd.reduce(counts))
    divisors = [d for i in range(1, int(g ** 0.5) + 1) if g % i == 0 for d in (i, g // i)]
    for d in sorted(set(divisors), reverse=True):
        if d <= lo:
            break
        if even_split_fits(counts, d, bound, k):
            return d
    return lo


def size_classes(fragmentation: Fragmentation, ts, k: int = 1, count_only: bool = False):
    """Class templates (an ``ECPlan``) for the fragmentation: SABRE's ECSize (dichotomize
    while every SA's relaxed bound allows) or the even split, whichever makes more classes.
    ``count_only``: just that number of classes."""
    counts = fragmentation.counts()
    k = check_k(k, int(counts.sum()))
    bound = JointBound(fragmentation, ts)
    even = even_split_classes(counts, bound, k)
    tree = ec_count(counts, bound, 0.0, 1.0, k)
    if count_only:
        return max(even, tree)
    if even > tree:
        return ECPlan(even_templates(counts, even), 0, {})
    return ec_size(counts, bound, 0.0, 1.0, k)
