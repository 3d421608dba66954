"""S-INSTANT: full-domain generalization predicted from a summary, validated on the data.

Nergiz, Tamersoy, Saygin, "Instant anonymization", ACM TODS 36(1), 2011 (§3-§6).  Pure numpy.

* **The lattice** (§2.1, Def. 2.3): each quasi-identifier (QI) has a list of levels
  (:class:`QILevels`): level 0 is the value itself, the last level ``*`` (one group).  A
  node is one level per QI; ``a`` is higher than ``b`` when it is at least as general in every
  QI.  Categorical QIs take the levels of their hierarchy; a numerical QI without one gets
  *interval levels* of doubling widths aligned on one origin (:func:`interval_levels`).
* **The summary** F (Def. 2.9): per QI a marginal over its level-0 cells (the histogram
  variant: QIs independent) and, optionally, a list of most common value combinations with
  their frequencies (PostgreSQL's extended MCV statistics, in the role of the paper's
  Bayesian network); the rest of the mass is spread by independence (:class:`Summary`).
  The combinations may be of generalized values, at one node of the lattice (expression
  statistics; :func:`joint_level` chooses the node, :func:`transition` carries it to others).
* **Bucket likelihoods** ell_i = F(b_i) of a node's buckets (Def. 4.1, Eq. 1).
* **mu-probability** (§4.1, §5.1): the probability that every bucket is empty or satisfies
  the condition (size >= k and, for l-diversity, >= l distinct sensitive values).  Levin's
  representation (Levin 1981): with independent ``X_i ~ Poisson(N ell_i)``, the multinomial
  bucket sizes are the X_i conditioned on ``sum X_i = N``, so

      P(all buckets pass) = P(sum Y_i = N) / P(sum X_i = N) * prod_i P(X_i passes)

  where ``Y_i`` is X_i truncated to its passing values.  ``P(sum X_i = N)`` is the Poisson(N)
  point mass; ``P(sum Y_i = N)`` the normal approximation with continuity correction.  (The
  paper's Algorithm 3 puts the truncated sum in the denominator; this is Levin's form.)
* **mu-expectation** (§4.2, §5.2): the expected number of rows in failing buckets.
* **Optimizations** (§6): SD_CUT (a bucket's sums run over mean +- ``sd`` sigma only, and a
  bucket whose whole window passes costs nothing), HYBRID (k-anonymity: the truncated moments
  of a bucket with mean >= 9 from the normal approximation), LIMIT (the conditional
  l-diversity probability is taken as constant once it is within ``LIMIT_EPS`` of its limit).
* **The walk** (Algorithm 1, lines 1-11): top-down by level sum; a node is evaluated only if
  every parent passed (anti-monotonicity, Theorem 3.5), the survivors sorted by predicted LM
  (the loss metric of Iyengar 2002, computed from the marginals).

Distinct l-diversity (at least l distinct sensitive values per class) is the condition here,
not the paper's frequency form (Def. 2.7): the conditional probability that a class of x rows
holds l distinct values is computed from the occupancy indicators (:func:`distinct_probability`).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from . import limits
from .checkpoint import checked, checkpoint

SD_CUT = 5.0                   # sums over mean +- SD_CUT sigma
HYBRID_MIN_MEAN = 9.0          # Poisson(m) as normal when m - 3 sqrt(m) >= 0
LIMIT_EPS = 1e-6               # LIMIT: the conditional l-diversity probability is final within this
LIMIT_MAX_SIZE = 1 << 14       # ... or at this class size
EXACT_OCCUPANCY = 64           # class sizes with exact distinct-value probabilities
BUCKETS_PER_ROW = 64           # a node with more buckets than this x N is pruned unevaluated
CHUNK = 1 << 21                # matrix cells per chunk of the windowed sums
# Bounds on the work a call can ask for (docs/instant.md, "Bounds"): the lattice is refused
# beyond MAX_LATTICE_NODES nodes before any node is made (the product of the QIs' level
# counts; 7 census QIs make 7,056, Adult's 6 a few hundred), and a node of more than
# MAX_NODE_BUCKETS buckets is pruned unevaluated like one of more than BUCKETS_PER_ROW x N
# (each costs arrays of that many cells).
MAX_LATTICE_NODES = limits.INSTANT_LATTICE_NODES
MAX_NODE_BUCKETS = limits.INSTANT_NODE_BUCKETS


class LatticeTooLarge(limits.LimitExceeded):
    """The lattice of the QIs' levels has more than :data:`MAX_LATTICE_NODES` nodes."""

    def __init__(self, names, levels, nodes: int, cap: int):
        self.names, self.levels, self.nodes, self.cap = tuple(names), tuple(levels), nodes, cap
        super().__init__(limits.over("nodes of the generalization lattice (levels per quasi-identifier: %s)" % ", ".join(
            "%s %d" % x for x in zip(self.names, self.levels)), nodes, cap))


