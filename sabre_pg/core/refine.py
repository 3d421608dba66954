"""Refinement (``method => 'refine'``): t-Mondrian's top-down partitioning with a searched cut.

t-Mondrian (:mod:`.mondrian`) cuts a partition at the median of its widest QI and stops it as
soon as that cut (and the median of every other QI) moves a part's SA distribution beyond t.
The refinement cuts the same way, top down from the whole table (or from given classes), but
each partition keeps the cut, among many candidates on every QI, that lowers the information
loss most while both parts stay k-anonymous and t-close by the exact EMD
(:mod:`.cut_search`: quantile cuts, cuts along a categorical QI's hierarchy, the least-IL
position, and SABRE's stratified cut that halves every SA value's rows).

Safety: a cut is kept only after the exact check of both parts, so every published class is
t-close and k-anonymous by the arithmetic of ``sabre_verify`` whatever the search chooses.
Utility is measured, not proven, against t-Mondrian (``benchmarks/bench_methods.py``,
``docs/evaluation.md``): starting from t-Mondrian's classes would guarantee "never worse class
for class", but starting from the whole table measured lower on every data set (Adult, t = 0.2:
AIL 0.318 against 0.357).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .cut_search import cut_search
from .emd import SADomain
from .hilbert import hilbert_keys
from .mondrian import Partitioner


def refine(qis, sa_codes, domain: SADomain, t: float, k: int, classes: np.ndarray | None = None,
           keys: np.ndarray | None = None, emd_weight: float = 0.0, search: str = "fast") -> np.ndarray:
    """The class id (0..C-1) of every row: ``classes`` (t-close, k-anonymous; default: the
    whole table as one partition) cut while a searched cut stays t-close (``emd_weight``,
    ``search`` ('fast' or 'thorough'): see :func:`.cut_search.cut_search`).

    ``keys`` (default: the rows' Hilbert keys) order rows with equal values of a QI, so cuts
    through ties keep together rows that are close in the other QIs."""
    if keys is None:
        keys = hilbert_keys([qi.values for qi in qis], [qi.axis_range() for qi in qis])
    # rows stored in key order: a partition's rows lie close together in memory (the search
    # gathers them once per QI and round)
    at = np.argsort(keys, kind="stable")
    p = Partitioner([dataclasses.replace(qi, values=np.asarray(qi.values)[at]) for qi in qis],
                    np.asarray(sa_codes)[at], domain, t, k)
    p.order_ties(np.asarray(keys)[at])
    part = np.zeros(len(at), dtype=np.int64) if classes is None else np.asarray(classes, np.int64)[at]
    ec = np.empty(len(at), dtype=np.int64)
    ec[at] = cut_search(p, part, emd_weight, search)
    return ec
