"""The sort-based t-Mondrian rounds that the kept per-QI orders replaced: the reference
:mod:`tests.core.test_mondrian_orders` compares :func:`sabre_pg.core.mondrian.split_all` with
(no pytest import: the server's Python runs it too, for the compiled split)."""
from __future__ import annotations

import numpy as np

from sabre_pg.core.mondrian import Partitioner, _compact, cut_round


def sorted_rounds(p: Partitioner, part: np.ndarray) -> np.ndarray:
    """The reference: every partition tries its QIs widest first, a round sorts the live rows
    and cuts each partition at the median of its QI (the implementation before the kept
    orders, verbatim but for the stratified mode, which no caller used)."""
    n_parts = int(part.max()) + 1
    d = p.columns.shape[1]
    tries = np.zeros(n_parts, dtype=np.int64)
    final = np.zeros(n_parts, dtype=bool)
    spans = np.zeros((n_parts, d))
    known = np.zeros(n_parts, dtype=bool)
    while not final.all():
        need = ~final & ~known
        if need.any():
            spans[need] = p.spans(np.where(need[part], part, -1), n_parts)[need]
            known |= need
        attempt = np.minimum(tries, d - 1)
        pick = np.argsort(-spans, axis=1, kind="stable")[np.arange(n_parts), attempt]
        usable = ~final & (tries < d) & (spans[np.arange(n_parts), pick] > 0)
        final |= ~usable
        live = np.where(final[part], -1, part)
        new_part, new_n, cut = cut_round(p, live, n_parts, np.where(usable, pick, -1))
        tries[usable & ~cut] += 1
        part = np.where(final[part], part, new_part)
        grown = new_n - n_parts
        present = np.bincount(part, minlength=new_n) > 0
        used = np.flatnonzero(present)
        part = (np.cumsum(present) - 1)[part]
        final = np.concatenate((final, np.zeros(grown, dtype=bool)))[used]
        tries = np.concatenate((tries, np.zeros(grown, dtype=np.int64)))[used]
        known = np.concatenate((known, np.zeros(grown, dtype=bool)))[used]
        spans = np.concatenate((spans, np.zeros((grown, d))))[used]
        n_parts = len(used)
    return _compact(part)
