"""Cut search: t-Mondrian's top-down partitioning, each partition cut where the information
loss falls most among the cuts that stay t-close (``method => 'refine'``).

t-Mondrian (:mod:`.mondrian`) tries one cut per QI -- at the median, widest QI first -- and
stops a partition when those are refused.  A t-close cut is often elsewhere: off the median
(the median row splits one SA value's run), or along a categorical QI's hierarchy (children of
the partition's lowest common ancestor).  The search therefore scores, per partition and per
QI, several cuts of the rows sorted by the QI (ties by Hilbert key):

* at the quantiles :data:`QUANTILES` of the partition (each part >= k rows);
* the same quantiles moved to the nearest boundary between children of the lowest common
  ancestor, for a categorical QI with a hierarchy (the parts then generalize to lower nodes);
* the position where the parts' information loss is least (every position is scored: segment
  prefix and suffix minima and maxima of every QI give both parts' spans in O(1));
* SABRE's stratified cut (:func:`.mondrian._stratified_cut`): of each SA value's rows, the
  half with the smaller QI values goes left, so both parts keep about the partition's SA
  distribution.

The score of a cut is the summed information loss of its rows after it, ``|L| IL(L) + |R|
IL(R)`` (IL as the metrics define it: the mean normalized span over the QIs, a categorical
QI's ``(L - 1)/(N - 1)`` of the lowest common ancestor).  Candidates are checked best first,
in batches, by the *exact* EMD (:func:`t_close_groups`); the first whose both parts have >= k
rows and EMD <= t is kept.  A partition with no such candidate is a class.  Every published
class is therefore t-close and k-anonymous by the arithmetic of ``sabre_verify``.
"""
from __future__ import annotations

import numpy as np

from .exact_emd import domain_class_emds
from .mondrian import Partitioner, _stratified_cut

__all__ = ["cut_search", "QUANTILES"]

QUANTILES = (0.5, 0.45, 0.55, 0.4, 0.6, 0.33, 0.67, 0.25, 0.75)
LAMBDA = 0.0
STRATIFIED = True
FIRST_BATCH = 2            # candidates per partition in the first exact check of a round


def cut_search(p: Partitioner, part: np.ndarray) -> np.ndarray:
    """Cut the partitions of ``part`` (ids 0..P-1; each t-close and k-anonymous) while a
    candidate cut is t-close; returns the class id (0..C-1) of every row."""
    part = np.asarray(part, dtype=np.int64)
    n_parts = int(part.max()) + 1 if len(part) else 0
    final = np.zeros(n_parts, dtype=bool)
    by_rank = [p.columns[np.argsort(p.ranks_of(j)), j] for j in range(p.columns.shape[1])]
    while not final.all():
        part, n_parts, final = _search_round(p, part, n_parts, final, by_rank)
    _, inverse = np.unique(part, return_inverse=True)
    return inverse.reshape(-1).astype(np.int64)


def _search_round(p, part, n_parts, final, by_rank):
    """One round: every live partition keeps its best t-close candidate cut, or becomes final."""
    rows = np.flatnonzero(~final[part])
    owner = part[rows]
    sizes = np.bincount(owner, minlength=n_parts)
    live = (sizes >= 2 * p.k) & ~final
    final = final | ~live
    rows = rows[live[owner]]
    if not len(rows):
        return part, n_parts, final
    owner = part[rows]
    sizes = np.bincount(owner, minlength=n_parts)
    orders, cands = [], []
    for j in range(p.columns.shape[1]):
        order = _SortedPartitions(p, rows, owner, j, sizes, by_rank)
        orders.append(order)
        cands.append(order.candidates(p, by_rank))
    cand = {key: np.concatenate([c[key] for c in cands]) for key in cands[0]}
    chosen = _check_best_first(p, orders, cand, n_parts)
    has = chosen >= 0
    final = final | (live & ~has)
    new_part = part.copy()
    ids = np.flatnonzero(has)
    c = chosen[ids]
    for j, order in enumerate(orders):
        mine = cand["dim"][c] == j
        if not mine.any():
            continue
        r, right = order.members(ids[mine], cand["pos"][c][mine], cand["strat"][c][mine])
        new_part[r] = n_parts + 2 * part[r] + right
    present = np.bincount(new_part, minlength=3 * n_parts) > 0
    used = np.flatnonzero(present)
    new_final = np.concatenate((final, np.zeros(2 * n_parts, dtype=bool)))[used]
    return (np.cumsum(present) - 1)[new_part], len(used), new_final


