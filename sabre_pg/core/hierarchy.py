"""Generalization hierarchies (the paper's H, §3.1) built from ARX-format rows.

An ARX hierarchy file has one row per leaf: ``leaf;level1;...;root``; every row has the
same length, so every leaf sits at depth ``height`` and a node's *height* is its column
index (leaves 0, root ``height``).  The ground distance between two leaves is
``h(LCA)/h(H)``.

Nodes are identified by (level, label), so the same label may appear on two levels
(``Other;Other;*``).  Leaves are numbered in *pre-order* (siblings in order of first
appearance), which makes every node's leaves a contiguous range ``[lo, hi)``; the LCA of a
set of leaves is then the LCA of its left-most and right-most leaf.
"""
from __future__ import annotations

import numpy as np

from . import limits
from .checkpoint import checkpoint

ROWS_PER_CHECKPOINT = 1024   # a cancel is noticed every this many rows of a long hierarchy


class HierarchyError(ValueError):
    """A malformed hierarchy; the message names the offending row (1-based)."""


def parse_arx(text: str, delimiter: str = ";") -> list[list[str]]:
    """Split ARX-format text into rows of labels (blank lines ignored)."""
    if not delimiter:
        raise HierarchyError("the delimiter must not be empty")
    rows = []
    for i, line in enumerate(text.splitlines()):
        if not i % ROWS_PER_CHECKPOINT:
            checkpoint()
        line = line.rstrip("\r")
        if line.strip() == "":
            continue
        rows.append(line.split(delimiter))
    return rows


def check_size(leaves: int, height: int, cells: int, text_bytes: int = 0) -> None:
    """A hierarchy a caller supplies (ARX text, or rows in the catalog) within the caps of
    :mod:`limits`: leaves, height, labels (leaves x levels) and text; raises
    :class:`limits.LimitExceeded`.  (Flat hierarchies built from a column's own values are
    bounded by the table, not by these caps.)"""
    limits.check("hierarchy text (bytes)", text_bytes, limits.HIERARCHY_TEXT_BYTES)
    limits.check("hierarchy leaves (rows)", leaves, limits.HIERARCHY_LEAVES)
    limits.check("hierarchy height (levels above the leaves)", height, limits.HIERARCHY_HEIGHT)
    limits.check("hierarchy labels (leaves x levels)", cells, limits.HIERARCHY_CELLS)


FLAT_ROOT = "*"
FLAT_ROOT_IF_STAR = "(any)"


def flat_root_label(values) -> str:
    """The root label of the flat hierarchy over ``values``: ``*``; ``(any)`` when ``*`` is a
    value; when both are values, the first of ``(any 2)``, ``(any 3)``, ... that is not."""
    taken = {str(v) for v in values}
    label, i = FLAT_ROOT, 1
    while label in taken:
        label = FLAT_ROOT_IF_STAR if i == 1 else "(any %d)" % i
        i += 1
    return label


