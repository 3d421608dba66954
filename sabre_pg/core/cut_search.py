"""Cut search: t-Mondrian's top-down partitioning, each partition cut where the information
loss falls most among the cuts that stay t-close (``method => 'refine'``).

t-Mondrian (:mod:`.mondrian`) tries one cut per QI -- at the median, widest QI first -- and
stops a partition when those are refused.  A t-close cut is often elsewhere: off the median
(the median row splits one SA value's run), or along a categorical QI's hierarchy (children
of the partition's lowest common ancestor).  The search therefore scores, per partition and
per QI searched, several cuts of the rows sorted by the QI (ties by Hilbert key):

* at the quantiles :data:`QUANTILES` of the partition (each part >= k rows);
* the same quantiles moved to the nearest boundary between children of the lowest common
  ancestor, for a categorical QI with a hierarchy (the parts then generalize to lower nodes);
* the least-IL position among a grid of positions and the positions where the QI's value
  changes (at most about 4 grid of them; a cut through a run of one value does not narrow
  it).  Only that one of them is a candidate: more candidates let the greedy keep cuts that
  leave worse partitions (Adult: AIL 0.334 with all of them against 0.322);
* SABRE's stratified cut (:func:`.mondrian._stratified_cut`): of each SA value's rows, the
  half with the smaller QI values goes left, so both parts keep about the partition's SA
  distribution.  'fast' makes it a candidate only when a partition is searched again after
  a refusal (it was kept in 0.5% of the cuts and cost 30% of the time).

Scores come from segment reductions: the candidate positions split a partition into segments,
``np.minimum/maximum.reduceat`` give every segment's smallest and largest value of every QI
(on dense integer codes of the values, :class:`_DenseQIs`), running ones over the segments
both parts' spans -- O(n d) per QI searched and round.  The setting (:data:`SEARCH`,
``options.search``) bounds the work: 'fast' searches a partition of fewer than 128 rows, or
of less than 1/256 of the table (:data:`SMALL_SHARE`), on its widest QI (normalized span)
and scores a partition of more than 8192 rows on a sample of its rows; a refused partition
is searched once more, on every QI and with the stratified cut, before it becomes a class.
Every QI is thus searched in the top 8 levels of the partition tree, where a cut moves many
rows, and the widest below (Mondrian's rule).  'thorough' searches every QI, the stratified
cut included, with a grid of 64 on every row.  (The widest QI alone under 128 rows, against
the two widest under 256: AIL lower in 17 of the 24 census-like configurations at 100k (up
to 7 points further below t-Mondrian), equal in 5, at most 0.0002 higher in 2; 1M rows,
t = 0.35, k = 6: 0.0248 against 0.0296; Adult 0.2976 against 0.2978.  The widest QI alone
under 256 rows made Adult 0.3005, under 1024 0.311.  Under 1/256 of the table as well:
Adult unchanged (117 rows < 128); census-like 100k (390 rows): AIL lower in 16 of 24, equal
in 4, 1.7% higher in 4 (flat SA, t = 0.25), 17-34% below t-Mondrian; 1M (3,906 rows):
0.0169 against 0.0248.)

The score of a cut is the summed information loss of its rows after it, ``|L| IL(L) + |R|
IL(R)`` (IL as the metrics define it: the mean normalized span over the QIs, a categorical
QI's ``(L - 1)/(N - 1)`` of the lowest common ancestor).  Candidates are checked best first,
in batches, by the *exact* EMD (:func:`t_close_groups`); the first whose both parts have >= k
rows and EMD <= t is kept.  A partition with no such candidate is a class.  Every published
class is therefore t-close and k-anonymous by the arithmetic of ``sabre_verify``.
"""
from __future__ import annotations

import weakref

import numpy as np

from . import kernels
from .checkpoint import checkpoint
from .mondrian import Partitioner, _stratified_cut, against_table, integer_offsets
from .segments import grouped as _grouped, lower_bound, segment_ids as _segment_ids, segment_indices as _segment_indices
from .segments import carried, slot_ids
from .segments import split_segments as _split_segments

__all__ = ["cut_search", "QUANTILES", "SEARCH"]

QUANTILES = (0.5, 0.45, 0.55, 0.4, 0.6, 0.33, 0.67, 0.25, 0.75)
DENSE_LIMIT = 1 << 24     # running SA counts per QI order when n m is at most this
DENSE_GAIN = 4           # a running count costs about a quarter of a row gathered
FIRST_BATCH = 1            # candidates per partition in the first exact check of a round
# search setting: (QIs searched in a partition of fewer than ``small`` rows, grid, small,
# sample: rows scoring a larger partition's cuts, 0 all[, stratify_first: the stratified cut
# is a candidate in a partition's first search too, not only in its retry; default True])
SEARCH = {"fast": (1, 16, 128, 8192, False), "thorough": (None, 64, 0, 0, True)}
SMALL_SHARE = 256        # a partition is also small below 1/256 of the table's rows