class _SortedPartitions:
    """The live rows sorted by (partition, rank of QI j); each partition is a segment."""

    def __init__(self, p, rows, owner, j, sizes, by_rank):
        n = len(p.codes)
        order = np.argsort(owner * n + p.ranks_of(j)[rows])
        self.j = j
        self.rows, self.owner = rows[order], owner[order]
        self.sizes = sizes
        self.starts = np.cumsum(sizes) - sizes
        self.strat_left = _stratified_cut(p.codes[self.rows], self.owner, len(sizes))
        self._prefix_suffix_il(p, by_rank)

    def _prefix_suffix_il(self, p, by_rank):
        """IL of every segment prefix ending at x (``pre[x]``) and suffix starting at x."""
        n = len(p.codes)
        o = self.owner * n
        pre = np.zeros(len(self.rows))
        suf = np.zeros(len(self.rows))
        for i, qi in enumerate(p.qis):
            r = p.ranks_of(i)[self.rows]
            lo = np.minimum.accumulate(r - o) + o
            hi = np.maximum.accumulate(r + o) - o
            slo = (np.minimum.accumulate((r + o)[::-1]) - o[::-1])[::-1]
            shi = (np.maximum.accumulate((r - o)[::-1]) + o[::-1])[::-1]
            pre += p.span(i, by_rank[i][lo], by_rank[i][hi])
            suf += p.span(i, by_rank[i][slo], by_rank[i][shi])
        d = len(p.qis)
        self.pre, self.suf = pre / d, suf / d

    def score(self, q, pos):
        """Summed IL of partition q's rows after a cut leaving ``pos`` rows left."""
        x = self.starts[q] + pos
        return pos * self.pre[x - 1] + (self.sizes[q] - pos) * self.suf[x]

    def candidates(self, p, by_rank) -> dict:
        """Candidate cuts of every live partition on this QI (arrays: owner, dim, pos,
        strat, score)."""
        k = p.k
        q = np.flatnonzero(self.sizes >= 2 * k)
        q = q[np.isin(q, self.owner)]
        size = self.sizes[q]
        positions = [np.clip(np.rint(f * size).astype(np.int64), k, size - k) for f in QUANTILES]
        qi = p.qis[self.j]
        if not qi.numerical and qi.hierarchy.n_leaves > 1:
            positions += [self._snap(p, q, pos, by_rank) for pos in positions]
        positions.append(self._best_position(q, k))
        owners = np.concatenate([q] * len(positions))
        pos = np.concatenate(positions)
        scores = self.score(owners, pos)
        key, first = np.unique(owners * (len(self.rows) + 1) + pos, return_index=True)
        owners, pos, scores = owners[first], pos[first], scores[first]
        s_owner, s_score = self._stratified_scores(p, by_rank)
        if not STRATIFIED:
            s_owner, s_score = s_owner[:0], s_score[:0]
        return {"owner": np.concatenate((owners, s_owner)),
                "dim": np.full(len(owners) + len(s_owner), self.j),
                "pos": np.concatenate((pos, np.zeros(len(s_owner), dtype=np.int64))),
                "strat": np.concatenate((np.zeros(len(owners), bool), np.ones(len(s_owner), bool))),
                "score": np.concatenate((scores, s_score))}

    def _snap(self, p, q, pos, by_rank):
        """``pos`` moved to the boundary between children of the partition's lowest common
        ancestor that holds the row at ``pos`` (a categorical QI with a hierarchy)."""
        h = p.qis[self.j].hierarchy
        v = p.columns[self.rows, self.j].astype(np.int64)
        lo, hi = v[self.starts[q]], v[self.starts[q] + self.sizes[q] - 1]
        level = h.lca_level(lo, hi)
        at = v[self.starts[q] + pos]
        child = h.anc[at, np.maximum(level - 1, 0)]
        bound = np.where(h.lo[child] > lo, h.lo[child], h.hi[child])
        width = h.n_leaves + 1
        idx = np.searchsorted(self.owner * width + v, q * width + bound)
        return np.clip(idx - self.starts[q], p.k, self.sizes[q] - p.k)

    def _best_position(self, q, k):
        """Per partition q, the position in [k, size - k] with the least score."""
        idx = np.flatnonzero(self.sizes[self.owner] >= 2 * k)
        pos = idx - self.starts[self.owner[idx]]
        ok = (pos >= k) & (pos <= self.sizes[self.owner[idx]] - k)
        idx, pos = idx[ok], pos[ok]
        own = self.owner[idx]
        s = self.score(own, pos)
        order = np.lexsort((s, own))
        firsts = order[np.r_[True, own[order][1:] != own[order][:-1]]]
        best = np.zeros(len(self.sizes), dtype=np.int64)
        best[own[firsts]] = pos[firsts]
        return best[q]

    def _stratified_scores(self, p, by_rank):
        """Score of the stratified cut of every partition with >= k rows each side."""
        left = self.strat_left
        n_left = np.bincount(self.owner, weights=left, minlength=len(self.sizes))
        ok = (n_left >= p.k) & (self.sizes - n_left >= p.k)
        sel = ok[self.owner]
        label = 2 * self.owner[sel] + ~left[sel]
        order = np.argsort(label, kind="stable")
        label = label[order]
        rows = self.rows[sel][order]
        starts = np.flatnonzero(np.r_[True, label[1:] != label[:-1]])
        il = np.zeros(len(starts))
        for i in range(len(p.qis)):
            v = p.columns[rows, i]
            il += p.span(i, np.minimum.reduceat(v, starts), np.maximum.reduceat(v, starts))
        il /= len(p.qis)
        count = np.diff(np.r_[starts, len(label)])
        owners = np.unique(label[starts] // 2)
        total = np.bincount(label[starts] // 2, weights=il * count, minlength=len(self.sizes))
        return owners, total[owners]

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


def _check_best_first(p, orders, cand, n_parts) -> np.ndarray:
    """Per partition, the index of its best-scored candidate that passes the exact check, or
    -1.  Candidates are checked in batches of growing size, best first."""
    order = np.lexsort((cand["score"], cand["owner"]))
    owner = cand["owner"][order]
    first = np.r_[True, owner[1:] != owner[:-1]]
    start = np.flatnonzero(first)
    rank = np.arange(len(owner)) - start[np.cumsum(first) - 1]
    chosen = np.full(n_parts, -1, dtype=np.int64)
    done = np.zeros(n_parts, dtype=bool)
    lo, width = 0, FIRST_BATCH
    while lo <= rank.max() if len(rank) else False:
        pick = order[(rank >= lo) & (rank < lo + width) & ~done[owner]]
        if not len(pick):
            break
        if lo == 0 and LAMBDA:
            ok, emd = _check(p, orders, cand, pick, width, True)
            score = cand["score"][pick] * (1 + LAMBDA * emd / p.t)
        else:
            ok = _check(p, orders, cand, pick, width)
            score = cand["score"][pick]
        good, score = pick[ok], score[ok]
        # the best passing candidate of each partition
        if len(good):
            g = good[np.lexsort((score, cand["owner"][good]))]
            g_owner = cand["owner"][g]
            firsts = g[np.r_[True, g_owner[1:] != g_owner[:-1]]]
            chosen[cand["owner"][firsts]] = firsts
            done[cand["owner"][firsts]] = True
        lo, width = lo + width, 2 * width
    return chosen


def _check(p, orders, cand, pick, copies, with_emd=False) -> np.ndarray:
    """Exact check of the candidates ``pick`` (at most ``copies`` per partition): both parts
    k-anonymous and t-close."""
    rows, labels = [], []
    for j, order in enumerate(orders):
        mine = pick[cand["dim"][pick] == j]
        if not len(mine):
            continue
        seg = order.starts[cand["owner"][mine]]
        size = order.sizes[cand["owner"][mine]]
        idx = np.repeat(seg - np.cumsum(size) + size, size) + np.arange(size.sum())
        c = np.repeat(mine, size)
        pos_in = idx - np.repeat(seg, size)
        right = pos_in >= cand["pos"][c]
        s = cand["strat"][c]
        right[s] = ~order.strat_left[idx[s]]
        rows.append(order.rows[idx])
        labels.append(2 * c + right)
    return t_close_groups(p, np.concatenate(labels), np.concatenate(rows), copies, pick, with_emd)


def t_close_groups(p, labels, rows, copies, pick, with_emd=False) -> np.ndarray:
    """Exact check of groups that may share rows (each row in at most ``copies`` groups):
    the table's distribution is scaled by ``copies`` and the remainder is one extra group, so
    every group's EMD is against the table's distribution.  Returns, per candidate of
    ``pick``, whether its two groups 2c and 2c + 1 both pass."""
    m = p.domain.m
    codes = p.codes[rows]
    key, counts = np.unique(labels * m + codes, return_counts=True)
    ec, cc = key // m, key % m
    rest = copies * p.table_counts - np.bincount(codes, minlength=m)
    present = np.flatnonzero(rest)
    exact = domain_class_emds(np.concatenate((np.full(len(present), -1), ec)),
                              np.concatenate((present, cc)),
                              np.concatenate((rest[present], counts)), p.domain)
    bad = exact.violating(p.t, p.k)
    good = np.zeros(2 * (int(pick.max()) + 1), dtype=bool)
    keep = exact.class_ids >= 0
    good[exact.class_ids[keep]] = ~bad[keep]
    if with_emd:
        e = np.zeros(len(good))
        e[exact.class_ids[keep]] = exact.emd[keep]
        return good[2 * pick] & good[2 * pick + 1], np.maximum(e[2 * pick], e[2 * pick + 1])
    return good[2 * pick] & good[2 * pick + 1]
