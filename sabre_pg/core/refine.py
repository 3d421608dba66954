"""Refinement (``method => 'refine'``): t-Mondrian's classes cut further by SABRE's idea.

t-Mondrian (:mod:`.mondrian`) stops when no median cut of a class keeps both parts t-close:
a cut by QI alone moves the SA distribution.  SABRE's dichotomize halves a class *by SA
value* instead, so both halves keep about the class's SA distribution.  The refinement joins
the two: every t-Mondrian class is cut again on its widest QI, but stratified -- of each SA
value's rows, the half with the smaller QI values goes left (odd counts round up and down
alternately, as dichotomize does; rows with equal values of the QI in Hilbert order) -- and
then Mondrian-style again while cuts are allowed, each QI tried widest first, a median cut
before a stratified one.

Safety: a cut is kept only if both parts have >= k rows and an *exact* EMD to the table of at
most t (:func:`.mondrian.cut_round`), so every published class is checked by exact arithmetic
whatever the cut rule.  Utility: the refinement only cuts t-Mondrian's classes, and a part's
range (or lowest common ancestor) lies within its class's, so no row's information loss
grows: AIL is at most t-Mondrian's, class for class.
"""
from __future__ import annotations

import numpy as np

from .emd import SADomain
from .hilbert import hilbert_keys
from .mondrian import Partitioner, split_all


def refine(qis, sa_codes, domain: SADomain, t: float, k: int, classes: np.ndarray,
           keys: np.ndarray | None = None) -> np.ndarray:
    """Cut the t-close, k-anonymous ``classes`` (an id per row) further with median and
    stratified cuts; returns the new class id (0..C-1) of every row.

    ``keys`` (default: the rows' Hilbert keys) order rows with equal values of the cut QI, so
    a stratified cut keeps together rows that are close in the other QIs (Adult, t = 0.2:
    AIL 0.439 against 0.454 in row order)."""
    p = Partitioner(qis, sa_codes, domain, t, k)
    p.order_ties(hilbert_keys([qi.values for qi in qis], [qi.axis_range() for qi in qis])
                 if keys is None else keys)
    return split_all(p, np.asarray(classes, dtype=np.int64), stratify=True)
