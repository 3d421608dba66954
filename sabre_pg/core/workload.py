"""Query-workload utility of an anonymized table (§6.2 of SABRE): the median relative error of
random COUNT queries and the KL-divergence of the OLAP datacube.  Pure numpy.

Grid
----
Every attribute is mapped to a 1-d grid of *cells*:

* a numerical QI or SA: the ranks of its sorted distinct values in the source (when there are
  more than ``max_bins`` distinct values, ranks are grouped into ``max_bins`` equal-width bins);
* a categorical QI or SA: the pre-order leaf positions of its hierarchy (flat when none), so
  every hierarchy node is a contiguous run of cells ``[lo, hi]``.

A source tuple is a point of the grid; a row of the anonymized output is a *box*: for each QI
the inclusive cell interval ``[lo, hi]`` of its generalized value (the rank interval of
``[qi_lo, qi_hi]``, or the leaf range of the hierarchy node), and one cell for its SA value,
which is published unchanged.  The estimate of a count from the output assumes each output
row is spread uniformly over the cells of its box (the fraction of a box inside a predicate is
the fraction of its ranks / leaves the predicate selects).

Workload (§6.2, after Xiao and Tao's Anatomy)
---------------------------------------------
``SELECT COUNT(*) FROM T WHERE A_1 IN R_1 AND ... AND A_lambda IN R_lambda AND S IN R_S``:
each query picks lambda distinct QIs uniformly at random; each predicate selects a run of
``b = max(1, round(s * m))`` consecutive cells of the attribute's m cells, starting at a
uniformly random cell, with ``s = theta ** (1 / (lambda + 1))``, so that the expected
selectivity of the query is about theta.  A run of cells is a value range for a numerical
attribute and a set of leaves adjacent in the hierarchy's pre-order for a categorical one
(every subtree is such a run).  The relative error of a query is ``|est - prec| / prec``;
queries with ``prec = 0`` are dropped, and the median over the rest is reported.

Evaluation: queries are grouped by their set of attributes; for each set the exact and the
estimated (lambda + 1)-dimensional count cubes are built (the estimated one by scattering
``+-1/volume`` at the 2^lambda corners of every box into a difference array, then a cumulative
sum per axis), turned into summed-area tables, and every query is answered with 2^(lambda+1)
look-ups.  When a cube would exceed ``max_cells`` cells the queries of that set are answered
directly in chunks (same numbers, slower).

Datacube (§6.2, after Kifer and Gehrke)
---------------------------------------
The datacube of level mu is the set of cuboids ``GROUP BY A_i1..A_imu, S`` over every
combination of mu QIs (i.e. one cuboid per combination, with ``WHERE S = v`` for each SA value
v as the last axis).  For each cuboid, P is the normalized exact cube and Q the normalized
estimated cube; ``KL(P || Q) = sum_{P > 0} P log(P / Q)`` in nats.  Q never vanishes where P
does not (each tuple's own cell lies in its box), but to stay finite under binning the
normalized Q is mixed with the uniform distribution with weight ``eps = 1e-10``
(``(1 - eps) Q + eps / cells``), which changes KL by at most about eps.  The reported
value is the mean over the cuboids of the level (``kl_divergence`` also returns each one).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from .checkpoint import checkpoint

DEFAULT_MAX_CELLS = 8_000_000
DEFAULT_MAX_BINS = 1024
KL_EPSILON = 1e-10


# ----------------------------------------------------------------------------- the grid
@dataclass
class Grid:
    """Source points and output boxes on a common cell grid.

    ``sizes[j]`` cells on QI axis j, ``sa_size`` cells on the SA axis;
    ``src[:, j]`` the cell of each source tuple, ``src_sa`` its SA cell;
    ``lo[:, j]``/``hi[:, j]`` the inclusive box of each output row, ``out_sa`` its SA cell.
    """
    sizes: list
    sa_size: int
    src: np.ndarray
    src_sa: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    out_sa: np.ndarray

    def __post_init__(self):
        self.sizes = [int(s) for s in self.sizes]
        self.src = np.asarray(self.src, dtype=np.int64).reshape(len(self.src_sa), -1)
        self.src_sa = np.asarray(self.src_sa, dtype=np.int64)
        self.lo = np.asarray(self.lo, dtype=np.int64).reshape(len(self.out_sa), -1)
        self.hi = np.asarray(self.hi, dtype=np.int64).reshape(len(self.out_sa), -1)
        self.out_sa = np.asarray(self.out_sa, dtype=np.int64)
        d = len(self.sizes)
        for name, a in (("src", self.src), ("lo", self.lo), ("hi", self.hi)):
            if a.shape[1] != d:
                raise ValueError("%s has %d columns for %d quasi-identifiers" % (name, a.shape[1], d))
        if (self.lo > self.hi).any():
            raise ValueError("an output box has lo > hi")
        top = np.asarray(self.sizes, dtype=np.int64)
        if len(self.src) and ((self.src < 0).any() or (self.src >= top).any()):
            raise ValueError("a source cell is outside its axis")
        if len(self.lo) and ((self.lo < 0).any() or (self.hi >= top).any()):
            raise ValueError("an output box is outside its axis")

    @property
    def d(self) -> int:
        return len(self.sizes)


class NumericalAxis:
    """Cells of a numerical attribute: ranks of the source's distinct values (binned if many)."""

    def __init__(self, source_values, max_bins: int = DEFAULT_MAX_BINS):
        self.domain = np.unique(np.asarray(source_values, dtype=np.float64))
        m = len(self.domain)
        if m == 0:
            raise ValueError("a numerical axis needs at least one value")
        self.bins = min(m, int(max_bins))
        self.m = m

    @property
    def size(self) -> int:
        return self.bins

    def _cell(self, rank):
        rank = np.asarray(rank, dtype=np.int64)
        return rank if self.bins == self.m else rank * self.bins // self.m

    def cells(self, values) -> np.ndarray:
        """Cells of source values (each must be in the domain)."""
        return self._cell(np.searchsorted(self.domain, np.asarray(values, dtype=np.float64)))

    def box(self, lo, hi):
        """Inclusive cell interval of the generalized ranges [lo, hi] (clipped to the domain)."""
        rlo = np.searchsorted(self.domain, np.asarray(lo, dtype=np.float64), side="left")
        rhi = np.searchsorted(self.domain, np.asarray(hi, dtype=np.float64), side="right") - 1
        rlo = np.clip(rlo, 0, self.m - 1)
        rhi = np.clip(rhi, rlo, self.m - 1)
        return self._cell(rlo), self._cell(rhi)