def lattice_size(heights) -> int:
    """The lattice's node count, prod(h + 1), in exact integers."""
    return math.prod(int(h) + 1 for h in heights)


def check_lattice(qis, cap: int = MAX_LATTICE_NODES) -> int:
    """The node count of the lattice of ``qis`` (:class:`QILevels`), or :class:`LatticeTooLarge`
    when above ``cap`` -- checked before any node is made."""
    nodes = lattice_size(q.top for q in qis)
    if nodes > cap:
        raise LatticeTooLarge([q.name for q in qis], [q.top + 1 for q in qis], nodes, cap)
    return nodes


# ------------------------------------------------------------------ levels of one QI

@dataclass(frozen=True)
class Intervals:
    """Interval levels of a numerical QI: level j in 1..len(widths) groups a value v into the
    bin ``floor((v - origin) / widths[j-1])``; the level after them is ``*``."""
    origin: float
    widths: tuple
    low: float                     # the summary's smallest and largest value
    high: float
    integer: bool


@dataclass(frozen=True)
class QILevels:
    """One QI's generalization levels over its level-0 cells (its distinct values in the summary).

    ``groups[j][c]`` is the group of cell c at level j (level 0: c itself; the last level: 0);
    ``lm[j][g]`` the loss metric of group g, ``(|leaves under it| - 1) / (|all leaves| - 1)``."""
    name: str
    cells: tuple                   # cell labels (leaf text or float value), in cell order
    probs: np.ndarray              # marginal over the cells, sums to 1
    groups: tuple
    lm: tuple
    intervals: Intervals | None = None

    @property
    def top(self) -> int:
        return len(self.groups) - 1

    def marginal(self, level: int, probs=None) -> np.ndarray:
        p = self.probs if probs is None else probs
        return np.bincount(self.groups[level], p, minlength=len(self.lm[level]))

    def expected_lm(self, level: int) -> float:
        return float(self.marginal(level) @ self.lm[level])


def hierarchy_levels(name: str, hierarchy, leaf_probs) -> QILevels:
    """The levels of a hierarchy (``core.hierarchy.Hierarchy``): cells are its leaves."""
    total = max(hierarchy.n_leaves - 1, 1)
    groups, lm = [], []
    for j in checked(range(hierarchy.height + 1)):
        nodes, inverse = np.unique(hierarchy.anc[:, j], return_inverse=True)
        groups.append(inverse.astype(np.int64))
        lm.append((hierarchy.leaf_count[nodes] - 1) / total)
    p = np.asarray(leaf_probs, dtype=np.float64)
    return QILevels(name, tuple(hierarchy.leaves), p / p.sum(), tuple(groups), tuple(lm))


def interval_widths(low: float, high: float, integer: bool) -> tuple:
    """Doubling widths from the first one that groups (2 for integers whose range is at most
    64, else a power of two near range / 32) while they still split the range."""
    span = high - low
    if span <= 0:
        return ()
    first = 2.0 ** math.ceil(math.log2(span / 32.0)) if span > 64 or not integer else 2.0
    if integer:
        first = max(first, 2.0)
    widths, w = [], first
    while w <= span:
        widths.append(w)
        w *= 2
    return tuple(widths)


