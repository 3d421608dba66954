"""Partition first, then SABRE inside each part (issue #11's hybrid of t-Mondrian and SABRE;
a benchmark method only, docs/partition-first.md).

1. t-Mondrian (:func:`.mondrian.mondrian`) cuts the table top down into parts P of at least
   ``part_rows`` rows (its k is ``part_rows``), each t-close to the table by the exact EMD.
2. Inside each part, SABRE-AK (:func:`.sabre.plan_from_counts` on P's SA counts, then
   :func:`.takeout.takeout_sweep` in Hilbert order) with the budget ``t - EMD(P, table)``:
   every class C of P has EMD(C, P) <= t - EMD(P, table) by Theorem 4, so EMD(C, table) <= t
   by the triangle inequality (the argument of SABRE_W's DIRECT case).
3. Every class is then checked by the exact EMD against the whole table and for k rows; a part
   with a class that fails (or no budget left) is published as one class (it is t-close and
   has >= part_rows >= k rows).  The guarantee therefore rests on the exact check alone.

Measured (``benchmarks/bench_methods.py --methods partition-first``): SABRE's classes spread over their
part's QI space, so its AIL is about twice t-Mondrian's even with parts of 256 rows, and a plan
per part costs more than SABRE-AK on the whole table.  It is kept as a benchmark method to
reproduce that result; the product does not expose it.
"""
from __future__ import annotations

import numpy as np

from .checkpoint import checkpoint
from .emd import SADomain
from .exact_emd import domain_class_emds
from .hilbert import hilbert_keys
from .mondrian import mondrian
from .parameters import check_k, check_t
from .sabre import plan_from_counts
from .takeout import takeout_sweep

PART_ROWS = 1024          # default smallest part of the t-Mondrian split


def partition_first(qis, sa_codes, domain: SADomain, t: float, k: int, part_rows: int = PART_ROWS,
           keys: np.ndarray | None = None, lookahead: int = 4) -> np.ndarray:
    """The class id (0..C-1) of every row: t-Mondrian parts of >= ``part_rows`` rows, SABRE-AK
    inside each with budget t - EMD(part, table), every class exactly checked (see the module).

    ``keys``: Hilbert keys of the rows (default: made here), the order of takeOut's sweep."""
    codes = np.asarray(sa_codes, dtype=np.int64)
    n = len(codes)
    t, k = check_t(t), check_k(k, n)
    if part_rows < k:
        raise ValueError("part_rows must be at least k (%d), got %r" % (k, part_rows))
    if keys is None:
        keys = hilbert_keys([qi.values for qi in qis], [qi.axis_range() for qi in qis])
    ones = np.ones(n, dtype=np.int64)
    part = mondrian(qis, codes, domain, t, min(part_rows, n))
    budget = t - domain_class_emds(part, codes, ones, domain).emd
    order = np.argsort(part, kind="stable")
    sizes = np.bincount(part)
    ec = np.empty(n, dtype=np.int64)
    next_id = 0
    for q, rows in enumerate(np.split(order, np.cumsum(sizes)[:-1])):
        checkpoint()
        local = np.zeros(len(rows), dtype=np.int64)
        if budget[q] > 0 and len(rows) >= 2 * k:
            plan = plan_from_counts(np.bincount(codes[rows], minlength=domain.m), domain,
                                    float(budget[q]), k, lookahead)
            local = takeout_sweep(plan.buckets.bucket_of_code()[codes[rows]], keys[rows],
                                  plan.plan.templates)
        ec[rows] = next_id + local
        next_id += int(local.max()) + 1
    exact = domain_class_emds(ec, codes, ones, domain)
    failed = np.zeros(next_id, dtype=bool)
    failed[exact.class_ids] = exact.violating(t, k)
    whole = np.zeros(len(sizes), dtype=bool)
    whole[part[failed[ec]]] = True               # parts with a failing class stay whole
    ec = np.where(whole[part], next_id + part, ec)
    _, inverse = np.unique(ec, return_inverse=True)
    return inverse.reshape(-1).astype(np.int64)
