"""Exact EMD of every equivalence class against the whole table, in integer arithmetic.

An implementation independent of the engine's (``emd.py``): the verifier ``sabre_verify``
and the check made before an output is published use it to decide ``EMD <= t`` *exactly*.

Input is a grouped table, one row per (class, SA code) with its number of tuples, as
``SELECT ec_id, code, count(*) ... GROUP BY 1, 2`` returns it.  For a class of ``n`` tuples
with ``P_j`` tuples of code ``j``, in a table of ``N`` tuples with ``Q_j`` of code ``j``,
``p_j - q_j = (N P_j - n Q_j) / (n N)``: scaled by ``n N`` every quantity below is an integer.
Each class's EMD is a fraction ``numerator / denominator`` of integers.

* **Ordered distance** (numerical SA; codes are the ranks ``0..m-1`` of the m distinct values,
  ground distance ``|i - j| / (m - 1)``), Li et al. (ICDE 2007):
  ``EMD = 1/(m-1) * sum_{i=0}^{m-2} |F_P(i) - F_Q(i)|`` with the cumulative distributions F,
  so ``numerator = sum_i |N C_P(i) - n C_Q(i)|`` (C = cumulative counts) over
  ``denominator = n N (m - 1)``.  Between two consecutive codes of the class ``C_P`` is a
  constant ``a`` while ``C_Q`` is non-decreasing, so ``N a - n C_Q(i)`` changes sign once: a
  binary search finds where, and the prefix sums of ``C_Q`` give both partial sums.  Cost per
  class is O(support * log m), never O(m).
* **Hierarchical distance** (categorical SA with a hierarchy of height H, ground distance
  ``height(LCA) / H``), Li et al.: ``extra(N)`` is the sum of ``p - q`` over the leaves of
  node N; ``pos_extra(N)`` / ``neg_extra(N)`` the sums of the positive / negated negative
  ``extra`` of N's children; ``EMD = sum over internal N of height(N)/H * min(pos_extra,
  neg_extra)``.  Since ``pos_extra - neg_extra = extra(N)``, ``min = (sum_children |extra(C)|
  - |extra(N)|) / 2``; every leaf is at depth H, so a child's parent has height one more than
  the child, and the sum telescopes to ``EMD = 1/(2H) * sum over non-root nodes X of
  |extra(X)|`` (``extra(root) = 0``).  Per level, nodes where the class has no tuple
  contribute ``n Q(X)``, so only the class's support is visited: O(support * H).
* **Equal distance** (categorical SA without hierarchy): the flat hierarchy (H = 1),
  ``EMD = 1/2 * sum_j |p_j - q_j|``.

Arithmetic is vectorized int64 when a bound on every intermediate value proves it cannot
overflow, else Python integers in object arrays (same code).  ``exceeds(t)`` compares with
the decimal t is written as (:func:`threshold`) exactly: an EMD equal to t is not a violation.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from .checkpoint import checkpoint

INT64_SAFE = 1 << 62           # every intermediate value stays below this on the int64 path
FLOAT_EXACT = 1 << 53          # integers below this convert to float64 exactly


@dataclass(frozen=True)
class ClassEMDs:
    """Exact EMD and size of every class (arrays in order of ``class_ids``, ascending).

    ``numerators`` / ``denominators`` hold the exact EMDs (int64 or Python-int object
    arrays); ``emd`` is each one correctly rounded to float64, so ``max_emd <= t`` whenever
    no class exceeds t.
    """

    kind: str                       # "ordered", "hierarchical" or "equal"
    n_rows: int                     # N, tuples of the whole table
    class_ids: np.ndarray
    sizes: np.ndarray
    numerators: np.ndarray
    denominators: np.ndarray
    emd: np.ndarray

    @property
    def classes(self) -> int:
        return len(self.class_ids)

    @property
    def max_emd(self) -> float:
        return float(self.emd.max()) if len(self.emd) else 0.0

    @property
    def min_class_size(self) -> int:
        return int(self.sizes.min()) if len(self.sizes) else 0

    def fraction(self, i: int) -> Fraction:
        """The exact EMD of the i-th class."""
        return Fraction(int(self.numerators[i]), int(self.denominators[i]))

    def exceeds(self, t: float) -> np.ndarray:
        """Boolean per class: EMD > t, decided exactly against the decimal ``t`` stands for
        (:func:`threshold`: ``0.3`` is 3/10, not the binary double just below it).

        ``emd`` is correctly rounded and rounding is monotone, so a class whose ``emd`` is more
        than two ulps away from t is decided by ``emd``; only those nearer are compared as
        fractions.
        """
        ft = threshold(t)
        f = float(ft)
        near = 2 * np.spacing(f)
        out = self.emd > f
        tie = np.flatnonzero(np.abs(self.emd - f) <= near)
        num, den = ft.numerator, ft.denominator
        for i in tie:
            checkpoint()
            out[i] = int(self.numerators[i]) * den > num * int(self.denominators[i])
        return out

    def violating(self, t: float, k: int) -> np.ndarray:
        """Boolean per class: not t-close (EMD > t) or fewer than k tuples."""
        return self.exceeds(t) | (self.sizes < k)

    def violations(self, t: float, k: int) -> int:
        return int(np.count_nonzero(self.violating(t, k)))


def threshold(t) -> Fraction:
    """t as the exact decimal it is written as: the shortest decimal that reads back as the
    float8 ``t`` (``repr``), so ``t => 0.3`` means 3/10 and a class of EMD exactly 3/10 is
    within it, while ``t => 0.2999999999`` is below 3/10.  It differs from the double by at
    most half an ulp."""
    try:
        return Fraction(repr(float(t)))
    except (ValueError, OverflowError, TypeError):
        raise ValueError("t must be a finite number, got %r" % (t,)) from None


# ---------------------------------------------------------------------------- grouped input

@dataclass
class _Groups:
    """Grouped input sorted by (class, code), one group per distinct pair."""

    codes: np.ndarray               # int64
    counts: np.ndarray              # int64 (or object when the total does not fit)
    starts: np.ndarray              # index of each class's first group
    cls: np.ndarray                 # class index (0..C-1) of every group
    class_ids: np.ndarray
    sizes: np.ndarray               # n per class
    N: int
    code_totals: np.ndarray         # Q per code (int64 or object)


def _as_int_array(name: str, a) -> np.ndarray:
    arr = np.asarray(a)
    if arr.dtype == np.uint64 and arr.size and int(arr.max()) >= 1 << 63:
        arr = np.asarray([int(v) for v in arr], dtype=object)
    if arr.ndim != 1:
        raise ValueError("%s must be one-dimensional" % name)
    if arr.size and arr.dtype.kind not in "iu":
        if arr.dtype.kind == "O" and all(isinstance(v, (int, np.integer)) for v in arr):
            return arr
        raise ValueError("%s must hold integers, got %s" % (name, arr.dtype))
    return arr.astype(np.int64, copy=False) if arr.size else np.empty(0, dtype=np.int64)


def _exact_sum(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Sums of the runs of ``values`` beginning at ``starts`` (exact for int64 and object)."""
    if len(values) == 0:
        return values[:0]
    return np.add.reduceat(values, starts)