def interval_levels(name: str, values, probs, integer: bool) -> QILevels:
    """Levels of a numerical QI from its summary's values: exact values, intervals of doubling
    widths aligned on a multiple of the widest (so they nest), then ``*``.  An interval's LM is
    the share of the range [low, high] it covers (for integers, of its values)."""
    v = np.asarray(values, dtype=np.float64)
    p = np.asarray(probs, dtype=np.float64)
    order = np.argsort(v, kind="stable")
    v, p = v[order], p[order]
    low, high = float(v.min()), float(v.max())
    widths = interval_widths(low, high, integer)
    origin = math.floor(low / widths[-1]) * widths[-1] if widths else low
    unit = 1.0 if integer else 0.0
    denominator = (high - low) or 1.0
    groups, lm = [np.arange(len(v), dtype=np.int64)], [np.zeros(len(v))]
    for w in checked(widths):
        bins = np.floor((v - origin) / w)
        used, inverse = np.unique(bins, return_inverse=True)
        start = np.maximum(origin + used * w, low)
        end = np.minimum(origin + (used + 1) * w - unit, high)
        groups.append(inverse.astype(np.int64))
        lm.append(np.clip((end - start) / denominator, 0.0, 1.0))
    groups.append(np.zeros(len(v), dtype=np.int64))
    lm.append(np.array([1.0 if high > low else 0.0]))
    return QILevels(name, tuple(v.tolist()), p / p.sum(), tuple(groups), tuple(lm),
                    Intervals(float(origin), widths, low, high, integer))


# ------------------------------------------------------------------ the summary F

@dataclass(frozen=True)
class Summary:
    """F: independent marginals, plus optional joint most common combinations ``joint_cells``
    (items x QIs, cell indices) with frequencies ``joint_freqs``; the rest of the mass is spread
    over the residual marginals by independence.

    With ``joint_level`` (a node) the combinations are of *groups* at that node's levels (the
    MCV list of expression statistics on the generalized values; a QI at its top level is not
    in the list, its column of ``joint_cells`` is 0): see :meth:`_grouped_likelihoods`."""
    qis: tuple
    joint_cells: np.ndarray | None = None
    joint_freqs: np.ndarray | None = None
    joint_level: tuple | None = None

    def likelihoods(self, node) -> np.ndarray:
        """ell_i of every bucket of ``node`` (C order over the QIs' groups at their levels)."""
        shape = tuple(len(q.lm[j]) for q, j in zip(self.qis, node))
        margins = [q.marginal(j) for q, j in zip(self.qis, node)]
        if self.joint_cells is None or not len(self.joint_freqs):
            return _outer(margins)
        if self.joint_level is not None:
            if all(j == q.top for q, j in zip(self.qis, self.joint_level)):
                return _outer(margins)
            return self._grouped_likelihoods(node)
        f = self.joint_freqs
        rest = max(1.0 - float(f.sum()), 0.0)
        residual = []
        for a, (q, j) in enumerate(zip(self.qis, node)):
            r = np.clip(q.probs - np.bincount(self.joint_cells[:, a], f, minlength=len(q.probs)), 0, None)
            r = q.marginal(j, r)
            residual.append(r / r.sum() if r.sum() > 0 else margins[a])
        idx = np.ravel_multi_index(tuple(q.groups[j][self.joint_cells[:, a]]
                                         for a, (q, j) in enumerate(zip(self.qis, node))), shape)
        out = rest * _outer(residual)
        np.add.at(out, idx, f)
        return out / out.sum()

    def _grouped_likelihoods(self, node) -> np.ndarray:
        """The joint at ``joint_level`` v carried to ``node`` u: the dense table of v's groups
        over the QIs in the list (the items; the rest of the mass over the combinations not in
        the list, in proportion to the product of their marginals -- the list is nearly
        complete at v, so what it leaves out are the rare combinations PostgreSQL's sample
        saw too seldom to keep) is multiplied along each QI by its :func:`transition` from
        level v to level u -- exact where u is at or above v (a group's items land in the one
        group above it), and where u is below v a group's mass spread over the groups under it
        by the marginal (the QIs independent *within* a combination of v); the QIs not in the
        list (at the top of v) are independent of the rest."""
        v, f = self.joint_level, self.joint_freqs
        inside = [a for a, q in enumerate(self.qis) if v[a] < q.top]
        outside = [a for a in range(len(self.qis)) if a not in inside]
        shape = tuple(len(self.qis[a].lm[v[a]]) for a in inside)
        listed = np.ravel_multi_index(tuple(self.joint_cells[:, a] for a in inside), shape)
        table = _outer([self.qis[a].marginal(v[a]) for a in inside])
        table[listed] = 0.0
        if table.sum() > 0:
            table *= max(1.0 - float(f.sum()), 0.0) / table.sum()
        np.add.at(table, listed, f)
        table = table.reshape(shape)
        # the QIs whose groups merge first: the table never grows beyond v's or u's size
        for axis in sorted(range(len(inside)), key=lambda x: node[inside[x]] < v[inside[x]]):
            a = inside[axis]
            table = np.moveaxis(np.tensordot(table, transition(self.qis[a], v[a], node[a]), axes=([axis], [0])),
                                -1, axis)
        table = np.multiply.outer(table, _outer([self.qis[a].marginal(node[a]) for a in outside]).reshape(
            tuple(len(self.qis[a].lm[node[a]]) for a in outside)))
        out = np.transpose(table, np.argsort(inside + outside)).ravel()
        return out / out.sum()

    def buckets(self, node) -> int:
        return int(np.prod([len(q.lm[j]) for q, j in zip(self.qis, node)], dtype=np.float64))

    def predicted_lm(self, node) -> float:
        return float(np.mean([q.expected_lm(j) for q, j in zip(self.qis, node)]))


