"""The hierarchy model: ARX rows -> pre-order leaves, node ranges, heights, LCAs, errors."""
from __future__ import annotations

import itertools

import numpy as np
import re

import pytest

from sabre_pg.core.hierarchy import Hierarchy, HierarchyError, flat_root_label, parse_arx

# leaves deliberately interleaved: 'c' (under X) appears after 'b' (under Y) in the file
ROWS = [
    ["a", "X", "P", "*"],
    ["b", "Y", "Q", "*"],
    ["c", "X", "P", "*"],
    ["d", "Z", "P", "*"],
    ["e", "Y", "Q", "*"],
    ["f", "W", "Q", "*"],
    ["g", "Z", "P", "*"],
]


@pytest.fixture
def h():
    return Hierarchy(ROWS, name="t")


def naive_ancestors(rows):
    """leaf label -> list of (level, label) ancestors, straight from the rows."""
    return {r[0]: [(j, r[j]) for j in range(len(r))] for r in rows}


def test_basic_shape(h):
    assert h.height == 3
    assert h.n_leaves == 7
    # nodes: 7 leaves + X, Y, Z, W + P, Q + root
    assert h.n_nodes == 7 + 4 + 2 + 1
    assert h.labels[h.root] == "*"
    assert h.level[h.root] == 3
    assert h.parent[h.root] == -1
    assert not h.is_flat


def test_preorder_leaf_positions(h):
    # siblings in order of first appearance: P(X(a, c), Z(d, g)), Q(Y(b, e), W(f))
    assert h.leaves == ["a", "c", "d", "g", "b", "e", "f"]
    assert h.leaf_pos == {lab: i for i, lab in enumerate(h.leaves)}
    assert h.codes(["g", "a", "f"]).tolist() == [3, 0, 6]


def test_node_leaf_ranges_are_contiguous(h):
    anc = naive_ancestors(ROWS)
    for nid in range(h.n_nodes):
        key = (int(h.level[nid]), h.labels[nid])
        assert h.node_id[key] == nid
        under = sorted(h.leaf_pos[leaf] for leaf, a in anc.items() if key in a)
        assert under == list(range(int(h.lo[nid]), int(h.hi[nid]))), h.labels[nid]
        assert h.leaf_count[nid] == len(under)


def test_node_heights_and_parents(h):
    expect_level = {"a": 0, "X": 1, "Z": 1, "P": 2, "Q": 2, "*": 3}
    for lab, lv in expect_level.items():
        nid = h.node_id[(lv, lab)]
        assert h.level[nid] == lv
    for r in ROWS:
        for j in range(3):
            assert h.parent[h.node_id[(j, r[j])]] == h.node_id[(j + 1, r[j + 1])]
    # anc[:, j] is the level-j ancestor
    for p, leaf in enumerate(h.leaves):
        row = next(r for r in ROWS if r[0] == leaf)
        assert [h.labels[x] for x in h.anc[p]] == row
    assert sorted(h.labels[c] for c in h.children(h.node_id[(2, "P")])) == ["X", "Z"]
    assert h.leaf_count[h.root] == 7
    assert h.leaf_count[h.node_id[(1, "W")]] == 1


def naive_lca_level(rows, x, y):
    rx = next(r for r in rows if r[0] == x)
    ry = next(r for r in rows if r[0] == y)
    for j in range(len(rx)):
        if rx[j] == ry[j]:
            return j
    raise AssertionError


def test_lca_vectorized_vs_naive(h):
    n = h.n_leaves
    A, B = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    lv = h.lca_level(A, B)
    nd = h.lca_node(A, B)
    for i, j in itertools.product(range(n), range(n)):
        e = naive_lca_level(ROWS, h.leaves[i], h.leaves[j])
        assert lv[i, j] == e
        assert h.labels[nd[i, j]] == next(r for r in ROWS if r[0] == h.leaves[i])[e]
    D = h.distance_matrix()
    assert np.allclose(D, lv / 3)
    assert np.allclose(D, D.T) and np.all(np.diag(D) == 0)
    # the LCA of a set of leaves
    assert h.labels[h.lca_of_leaves([h.leaf_pos["a"], h.leaf_pos["g"]])] == "P"
    assert h.labels[h.lca_of_leaves([h.leaf_pos["c"]])] == "c"
    assert h.labels[h.lca_of_leaves([h.leaf_pos[x] for x in "adf"])] == "*"


def test_same_label_on_two_levels():
    """A label on a chain of nodes over the same leaves is one set: allowed."""
    h = Hierarchy([["a", "A", "*"], ["Other", "Other", "*"], ["b", "B", "*"]])
    assert h.n_leaves == 3
    assert h.height == 2
    assert h.lca_level(h.leaf_pos["a"], h.leaf_pos["Other"]) == 2
    assert h.lca_level(h.leaf_pos["a"], h.leaf_pos["a"]) == 0


@pytest.mark.parametrize("rows, label", [
    ([["a", "Other", "*"], ["Other", "Other", "*"], ["b", "B", "*"]], "Other"),   # internal node = a leaf
    ([["a", "a", "*"], ["b", "a", "*"]], "a"),
    ([["a", "X", "R", "*"], ["b", "Y", "X", "*"]], "X"),                      # two internal nodes
    ([["a", "*"], ["*", "*"]], "*"),                                           # the root = a leaf
])
def test_a_label_naming_two_sets_of_leaves_is_refused(rows, label):
    """A class over {a, Other} would be published as 'Other', which reads as the leaf."""
    with pytest.raises(HierarchyError, match="label '%s' names two different nodes" % re.escape(label)):
        Hierarchy(rows, name="h")