def group(ec, codes, counts, m: int) -> _Groups:
    """Validate, sort by (class, code) and merge duplicate pairs."""
    ec = _as_int_array("class ids", ec)
    codes = _as_int_array("codes", codes)
    counts = _as_int_array("counts", counts)
    if not (len(ec) == len(codes) == len(counts)):
        raise ValueError("class ids, codes and counts differ in length: %d, %d, %d"
                         % (len(ec), len(codes), len(counts)))
    if len(codes) and (int(codes.min()) < 0 or int(codes.max()) >= m):
        raise ValueError("codes must lie in [0, %d), got [%d, %d]" % (m, codes.min(), codes.max()))
    if len(counts) and int(counts.min()) < 1:
        raise ValueError("counts must be positive, got %d" % counts.min())
    ec, codes = ec.astype(np.int64), codes.astype(np.int64)
    wide = len(counts) and int(counts.max()) * len(counts) >= INT64_SAFE
    counts = counts.astype(object) if wide else counts.astype(np.int64)
    if len(ec) > 1:
        d_ec, d_code = np.diff(ec), np.diff(codes)
        if not np.all((d_ec > 0) | ((d_ec == 0) & (d_code > 0))):
            lo, hi = int(ec.min()), int(ec.max())
            if (hi - lo + 1) * m < INT64_SAFE:          # one int64 key sorts much faster
                order = np.argsort((ec - lo) * m + codes)
            else:
                order = np.lexsort((codes, ec))
            ec, codes, counts = ec[order], codes[order], counts[order]
            new = np.r_[True, (ec[1:] != ec[:-1]) | (codes[1:] != codes[:-1])]
            keep = np.flatnonzero(new)
            ec, codes, counts = ec[keep], codes[keep], _exact_sum(counts, keep)
    starts = np.flatnonzero(np.r_[True, ec[1:] != ec[:-1]]) if len(ec) else np.empty(0, np.int64)
    cls = np.cumsum(np.r_[True, ec[1:] != ec[:-1]]) - 1 if len(ec) else np.empty(0, np.int64)
    sizes = _exact_sum(counts, starts)
    N = int(sizes.sum()) if sizes.dtype != object else int(sum(sizes))
    return _Groups(codes, counts, starts, cls, ec[starts], sizes, N,
                   _totals(codes, counts, m, N))