class Hierarchy:
    """A validated generalization hierarchy.

    Attributes
    ----------
    height : int
        h(H), the root's height (0 for a single-node hierarchy).
    leaves : list[str]
        leaf labels in pre-order; ``leaf_pos[label]`` is a leaf's position.
    labels, level, lo, hi, parent : per node (node ids are assigned level by level,
        each level in pre-order): label, height, leaf range [lo, hi), parent id (-1 for root).
    anc : ndarray (n_leaves, height + 1)
        node id of each leaf's ancestor at every level (column 0 is the leaf itself).
    """

    def __init__(self, rows, name: str | None = None, empty_leaves: bool = False):
        self.name = name
        self.empty_leaves = empty_leaves
        rows = [list(r) for r in rows]
        self._check_rows(rows)
        width = len(rows[0])
        self.height = height = width - 1
        # one parent per node; first appearance of every node
        parent_of: dict[tuple[int, str], tuple[str, int]] = {}
        first: dict[tuple[int, str], int] = {}
        for i, r in enumerate(rows):
            if not i % ROWS_PER_CHECKPOINT:
                checkpoint()
            for j in range(width):
                key = (j, r[j])
                first.setdefault(key, i)
                if j < height:
                    p = parent_of.get(key)
                    if p is None:
                        parent_of[key] = (r[j + 1], i)
                    elif p[0] != r[j + 1]:
                        what = "leaf" if j == 0 else "node"
                        raise HierarchyError(
                            "hierarchy %s: %s '%s' has two parents, '%s' (row %d) and '%s' (row %d)"
                            % (self._nm(), what, r[j], p[0], p[1] + 1, r[j + 1], i + 1))
        # pre-order of leaves: sort rows by first appearance of ancestors, top-down
        order = sorted(range(len(rows)),
                       key=lambda i: tuple(first[(j, rows[i][j])] for j in range(height - 1, -1, -1)))
        self.rows = [rows[i] for i in order]
        self.leaves = [r[0] for r in self.rows]
        self.leaf_pos = {lab: p for p, lab in enumerate(self.leaves)}
        n = len(self.rows)
        # nodes level by level in pre-order
        labels, level, lo, hi = [], [], [], []
        anc = np.empty((n, height + 1), dtype=np.int64)
        node_id: dict[tuple[int, str], int] = {}
        for j in range(height + 1):
            for p, r in enumerate(self.rows):
                if not p % ROWS_PER_CHECKPOINT:
                    checkpoint()
                key = (j, r[j])
                nid = node_id.get(key)
                if nid is None:
                    nid = node_id[key] = len(labels)
                    labels.append(r[j])
                    level.append(j)
                    lo.append(p)
                    hi.append(p + 1)
                else:
                    hi[nid] = p + 1
                anc[p, j] = nid
        self.labels = labels
        self.level = np.asarray(level, dtype=np.int64)
        self.lo = np.asarray(lo, dtype=np.int64)
        self.hi = np.asarray(hi, dtype=np.int64)
        self.leaf_count = self.hi - self.lo
        self.anc = anc
        parent = np.full(len(labels), -1, dtype=np.int64)
        for j in range(height):
            parent[anc[:, j]] = anc[:, j + 1]
        self.parent = parent
        self.root = int(anc[0, height])
        self.node_id = node_id
        self._check_labels()

    def _check_labels(self) -> None:
        """Every label names one set of leaves: a class is published as its node's label, so a
        label on two nodes with different leaves (an internal node labelled like a leaf of
        another, or like a node elsewhere) would publish two different sets alike.  The same
        label on a chain of nodes with the same leaves (``Other;Other;*``) is unambiguous."""
        if self.height <= 1 and (self.height == 0 or self.labels[self.root] not in self.leaf_pos or len(self.leaves) == 1):
            return          # leaves are unique, and the root is no leaf (or the only one)
        spans: dict[str, int] = {}
        lo, hi = self.lo.tolist(), self.hi.tolist()
        for nid, label in enumerate(self.labels):
            if not nid % ROWS_PER_CHECKPOINT:
                checkpoint()
            first = spans.setdefault(label, nid)
            if lo[first] != lo[nid] or hi[first] != hi[nid]:
                a, b = sorted((first, nid), key=lambda x: (self.level[x], x))
                raise HierarchyError(
                    "hierarchy %s: label '%s' names two different nodes, %s and %s, so a class "
                    "generalized to one would read as the other" % (self._nm(), label, self._describe(a),
                                                                   self._describe(b)))

    def _describe(self, nid: int) -> str:
        """A node for messages: a leaf, or a level-j node with its first leaves."""
        if self.level[nid] == 0:
            return "a leaf"
        leaves = self.leaves[self.lo[nid]:self.hi[nid]]
        shown = ", ".join("'%s'" % x for x in leaves[:3]) + (", ..." if len(leaves) > 3 else "")
        return "the level-%d node over %s" % (int(self.level[nid]), shown)

    def _check_rows(self, rows) -> None:
        """Rows of one width, no empty label (but the leaf ``''`` when ``empty_leaves``: a
        column's own value in a flat hierarchy), one root, every leaf once."""
        if not rows:
            raise HierarchyError("hierarchy %s has no rows" % self._nm())
        width = len(rows[0])
        root = rows[0][-1]
        seen_leaf: dict[str, int] = {}
        for i, r in enumerate(rows):
            if not i % ROWS_PER_CHECKPOINT:
                checkpoint()
            if len(r) != width:
                raise HierarchyError(
                    "hierarchy %s: row %d has %d fields, row 1 has %d (ragged rows): %s"
                    % (self._nm(), i + 1, len(r), width, ";".join(r)))
            for j, lab in enumerate(r):
                if lab == "" and not (j == 0 and self.empty_leaves and width > 1):
                    raise HierarchyError("hierarchy %s: row %d has an empty label in column %d"
                                         % (self._nm(), i + 1, j + 1))
        for i, r in enumerate(rows):
            if r[-1] != root:
                raise HierarchyError(
                    "hierarchy %s: two roots, '%s' (row 1) and '%s' (row %d)"
                    % (self._nm(), root, r[-1], i + 1))
        for i, r in enumerate(rows):
            if r[0] in seen_leaf:
                raise HierarchyError(
                    "hierarchy %s: leaf '%s' appears twice (rows %d and %d)"
                    % (self._nm(), r[0], seen_leaf[r[0]] + 1, i + 1))
            seen_leaf[r[0]] = i

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_arx(cls, text: str, delimiter: str = ";", name: str | None = None) -> "Hierarchy":
        return cls(parse_arx(text, delimiter), name=name)

    @classmethod
    def flat(cls, values, name: str | None = None) -> "Hierarchy":
        """Every value directly under one root: the equal ground distance.

        The leaves are the distinct values as text (``str``), sorted by code point -- the same
        set gives the same hierarchy (and the same leaf positions, hence Hilbert axes) whatever
        the order or repetition it came in.  The root is labelled by :func:`flat_root_label`.
        """
        leaves = sorted({str(v) for v in values})
        if not leaves:
            raise HierarchyError("a flat hierarchy needs at least one value")
        root = flat_root_label(leaves)
        # the empty string is a value like any other (a leaf; the root is never empty)
        return cls([[leaf, root] for leaf in leaves], name=name, empty_leaves=True)

    def _nm(self) -> str:
        return "'%s'" % self.name if self.name else "(unnamed)"

    # ------------------------------------------------------------------ queries
    @property
    def n_leaves(self) -> int:
        return len(self.leaves)

    @property
    def n_nodes(self) -> int:
        return len(self.labels)

    @property
    def is_flat(self) -> bool:
        return self.height <= 1

    def children(self, node: int) -> list[int]:
        return [int(c) for c in np.flatnonzero(self.parent == node)]

    def lca_level(self, a, b) -> np.ndarray:
        """Height of the lowest common ancestor of leaves at positions a and b (vectorized)."""
        a = np.asarray(a, dtype=np.int64)
        b = np.asarray(b, dtype=np.int64)
        eq = self.anc[a] == self.anc[b]          # (..., H+1), monotone along the last axis
        return np.argmax(eq, axis=-1)

    def lca_node(self, a, b) -> np.ndarray:
        """Node id of the LCA of leaves at positions a and b (vectorized)."""
        a = np.asarray(a, dtype=np.int64)
        lv = self.lca_level(a, b)
        return self.anc[a, lv]

    def lca_of_leaves(self, positions) -> int:
        pos = np.asarray(positions, dtype=np.int64)
        return int(self.lca_node(pos.min(), pos.max()))

    def distance_matrix(self) -> np.ndarray:
        """Ground distance h(LCA(i, j))/h(H) between all pairs of leaves (for tests, small H)."""
        idx = np.arange(self.n_leaves)
        lv = self.lca_level(idx[:, None], idx[None, :])
        return lv / self.height if self.height else np.zeros(lv.shape)

    def codes(self, values) -> np.ndarray:
        """Map labels to pre-order leaf positions; unknown labels raise KeyError naming one."""
        pos = self.leaf_pos
        out = np.empty(len(values), dtype=np.int64)
        for i, v in enumerate(values):
            try:
                out[i] = pos[v]
            except KeyError:
                raise KeyError("value '%s' is not a leaf of hierarchy %s" % (v, self._nm())) from None
        return out

    def to_arx(self, delimiter: str = ";") -> str:
        return "\n".join(delimiter.join(r) for r in self.rows) + "\n"