def test_flat_hierarchy_takes_the_empty_string():
    h = Hierarchy.flat(["x", "", "y"])
    assert h.leaves == ["", "x", "y"] and h.labels[h.root] == "*"
    with pytest.raises(HierarchyError, match="empty label"):
        Hierarchy([["", "*"], ["x", "*"]])


def test_from_arx_and_round_trip(h):
    text = "\n".join(";".join(r) for r in ROWS) + "\n\n"
    h2 = Hierarchy.from_arx(text)
    assert h2.leaves == h.leaves
    h3 = Hierarchy.from_arx(h.to_arx())
    assert h3.leaves == h.leaves and h3.labels == h.labels
    assert parse_arx("a,b\r\nc,b\r\n", ",") == [["a", "b"], ["c", "b"]]
    with pytest.raises(HierarchyError):
        parse_arx("a;b", "")


@pytest.mark.parametrize("rows, pattern", [
    ([["a", "X", "*"], ["b", "*"]], r"row 2 has 2 fields, row 1 has 3 \(ragged"),
    ([["a", "X", "*"], ["b", "X", "*"], ["c", "Y", "ROOT"]], r"two roots.*'\*' \(row 1\).*'ROOT' \(row 3\)"),
    ([["a", "X", "*"], ["b", "Y", "*"], ["a", "Y", "*"]], r"leaf 'a' appears twice \(rows 1 and 3\)"),
    ([["a", "X", "P", "*"], ["b", "X", "Q", "*"]], r"node 'X' has two parents, 'P' \(row 1\) and 'Q' \(row 2\)"),
    ([["a", "X", "*"], ["b", "", "*"]], r"row 2 has an empty label in column 2"),
    ([["", "*"]], r"row 1 has an empty label in column 1"),
    ([], r"no rows"),
])
def test_errors_name_the_row(rows, pattern):
    with pytest.raises(HierarchyError, match=pattern):
        Hierarchy(rows, name="bad")


def test_error_message_names_the_hierarchy():
    with pytest.raises(HierarchyError, match="'disease'"):
        Hierarchy([["a", "X", "*"], ["b"]], name="disease")
    assert issubclass(HierarchyError, ValueError)


def test_leaf_with_two_parents_is_reported():
    # a leaf under two parents necessarily repeats the leaf: named with both rows
    with pytest.raises(HierarchyError, match=r"'a'.*rows 1 and 2"):
        Hierarchy([["a", "X", "*"], ["a", "Y", "*"]])


def test_unknown_code_names_the_value(h):
    with pytest.raises(KeyError, match="'zzz' is not a leaf"):
        h.codes(["a", "zzz"])


@pytest.mark.parametrize("rows, height, n_nodes", [([["a", "*"]], 1, 2), ([["a"]], 0, 1)])
def test_single_leaf(rows, height, n_nodes):
    h = Hierarchy(rows)
    assert h.height == height
    assert h.n_leaves == 1 and h.leaves == ["a"]
    assert h.n_nodes == n_nodes
    assert h.leaf_count[h.root] == 1
    assert h.lca_level(0, 0) == 0
    assert h.lca_of_leaves([0]) == h.node_id[(0, "a")]
    assert h.distance_matrix().tolist() == [[0.0]]
    assert h.is_flat


def test_flat():
    h = Hierarchy.flat(["x", "y", "z"], name="letters")
    assert h.height == 1 and h.is_flat and h.name == "letters"
    assert h.leaves == ["x", "y", "z"]
    assert h.labels[h.root] == "*"
    D = h.distance_matrix()
    assert np.array_equal(D, 1 - np.eye(3))
    h1 = Hierarchy.flat([7])
    assert h1.leaves == ["7"] and h1.height == 1
    with pytest.raises(HierarchyError, match="at least one value"):
        Hierarchy.flat([])


def test_flat_leaves_are_the_sorted_distinct_values():
    """The same set of values gives the same leaves (and leaf positions) in any order or
    repetition; values are compared as text and sorted by code point (not by locale)."""
    h = Hierarchy.flat(["b", "a", "B", "b", "é", "a"])
    assert h.leaves == ["B", "a", "b", "é"]
    assert Hierarchy.flat(["é", "B", "a", "b"]).rows == h.rows
    assert Hierarchy.flat([10, 9, "10"]).leaves == ["10", "9"]


@pytest.mark.parametrize("values, root", [
    (["x", "y"], "*"),
    (["*", "x"], "(any)"),
    (["*"], "(any)"),
    (["(any)", "x"], "*"),
    (["*", "(any)"], "(any 2)"),
    (["*", "(any)", "(any 2)", "(any 3)", "x"], "(any 4)"),
])
def test_flat_root_label_is_never_a_value(values, root):
    h = Hierarchy.flat(values)
    assert flat_root_label(values) == root
    assert h.labels[h.root] == root and h.height == 1
    assert sorted(h.leaves) == sorted(set(values))
    # a class generalized to the root must not read like a class holding that value
    assert root not in h.leaves