def _totals(keys: np.ndarray, weights: np.ndarray, length: int, total: int) -> np.ndarray:
    """Exact sums of ``weights`` per key in [0, length)."""
    if weights.dtype != object and total < FLOAT_EXACT:
        sums = np.bincount(keys, weights=weights.astype(np.float64), minlength=length)
        return sums.astype(np.int64)
    out = np.zeros(length, dtype=object)
    np.add.at(out, keys, weights.astype(object))
    return out


def _arith(g: _Groups, bound: int):
    """The dtype that holds every intermediate value below ``bound`` exactly."""
    return np.int64 if bound < INT64_SAFE and g.counts.dtype != object else object


def _result(kind: str, g: _Groups, num: np.ndarray, den: np.ndarray) -> ClassEMDs:
    sizes = g.sizes if g.sizes.dtype == object and g.N >= 1 << 63 else g.sizes.astype(np.int64)
    return ClassEMDs(kind, g.N, g.class_ids, sizes, num, den, _rounded(num, den))


def _rounded(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """Every num/den correctly rounded to float64."""
    out = np.empty(len(num), dtype=np.float64)
    if num.dtype == object:
        small = np.zeros(len(num), dtype=bool)
    else:
        small = (num < FLOAT_EXACT) & (den < FLOAT_EXACT)
        out[small] = num[small].astype(np.float64) / den[small].astype(np.float64)
    for i in np.flatnonzero(~small):
        checkpoint()
        out[i] = int(num[i]) / int(den[i])      # Python's int division is correctly rounded
    return out


# ---------------------------------------------------------------------------- ordered distance

def ordered_class_emds(ec, codes, counts, m: int) -> ClassEMDs:
    """Ordered-distance EMD per class; codes are ranks 0..m-1 of the SA's distinct values."""
    g = group(ec, codes, counts, m)
    if not len(g.sizes) or m <= 1:
        return _result("ordered", g, np.zeros(len(g.sizes), np.int64), np.ones(len(g.sizes), np.int64))
    max_n = int(max(g.sizes))
    dt = _arith(g, 4 * m * max_n * g.N)
    N = dt(g.N) if dt is np.int64 else g.N
    cq = np.cumsum(g.code_totals.astype(dt))                # C_Q(i), non-decreasing
    scq = np.r_[np.zeros(1, dtype=dt), np.cumsum(cq)]       # scq[i] = sum_{j<i} C_Q(j)
    counts = g.counts.astype(dt)
    cs = np.cumsum(counts)
    a = cs - (cs - counts)[g.starts][g.cls]                 # C_P through each group's code
    n = g.sizes.astype(dt)[g.cls]
    last = np.r_[g.starts[1:] - 1, len(g.codes) - 1]
    lo = g.codes
    hi = np.r_[g.codes[1:], 0]
    hi[last] = m - 1                                        # sum runs over i in [0, m-2]
    aN = a * N
    # C_Q(i) * n <= a N  <=>  C_Q(i) <= floor(a N / n)   (C_Q is integral)
    cross = np.searchsorted(cq, aN // n, side="right")
    x = np.minimum(np.maximum(cross, lo), hi)
    part = ((x - lo) * aN - n * (scq[x] - scq[lo])
            + n * (scq[hi] - scq[x]) - (hi - x) * aN)
    sizes = g.sizes.astype(dt)
    num = _exact_sum(part, g.starts) + sizes * scq[g.codes[g.starts]]   # [0, first code): C_P = 0
    den = sizes * N * (m - 1)
    return _result("ordered", g, num, den)


# ---------------------------------------------------------------------------- tree distance

def tree_class_emds(ec, codes, counts, levels, height: int, kind: str = "hierarchical") -> ClassEMDs:
    """Tree-distance EMD per class (all leaves at depth ``height``).

    ``levels[l]`` maps each leaf code to its ancestor's id at height l, for l = 0..height-1
    (the root excluded); each map must be non-decreasing in the code (leaves in pre-order).
    """
    levels = [np.asarray(lv, dtype=np.int64) for lv in levels]
    if len(levels) != height:
        raise ValueError("expected %d level maps (heights 0..%d), got %d" % (height, height - 1, len(levels)))
    m = len(levels[0]) if levels else 1
    for lv in levels:
        checkpoint()
        if len(lv) != m or (m > 1 and np.any(np.diff(lv) < 0)):
            raise ValueError("every level map must have %d entries, non-decreasing in the leaf code" % m)
    g = group(ec, codes, counts, m)
    if not len(g.sizes) or height == 0:
        return _result(kind, g, np.zeros(len(g.sizes), np.int64), np.ones(len(g.sizes), np.int64))
    max_n = int(max(g.sizes))
    dt = _arith(g, 4 * height * max_n * g.N)
    N = dt(g.N) if dt is np.int64 else g.N
    sizes = g.sizes.astype(dt)
    counts = g.counts.astype(dt)
    class_starts = np.zeros(len(g.codes), dtype=bool)
    class_starts[g.starts] = True
    num = height * sizes * N            # nodes without tuples of the class: n Q(X), sum n N
    for lv in levels:
        checkpoint()
        node = lv[g.codes]
        run = np.flatnonzero(class_starts | np.r_[True, node[1:] != node[:-1]])
        P = _exact_sum(counts, run)                                    # class tuples under X
        Q = _totals(lv, g.code_totals, int(lv[-1]) + 1, g.N).astype(dt)[node[run]]
        n = sizes[g.cls[run]]
        term = np.abs(N * P - n * Q) - n * Q
        num = num + _exact_sum(term, np.flatnonzero(class_starts[run]))
    den = 2 * height * sizes * N
    return _result(kind, g, num, den)


def hierarchical_class_emds(ec, codes, counts, hierarchy) -> ClassEMDs:
    """Hierarchical EMD per class; codes are pre-order leaf positions of ``hierarchy``
    (a :class:`sabre_pg.core.hierarchy.Hierarchy`)."""
    H = int(hierarchy.height)
    return tree_class_emds(ec, codes, counts, [hierarchy.anc[:, lv] for lv in range(H)], H)


def equal_class_emds(ec, codes, counts, m: int) -> ClassEMDs:
    """Equal-distance EMD per class (the flat hierarchy over codes 0..m-1)."""
    return tree_class_emds(ec, codes, counts, [np.arange(m)], 1, kind="equal")


def domain_class_emds(ec, codes, counts, domain) -> ClassEMDs:
    """The exact EMD per class under the ground distance of ``domain`` (a
    :class:`sabre_pg.core.emd.SADomain`): ordered for a numerical SA, equal distance for a flat
    hierarchy, hierarchical otherwise."""
    if domain.numerical:
        return ordered_class_emds(ec, codes, counts, domain.m)
    if domain.hierarchy.height <= 1:
        return equal_class_emds(ec, codes, counts, domain.m)
    return hierarchical_class_emds(ec, codes, counts, domain.hierarchy)