class CategoricalAxis:
    """Cells of a categorical attribute: pre-order leaf positions of its hierarchy."""

    def __init__(self, hierarchy):
        self.hierarchy = hierarchy

    @property
    def size(self) -> int:
        return self.hierarchy.n_leaves

    def box(self, nodes):
        h = self.hierarchy
        nodes = np.asarray(nodes, dtype=np.int64)
        return h.lo[nodes], h.hi[nodes] - 1


def node_of_label(hierarchy) -> dict:
    """label -> node id; a label used on several levels maps to its lowest (deepest) node."""
    out: dict = {}
    for nid in np.argsort(hierarchy.level, kind="stable")[::-1]:
        out[hierarchy.labels[nid]] = int(nid)
    return out


# ----------------------------------------------------------------------------- workload
@dataclass
class Workload:
    """``attrs[q]``: the lambda QI axes of query q (sorted); ``lo``/``hi``: inclusive cell runs,
    one column per predicate, the SA predicate last."""
    attrs: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    lam: int
    theta: float

    def __len__(self):
        return len(self.attrs)


def make_workload(sizes, sa_size: int, queries: int = 10_000, lam: int = 3, theta: float = 0.1,
                  seed: int = 1) -> Workload:
    """The random COUNT workload of §6.2 (see the module docstring)."""
    d = len(sizes)
    if not 1 <= lam <= d:
        raise ValueError("lambda must be between 1 and the number of quasi-identifiers (%d), got %r" % (d, lam))
    if not (0 < theta <= 1):
        raise ValueError("theta must satisfy 0 < theta <= 1, got %r" % (theta,))
    if queries < 1:
        raise ValueError("the number of queries must be at least 1, got %r" % (queries,))
    rng = np.random.default_rng(seed)
    attrs = np.sort(np.argsort(rng.random((queries, d)), axis=1)[:, :lam], axis=1)
    s = theta ** (1.0 / (lam + 1))
    m = np.column_stack([np.asarray(sizes, dtype=np.int64)[attrs], np.full(queries, int(sa_size))])
    b = np.maximum(1, np.rint(s * m).astype(np.int64))
    start = (rng.random(m.shape) * (m - b + 1)).astype(np.int64)
    return Workload(attrs, start, start + b - 1, lam, theta)


# ----------------------------------------------------------------------------- cubes
def _true_cube(grid: Grid, axes) -> np.ndarray:
    shape = [grid.sizes[a] for a in axes] + [grid.sa_size]
    idx = np.ravel_multi_index([grid.src[:, a] for a in axes] + [grid.src_sa], shape)
    return np.bincount(idx, minlength=int(np.prod(shape))).astype(np.float64).reshape(shape)