def transition(q: QILevels, v: int, u: int) -> np.ndarray:
    """Groups at level v x groups at level u: the share of group g's marginal mass in group h
    (u >= v: 1 for the group above g; u < v: the marginal of g's groups at level u, normalized)."""
    m = np.zeros((len(q.lm[v]), len(q.lm[u])))
    np.add.at(m, (q.groups[v], q.groups[u]), q.probs)
    return m / np.maximum(m.sum(axis=1, keepdims=True), 1e-300)


def joint_level(qis, target: int, allowed=None) -> tuple:
    """The node whose combinations an MCV list of ``target`` items can hold: from the lowest
    levels, the QI with the most groups is generalized (to its next level in ``allowed[a]``,
    default every level) until the node has at most ``target`` buckets.  The QIs keep
    balanced resolutions (none generalized while another has more groups)."""
    allowed = [tuple(range(q.top + 1)) if allowed is None else tuple(sorted(allowed[a])) for a, q in enumerate(qis)]
    node = [levels[0] for levels in allowed]
    while True:
        sizes = [len(q.lm[j]) for q, j in zip(qis, node)]
        if np.prod(sizes, dtype=np.float64) <= target:
            return tuple(node)
        a = max(range(len(qis)), key=lambda i: (sizes[i], -i) if node[i] < qis[i].top else (0, -i))
        node[a] = next(j for j in allowed[a] + (qis[a].top,) if j > node[a])


def bin_groups(q: QILevels, level: int, bins) -> np.ndarray:
    """The groups at interval ``level`` (>= 1) of the bins ``floor((v - origin) / width)``
    (-1 for a bin holding none of the summary's values)."""
    iv = q.intervals
    used = np.unique(np.floor((np.asarray(q.cells) - iv.origin) / iv.widths[level - 1]))
    b = np.asarray(bins, dtype=np.float64)
    pos = np.minimum(np.searchsorted(used, b), len(used) - 1)
    return np.where(used[pos] == b, pos, -1).astype(np.int64)


def _outer(vectors) -> np.ndarray:
    out = np.ones(1)
    for v in vectors:
        out = np.multiply.outer(out, v).ravel()
    return out


# ------------------------------------------------------------------ the condition on a bucket

def distinct_probability(sa_probs, l: int, sizes) -> np.ndarray:
    """P(a class of x rows drawn from ``sa_probs`` holds >= l distinct values), for each x in
    ``sizes``: exact up to ``EXACT_OCCUPANCY`` rows (a generating-function DP over the values),
    beyond it the occupancy indicators ``1 - (1 - q_j)^x`` summed as a Poisson-binomial (their
    weak dependence vanishes as x grows)."""
    q = np.asarray(sa_probs, dtype=np.float64)
    q = q[q > 0]
    x = np.asarray(sizes, dtype=np.int64)
    if l <= 1:
        return (x >= 1).astype(np.float64)
    exact = _occupancy_exact(q, l, EXACT_OCCUPANCY)
    dist = np.zeros((len(x), l + 1))
    dist[:, 0] = 1.0
    xf = x.astype(np.float64)
    for qj in checked(q):
        seen = -np.expm1(xf * np.log1p(-qj)) if qj < 1 else (x >= 1).astype(np.float64)
        moved = dist * seen[:, None]
        dist = dist * (1 - seen)[:, None]
        dist[:, 1:] += moved[:, :-1]
        dist[:, l] += moved[:, l]
    small = x <= EXACT_OCCUPANCY
    return np.where(small, exact[np.minimum(x, EXACT_OCCUPANCY)], dist[:, l])


