"""Refinement (``method => 'refine'``): t-Mondrian's top-down partitioning with a searched cut,
then a rescue of the classes it leaves and merge passes.

1. **Cut search** (:mod:`.cut_search`).  t-Mondrian (:mod:`.mondrian`) cuts a partition at the
   median of its widest QI and stops it as soon as that cut (and the median of every other
   QI) moves a part's SA distribution beyond t.  The refinement cuts the same way, top down
   from the whole table (or from given classes), but each partition keeps the cut, among many
   candidates on every QI, that lowers the information loss most while both parts stay
   k-anonymous and t-close by the exact EMD.
2. **Rescue** (:func:`stratified_rescue`).  The search leaves classes with an EMD just below t;
   SABRE's stratified halving would keep their distribution but for the rounding of odd
   counts, which puts the halves just above t.  The rounding is searched
   (:func:`balanced_halves`) and a class is halved along the QI where IL falls most.
3. **Merge passes** (:func:`merge_passes`).  A union of t-close classes is t-close (EMD is
   convex in the class distribution), so neighbouring classes are merged 4 at a time and
   searched again; a union keeps its new classes only where their summed IL is lower.

Safety: a cut or half is kept only after the exact check of both parts, so every published
class is t-close and k-anonymous by the arithmetic of ``sabre_verify`` whatever the search
chooses.  Utility is measured, not proven, against t-Mondrian (``benchmarks/bench_methods.py``,
``docs/evaluation.md``): starting from t-Mondrian's classes would guarantee "never worse class
for class" (merge passes then stay inside them), but starting from the whole table measured
lower on every data set (Adult, t = 0.2: AIL 0.318 against 0.357).  The rescue and the merge
passes never raise the AIL of what they start from.
"""
from __future__ import annotations

import dataclasses
import functools
import signal
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .checkpoint import checkpoint, map_checked
from .cut_search import cut_search, run_ranks
from .generalize import ECIndex, stable_argsort
from .emd import SADomain
from .hilbert import hilbert_keys
from .mondrian import Partitioner
from .redistribute import dichotomize

MERGE_GROUP = 4          # classes merged into one union by a merge pass
MERGES = {"fast": 2, "thorough": 4}     # merge passes per search setting
MERGE_ROWS = 50_000      # 'fast' makes its merge passes on tables up to this many rows, and
                         # searches the stratified cut first (not only on a retry) there
BALANCE_STEPS = 16       # roundings flipped at most by the halves' rounding search
BALANCE_CHUNK = 1 << 22  # (partitions x flips x values) evaluated at once by that search
THREAD_ROWS = 1 << 14    # tables of at least this many rows are searched in threads
THREAD_PARTS = 4         # the whole table's first rounds run until about this many partitions
                         # per thread (then the threads take them one at a time, largest first)


