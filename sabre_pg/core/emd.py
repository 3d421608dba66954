"""Earth Mover's Distance (§3.1 of SABRE, after Li et al. 2007).

* Ordered EMD, numerical SA over its m sorted distinct values, ground distance |i-j|/(m-1):
  ``EMD = 1/(m-1) * sum_{i<m} |sum_{j<=i} (p_j - q_j)|`` (0 when m == 1).
* Hierarchical EMD, categorical SA with hierarchy H, ground distance h(LCA)/h(H):
  ``extra(leaf) = p - q``, ``extra(n) = sum extra(children)``, ``pos_e``/``neg_e`` the sums of
  the positive / negative child extras, ``cost(n) = h(n)/h(H) * min(pos_e, neg_e)``,
  ``EMD = sum of cost(n) over internal nodes``.  With the flat hierarchy this is the equal
  distance ``1/2 * sum |p - q|``.

All functions take distributions along the last axis, so a (classes x values) matrix is
handled in one numpy pass.  ``class_emds`` computes the EMD of every equivalence class from
the per-tuple class ids and SA codes without materializing a dense matrix when that would be
large (numerical SA: exact, O(n log m)).
"""
from __future__ import annotations

import numpy as np

from .checkpoint import checkpoint
from .hierarchy import Hierarchy


def ordered_emd(p, q) -> np.ndarray | float:
    """Ordered-distance EMD between distributions p and q (last axis = sorted values)."""
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    m = max(p.shape[-1], q.shape[-1])
    if m <= 1:
        out = np.zeros(np.broadcast_shapes(p.shape, q.shape)[:-1])
    else:
        out = np.abs(np.cumsum(p - q, axis=-1)[..., :-1]).sum(axis=-1) / (m - 1)
    return float(out) if np.ndim(out) == 0 else out


def equal_emd(p, q) -> np.ndarray | float:
    """Equal ground distance (flat hierarchy): half the L1 distance."""
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    out = 0.5 * np.abs(p - q).sum(axis=-1)
    return float(out) if np.ndim(out) == 0 else out


class _TreePlan:
    """Per-hierarchy arrays for the vectorized hierarchical EMD (cached on the hierarchy)."""

    def __init__(self, h: Hierarchy):
        self.height = h.height
        self.levels = []
        for lvl in range(1, h.height + 1):
            nodes = np.flatnonzero(h.level == lvl)
            kids = np.flatnonzero(h.level == lvl - 1)       # pre-order within the level
            # children of consecutive parents are consecutive runs; starts of each run
            starts = np.searchsorted(h.lo[kids], h.lo[nodes])
            self.levels.append((lvl, h.lo[kids], h.hi[kids], starts))


def _plan(h: Hierarchy) -> _TreePlan:
    plan = getattr(h, "_emd_plan", None)
    if plan is None:
        plan = h._emd_plan = _TreePlan(h)
    return plan


def hierarchical_emd(p, q, hierarchy: Hierarchy) -> np.ndarray | float:
    """Hierarchical EMD; p and q are indexed by pre-order leaf position (last axis)."""
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    d = p - q
    if d.shape[-1] != hierarchy.n_leaves:
        raise ValueError("distribution has %d values, hierarchy has %d leaves"
                         % (d.shape[-1], hierarchy.n_leaves))
    plan = _plan(hierarchy)
    lead = d.shape[:-1]
    d2 = d.reshape(-1, d.shape[-1])
    cumulative = np.zeros((d2.shape[0], d2.shape[1] + 1))     # prefix sums of p - q
    np.cumsum(d2, axis=1, out=cumulative[:, 1:])
    total = np.zeros(d2.shape[0])
    if plan.height:
        for lvl, klo, khi, starts in plan.levels:
            extra = cumulative[:, khi] - cumulative[:, klo]                   # extra() of every node one level down
            pos = np.add.reduceat(np.maximum(extra, 0.0), starts, axis=1)
            neg = np.add.reduceat(np.maximum(-extra, 0.0), starts, axis=1)
            total += (lvl / plan.height) * np.minimum(pos, neg).sum(axis=1)
    out = total.reshape(lead)
    return float(out) if np.ndim(out) == 0 else out


class SADomain:
    """The sensitive attribute's value domain and its ground distance.

    kind 'numerical': codes 0..m-1 index the sorted distinct values present in the table.
    kind 'categorical': codes are pre-order leaf positions of ``hierarchy`` (flat if none).
    """

    def __init__(self, kind: str, m: int | None = None, hierarchy: Hierarchy | None = None):
        if kind not in ("numerical", "categorical"):
            raise ValueError("SA kind must be 'numerical' or 'categorical', not %r" % (kind,))
        self.kind = kind
        if kind == "categorical":
            if hierarchy is None:
                raise ValueError("a categorical SA needs a hierarchy (use Hierarchy.flat)")
            self.hierarchy = hierarchy
            self.m = hierarchy.n_leaves
        else:
            if m is None or m < 1:
                raise ValueError("a numerical SA needs m >= 1 distinct values")
            self.hierarchy = None
            self.m = int(m)

    @property
    def numerical(self) -> bool:
        return self.kind == "numerical"

    def emd(self, p, q):
        if self.numerical:
            return ordered_emd(p, q)
        return hierarchical_emd(p, q, self.hierarchy)

    def distance(self, i, j):
        """Ground distance between codes i and j (vectorized)."""
        i = np.asarray(i)
        j = np.asarray(j)
        if self.numerical:
            return np.abs(i - j) / (self.m - 1) if self.m > 1 else np.zeros(np.broadcast(i, j).shape)
        h = self.hierarchy
        if h.height == 0:
            return np.zeros(np.broadcast(i, j).shape)
        return h.lca_level(i, j) / h.height

    def distance_matrix(self) -> np.ndarray:
        idx = np.arange(self.m)
        return self.distance(idx[:, None], idx[None, :])