def _estimated_cube(grid: Grid, axes) -> np.ndarray:
    """Output rows spread uniformly over their boxes (difference array + cumulative sums)."""
    sizes = [grid.sizes[a] for a in axes]
    dshape = [s + 1 for s in sizes] + [grid.sa_size]
    lo = grid.lo[:, axes]
    hi = grid.hi[:, axes] + 1
    w = 1.0 / np.prod((hi - lo).astype(np.float64), axis=1)
    flat = np.zeros(int(np.prod(dshape)))
    for corner in itertools.product((0, 1), repeat=len(axes)):
        coords = [hi[:, j] if c else lo[:, j] for j, c in enumerate(corner)] + [grid.out_sa]
        sign = -1.0 if sum(corner) % 2 else 1.0
        flat += np.bincount(np.ravel_multi_index(coords, dshape), weights=sign * w, minlength=flat.size)
    cube = flat.reshape(dshape)
    for j in range(len(axes)):
        np.cumsum(cube, axis=j, out=cube)
    return cube[tuple(slice(0, s) for s in sizes)]


def _summed_area(cube: np.ndarray) -> np.ndarray:
    summed = np.zeros([s + 1 for s in cube.shape])
    summed[tuple(slice(1, None) for _ in cube.shape)] = cube
    for j in range(cube.ndim):
        np.cumsum(summed, axis=j, out=summed)
    return summed