def refine(qis, sa_codes, domain: SADomain, t: float, k: int, classes: np.ndarray | None = None,
           keys: np.ndarray | None = None, emd_weight: float = 0.0, search: str = "fast",
           merges: int | None = None, rescue: bool = True, threads: int = 1,
           key_order: np.ndarray | None = None, other_sas=(), reference=None) -> np.ndarray:
    """The class id (0..C-1) of every row: ``classes`` (t-close, k-anonymous; default: the
    whole table as one partition) cut while a searched cut stays t-close (``emd_weight``,
    ``search`` ('fast' or 'thorough'): see :func:`.cut_search.cut_search`); then, with
    ``rescue``, the classes it leaves halved by :func:`stratified_rescue`; then ``merges``
    merge passes (:func:`merge_passes`; default :func:`merge_count` of ``search``).

    ``keys`` (default: the rows' Hilbert keys) order rows with equal values of a QI, so cuts
    through ties keep together rows that are close in the other QIs.

    ``threads`` > 1: a table of at least :data:`THREAD_ROWS` rows is searched and rescued in
    that many threads (:func:`search_threads`); the classes are the same as with one.
    ``key_order``: ``np.argsort(keys, kind="stable")`` when the caller has it.
    ``other_sas``: (codes, domain, t) of further SAs every class must also be t-close on
    (several SAs: :mod:`.multi_refine`), or (codes, domain, t, reference counts).  ``reference``: SA counts of a larger table holding
    these rows; every class is then t-close to its distribution (a Citus shard anonymized
    against its whole table, :class:`.mondrian.Partitioner`)."""
    if keys is None:
        keys = hilbert_keys([qi.values for qi in qis], [qi.axis_range() for qi in qis])
    # rows stored in key order: a partition's rows lie close together in memory (the search
    # gathers them once per QI and round)
    at = np.argsort(keys, kind="stable") if key_order is None else key_order
    p = Partitioner([dataclasses.replace(qi, values=np.asarray(qi.values)[at]) for qi in qis],
                    np.asarray(sa_codes)[at], domain, t, k, reference)
    for codes, other, t_other, *ref in other_sas:      # several SAs (multi_refine.py); ref: its reference
        p.add_sa(np.asarray(codes)[at], other, t_other, *ref)
    p.order_ties(np.asarray(keys)[at])
    part = np.zeros(len(at), dtype=np.int64) if classes is None else np.asarray(classes, np.int64)[at]
    # a table small enough for merge passes also gets the stratified cut in every first search
    found = search_threads(p, part, threads, rescue, emd_weight=emd_weight, search=search,
                           stratify_first=len(at) <= MERGE_ROWS or None)
    ec = np.empty(len(at), dtype=np.int64)
    ec[at] = merge_passes(p, found, merge_count(search, len(at)) if merges is None else merges,
                          emd_weight, rescue, None if classes is None else part)
    return ec


def search_threads(p: Partitioner, part: np.ndarray, threads: int, rescue: bool, **search) -> np.ndarray:
    """The cut search of ``part`` (keyword arguments ``search`` of :func:`.cut_search.cut_search`)
    and, with ``rescue``, the stratified rescue of what it leaves: the class of every row.

    With ``threads`` > 1 and at least :data:`THREAD_ROWS` rows, the whole table is searched
    for the rounds that make about :data:`THREAD_PARTS` partitions per thread, each round's
    per-QI work shared between the threads (``pmap`` of :func:`.cut_search.cut_search`); then
    each partition, the largest first, is taken by the next free thread, which searches and
    rescues it as a table of its own (:meth:`.mondrian.Partitioner.subset`: same EMDs and
    spans).  Every decision of the search and the rescue depends on one partition's rows
    only, so the classes are those of one thread; numpy releases the interpreter lock in its
    loops, so the threads can run on separate cores (measured at 1M rows on 2 cores: between
    no gain and 1.3x, docs/evaluation.md).  The threads block every signal: the
    caller's thread (a database backend's) receives them as before."""
    def run(q, part):
        found = cut_search(q, part, **search)
        return stratified_rescue(q, found) if rescue else found

    if threads <= 1 or len(part) < THREAD_ROWS:
        return run(p, part)
    with ThreadPoolExecutor(threads, initializer=_signals_to_caller) as pool:
        part = cut_search(p, part, max_rounds=int(np.ceil(np.log2(THREAD_PARTS * threads))),
                          pmap=functools.partial(map_checked, pool), **search)
        # one task per partition, the largest first: a thread that is done takes the next
        by = ECIndex(part)
        groups = [by.order[by.starts[q]:by.starts[q] + by.sizes[q]] for q in np.argsort(-by.sizes, kind="stable")]
        found = map_checked(pool, lambda q: run(q, np.zeros(len(q.codes), dtype=np.int64)), p.subsets(groups))
    ec, offset = np.empty(len(part), dtype=np.int64), 0
    for rows, f in zip(groups, found):
        checkpoint()
        ec[rows] = f + offset
        offset += int(f.max()) + 1
    return ec


def _signals_to_caller() -> None:
    """A worker thread blocks every signal, so they reach the thread that started it."""
    signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())


def merge_count(search: str, n: int) -> int:
    """Merge passes of a table of n rows: :data:`MERGES` of the setting, none for 'fast'
    above :data:`MERGE_ROWS` rows."""
    return MERGES[search] if search != "fast" or n <= MERGE_ROWS else 0


