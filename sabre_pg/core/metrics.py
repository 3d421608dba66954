"""Utility and privacy metrics (§3.2 and §6).

* IL of one attribute in one EC: numerical ``(max_G - min_G) / (max - min)`` over the table;
  categorical ``(L - 1) / (N - 1)`` with L = |leaves(node)|, N = |leaves(root)|: 0 for a leaf,
  1 for the root.  The paper (§3.2) writes ``L / N``, which charges a leaf 1/N; ``paper=True``
  gives that variant (``ail_paper`` in the results), so figures compare with the paper's.
* IL(G) = sum_i w_i IL_i(G), weights default 1/d; AIL = average IL over all tuples
  = sum_G |G| IL(G) / n.
* Real closeness: the largest EMD over the classes.
* Discernibility: sum |G|^2.  Average class size: n / C and the normalized n / (C k).
"""
from __future__ import annotations

import numpy as np

from .generalize import CategoricalNode, NumericalRange


def il_numerical(g: NumericalRange, vmin: float, vmax: float) -> np.ndarray:
    span = float(vmax) - float(vmin)
    if span <= 0:
        return np.zeros(len(g.lo))
    return (np.asarray(g.hi, dtype=np.float64) - np.asarray(g.lo, dtype=np.float64)) / span


def il_categorical(g: CategoricalNode, paper: bool = False) -> np.ndarray:
    """(L - 1) / (N - 1) per class; the paper's L / N with ``paper=True``."""
    h = g.hierarchy
    if paper:
        return h.leaf_count[g.node] / h.n_leaves
    if h.n_leaves <= 1:
        return np.zeros(len(g.node))
    return (h.leaf_count[g.node] - 1) / (h.n_leaves - 1)


def il_per_class(ils, weights=None) -> np.ndarray:
    """IL(G) for every class from the per-attribute IL columns."""
    by_attribute = np.column_stack(ils) if len(ils) else np.zeros((0, 0))
    d = by_attribute.shape[1]
    w = np.full(d, 1.0 / d) if weights is None else np.asarray(weights, dtype=np.float64)
    if len(w) != d:
        raise ValueError("%d weights for %d quasi-identifiers" % (len(w), d))
    return by_attribute @ w


def ail(il_classes: np.ndarray, sizes: np.ndarray) -> float:
    sizes = np.asarray(sizes, dtype=np.float64)
    return float((il_classes * sizes).sum() / sizes.sum())


def discernibility(sizes) -> int:
    s = np.asarray(sizes, dtype=np.int64)
    return int((s * s).sum())


def average_class_size(n: int, n_classes: int, k: int | None = None) -> float:
    """n / C, or the normalized n / (C k) when k is given."""
    return n / n_classes / (k if k else 1)


def real_closeness(emds) -> float:
    e = np.asarray(emds)
    return float(e.max()) if len(e) else 0.0