def _occupancy_exact(q, l: int, size: int) -> np.ndarray:
    """P(>= l distinct values among x draws) for x = 0..size: x! [s^x] of the generating
    function prod_j (1 + d (e^{q_j s} - 1)), with the power of d (distinct values) capped at l."""
    c = np.arange(size + 1)
    logf = _log_factorials(size)
    f = np.zeros((l + 1, size + 1))
    f[0, 0] = 1.0
    for qj in checked(q):
        g = np.exp(c * math.log(qj) - logf)
        g[0] = 0.0
        moved = np.array([np.convolve(row, g)[:size + 1] for row in f])
        f[1:] += moved[:-1]
        f[l] += moved[l]
    return np.clip(f[l] * np.exp(logf), 0.0, 1.0)


@dataclass(frozen=True)
class Condition:
    """What a non-empty bucket of x rows must satisfy: x >= k and, with ``l``, P(l distinct
    sensitive values | x) = ``h[x]`` (taken as ``h_inf`` beyond ``len(h) - 1``: LIMIT)."""
    k: int
    l: int | None = None
    h: np.ndarray = field(default=None, repr=False)
    h_inf: float = 1.0

    @classmethod
    def build(cls, k: int, l: int | None = None, sa_probs=None, limit_eps: float = LIMIT_EPS) -> "Condition":
        """The condition's success table up to the size where it settles."""
        if not l or l <= 1:
            return cls(k, None, (np.arange(k) == 0).astype(np.float64), 1.0)
        if l > int(np.count_nonzero(np.asarray(sa_probs, dtype=np.float64) > 0)):
            return cls(k, l, np.ones(1), 0.0)     # more distinct values than there are: no class passes
        size = max(k, 1)
        while True:
            xs = np.arange(2 * size)
            g = distinct_probability(sa_probs, l, xs)
            if g[-1] >= 1 - limit_eps or 2 * size >= LIMIT_MAX_SIZE or np.all(g[size:] == g[-1]):
                break
            size *= 2
        h = np.where(xs >= k, g, 0.0)
        h[0] = 1.0
        settled = np.flatnonzero(np.abs(h - h[-1]) > limit_eps)
        cut = max(int(settled[-1]) + 2 if len(settled) else 1, k)
        return cls(k, l, h[:cut], float(h[-1]))

    @property
    def step(self) -> bool:
        """k-anonymity alone: fail below k, pass from k on."""
        return self.l is None


def _log_factorials(n: int) -> np.ndarray:
    return np.concatenate(([0.0], np.cumsum(np.log(np.arange(1, n + 1, dtype=np.float64)))))


def deficits(lam, cond: Condition, sd: float = SD_CUT, hybrid: bool = False, trials: int | None = None) -> tuple:
    """(D0, D1, D2): for each bucket of mean ``lam``, ``sum_x x^r P(X = x) (1 - h(x))``, the
    mass, first and second moments the condition removes (x = 0 always passes); X is
    Poisson(lam), or Binomial(trials, lam / trials) when ``trials`` is given.

    long: the windowed sums (SD_CUT), the HYBRID normal path and the LIMIT tail in one place,
    since each bucket takes exactly one of them."""
    lam = np.asarray(lam, dtype=np.float64)
    d = np.zeros((3, len(lam)))
    xcut = len(cond.h) - 1
    share = np.clip(lam / trials, 0.0, 1.0) if trials else np.zeros_like(lam)
    variance = lam * (1 - share)
    sigma = np.sqrt(variance)
    fail = 1.0 - cond.h
    tail = 1.0 - cond.h_inf
    if tail > 0:                       # beyond xcut a constant failure share: full moments x tail
        d += tail * np.stack([np.ones_like(lam), lam, variance + lam * lam])
        d[0] -= tail * (np.exp(trials * np.log1p(-share)) if trials else np.exp(-lam))   # x = 0 passes
        fail = fail - tail             # the window corrects the part up to xcut
    lo = np.maximum(np.floor(lam - sd * sigma), 1).astype(np.int64)
    hi = np.minimum(np.ceil(lam + sd * sigma) + 2, xcut).astype(np.int64)
    active = lo <= hi
    if hybrid and cond.step and tail == 0:
        normal = active & (lam >= HYBRID_MIN_MEAN)
        if normal.any():
            d[:, normal] += _normal_deficits(lam[normal], variance[normal], cond.k)
        active &= ~normal
    idx = np.flatnonzero(active)
    if not len(idx):
        return d[0], d[1], d[2]
    top = int(hi[idx].max())
    logf = _log_factorials(top)
    if trials:                         # log C(trials, x) = sum_{i<x} log(trials - i) - log x!
        logc = np.concatenate(([0.0], np.cumsum(np.log(trials - np.arange(min(top, trials), dtype=np.float64)))))
        logc = np.concatenate((logc, np.full(max(top + 1 - len(logc), 0), -np.inf))) - logf
    idx = idx[np.argsort(hi[idx] - lo[idx], kind="stable")]
    start = 0
    while start < len(idx):
        checkpoint()
        width = int(hi[idx[start]] - lo[idx[start]] + 1)
        stop = start + 1
        while stop < len(idx) and (stop - start + 1) * max(width, hi[idx[stop]] - lo[idx[stop]] + 1) <= CHUNK:
            width = max(width, int(hi[idx[stop]] - lo[idx[stop]] + 1))
            stop += 1
        part = idx[start:stop]
        x = lo[part, None] + np.arange(width)[None, :]
        inside = x <= hi[part, None]
        x = np.where(inside, x, 0)
        m = lam[part, None]
        if trials:
            q = share[part, None]
            with np.errstate(divide="ignore", invalid="ignore"):
                logp = logc[x] + x * np.log(q) + (trials - x) * np.log1p(-q)
        else:
            logp = x * np.log(m) - m - logf[x]
        pmf = np.where(inside, np.exp(logp), 0.0)
        w = pmf * fail[x]
        d[0, part] += w.sum(axis=1)
        d[1, part] += (w * x).sum(axis=1)
        d[2, part] += (w * x * x).sum(axis=1)
        start = stop
    return d[0], d[1], d[2]