def merge_passes(p: Partitioner, ec: np.ndarray, passes: int, emd_weight: float = 0.0,
                 rescue: bool = True, within: np.ndarray | None = None) -> np.ndarray:
    """Classes ``ec`` improved by ``passes`` merge passes: the classes, in the order of their
    first row (rows are stored in Hilbert-key order), are merged :data:`MERGE_GROUP` at a time
    (every other pass shifted by half a group, so a boundary of one pass is inside a group of
    the next); every union is searched again ('thorough' cut search, then the stratified
    rescue), and a union keeps its new classes only where their summed IL is lower than its
    old classes'.  A union of t-close classes is t-close (EMD is convex in the class's
    distribution) and has >= k rows, so the search may start from it; every new class passes
    the same exact check.  Cost per pass: about one thorough search of the table.  ``within``
    (a partition id per row, e.g. given classes): a union never crosses its partitions."""
    for i in range(passes):
        checkpoint()
        n_classes, n = int(ec.max()) + 1, len(ec)
        union = _unions(ec, within, n_classes, (i % 2) * (MERGE_GROUP // 2))
        new = cut_search(p, union[ec], emd_weight, "thorough")
        if rescue:          # classes the search left as they were are rescued already
            new = stratified_rescue(p, new, ~_unchanged(ec, new))
        rows = np.arange(n)
        old_il = np.bincount(union, weights=_summed_il(p, rows, ec, n_classes))
        new_union = np.zeros(int(new.max()) + 1, dtype=np.int64)
        new_union[new] = union[ec]
        new_il = np.bincount(new_union, weights=_summed_il(p, rows, new, len(new_union)),
                             minlength=len(old_il))
        better = new_il < old_il * (1 - 1e-12)
        _, ec = np.unique(np.where(better[union[ec]], n_classes + new, ec), return_inverse=True)
        ec = ec.reshape(-1)
    return ec


def stratified_rescue(p: Partitioner, ec: np.ndarray, todo: np.ndarray | None = None) -> np.ndarray:
    """Classes ``ec`` (0..C-1) of the rows of ``p`` that the cut search left, cut by
    :func:`rescue_round` while it cuts one (those of ``todo``, default all; then the halves,
    down to 2k rows).
    The search is not resumed inside the halves: they keep about their class's EMD, so its
    cuts are refused there (Adult: AIL 0.309 resumed, 0.309 not, 0.4 s less).  Returns class
    ids."""
    if todo is None:
        todo = np.ones(int(ec.max()) + 1 if len(ec) else 0, dtype=bool)
    while todo.any():
        checkpoint()
        ec, todo = rescue_round(p, ec, todo)
    return ec


def rescue_round(p: Partitioner, ec: np.ndarray, todo: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cut every class of ``todo`` with >= 2k rows into SABRE's stratified halves (each SA
    value's rows halved in the order of one QI, the extra row of an odd count placed by
    :func:`balanced_halves`) along the QI where the summed IL falls most, if it falls and both
    halves pass the exact check.  Returns the new class of every row and, per new class,
    whether it is such a half."""
    n_classes, m, k = len(todo), p.domain.m, p.k
    sizes = np.bincount(ec, minlength=n_classes)
    q = np.flatnonzero(todo & (sizes >= 2 * k))
    if not len(q):
        return ec, np.zeros(n_classes, dtype=bool)
    at = np.full(n_classes, -1)
    at[q] = np.arange(len(q))
    rows = np.flatnonzero(at[ec] >= 0)
    owner, codes = at[ec[rows]], p.codes[rows]
    counts = np.bincount(owner * m + codes, minlength=len(q) * m).reshape(len(q), m)
    left_counts = balanced_halves(counts, p.domain, p.table_counts / p.table_counts.sum(), p.t)
    n_left = left_counts.sum(axis=1)
    best, right, own = _best_halves(p, rows, owner, owner * m + codes, left_counts)
    want = (n_left >= k) & (sizes[q] - n_left >= k) & (best < own * (1 - 1e-12))
    label = np.where(want[owner], 2 * owner + right, -1)
    ids, ok = p.t_close(label[label >= 0], rows[label >= 0])
    passed = np.zeros(2 * len(q), dtype=bool)
    passed[ids] = ok
    cut = want & passed[0::2] & passed[1::2]
    new = ec.copy()
    mine = cut[owner]
    new[rows[mine]] = n_classes + 2 * owner[mine] + right[mine]
    present = np.bincount(new, minlength=n_classes + 2 * len(q)) > 0
    halves = np.r_[np.zeros(n_classes, dtype=bool), np.ones(2 * len(q), dtype=bool)][present]
    return (np.cumsum(present) - 1)[new], halves


def _best_halves(p: Partitioner, rows, owner, group, left_counts):
    """(least summed IL of the halves, whether each row goes right in them, summed IL of the
    class) of every class ``owner`` (0..Q-1) of ``rows``: each (class, SA value) ``group``'s
    rows halved in the order of a QI, ``left_counts`` (Q x m) of them left, along the QI
    where the halves' IL is least (the first such QI on ties).  A class's halves along a QI
    with one value there follow the ties' order, the same for every such QI: they are scored
    once, at the first of them (a later one never scores lower)."""
    n_q = len(left_counts)
    best, right = np.full(n_q, np.inf), np.zeros(len(rows), dtype=bool)
    spans, single = p.group_spans(rows, owner, n_q, single=True)
    first_single = np.where(single.any(axis=1), np.argmax(single, axis=1), -1)
    for j in range(len(p.qis)):
        checkpoint()
        use = ~single[:, j] | (first_single == j)
        if not use.any():
            continue
        sub = None if use.all() else np.flatnonzero(use[owner])
        rows_j, owner_j, group_j = (rows, owner, group) if sub is None else (rows[sub], owner[sub], group[sub])
        order = _group_order(p, rows_j, group_j, j)
        key = group_j[order]
        r = np.empty(len(rows_j), dtype=bool)
        r[order] = run_ranks(key) >= left_counts.reshape(-1)[key]
        score = _summed_il(p, rows_j, 2 * owner_j + r, 2 * n_q)
        score = np.where(use, score[0::2] + score[1::2], np.inf)
        better = score < best
        best[better] = score[better]
        if sub is None:
            right = np.where(better[owner], r, right)
        else:
            right[sub] = np.where(better[owner_j], r, right[sub])
    return best, right, _il_of(p, spans, np.bincount(owner, minlength=n_q))


def _group_order(p: Partitioner, rows, group, j) -> np.ndarray:
    """Indices of ``rows`` sorted by (``group``, position in the order of QI j).  Most of
    the table: the table's order of QI j restricted to the rows, then a stable radix sort by
    group (linear); a few rows: one sort of them."""
    if 8 * len(rows) < len(p.codes):
        return np.lexsort((p.ranks_of(j)[rows], group))
    position = np.full(len(p.codes), -1)
    position[rows] = np.arange(len(rows))
    order = position[p.value_order(j)]
    order = order[order >= 0]
    return order[stable_argsort(group[order])]


def _unchanged(old, new) -> np.ndarray:
    """Per class of ``new``: whether its rows are exactly one class of ``old``."""
    n_new = int(new.max()) + 1
    lo, hi = np.full(n_new, len(old)), np.full(n_new, -1)
    np.minimum.at(lo, new, old)
    np.maximum.at(hi, new, old)
    return (lo == hi) & (np.bincount(new, minlength=n_new) == np.bincount(old)[lo])


def _unions(ec, within, n_classes, offset) -> np.ndarray:
    """Union id of every class: classes in the order of their first row, :data:`MERGE_GROUP`
    at a time from ``offset`` on, inside each partition of ``within``."""
    first = np.full(n_classes, len(ec))
    np.minimum.at(first, ec, np.arange(len(ec)))
    parent = np.zeros(n_classes, dtype=np.int64) if within is None else within[first]
    order = np.lexsort((first, parent))
    start = np.r_[True, parent[order][1:] != parent[order][:-1]]
    rank = np.empty(n_classes, dtype=np.int64)
    rank[order] = np.arange(n_classes) - np.flatnonzero(start)[np.cumsum(start) - 1]
    return np.unique(parent * (n_classes + MERGE_GROUP) + (rank + offset) // MERGE_GROUP,
                     return_inverse=True)[1].reshape(-1)


def _summed_il(p: Partitioner, rows, label, n_labels) -> np.ndarray:
    """Summed IL (rows times mean normalized span) of each group ``label`` of ``rows``."""
    return _il_of(p, p.group_spans(rows, label, n_labels), np.bincount(label, minlength=n_labels))


def _il_of(p: Partitioner, spans, sizes) -> np.ndarray:
    """Summed IL of groups with ``spans`` (groups x QIs) and ``sizes`` rows."""
    il = np.zeros(len(spans))
    for j in range(len(p.qis)):
        il += spans[:, j]
    return il / len(p.qis) * sizes


def balanced_halves(counts: np.ndarray, domain: SADomain, table: np.ndarray, t: float) -> np.ndarray:
    """The SA counts of the left half of partitions with SA ``counts`` (rows): half of each
    count, an odd count rounded up or down.  SABRE's dichotomize alternates the roundings, so
    a class a little below t has halves a little above it.  Where those halves are not both
    within t of ``table``, a local search flips, step by step, the one rounding that lowers
    the larger of the two halves' EMDs most, until no flip lowers it: the halves keep about
    the class's EMD, and the lowest such EMD leaves the most room for the halves' own
    halving.  Cost: per such partition and step, one EMD per odd count; at most
    :data:`BALANCE_STEPS` steps; (partitions x odd counts x values) evaluated in chunks of
    :data:`BALANCE_CHUNK`."""
    left = dichotomize(counts)[0]
    values, flips = odd_values(counts)
    width = values.shape[1]
    if not width:
        return left
    cost = _halves_emd(left, counts, domain, table)
    active = np.flatnonzero(cost > t)          # only where the alternation fails
    chunk = max(BALANCE_CHUNK // (width * counts.shape[1]), 1)     # (at most width flips a partition)
    for _ in range(BALANCE_STEPS):
        moved = np.zeros(len(counts), dtype=bool)
        for s in range(0, len(active), chunk):
            checkpoint()
            a = active[s:s + chunk]
            f = flips[a]                # the flips that exist (a partition has n_odd of the width)
            i, j = np.nonzero(f)        # one candidate per flip: (partition of the chunk, flip)
            cand = left[a][i]
            row, v = np.arange(len(i)), values[a][i, j]
            cand[row, v] = counts[a][i, v] - cand[row, v]          # floor <-> ceil
            c = np.full(f.shape, np.inf)
            c[i, j] = _halves_emd(cand, counts[a][i], domain, table)
            best = np.argmin(c, axis=1)
            c = c[np.arange(len(a)), best]
            better = c < cost[a]
            n_flips = f.sum(axis=1)     # a partition's flips are the first of its row: candidates first[p] + flip
            first = np.cumsum(n_flips) - n_flips
            left[a[better]], cost[a[better]] = cand[first[better] + best[better]], c[better]
            moved[a[better]] = True
        active = active[moved[active]]
    return left


def odd_values(counts: np.ndarray):
    """(values, flips): each partition's SA values of odd count (rows of ``counts``), padded to
    the most any partition has (``values`` partitions x width), and which of them are real
    (``flips``): the roundings :func:`balanced_halves` may flip."""
    odd = (counts & 1).astype(bool)
    n_odd = odd.sum(axis=1)
    width = int(n_odd.max(initial=0))
    at, value = np.nonzero(odd)
    values = np.zeros((len(counts), width), dtype=np.int64)
    values[at, np.arange(len(at)) - (np.cumsum(n_odd) - n_odd)[at]] = value
    return values, np.arange(width) < n_odd[:, None]


def _halves_emd(left, counts, domain, table):
    """The larger EMD to ``table`` of the two halves (``left``, ``counts - left``; last axis
    the SA values); infinite when a half is empty."""
    right = counts - left
    n_left, n_right = left.sum(axis=-1, keepdims=True), right.sum(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        e = np.maximum(domain.emd(left / n_left, table), domain.emd(right / n_right, table))
    return np.where((n_left[..., 0] > 0) & (n_right[..., 0] > 0), e, np.inf)