def _box_sums(summed: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Sums of the cube over inclusive boxes [lo, hi] (rows) from its summed-area table."""
    k = lo.shape[1]
    out = np.zeros(len(lo))
    for corner in itertools.product((0, 1), repeat=k):
        idx = tuple(hi[:, j] + 1 if c else lo[:, j] for j, c in enumerate(corner))
        sign = 1.0 if (k - sum(corner)) % 2 == 0 else -1.0
        out += sign * summed[idx]
    return out


def _direct_counts(grid: Grid, axes, qlo, qhi, chunk_cells: int = 4_000_000):
    """Exact and estimated counts without a cube (chunks of queries x distinct rows)."""
    a = list(axes)
    # source: distinct (cells, sa) with weights
    pts = np.column_stack([grid.src[:, a], grid.src_sa])
    pts, w = np.unique(pts, axis=0, return_counts=True)
    # output: distinct (box, sa) with weights
    boxes = np.column_stack([grid.lo[:, a], grid.hi[:, a], grid.out_sa])
    boxes, bw = np.unique(boxes, axis=0, return_counts=True)
    k = len(a)
    blo, bhi, bsa = boxes[:, :k], boxes[:, k:2 * k], boxes[:, 2 * k]
    blen = (bhi - blo + 1).astype(np.float64)
    n_queries = len(qlo)
    prec = np.empty(n_queries)
    est = np.empty(n_queries)
    step = max(1, chunk_cells // max(len(pts), len(boxes), 1))
    for q0 in range(0, n_queries, step):
        checkpoint()
        l, h = qlo[q0:q0 + step], qhi[q0:q0 + step]
        mask = np.ones((len(l), len(pts)), dtype=bool)
        for j in range(k + 1):
            mask &= (pts[None, :, j] >= l[:, j, None]) & (pts[None, :, j] <= h[:, j, None])
        prec[q0:q0 + step] = mask @ w
        frac = ((bsa[None, :] >= l[:, k, None]) & (bsa[None, :] <= h[:, k, None])) * bw[None, :].astype(np.float64)
        for j in range(k):
            ov = np.minimum(bhi[None, :, j], h[:, j, None]) - np.maximum(blo[None, :, j], l[:, j, None]) + 1
            frac *= np.maximum(ov, 0) / blen[None, :, j]
        est[q0:q0 + step] = frac.sum(axis=1)
    return prec, est


def query_counts(grid: Grid, workload: Workload, max_cells: int = DEFAULT_MAX_CELLS):
    """(prec, est) of every query of the workload."""
    n_queries = len(workload)
    prec = np.empty(n_queries)
    est = np.empty(n_queries)
    keys = np.zeros(n_queries, dtype=np.int64)
    for j in range(workload.lam):
        keys |= np.int64(1) << workload.attrs[:, j]
    for key in np.unique(keys):
        checkpoint()
        sel = np.flatnonzero(keys == key)
        axes = [int(a) for a in workload.attrs[sel[0]]]
        qlo, qhi = workload.lo[sel], workload.hi[sel]
        cells = int(np.prod([grid.sizes[a] + 1 for a in axes])) * (grid.sa_size + 1)
        if cells <= max_cells:
            prec[sel] = _box_sums(_summed_area(_true_cube(grid, axes)), qlo, qhi)
            est[sel] = _box_sums(_summed_area(_estimated_cube(grid, axes)), qlo, qhi)
        else:
            prec[sel], est[sel] = _direct_counts(grid, axes, qlo, qhi)
    return np.rint(prec), est


def relative_errors(prec, est) -> np.ndarray:
    """|est - prec| / prec over the queries with prec > 0."""
    prec = np.asarray(prec, dtype=np.float64)
    est = np.asarray(est, dtype=np.float64)
    keep = prec > 0
    return np.abs(est[keep] - prec[keep]) / prec[keep]


def median_relative_error(grid: Grid, queries: int = 10_000, lam: int = 3, theta: float = 0.1,
                          seed: int = 1, max_cells: int = DEFAULT_MAX_CELLS) -> dict:
    """Median relative error of the §6.2 workload; also how many queries were kept."""
    wl = make_workload(grid.sizes, grid.sa_size, queries, lam, theta, seed)
    prec, est = query_counts(grid, wl, max_cells)
    err = relative_errors(prec, est)
    return {"median_relative_error": float(np.median(err)) if len(err) else float("nan"),
            "mean_relative_error": float(np.mean(err)) if len(err) else float("nan"),
            "queries": int(queries), "answered": int(len(err)),
            "dropped": int(queries - len(err))}


def kl(p_counts, q_counts, eps: float = KL_EPSILON) -> float:
    """KL(P || Q) in nats of two count arrays, normalized; Q mixed with the uniform
    distribution with weight eps (``(1 - eps) Q + eps / cells``)."""
    p = np.asarray(p_counts, dtype=np.float64).ravel()
    q = np.asarray(q_counts, dtype=np.float64).ravel()
    if p.sum() <= 0 or q.sum() <= 0:
        return 0.0
    p = p / p.sum()
    q = (1.0 - eps) * q / q.sum() + eps / q.size
    nz = p > 0
    return float(np.sum(p[nz] * np.log(p[nz] / q[nz])))


def kl_divergence(grid: Grid, level: int = 2, max_cells: int = DEFAULT_MAX_CELLS) -> dict:
    """KL-divergence of the datacube of level mu = ``level``: mean over its cuboids."""
    if not 1 <= level <= grid.d:
        raise ValueError("level must be between 1 and the number of quasi-identifiers (%d), got %r"
                         % (grid.d, level))
    per = {}
    for axes in itertools.combinations(range(grid.d), level):
        checkpoint()
        cells = int(np.prod([grid.sizes[a] + 1 for a in axes])) * grid.sa_size
        if cells > max_cells:
            raise ValueError("the cuboid over axes %s has %d cells, more than max_cells = %d"
                             % (list(axes), cells, max_cells))
        per[axes] = kl(_true_cube(grid, list(axes)), _estimated_cube(grid, list(axes)))
    vals = np.array(list(per.values()))
    return {"kl_divergence": float(vals.mean()), "max": float(vals.max()), "cuboids": len(vals),
            "per_cuboid": per}


# ----------------------------------------------------------------------------- AIL & co.
def output_utility(ec, ils, weights=None, k: int | None = None) -> dict:
    """AIL, discernibility and AECS of an output from per-row IL columns (one per QI).

    ``ec`` is each output row's class id (any integers); ``ils[j][r]`` the IL of row r's
    generalized value of QI j (``metrics.il_numerical`` / ``il_categorical`` applied per
    row).  AIL = mean over rows of IL(row) = sum_G |G| IL(G) / n.
    """
    from . import metrics

    _, inv, sizes = np.unique(np.asarray(ec), return_inverse=True, return_counts=True)
    n = int(len(np.asarray(ec)))
    if n == 0:
        return {"rows": 0, "classes": 0, "ail": 0.0, "discernibility": 0, "aecs": 0.0,
                "aecs_normalized": None, "min_class_size": 0, "max_class_size": 0}
    il_rows = metrics.il_per_class(ils, weights)
    return {"rows": n, "classes": int(len(sizes)),
            "ail": metrics.ail(il_rows, np.ones(n)),
            "discernibility": metrics.discernibility(sizes),
            "aecs": metrics.average_class_size(n, len(sizes)),
            "aecs_normalized": metrics.average_class_size(n, len(sizes), k) if k else None,
            "min_class_size": int(sizes.min()), "max_class_size": int(sizes.max())}
