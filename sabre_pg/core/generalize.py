"""Generalization of each EC's QI values (§4.4 output).

A numerical QI becomes the range [min, max] of the EC.  A categorical QI becomes the
lowest common ancestor of the EC's values in its hierarchy: the leaf itself when the EC
holds one value, the root of a flat hierarchy when it holds more.  Because leaves are in
pre-order, the LCA of a set of leaves is the LCA of its left-most and right-most leaf.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .hierarchy import Hierarchy


def stable_argsort(ids: np.ndarray) -> np.ndarray:
    """``np.argsort(ids, kind='stable')`` for non-negative integers below 2^32, as two
    16-bit radix passes (numpy radix-sorts 16-bit keys): about twice as fast for millions."""
    ids = np.asarray(ids, dtype=np.int64)
    if len(ids) == 0 or ids.min() < 0 or ids.max() >= 1 << 32:
        return np.argsort(ids, kind="stable")
    order = np.argsort((ids & 0xFFFF).astype(np.uint16), kind="stable")
    if ids.max() >> 16:
        order = order[np.argsort((ids[order] >> 16).astype(np.uint16), kind="stable")]
    return order


class ECIndex:
    """Tuples grouped by EC: one stable sort, reused by every column."""

    def __init__(self, ec: np.ndarray, n_classes: int | None = None):
        ec = np.asarray(ec, dtype=np.int64)
        self.n_classes = int(ec.max()) + 1 if n_classes is None else int(n_classes)
        self.order = stable_argsort(ec)
        self.sizes = np.bincount(ec, minlength=self.n_classes)
        if (self.sizes == 0).any():
            raise ValueError("EC ids must be 0..C-1 with no empty class")
        self.starts = np.concatenate(([0], np.cumsum(self.sizes)[:-1]))

    def min_max(self, values: np.ndarray):
        v = np.asarray(values)[self.order]
        return np.minimum.reduceat(v, self.starts), np.maximum.reduceat(v, self.starts)


@dataclass
class NumericalRange:
    lo: np.ndarray
    hi: np.ndarray


@dataclass
class CategoricalNode:
    node: np.ndarray          # hierarchy node id per EC
    hierarchy: Hierarchy

    @property
    def labels(self) -> np.ndarray:
        return np.asarray(self.hierarchy.labels, dtype=object)[self.node]


def generalize_numerical(idx: ECIndex, values) -> NumericalRange:
    lo, hi = idx.min_max(values)
    return NumericalRange(lo, hi)


def generalize_categorical(idx: ECIndex, positions, hierarchy: Hierarchy) -> CategoricalNode:
    lo, hi = idx.min_max(np.asarray(positions, dtype=np.int64))
    return CategoricalNode(hierarchy.lca_node(lo, hi), hierarchy)