def normal_cdf(z) -> np.ndarray:
    """Phi(z) with relative accuracy ~1e-7 in both tails (Numerical Recipes' erfc)."""
    z = np.asarray(z, dtype=np.float64)
    a = np.abs(z) / math.sqrt(2.0)
    t = 1.0 / (1.0 + 0.5 * a)
    poly = -a * a - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (
        -0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))))
    upper = 0.5 * t * np.exp(poly)            # P(Z > |z|)
    return np.where(z >= 0, 1.0 - upper, upper)


def normal_pdf(z) -> np.ndarray:
    return np.exp(-0.5 * np.asarray(z) ** 2) / math.sqrt(2 * math.pi)


def _normal_deficits(lam, variance, k: int) -> np.ndarray:
    """HYBRID: D0..D2 of the sizes 1..k-1 under the normal approximation N(lam, variance) with
    continuity correction (partial moments of the normal on [a, b])."""
    s = np.sqrt(variance)
    a, b = (0.5 - lam) / s, (k - 0.5 - lam) / s
    mass = np.clip(normal_cdf(b) - normal_cdf(a), 0.0, None)
    pa, pb = normal_pdf(a), normal_pdf(b)
    d1 = lam * mass + s * (pa - pb)
    d2 = lam * lam * mass + 2 * lam * s * (pa - pb) + variance * (mass + a * pa - b * pb)
    return np.stack([mass, d1, d2])


# ------------------------------------------------------------------ mu-probability, mu-expectation

def mu_probability(likelihoods, n: int, cond: Condition, sd: float = SD_CUT, hybrid: bool = False) -> float:
    """P(every bucket empty or passing | sizes ~ Multinomial(n, likelihoods)), Levin's form."""
    lam = n * np.asarray(likelihoods, dtype=np.float64)
    lam = lam[lam > 0]
    d0, d1, d2 = deficits(lam, cond, sd, hybrid)
    passing = np.clip(1.0 - d0, 0.0, 1.0)
    if np.any(passing <= 0):
        return 0.0
    log_passing = float(np.log(passing).sum())
    e1 = lam - d1
    e2 = lam + lam * lam - d2
    mean = e1 / passing
    var = np.clip(e2 / passing - mean * mean, 0.0, None)
    m, v = float(mean.sum()), float(var.sum())
    if v <= 1e-12:
        sum_density = 1.0 if abs(m - n) <= 0.5 else 0.0
    else:
        s = math.sqrt(v)
        sum_density = float(normal_cdf((n + 0.5 - m) / s) - normal_cdf((n - 0.5 - m) / s))
    log_point = n * math.log(n) - n - math.lgamma(n + 1) if n > 0 else 0.0
    if sum_density <= 0:
        return 0.0
    return float(min(max(math.exp(log_passing + math.log(sum_density) - log_point), 0.0), 1.0))