def cut_search(p: Partitioner, part: np.ndarray, emd_weight: float = 0.0,
               search: str = "fast", stratify_first: bool | None = None,
               max_rounds: int | None = None, pmap=map) -> np.ndarray:
    """Cut the partitions of ``part`` (ids 0..P-1; each t-close and k-anonymous) while a
    candidate cut is t-close; returns the class id (0..C-1) of every row.

    ``search`` (:data:`SEARCH`): 'fast' scores a small partition's cuts on its widest QI
    only (normalized span) at fewer positions, the stratified cut only in a refused partition's
    second search (``stratify_first`` True: in the first one too, as 'thorough'; None: the
    setting's); 'thorough' on every QI.

    ``emd_weight`` w > 0: every candidate is checked, and among the t-close ones a partition
    keeps the least ``score * (1 + w * EMD / t)`` (EMD: the larger of its parts'), so a cut
    that leaves slack for the next ones can win over a slightly better one now (Adult,
    w = 0.2: AIL 0.310 against 0.318; census-like data: up to 7 points worse, 3-6x slower).

    ``max_rounds``: stop after that many rounds (the partitions returned may be cut further
    by a later search, e.g. in threads).

    ``pmap``: the ``map`` that runs the per-QI work of a round (e.g. a thread pool's: the
    QIs' orders, candidates, checks and regroupings are independent)."""
    if search not in SEARCH:
        raise ValueError("search must be one of %s, got %r" % (", ".join(SEARCH), search))
    setting = SEARCH[search] if stratify_first is None else SEARCH[search][:4] + (stratify_first,)
    if setting[2]:                  # the table's rows (a subset's Partitioner keeps its table's counts)
        setting = setting[:2] + (max(setting[2], p.rows // SMALL_SHARE),) + setting[3:]
    part = np.asarray(part, dtype=np.int64)
    n_parts = int(part.max()) + 1 if len(part) else 0
    final = np.zeros(n_parts, dtype=bool)
    wide = np.zeros(n_parts, dtype=bool)     # searched on every QI (its widest ones failed)
    p.ranks_of(None, pmap)          # every QI's order, the QIs sorted in pmap
    # the compiled loops (kernels.py) for a large table, else None: the numpy code
    p.kernels = kernels.for_rows(int(p.table_counts.sum()))
    _DenseQIs.of(p, pmap)

    # the rows (not yet final) in (partition, value of QI j) order, per QI
    orders = list(pmap(lambda j: p.value_order(j, part), range(p.columns.shape[1])))
    owners = counts = None
    rounds = 0
    while not final.all() and (max_rounds is None or rounds < max_rounds):
        checkpoint()
        part, n_parts, final, wide, orders, owners, counts = _search_round(
            p, part, n_parts, final, wide, orders, emd_weight, setting, pmap, owners, counts)
        rounds += 1
    _, inverse = np.unique(part, return_inverse=True)
    return inverse.reshape(-1).astype(np.int64)


def _search_round(p, part, n_parts, final, wide, orders, emd_weight, setting, pmap=map, owners=None, counts=None):
    """One round: every live partition keeps its best t-close candidate cut, or becomes final.
    ``orders[j]``: the rows of partitions not final, sorted by (partition, value of QI j),
    without the partitions whose QI j was found to have a single value (nor their parts: a
    part's span is at most its partition's; census-like data, 1M rows: half of the rows'
    orders); ``setting``: an entry of :data:`SEARCH`.  A partition searched on its widest QIs
    only or without the stratified cut, and refused, is searched again in the next round on
    every QI with the stratified cut (``wide``); refused then, it is final.  ``pmap`` runs
    the per-QI work.  ``owners[j]``: the partition of every row of ``orders[j]`` (None: taken
    from ``part``); returned with the new orders.  ``counts``: every partition's rows (None:
    counted from ``part``); returned for the new partitions."""
    sizes = counts = np.bincount(part, minlength=n_parts) if counts is None else counts
    live = (sizes >= 2 * p.k) & ~final
    final = final | ~live
    if owners is None:
        owners = list(pmap(part.__getitem__, orders))
    spans = _spans(p, orders, owners, n_parts)
    every = live[:, None] & (spans > 0)

    K = p.kernels

    def kept(j):                # the rows of live partitions with a span on QI j
        if K is not None:
            return K.keep_rows(orders[j], owners[j], np.ascontiguousarray(every[:, j]))
        keep = every[owners[j], j]
        return (orders[j], owners[j]) if keep.all() else (orders[j][keep], owners[j][keep])

    orders, owners = (list(x) for x in zip(*pmap(kept, range(len(orders))))) if orders else ([], [])
    if not live.any():
        return part, n_parts, final, wide, orders, owners, counts
    sizes = np.where(live, sizes, 0)
    searched = _widest(spans, every, sizes, setting[0], setting[2])
    searched |= every & wide[:, None]
    stratified = wide | (setting[4] if len(setting) > 4 else True)
    narrow = (searched != every).any(axis=1) | ~stratified     # a candidate was left out

    def sorted_by(j):           # the partitions searched on QI j, and their candidate cuts
        if K is not None:
            rows, own = K.keep_rows(orders[j], owners[j], np.ascontiguousarray(searched[:, j]))
            if not len(rows):
                return None
        else:
            sel = searched[owners[j], j]
            if not sel.any():
                return None
            rows, own = (orders[j], owners[j]) if sel.all() else (orders[j][sel], owners[j][sel])
        s = _SortedPartitions(p, rows, own, j, np.where(searched[:, j], sizes, 0),
                              setting[1], setting[3], stratified)
        return s, s.candidates(p)

    found = [f for f in pmap(sorted_by, range(len(orders))) if f is not None]
    if not found:                  # no partition has a QI to cut along
        return part, n_parts, final | live, wide, orders, owners, counts
    sorted_parts = [s for s, _ in found]
    cand = {key: np.concatenate([c[key] for _, c in found]) for key in found[0][1]}
    chosen = _check_best_first(p, sorted_parts, cand, n_parts, emd_weight, pmap)
    has = chosen >= 0
    wide = live & ~has & narrow
    final = final | (live & ~has & ~narrow)
    ids = np.flatnonzero(has)
    c = chosen[ids]
    right = np.zeros(len(part), dtype=np.uint8)      # a row of a cut partition goes right
    for s in sorted_parts:
        checkpoint()
        mine = cand["dim"][c] == s.j
        if mine.any() and K is not None:
            q = ids[mine]
            K.mark_right(right, s.starts[q], s.sizes[q], cand["pos"][c][mine], cand["strat"][c][mine],
                         s.strat_left, s.rows)
        elif mine.any():
            r, side = s.members(ids[mine], cand["pos"][c][mine], cand["strat"][c][mine])
            right[r] = side
    return _next_round(p, part, right, has, counts, final, wide, n_parts, orders, owners, every, pmap, K)


def _next_round(p, part, right, has, counts, final, wide, n_parts, orders, owners, every, pmap, K):
    """The round's cuts applied: partitions renumbered, the orders split, the new partitions'
    rows counted from the cuts (:func:`_search_round` returns this)."""
    n_new, new_id = slot_ids(has, counts)       # (segments.slot_ids: the orders stay grouped)
    uncut = ~has & (counts > 0)
    final, wide = (carried(a, new_id, uncut, n_new) for a in (final, wide))
    if K is not None:
        part, n_right = K.relabel(part, right, has, new_id, n_parts)
    else:
        n_right = np.bincount(part, weights=right, minlength=n_parts).astype(np.int64)
        part = new_id[part] + (has[part] & (right > 0))
    new_owner = np.stack((new_id, new_id + 1), axis=1).ravel()    # (partition, side) -> new id
    new_sizes = np.zeros(n_new, dtype=np.int64)        # (np.bincount(part): a pass over every row)
    new_sizes[new_id[uncut]] = counts[uncut]
    new_sizes[new_id[has]] = (counts - n_right)[has]
    new_sizes[new_id[has] + 1] = n_right[has]
    # compiled: the next round keeps the rows of live partitions only, so drop the others now
    keep = (new_sizes >= 2 * p.k) & ~final if K is not None else None
    orders, owners = _split_segments(orders, owners, right, counts, n_right, new_owner,
                                     [every[:, j] for j in range(len(orders))], pmap, K, keep)
    return part, n_new, final, wide, orders, owners, new_sizes




def _spans(p, orders, owners, n_parts) -> np.ndarray:
    """(partitions x QIs) normalized span of each partition present in the QI's order (the
    ends of its segment are its smallest and largest values); 0 where it is absent."""
    spans = np.zeros((n_parts, len(orders)))
    for j, (o, owner) in enumerate(zip(orders, owners)):
        if len(o):
            first = _run_firsts(owner)
            start = np.flatnonzero(first)
            end = np.append(start[1:], len(o)) - 1
            spans[owner[start], j] = p.span(j, p.columns[o[start], j], p.columns[o[end], j])
    return spans


def _widest(spans, every, sizes, count, small):
    """(partitions x QIs) whether the partition's cuts are searched on the QI: every QI with
    a span > 0 (``every``), or in a partition of fewer than ``small`` rows its ``count``
    widest QIs by normalized span (count None: every QI)."""
    searched = every.copy()
    if count is None or count >= spans.shape[1]:
        return searched
    few = np.flatnonzero((sizes < small) & every.any(axis=1))     # (the others: every QI)
    sub = spans[few]
    if count == 1 and not np.isnan(sub).any():  # the widest, the first of equal spans (the stable sort's first)
        searched[few] &= np.arange(spans.shape[1]) == np.argmax(sub, axis=1)[:, None]
    else:
        searched[few] &= np.argsort(np.argsort(-sub, axis=1, kind="stable"), axis=1, kind="stable") < count
    return searched


class _DenseQIs:
    """Every row's QI values as dense codes (the value's index among the QI's distinct
    values, in order), stored row by row in the smallest integer type that holds them:
    the scores' gathers and reductions move 2 bytes a value instead of 8.  ``values[i]``:
    QI i's distinct values (code -> value).  Made once per :class:`Partitioner`."""

    _made: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

    def __init__(self, p, pmap=map):
        n, d = p.ranks_of(None, pmap).shape
        codes = np.empty((n, d), dtype=np.int32, order="F")

        def column(i):          # a column at a time: contiguous writes
            offsets = integer_offsets(p.columns[:, i])
            if offsets is not None and offsets.max() <= 4 * n:
                present = np.bincount(offsets) > 0       # integer values: codes by a lookup
                codes[:, i] = (np.cumsum(present, dtype=np.int32) - 1)[offsets]
                return p.columns[:, i].min() + np.flatnonzero(present)
            by_value = p.value_order(i)
            v = p.columns[by_value, i]   # the values in order
            new = _run_firsts(v)
            codes[by_value, i] = np.cumsum(new, dtype=np.int32) - 1
            return v[new]

        self.values = list(pmap(column, range(d)))
        most = max(len(v) for v in self.values)
        small = codes.astype(np.int16, order="F") if most <= np.iinfo(np.int16).max else codes
        self.columns = [small[:, i] for i in range(d)]      # contiguous: gathers of one QI
        self.block = np.ascontiguousarray(small)

    @classmethod
    def of(cls, p, pmap=map) -> "_DenseQIs":
        if p not in cls._made:
            cls._made[p] = cls(p, pmap)
        return cls._made[p]


class _SortedPartitions:
    """The rows of the partitions searched on QI j, sorted by (partition, rank of QI j); each
    partition is a segment."""

    def __init__(self, p, rows, owner, j, sizes, grid, sample=0, stratified=True):
        """``stratified`` (bool, or one per partition): whether the partition's stratified
        cut is a candidate."""
        self.j, self.grid, self.sample = j, grid, sample
        self.rows, self.owner = rows, owner
        self.sizes = sizes
        self.starts = np.cumsum(sizes) - sizes
        self.stratified = np.broadcast_to(np.asarray(stratified, dtype=bool), sizes.shape)
        self.strat_left = np.zeros(len(rows), dtype=bool)
        self.n_left = np.zeros(len(sizes))
        if self.stratified.any():       # (else no row's partition is looked up)
            strat = self.stratified[owner]
            if strat.any():
                self.strat_left[strat] = _stratified_cut(p.codes[rows[strat]], owner[strat], len(sizes))
            self.n_left = np.bincount(owner[strat], weights=self.strat_left[strat], minlength=len(sizes))
        self._running = None
        self._change_at = None   # see _changes
        self._column = None      # the rows' dense codes of QI j (_changes, _snap)

    def candidates(self, p) -> dict:
        """Candidate cuts of every partition on this QI (arrays: owner, dim, pos, strat,
        score)."""
        k = p.k
        q = np.flatnonzero(self.sizes >= 2 * k)
        size = self.sizes[q]
        # one row per quantile (then per grid fraction), one column per partition
        positions = _clipped(np.rint(np.r_[QUANTILES, np.arange(1, self.grid) / self.grid][:, None]
                                     * size).astype(np.int64), k, size - k)
        n_fixed = len(QUANTILES)
        qi = p.qis[self.j]
        if not qi.numerical and qi.hierarchy.n_leaves > 1:
            positions = np.vstack((positions[:n_fixed], self._snap(p, q, positions[:n_fixed]), positions[n_fixed:]))
            n_fixed *= 2
        changes = self._changes(p)
        owners = np.concatenate((np.broadcast_to(q, positions.shape).ravel(), self.owner[changes]))
        at = np.concatenate((positions.ravel(), changes - self.starts[self.owner[changes]]))
        # the distinct (owner, pos), sorted; fixed if any copy is (bit 0 clear sorts first)
        key = np.sort(2 * (owners * (len(self.rows) + 1) + at) + (np.arange(len(at)) >= n_fixed * len(q)))
        key = key[_run_firsts(key >> 1)]
        fixed, key = (key & 1) == 0, key >> 1
        owners, pos = key // (len(self.rows) + 1), key % (len(self.rows) + 1)
        scores, s_owner, s_score = self._scores(p, q, owners, pos)
        fixed[_segment_argmin(owners, scores)] = True    # grid and changes: the least-IL one
        owners, pos, scores = owners[fixed], pos[fixed], scores[fixed]
        return {"owner": np.concatenate((owners, s_owner)),
                "dim": np.full(len(owners) + len(s_owner), self.j),
                "pos": np.concatenate((pos, np.zeros(len(s_owner), dtype=np.int64))),
                "strat": np.concatenate((np.zeros(len(owners), bool), np.ones(len(s_owner), bool))),
                "score": np.concatenate((scores, s_score))}

    def column(self, p) -> np.ndarray:
        """The dense code of QI j (:class:`_DenseQIs`: equal and ordered as the values) of
        every row (in this order), gathered once from a contiguous column of 2-byte codes
        (a quarter of the values' bytes)."""
        if self._column is None:
            self._column = np.take(_DenseQIs.of(p).columns[self.j], self.rows)
        return self._column

    def _changes(self, p):
        """Indices (into the rows) where the value of QI j changes inside a partition, at
        least k rows from both ends; at most about ``4 grid`` per partition (evenly thinned):
        a cut between two values narrows the QI, a cut through a run of one value does not."""
        if self._change_at is None:
            v = self.column(p)
            c = np.flatnonzero((v[1:] != v[:-1]) & (self.owner[1:] == self.owner[:-1])) + 1
            pos = c - self.starts[self.owner[c]]
            c = c[(pos >= p.k) & (pos <= self.sizes[self.owner[c]] - p.k)]
            own = self.owner[c]
            count = np.bincount(own, minlength=len(self.sizes))
            first = np.cumsum(count) - count
            rank = np.arange(len(c)) - first[own]
            step = np.maximum(count // (4 * self.grid), 1)
            self._change_at = c[rank % step[own] == 0]
        return self._change_at

    def _scores(self, p, q, owners, pos):
        """Summed IL ``|L| IL(L) + |R| IL(R)`` of the cuts (owners, pos), sorted by owner then
        pos, and (owners, summed IL) of the partitions' stratified cuts with >= k rows each
        side.  The cut positions split each partition into segments; segment minima and
        maxima of every QI (one reduction over the rows), then running ones over a
        partition's segments (a value offset by its partition's index never mixes with
        another's) give both parts' spans (:meth:`_stratified_scores`: the stratified cuts').

        A partition of more than ``sample`` rows is scored on every r-th row of its order
        (about ``sample`` rows) and the rows at its cuts: the scores rank the candidates
        only, the exact check decides."""
        cuts = self.starts[owners] + pos
        idx = self._sample(cuts)
        bounds = np.concatenate((self.starts[q], cuts))
        bounds.sort(kind="stable")
        at = np.searchsorted(bounds, cuts)
        group = np.searchsorted(self.starts[q], bounds, side="right") - 1
        if len(idx) < len(self.rows):       # (every row scoring: idx is the identity)
            bounds = np.searchsorted(idx, bounds)
        il_left, il_right = np.zeros(len(cuts)), np.zeros(len(cuts))
        dense = _DenseQIs.of(p)
        if p.kernels is not None:       # compiled: the same codes, per QI and cut
            ranges = p.kernels.cut_ranges(*p.kernels.segment_minmax(dense.block, self.rows, idx, bounds),
                                          group, at)
            for i, values in enumerate(dense.values):
                il_left += p.span(i, values[ranges[0, i]], values[ranges[1, i]])
                il_right += p.span(i, values[ranges[2, i]], values[ranges[3, i]])
            return ((pos * il_left + (self.sizes[owners] - pos) * il_right) / len(p.qis),
                    *self._stratified_scores(p, idx))
        block = np.take(dense.block, self.rows[idx], axis=0)   # one gather of whole rows (take: 3x fancy indexing's speed)
        for i, values in enumerate(dense.values):
            v = block[:, i]
            lo = np.minimum.reduceat(v, bounds).astype(np.int64)
            hi = np.maximum.reduceat(v, bounds).astype(np.int64)
            off = 2 * len(values) * group
            plo = np.minimum.accumulate(lo - off) + off
            phi = np.maximum.accumulate(hi + off) - off
            slo = (np.minimum.accumulate((lo + off)[::-1]) - off[::-1])[::-1]
            shi = (np.maximum.accumulate((hi - off)[::-1]) + off[::-1])[::-1]
            il_left += p.span(i, values[plo[at - 1]], values[phi[at - 1]])
            il_right += p.span(i, values[slo[at]], values[shi[at]])
        return ((pos * il_left + (self.sizes[owners] - pos) * il_right) / len(p.qis),
                *self._stratified_scores(p, idx))

    def _stratified_scores(self, p, idx):
        """(partitions, summed IL / d) of the stratified cuts with >= k rows each side, of
        the partitions where it is a candidate, scored on the rows ``idx``: their parts are
        segments of those rows regrouped by (partition, part) in linear time
        (:meth:`_stratified_layout`)."""
        idx = idx[self.stratified[self.owner[idx]]] if self.stratified.any() else idx[:0]
        if not len(idx):
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        dest, s_bounds, s_q = self._stratified_layout(idx)
        dense = _DenseQIs.of(p)
        il_strat = np.zeros(len(s_bounds))
        if p.kernels is not None:
            src = np.empty(len(idx), dtype=np.int64)
            src[dest] = idx
            seg_lo, seg_hi = p.kernels.segment_minmax(dense.block, self.rows, src, s_bounds)
            for i, values in enumerate(dense.values):
                il_strat += p.span(i, values[seg_lo[i]], values[seg_hi[i]])
        else:
            strat = np.empty((len(idx), len(p.qis)), dtype=dense.block.dtype)
            strat[dest] = np.take(dense.block, self.rows[idx], axis=0)
            for i, values in enumerate(dense.values):
                w = strat[:, i]
                il_strat += p.span(i, values[np.minimum.reduceat(w, s_bounds)], values[np.maximum.reduceat(w, s_bounds)])
        n_left = self.n_left[s_q]
        total = il_strat[0::2] * n_left + il_strat[1::2] * (self.sizes[s_q] - n_left)
        good = (n_left >= p.k) & (self.sizes[s_q] - n_left >= p.k)
        return s_q[good], total[good] / len(p.qis)

    def _sample(self, cuts):
        """Indices (sorted) of the rows scoring the cuts: all rows of a partition of at most
        ``sample`` rows, else every r-th row of it, its last row and the rows at ``cuts``."""
        if not self.sample or self.sizes.max() <= self.sample:
            return np.arange(len(self.rows))
        stride = np.maximum(self.sizes // self.sample, 1)
        big = np.flatnonzero(stride > 1)
        small = np.flatnonzero((stride == 1) & (self.sizes > 0))
        keep = np.zeros(len(self.rows), dtype=bool)
        keep[_segment_indices(self.starts[small], self.sizes[small])] = True
        count = -(-self.sizes[big] // stride[big])       # every r-th row: ceil(size / r) of them
        ids = _segment_ids(count)
        keep[self.starts[big][ids] + _segment_indices(np.zeros(len(big), np.int64), count) * stride[big][ids]] = True
        keep[cuts] = True
        keep[(self.starts + self.sizes - 1)[self.sizes > 0]] = True
        return np.flatnonzero(keep)

    def _stratified_layout(self, idx):
        """Where each row of ``idx`` goes when they are regrouped by (partition, stratified
        part, left first), keeping their order; the parts' first indices (two per partition
        present; an empty part's is not used) and those partitions."""
        left, owner = self.strat_left[idx], self.owner[idx]
        sizes = np.bincount(owner, minlength=len(self.sizes))
        starts = np.cumsum(sizes) - sizes
        n_left = np.bincount(owner, weights=left, minlength=len(self.sizes)).astype(np.int64)
        start = starts[owner]
        cl = np.r_[0, np.cumsum(left)]
        cr = np.arange(len(cl)) - cl
        i = np.arange(len(left))
        dest = np.where(left, start + cl[i] - cl[start], start + n_left[owner] + cr[i] - cr[start])
        q = np.flatnonzero(sizes)
        bounds = np.stack((starts[q], starts[q] + n_left[q]), axis=1).ravel()
        return dest, np.minimum(bounds, len(left) - 1), q

    def _snap(self, p, q, pos):
        """``pos`` (one column per partition of ``q``) moved to the boundary between children
        of the partition's lowest common ancestor that holds the row at ``pos`` (a
        categorical QI with a hierarchy): the partition's first row at or past the boundary
        leaf, found by a binary search inside its segment (the rows are sorted by leaf)."""
        h = p.qis[self.j].hierarchy
        v, leaf = self.column(p), _DenseQIs.of(p).values[self.j].astype(np.int64)     # code -> leaf
        first, last = self.starts[q], self.starts[q] + self.sizes[q]
        lo, hi = leaf[v[first]], leaf[v[last - 1]]
        child = h.anc[leaf[v[first + pos]], np.maximum(h.lca_level(lo, hi) - 1, 0)]
        bound = np.searchsorted(leaf, np.where(h.lo[child] > lo, h.lo[child], h.hi[child]))   # as a code
        idx = lower_bound(v, np.broadcast_to(first, bound.shape), np.broadcast_to(last, bound.shape), bound)
        return _clipped(idx - first, p.k, self.sizes[q] - p.k)

    def local_groups(self, codes, m, mine, cand, labelled=None, kernels=None):
        """(group, code, count) of the SA ``codes`` (m values) in both parts of the
        candidates ``mine``: group 2i for the left part of the i-th of ``mine``, 2i + 1 for
        its right part; by the compiled ``kernels`` when given, else from ``labelled`` (or
        :meth:`row_labels`)."""
        if kernels is not None:
            q = cand["owner"][mine]
            return kernels.part_counts(self.starts[q], self.sizes[q], cand["pos"][mine], cand["strat"][mine],
                                       self.strat_left, self.rows, codes, m)
        label, rows = self.row_labels(mine, cand) if labelled is None else labelled
        return _grouped(label, codes[rows], m)

    def row_labels(self, mine, cand):
        """(label, row) of every row of both parts of the candidates ``mine``: label 2i for
        the left part of the i-th of ``mine``, 2i + 1 for its right part (non-decreasing)."""
        size = self.sizes[cand["owner"][mine]]
        c = _segment_ids(size)      # the candidate (of mine) of every row visited
        at = np.arange(len(c)) - (np.cumsum(size) - size)[c]     # its position in its partition
        idx = self.starts[cand["owner"][mine]][c] + at
        right = at >= cand["pos"][mine][c]
        s = cand["strat"][mine][c]
        right[s] = ~self.strat_left[idx[s]]
        return 2 * c + right, self.rows[idx]

    def histograms(self, p, mine, cand):
        """(group, code, count) of both parts of the candidates ``mine`` (group 2i: the left part
        of the i-th, 2i + 1: its right part; sorted by (group, code)), from running code counts
        along the order (a prefix cut's left part is a difference of two of them)."""
        m = p.domain.m
        if self._running is None:
            onehot = np.zeros((len(self.rows) + 1, m), dtype=np.int32)
            onehot[np.arange(1, len(self.rows) + 1), p.codes[self.rows]] = 1
            self._running = np.cumsum(onehot, axis=0, dtype=np.int32)
            self._strat = np.bincount(self.owner * m + p.codes[self.rows], weights=self.strat_left,
                                      minlength=len(self.sizes) * m).reshape(-1, m).astype(np.int32)
        q = cand["owner"][mine]
        seg = self.starts[q]
        first = np.take(self._running, seg, axis=0)
        left = np.take(self._running, seg + cand["pos"][mine], axis=0) - first
        s = cand["strat"][mine]
        left[s] = self._strat[q[s]]
        right = np.take(self._running, seg + self.sizes[q], axis=0) - first - left
        both = np.stack((left, right), axis=1).reshape(-1, m)          # rows 2i, 2i + 1
        nz = np.flatnonzero(both)
        return nz // m, nz % m, both.reshape(-1)[nz].astype(np.int64)

    def members(self, q, pos, strat):
        """Rows of partitions q and whether each goes right, for the cuts (pos, strat)."""
        at = np.zeros(len(self.sizes), dtype=np.int64) - 1
        at[q] = np.arange(len(q))
        sel = at[self.owner] >= 0
        idx = np.flatnonzero(sel)
        c = at[self.owner[idx]]
        right = (idx - self.starts[self.owner[idx]]) >= pos[c]
        s = strat[c]
        right[s] = ~self.strat_left[idx[s]]
        return self.rows[idx], right.astype(np.int64)


def _check_best_first(p, orders, cand, n_parts, emd_weight, pmap=map) -> np.ndarray:
    """Per partition, the index of its best-scored candidate that passes the exact check, or
    -1.  Candidates are checked in batches of growing size, best first."""
    order = np.lexsort((cand["score"], cand["owner"]))
    owner = cand["owner"][order]
    rank = run_ranks(owner)
    chosen = np.full(n_parts, -1, dtype=np.int64)
    done = np.zeros(n_parts, dtype=bool)
    lo, width = 0, (len(order) if emd_weight else FIRST_BATCH)
    while lo <= rank.max() if len(rank) else False:
        checkpoint()
        pick = order[(rank >= lo) & (rank < lo + width) & ~done[owner]]
        if not len(pick):
            break
        copies = int(np.bincount(cand["owner"][pick]).max())
        if emd_weight:
            ok, emd = _check(p, orders, cand, pick, copies, True, pmap)
            score = cand["score"][pick] * (1 + emd_weight * emd / p.t)
        else:
            ok = _check(p, orders, cand, pick, copies, pmap=pmap)
            score = cand["score"][pick]
        good, score = pick[ok], score[ok]
        # the best passing candidate of each partition
        if len(good):
            g = good[np.lexsort((score, cand["owner"][good]))]
            g_owner = cand["owner"][g]
            firsts = g[_run_firsts(g_owner)]
            chosen[cand["owner"][firsts]] = firsts
            done[cand["owner"][firsts]] = True
        lo, width = lo + width, 2 * width
    return chosen


def _check(p, orders, cand, pick, copies, with_emd=False, pmap=map) -> np.ndarray:
    """Exact check of the candidates ``pick`` (at most ``copies`` per partition): both parts
    k-anonymous and t-close.  Each part's SA histogram comes from the rows (cost: the rows of
    every candidate) or, when that is cheaper, from running code counts along the QI's order
    (cost: m per candidate, plus n m to make the counts)."""
    m = p.domain.m

    def groups(order):          # (mine, its parts' (group, code, count) numbered 2i, 2i + 1, shared)
        mine = pick[cand["dim"][pick] == order.j]
        if not len(mine):
            return None
        size = order.sizes[cand["owner"][mine]]
        dense = len(order.rows) * m <= DENSE_LIMIT and (len(order.rows) + 2 * len(mine)) * m < DENSE_GAIN * size.sum()
        if dense:
            return mine, order.histograms(p, mine, cand), None
        # the rows found, kept for the other SAs' check (the compiled counts find none)
        labelled = order.row_labels(mine, cand) if p.kernels is None else None
        shared = (order, mine, labelled) if p.other_sas and labelled is not None else None
        return mine, order.local_groups(p.codes, m, mine, cand, labelled, p.kernels), shared

    found = [g for g in pmap(groups, orders) if g is not None]
    # the groups numbered by order, then by candidate within it: sorted as they come, so the
    # exact EMD need not sort them (numbered by candidate they were not: an argsort a batch)
    base = np.cumsum([0] + [len(mine) for mine, _, _ in found])
    ec = np.concatenate([g[0] + 2 * b for b, (_, g, _) in zip(base, found)])
    codes, counts = (np.concatenate([g[i] for _, g, _ in found]) for i in (1, 2))
    local = np.concatenate([mine for mine, _, _ in found])      # the candidate of each local number
    checked = t_close_groups(p, ec, codes, counts, copies, np.arange(len(local)), with_emd)
    at = np.empty(len(cand["owner"]), dtype=np.int64)
    at[local] = np.arange(len(local))
    ok = tuple(x[at[pick]] for x in checked) if with_emd else checked[at[pick]]   # in the order of pick
    if p.other_sas:         # several SAs: every other SA checked too (multi_refine.py)
        from .multi_refine import other_sas_close
        ok = other_sas_close(p, orders, cand, pick, copies, ok, with_emd, pmap, [x[2] for x in found if x[2]])
    return ok


def t_close_groups(p, ec, codes, counts, copies, pick, with_emd=False) -> np.ndarray:
    """Exact check of groups 2c, 2c + 1 (parts of candidate c; one row per (group, SA code)
    with its count) that may share rows, each row in at most ``copies`` groups: the table's
    counts scaled by ``copies`` less the groups' is one extra group, so every group's EMD is
    against the table's distribution.  Returns, per candidate of ``pick``, whether both of
    its groups pass (and, ``with_emd``, the larger of their EMDs)."""
    exact, keep = against_table(ec, codes, counts, copies * p.table_counts, p.domain)
    bad = exact.violating(p.t, p.k)
    good = np.zeros(2 * (int(pick.max()) + 1), dtype=bool)
    good[exact.class_ids[keep]] = ~bad[keep]
    if with_emd:
        e = np.zeros(len(good))
        e[exact.class_ids[keep]] = exact.emd[keep]
        return good[2 * pick] & good[2 * pick + 1], np.maximum(e[2 * pick], e[2 * pick + 1])
    return good[2 * pick] & good[2 * pick + 1]


def _clipped(a, lo, hi) -> np.ndarray:
    """``np.clip(a, lo, hi)`` for integers, without its per-call overhead."""
    return np.minimum(np.maximum(a, lo), hi)


def _segment_argmin(owners, scores) -> np.ndarray:
    """Index of the least score of every run of equal ``owners`` (sorted), the first on ties:
    ``lexsort((index, scores, owners))``'s first per owner, without the sort."""
    first = _run_firsts(owners)
    least = np.minimum.reduceat(scores, np.flatnonzero(first))[np.cumsum(first) - 1]
    at = np.flatnonzero(scores == least)
    return at[_run_firsts(owners[at])]






def run_ranks(a) -> np.ndarray:
    """Each element's position inside its run of equal elements of ``a`` (0 for the first)."""
    first = _run_firsts(a)
    return np.arange(len(a)) - np.flatnonzero(first)[np.cumsum(first) - 1]


def _run_firsts(a) -> np.ndarray:
    """Whether each element of ``a`` starts a run of equal ones (``np.r_[True, a[1:] !=
    a[:-1]]`` for a non-empty ``a``, without np.r_'s overhead)."""
    first = np.empty(len(a), dtype=bool)
    first[:1] = True
    np.not_equal(a[1:], a[:-1], out=first[1:])
    return first