def class_emds(ec: np.ndarray, codes: np.ndarray, domain: SADomain,
               n_classes: int | None = None, q: np.ndarray | None = None,
               chunk_cells: int = 500_000, order: np.ndarray | None = None) -> np.ndarray:
    """EMD of every class against the table distribution ``q`` (default: of ``codes``).

    ``ec[i]`` is tuple i's class id in 0..n_classes-1, ``codes[i]`` its SA code; ``order``
    (optional) lists the tuples sorted by class, as ``generalize.ECIndex.order`` does.
    Class x value count matrices of at most ``chunk_cells`` cells are evaluated densely; a
    numerical SA whose matrix would exceed 16 cells per tuple uses the sparse O(n log m) path.
    """
    ec = np.asarray(ec, dtype=np.int64)
    codes = np.asarray(codes, dtype=np.int64)
    m = domain.m
    if n_classes is None:
        n_classes = int(ec.max()) + 1
    if q is None:
        q = np.bincount(codes, minlength=m) / len(codes)
    sizes = np.bincount(ec, minlength=n_classes).astype(np.float64)
    if domain.numerical and n_classes * m > max(chunk_cells, 16 * len(ec)):
        return _ordered_class_emds_sparse(ec, codes, m, n_classes, q, sizes)
    out = np.empty(n_classes)
    step = max(1, chunk_cells // max(m, 1))
    if order is None:
        order = np.argsort(ec, kind="stable")
    ec_s, codes_s = ec[order], codes[order]
    bounds = np.searchsorted(ec_s, np.arange(0, n_classes + step, step))
    for c0 in range(0, n_classes, step):
        checkpoint()
        c1 = min(n_classes, c0 + step)
        a, b = bounds[c0 // step], bounds[c0 // step + 1]
        cnt = np.bincount((ec_s[a:b] - c0) * m + codes_s[a:b], minlength=(c1 - c0) * m)
        distributions = cnt.reshape(c1 - c0, m) / np.maximum(sizes[c0:c1, None], 1.0)
        out[c0:c1] = domain.emd(distributions, q[None, :])
    return out


def _ordered_class_emds_sparse(ec, codes, m, n_classes, q, sizes):
    """Exact ordered EMD per class in O(n log m) without a dense class x value matrix.

    Per class, F_P (its CDF) is a step function that is constant between consecutive distinct
    codes of the class; F_Q is non-decreasing, so sum |c - F_Q(i)| over a run of i is found
    with one binary search and prefix sums of F_Q.
    """
    if m <= 1:
        return np.zeros(n_classes)
    cdf_q = np.cumsum(q)[:-1]                      # F_Q(i) for i = 0..m-2
    pre = np.concatenate(([0.0], np.cumsum(cdf_q)))  # pre[i] = sum_{j<i} cdf_q[j]
    # distinct (class, code) pairs with counts, sorted by class then code
    key = ec * m + codes
    uk, cnt = np.unique(key, return_counts=True)
    cls = uk // m
    cod = uk % m
    frac = cnt / sizes[cls]
    # CDF of the class after each distinct code (cumulative within class)
    csum = np.cumsum(frac)
    first = np.r_[True, cls[1:] != cls[:-1]]
    start_idx = np.flatnonzero(first)
    base = np.repeat(np.r_[0.0, csum[start_idx[1:] - 1]], np.diff(np.r_[start_idx, len(cls)]))
    c = csum - base                              # F_P on [cod, next_cod)
    nxt = np.r_[cod[1:], m - 1]
    last = np.r_[cls[1:] != cls[:-1], True]
    nxt[last] = m - 1                            # the final run goes to m-2 inclusive
    a = cod
    b = np.minimum(nxt, m - 1)                   # run is i in [a, b), with i <= m-2
    # the run before the class's first code: F_P = 0 on [0, first_code)
    total = np.zeros(n_classes)
    s = np.clip(np.searchsorted(cdf_q, c, side="left"), a, b)   # i < s: cdf_q < c
    seg = c * (s - a) - (pre[s] - pre[a]) + (pre[b] - pre[s]) - c * (b - s)
    np.add.at(total, cls, seg)
    total[cls[first]] += pre[cod[first]]        # sum_{i < first code} |0 - F_Q(i)|
    return total / (m - 1)