def mu_expectation(likelihoods, n: int, cond: Condition, sd: float = SD_CUT, hybrid: bool = False) -> float:
    """Expected rows in failing buckets (outliers): sum_i E[X_i; bucket i fails] with the
    bucket sizes' exact Binomial(n, ell_i) marginals (Algorithm 4; for l-diversity Eq. 7)."""
    lam = n * np.asarray(likelihoods, dtype=np.float64)
    return float(deficits(lam[lam > 0], cond, sd, hybrid, trials=n)[1].sum())


# ------------------------------------------------------------------ the walk (phase 1)

@dataclass(frozen=True)
class Candidate:
    node: tuple
    probability: float | None      # mu-probability (criterion 'probability')
    expectation: float | None      # mu-expectation in rows (criterion 'expectation')
    lm: float                      # predicted loss metric


@dataclass(frozen=True)
class Phase1:
    candidates: tuple              # passing nodes by predicted LM (ties: more general first)
    evaluated: int                 # nodes whose mu-probability/-expectation was computed
    lattice: int                   # nodes in the lattice


def lattice_nodes(heights, cap: int = MAX_LATTICE_NODES) -> list:
    """Every node of the lattice, most general first (by level sum, descending); a lattice of
    more than ``cap`` nodes is refused before any node is made (:class:`LatticeTooLarge`)."""
    nodes = lattice_size(heights)
    if nodes > cap:
        raise LatticeTooLarge(["QI %d" % (a + 1) for a in range(len(heights))], [h + 1 for h in heights], nodes, cap)
    nodes = list(itertools.product(*[range(h + 1) for h in heights]))
    return sorted(nodes, key=lambda v: (-sum(v), tuple(-x for x in v)))


def parents(node, heights):
    """The nodes one step more general in one QI."""
    return [node[:a] + (node[a] + 1,) + node[a + 1:] for a in range(len(node)) if node[a] < heights[a]]


def walk(summary: Summary, n: int, cond: Condition, threshold: float, criterion: str = "probability",
         max_outliers: float = 0.0, sd: float = SD_CUT, hybrid: bool = False) -> Phase1:
    """Algorithm 1, lines 1-11: top-down over the lattice; a node whose parents all passed is
    evaluated, and passes when its mu-probability >= ``threshold`` (criterion 'probability') or
    its mu-expectation <= ``max_outliers`` rows ('expectation'); the rest is pruned (Thm 3.5)."""
    check_lattice(summary.qis)
    heights = [q.top for q in summary.qis]
    passed, found, evaluated = set(), [], 0
    for node in checked(lattice_nodes(heights)):
        if any(p not in passed for p in parents(node, heights)):
            continue
        evaluated += 1
        if summary.buckets(node) > max(min(BUCKETS_PER_ROW * n, MAX_NODE_BUCKETS), 1 << 16):
            continue                   # hopeless (mostly near-empty buckets) and costly: pruned
        ell = summary.likelihoods(node)
        lm = summary.predicted_lm(node)
        if criterion == "expectation":
            e = mu_expectation(ell, n, cond, sd, hybrid)
            ok, prob = e <= max_outliers, None
            share = min(e / n, 1.0) if n else 0.0
            lm = (1 - share) * lm + share
        else:
            prob, e = mu_probability(ell, n, cond, sd, hybrid), None
            ok = prob >= threshold
        if ok:
            passed.add(node)
            found.append(Candidate(node, prob, e, lm))
    found.sort(key=lambda c: (round(c.lm, 12), -sum(c.node)))
    return Phase1(tuple(found), evaluated, int(np.prod([h + 1 for h in heights])))


def node_lm(levels, node, marginal_counts) -> float:
    """The exact LM of a node from exact marginal counts per QI at level 0 (no suppression)."""
    out = []
    for q, j, counts in zip(levels, node, marginal_counts):
        c = np.asarray(counts, dtype=np.float64)
        out.append(float(q.marginal(j, c) @ q.lm[j]) / c.sum())
    return float(np.mean(out))


def below(node, other) -> bool:
    """``node`` is at least as specific as ``other`` in every QI (anti-monotonicity: if
    ``other`` fails on the data, so does ``node``)."""
    return all(a <= b for a, b in zip(node, other))
