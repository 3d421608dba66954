"""EC generalization: numerical ranges and categorical LCAs."""
from __future__ import annotations

import numpy as np
import pytest

from sabre_pg.core.generalize import (ECIndex, generalize_categorical, generalize_numerical)
from sabre_pg.core.hierarchy import Hierarchy


def test_ec_index():
    idx = ECIndex(np.array([2, 0, 1, 0, 2, 2]))
    assert idx.n_classes == 3
    assert idx.sizes.tolist() == [2, 1, 3]
    assert idx.starts.tolist() == [0, 2, 3]
    lo, hi = idx.min_max(np.array([5, 1, 7, 3, 9, 6]))
    assert lo.tolist() == [1, 7, 5] and hi.tolist() == [3, 7, 9]


def test_ec_index_rejects_empty_class():
    with pytest.raises(ValueError, match="no empty class"):
        ECIndex(np.array([0, 2, 2]))
    with pytest.raises(ValueError):
        ECIndex(np.array([0, 0]), n_classes=2)


def test_numerical_min_max():
    ec = np.array([0, 1, 0, 1, 2])
    v = np.array([30.5, 17.0, 22.0, 40.0, 8.0])
    g = generalize_numerical(ECIndex(ec), v)
    assert g.lo.tolist() == [22.0, 17.0, 8.0]
    assert g.hi.tolist() == [30.5, 40.0, 8.0]


def test_categorical_flat_hierarchy():
    h = Hierarchy.flat(["M", "F", "X"])
    ec = np.array([0, 0, 1, 1, 2])
    pos = h.codes(["M", "M", "M", "F", "X"])
    g = generalize_categorical(ECIndex(ec), pos, h)
    # one value -> the leaf itself; more than one -> the root of a flat hierarchy
    assert g.labels.tolist() == ["M", "*", "X"]
    assert g.node[1] == h.root


def test_categorical_deep_hierarchy_lca():
    rows = [["a", "X", "P", "*"], ["b", "X", "P", "*"], ["c", "Y", "P", "*"],
            ["d", "Z", "Q", "*"], ["e", "Z", "Q", "*"]]
    h = Hierarchy(rows)
    groups = [["a", "b"], ["a", "c"], ["a", "e"], ["d", "d", "e"], ["c"], ["b", "a", "c", "b"]]
    want = ["X", "P", "*", "Z", "c", "P"]
    ec = np.concatenate([[i] * len(g) for i, g in enumerate(groups)])
    vals = [v for g in groups for v in g]
    g = generalize_categorical(ECIndex(ec), h.codes(vals), h)
    assert g.labels.tolist() == want
    assert [int(h.level[x]) for x in g.node] == [1, 2, 3, 1, 0, 2]


def brute_lca(h: Hierarchy, positions) -> int:
    """The lowest node above every leaf, found by walking up the parent links."""
    chains = []
    for p in set(int(x) for x in positions):
        node, chain = h.node_id[(0, h.leaves[p])], []
        while node >= 0:
            chain.append(node)
            node = int(h.parent[node])
        chains.append(chain)
    common = set(chains[0]).intersection(*chains[1:])
    return next(node for node in chains[0] if node in common)    # first = lowest


def test_generalization_is_tight_on_random_classes():
    """Ranges are exactly each class's min and max, labels exactly the lowest common ancestor
    of its values (not merely covering them), checked per class against a brute force."""
    rows = [["a", "X", "P", "*"], ["b", "X", "P", "*"], ["c", "Y", "P", "*"],
            ["d", "Z", "Q", "*"], ["e", "Z", "Q", "*"], ["f", "W", "Q", "*"]]
    h = Hierarchy(rows)
    rng = np.random.default_rng(11)
    for _ in range(30):
        n = int(rng.integers(1, 60))
        n_classes = int(rng.integers(1, n + 1))
        ec = np.concatenate([np.arange(n_classes), rng.integers(0, n_classes, n - n_classes)])
        rng.shuffle(ec)
        values = rng.normal(40, 15, n).round(1)
        positions = rng.integers(0, h.n_leaves, n)
        index = ECIndex(ec)
        ranges = generalize_numerical(index, values)
        nodes = generalize_categorical(index, positions, h)
        for c in range(n_classes):
            members = ec == c
            assert (ranges.lo[c], ranges.hi[c]) == (values[members].min(), values[members].max())
            assert nodes.node[c] == brute_lca(h, positions[members])
            assert nodes.labels[c] == h.labels[brute_lca(h, positions[members])]
