"""Utility and privacy metrics on hand-computed cases."""
from __future__ import annotations

import numpy as np
import pytest

from sabre_pg.core import metrics
from sabre_pg.core.generalize import CategoricalNode, NumericalRange
from sabre_pg.core.hierarchy import Hierarchy


def test_il_numerical():
    g = NumericalRange(np.array([20.0, 30.0, 50.0]), np.array([40.0, 30.0, 70.0]))
    # table range 20..70 (span 50): (40-20)/50, 0, (70-50)/50
    assert metrics.il_numerical(g, 20, 70).tolist() == pytest.approx([0.4, 0.0, 0.4])
    # a constant column loses nothing
    assert metrics.il_numerical(g, 5, 5).tolist() == [0, 0, 0]


def test_il_categorical():
    rows = [["a", "X", "*"], ["b", "X", "*"], ["c", "X", "*"], ["d", "Y", "*"], ["e", "Y", "*"]]
    h = Hierarchy(rows)
    nodes = np.array([h.node_id[(0, "a")], h.node_id[(1, "X")], h.node_id[(1, "Y")], h.root])
    il = metrics.il_categorical(CategoricalNode(nodes, h))
    # (|leaves| - 1) / (5 - 1): leaf 0, X 2/4, Y 1/4, root 1
    assert il.tolist() == pytest.approx([0.0, 0.5, 0.25, 1.0])
    one = Hierarchy([["a", "*"]])
    assert metrics.il_categorical(CategoricalNode(np.array([one.root]), one)).tolist() == [0.0]


def test_il_per_class_weights_and_ail():
    il1 = np.array([0.4, 0.0, 1.0])
    il2 = np.array([0.2, 0.6, 0.0])
    # default weights 1/d
    assert metrics.il_per_class([il1, il2]).tolist() == pytest.approx([0.3, 0.3, 0.5])
    assert metrics.il_per_class([il1, il2], [1.0, 0.0]).tolist() == pytest.approx(il1.tolist())
    assert metrics.il_per_class([il1]).tolist() == pytest.approx(il1.tolist())
    with pytest.raises(ValueError, match="3 weights for 2"):
        metrics.il_per_class([il1, il2], [1, 1, 1])
    # AIL = sum |G| IL(G) / n: (2*0.3 + 3*0.3 + 5*0.5) / 10 = 0.4
    assert metrics.ail(np.array([0.3, 0.3, 0.5]), np.array([2, 3, 5])) == pytest.approx(0.4)


def test_discernibility_aecs_closeness():
    sizes = np.array([2, 3, 5])
    assert metrics.discernibility(sizes) == 4 + 9 + 25
    assert metrics.average_class_size(10, 3) == pytest.approx(10 / 3)
    assert metrics.average_class_size(10, 3, k=2) == pytest.approx(10 / 6)
    assert metrics.real_closeness(np.array([0.1, 0.35, 0.2])) == 0.35
    assert metrics.real_closeness(np.array([])) == 0.0


def test_categorical_il_ours_and_the_papers():
    """Ours is (L - 1)/(N - 1) (0 for a leaf); the paper's L/N charges a leaf 1/N."""
    h = Hierarchy([["a", "x", "*"], ["b", "x", "*"], ["c", "y", "*"], ["d", "y", "*"]])
    nodes = np.array([int(h.lca_node(0, 0)), int(h.lca_node(0, 1)), h.root])
    g = CategoricalNode(nodes, h)
    il_categorical = metrics.il_categorical
    assert il_categorical(g).tolist() == pytest.approx([0.0, 1 / 3, 1.0])
    assert il_categorical(g, paper=True).tolist() == pytest.approx([1 / 4, 2 / 4, 1.0])
