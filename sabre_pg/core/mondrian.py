"""t-Mondrian: the paper's baseline tMondrian (§6; LeFevre et al.'s Mondrian with the
t-closeness check of Li et al., ICDE 2007), with the exact EMD.

Top-down: every partition is cut on the QI of its widest *normalized span* -- a numerical QI's
range over the table's range, a categorical QI's IL ``(L - 1)/(N - 1)`` of the lowest common
ancestor of its leaves -- at the median value (``< median`` left, ``>= median`` right; when the
median is the partition's smallest value, ``<= median`` / ``> median``).  A cut is kept only
if both parts have at least k rows and an EMD to the whole table of at most t, decided
*exactly* (:mod:`.exact_emd`: ordered distance for a numerical SA, hierarchical for a
categorical SA with a hierarchy, equal distance for a flat one).  A refused cut is retried on
the next widest QI; a partition no QI can cut is a class.  Every class is therefore t-close
and k-anonymous by the same exact arithmetic as ``sabre_verify``.

All partitions of one round are cut together with numpy on rows kept sorted per QI
(:func:`split_all`: the medians and spans read at segment positions, the orders split in
linear time), so a round costs O(n d) with no sort, and there are about log2(n/k) rounds plus
retries.  :func:`cut_round` is the same round with one sort of the live rows.
:class:`Partitioner` and the stratified cut are shared with the refinement's cut search
(:mod:`.cut_search`).
"""
from __future__ import annotations

import copy
import dataclasses

import numpy as np

from . import kernels
from .checkpoint import checkpoint
from .emd import SADomain
from .exact_emd import domain_class_emds
from .generalize import stable_argsort
from .segments import carried, grouped, lower_bound, segment_ids, segment_indices, slot_ids, split_segments

__all__ = ["mondrian", "joint_mondrian", "Partitioner"]

SPAN_TABLE_LEAVES = 1024     # categorical QIs up to this many leaves: spans by table lookup


def integer_offsets(values: np.ndarray) -> np.ndarray | None:
    """``values - min`` as int64 when every value is an integer and they span less than
    2^32 (leaf positions, ages, years): sorted stably in linear time by
    :func:`.generalize.stable_argsort`; else None."""
    if not len(values):
        return None
    lo, hi = values.min(), values.max()
    if not hi - lo < 1 << 32 or not np.array_equal(values, np.rint(values)):
        return None
    return (values - lo).astype(np.int64)


class Partitioner:
    """The QIs of a table prepared for Mondrian cuts, and the table's SA counts.

    ``columns`` is an (n x d) matrix of QI values (leaf positions for a categorical QI)."""

    def __init__(self, qis, sa_codes: np.ndarray, domain: SADomain, t: float, k: int, reference=None):
        self.qis = qis
        self.codes = np.asarray(sa_codes, dtype=np.int64)
        self.domain, self.t, self.k = domain, t, k
        self.columns = np.empty((len(self.codes), len(qis)), order="F")     # gathers by column
        for i, qi in enumerate(qis):
            self.columns[:, i] = qi.values
        # the distribution every class is measured against: these rows' own, or ``reference``
        # (SA counts of a larger table holding these rows: a Citus shard against its whole table)
        self.table_counts = np.bincount(self.codes, minlength=domain.m) if reference is None else \
            _reference_counts(reference, self.codes, domain)
        self.rows = len(self.codes)    # these rows (a subset keeps its table's)
        lo, hi = self.columns.min(axis=0), self.columns.max(axis=0)
        self.scale = np.where(hi > lo, hi - lo, 1.0)
        self.ties = None        # a secondary order of the rows (rank), for equal QI values
        self.ranks = None       # per QI, every row's position in its order (see rank)
        self._span_tables = {}  # categorical QI -> span of every (lo, hi) leaf pair
        self.other_sas = []     # (codes, domain, t, table counts) of further SAs (add_sa)
        self._by_row = None
        self.kernels = None     # the compiled loops of the cut search (kernels.for_rows), or None

    def subsets(self, groups: list) -> list:
        """:meth:`subset` of each of ``groups`` (disjoint sets of rows, each increasing), the
        ranks of all restricted in one pass per QI (one :meth:`subset` each would pass over
        the whole table per group)."""
        if self.ranks is None:
            return [self.subset(rows) for rows in groups]
        group = np.zeros(len(self.codes), dtype=np.int64)       # 0: in no group
        for g, rows in enumerate(groups):
            checkpoint()
            group[rows] = g + 1
        sizes = np.bincount(group, minlength=len(groups) + 1)
        starts = np.cumsum(sizes) - sizes
        ranks = np.empty_like(self.ranks)
        for j in range(self.ranks.shape[1]):
            by_value = self.value_order(j, group)     # by group, then value
            ranks[by_value, j] = np.arange(len(group)) - starts[group[by_value]]
        return [self.subset(rows, ranks[rows]) for rows in groups]

    def subset(self, rows: np.ndarray, ranks: np.ndarray | None = None) -> "Partitioner":
        """The rows ``rows`` (increasing) as a Partitioner of their own that measures as this
        one: EMDs against this table's SA distribution, spans over this table's ranges, ties
        in the same order.  A set of partitions searched apart (:func:`.refine.refine`'s
        threads) is then cut exactly as in the whole table.  ``ranks``: the rows' ranks
        among themselves per QI, when known (:meth:`subsets`)."""
        sub = copy.copy(self)
        sub.qis = [dataclasses.replace(qi, values=np.asarray(qi.values)[rows]) for qi in self.qis]
        sub.codes = self.codes[rows]
        sub.columns = np.asfortranarray(self.columns[rows])
        sub.ties = None if self.ties is None else self.ties[rows]
        sub.ranks, sub._by_row = (None if ranks is None else np.asfortranarray(ranks)), None
        if self.ranks is not None and ranks is None:      # the same orders restricted to the rows: no sort
            sub.ranks = np.empty((len(rows), self.ranks.shape[1]), dtype=np.int64, order="F")
            for j in range(self.ranks.shape[1]):
                r = self.ranks[rows, j]
                kept = np.zeros(len(self.codes), dtype=np.int64)
                kept[r] = 1
                sub.ranks[:, j] = (np.cumsum(kept) - 1)[r]
        sub.other_sas = [(codes[rows], domain, t, table) for codes, domain, t, table in self.other_sas]
        return sub

    def order_ties(self, keys: np.ndarray) -> None:
        """Break ties of the cut QI by ``keys`` (e.g. Hilbert keys: close in the other QIs)."""
        keys = np.asarray(keys)
        if len(keys) > 1 and (keys[1:] >= keys[:-1]).all():
            self.ties = None         # rows stored in key order: ties by row, as without keys
        else:
            self.ties = np.argsort(np.argsort(keys, kind="stable"), kind="stable")
        self.ranks = None

    def rank(self, rows: np.ndarray, dim: np.ndarray) -> np.ndarray:
        """Each row's position (0..n-1) in the order of QI ``dim[i]`` for row ``rows[i]``, ties
        broken by ``ties`` (else by row): one sort per QI, made on first use."""
        return self.ranks_of(None)[rows, dim]

    def ranks_of(self, j, pmap=map):
        """Every row's position in the order of QI j (all QIs: j None); see :meth:`rank`.
        ``pmap``: the ``map`` that sorts the QIs (e.g. a thread pool's)."""
        if self.ranks is None:
            n, d = self.columns.shape
            ranks = np.empty((n, d), dtype=np.int64, order="F")

            def sort(i):
                column = self.columns[:, i]
                if self.ties is not None:
                    order = np.lexsort((self.ties, column))
                else:
                    offsets = integer_offsets(column)
                    order = np.argsort(column, kind="stable") if offsets is None else stable_argsort(offsets)
                ranks[order, i] = np.arange(n)

            list(pmap(sort, range(d)))
            self.ranks = ranks
        return self.ranks if j is None else self.ranks[:, j]

    def value_order(self, j: int, group: np.ndarray | None = None) -> np.ndarray:
        """The rows in the order of QI j (the inverse of :meth:`ranks_of`); with ``group``
        (a label per row), regrouped stably by label: the rows by (label, order of QI j)."""
        n = len(self.codes)
        by_value = np.empty(n, dtype=np.int64)
        by_value[self.ranks_of(j)] = np.arange(n)
        return by_value if group is None else by_value[stable_argsort(group[by_value])]

    def span(self, j: int, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Normalized span of QI j over parts with smallest values ``lo`` and largest ``hi``:
        the range over the table's, or the IL (L - 1)/(N - 1) of the lowest common ancestor."""
        qi = self.qis[j]
        if qi.numerical:
            return (hi - lo) / self.scale[j]
        h = qi.hierarchy
        if h.n_leaves <= 1:
            return np.zeros(len(lo))
        lo, hi = lo.astype(np.int64), hi.astype(np.int64)
        if h.n_leaves <= SPAN_TABLE_LEAVES:          # every (lo, hi) pair looked up
            if j not in self._span_tables:
                a = np.repeat(np.arange(h.n_leaves), h.n_leaves)
                b = np.tile(np.arange(h.n_leaves), h.n_leaves)
                self._span_tables[j] = (h.leaf_count[h.lca_node(a, b)] - 1) / (h.n_leaves - 1)
            return self._span_tables[j][lo * h.n_leaves + hi]
        return (h.leaf_count[h.lca_node(lo, hi)] - 1) / (h.n_leaves - 1)

    @property
    def by_row(self) -> np.ndarray:
        """``columns`` stored row by row (a row's QI values adjacent: gathers of whole rows,
        the cut search's), made on first use."""
        if self._by_row is None:
            self._by_row = np.ascontiguousarray(self.columns)
        return self._by_row

    def spans(self, part: np.ndarray, n_parts: int) -> np.ndarray:
        """Normalized span of every QI in every partition (n_parts x d); rows of ``part`` < 0
        are ignored."""
        rows = np.flatnonzero(part >= 0)
        return self.group_spans(rows, part[rows], n_parts)

    def group_spans(self, rows: np.ndarray, labels: np.ndarray, n_groups: int, single: bool = False):
        """Normalized span of every QI in every group (n_groups x d) of ``rows`` labelled
        ``labels`` (0..n_groups-1); a group without rows spans 0.  With ``single``, also
        (n_groups x d) whether the group has one value of the QI (True for a group without
        rows)."""
        order = rows[stable_argsort(labels)]
        sizes = np.bincount(labels, minlength=n_groups)
        present = np.flatnonzero(sizes)
        starts = (np.cumsum(sizes) - sizes)[present]
        out = np.zeros((n_groups, len(self.qis)))
        one = np.ones((n_groups, len(self.qis)), dtype=bool)
        for j in range(len(self.qis)):
            v = self.columns[:, j][order]
            lo, hi = np.minimum.reduceat(v, starts), np.maximum.reduceat(v, starts)
            out[present, j] = self.span(j, lo, hi)
            one[present, j] = lo == hi
        return (out, one) if single else out

    def add_sa(self, sa_codes: np.ndarray, domain: SADomain, t: float, reference=None) -> None:
        """Another SA every part must also be t-close on, with its own t (several SAs,
        docs/multiple-sa.md: a cut is kept only if both parts hold on every SA); ``reference``:
        that SA's counts in a larger table holding these rows, as for the first SA."""
        codes = np.asarray(sa_codes, dtype=np.int64)
        table = np.bincount(codes, minlength=domain.m) if reference is None else \
            _reference_counts(reference, codes, domain)
        self.other_sas.append((codes, domain, t, table))

    def t_close(self, labels: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Exact check of the groups ``labels`` (>= 0) of ``rows``: (ids, ok) with ok[i] when
        group ids[i] has >= k rows and EMD <= t against the whole table, on every SA."""
        ids, ok = _t_close(labels, self.codes[rows], self.table_counts, self.domain, self.t, self.k)
        for codes, domain, t, table in self.other_sas:   # same groups: same ids, in order
            ok &= _t_close(labels, codes[rows], table, domain, t, self.k)[1]
        return ids, ok


def _reference_counts(reference, codes, domain: SADomain) -> np.ndarray:
    """``reference`` as int64 SA counts; it must hold the rows ``codes``."""
    ref = np.asarray(reference, dtype=np.int64)
    if ref.shape != (domain.m,) or (ref < np.bincount(codes, minlength=domain.m)).any():
        raise ValueError("the reference SA counts must cover the rows' SA codes (%d values)" % domain.m)
    return ref


def _t_close(labels, codes, table_counts, domain: SADomain, t: float, k: int):
    """(ids, ok) of :meth:`Partitioner.t_close` on one SA: ``codes`` are the SA codes of the
    grouped rows."""
    m = domain.m
    key, counts = np.unique(labels * m + codes, return_counts=True)
    exact, keep = against_table(key // m, key % m, counts, table_counts, domain)
    return exact.class_ids[keep], ~exact.violating(t, k)[keep]


def against_table(ec, codes, counts, table_counts, domain: SADomain):
    """(exact EMDs, mask) of groups ``ec`` (one row per (group, SA code) with its count)
    against the table ``table_counts``: the table's counts less the groups' form one more
    group (-1), so each group's EMD is to the table's distribution; the mask selects the
    groups' entries (not the -1 group's)."""
    rest = table_counts - np.bincount(codes, weights=counts, minlength=domain.m).astype(np.int64)
    present = np.flatnonzero(rest)
    exact = domain_class_emds(np.concatenate((np.full(len(present), -1), ec)), np.concatenate((present, codes)),
                              np.concatenate((rest[present], counts)), domain)
    return exact, exact.class_ids >= 0


def cut_round(p: Partitioner, part: np.ndarray, n_parts: int, dim: np.ndarray,
              stratified: np.ndarray | None = None) -> tuple[np.ndarray, int, np.ndarray]:
    """Cut every partition q with ``dim[q] >= 0`` on QI ``dim[q]``.

    Mondrian's cut: at the median value.  ``stratified[q]``: SABRE's dichotomize along the
    QI instead -- of every SA value's rows in q, the half with the smaller QI values goes left
    (odd counts give their extra row alternately left and right), so both parts keep about
    q's SA distribution and stay close to the table's when q is (the refinement's cut).

    Returns (part, n_parts, cut): the new partition id per row (a kept cut gives its two parts
    new ids), the new number of ids, and ``cut[q]``: whether q's cut was kept (t-close and
    k-anonymous parts)."""
    cut = np.zeros(n_parts, dtype=bool)
    rows = np.flatnonzero((part >= 0) & (dim[np.maximum(part, 0)] >= 0))
    if not len(rows):
        return part, n_parts, cut
    owner = part[rows]
    v = p.columns[rows, dim[owner]]
    order = np.argsort(owner * len(p.codes) + p.rank(rows, dim[owner]))   # (owner, value, tie)
    rows, owner, v = rows[order], owner[order], v[order]
    sizes = np.bincount(owner, minlength=n_parts)
    left = _median_cut(owner, v, sizes, n_parts)
    if stratified is not None and stratified.any():
        s = stratified[owner]
        left[s] = _stratified_cut(p.codes[rows[s]], owner[s], n_parts)
    n_left = np.bincount(owner, weights=left, minlength=n_parts)
    splittable = (n_left > 0) & (n_left < sizes)
    candidate = splittable[owner]
    labels = 2 * owner + ~left                  # 2q: left part of q, 2q + 1: right part
    ids, ok = p.t_close(labels[candidate], rows[candidate])
    good = np.zeros(2 * n_parts, dtype=bool)
    good[ids[ok]] = True
    cut = splittable & good[0::2] & good[1::2]
    take = cut[owner]
    part = part.copy()
    part[rows[take]] = n_parts + labels[take]   # fresh ids n_parts + 2q (+1)
    return part, 3 * n_parts, cut


def _median_cut(owner, v, sizes, n_parts) -> np.ndarray:
    """Rows sorted by (partition, value): left = below the partition's median value (or at
    most the median when it is the smallest value)."""
    starts = np.cumsum(sizes) - sizes
    median = np.zeros(n_parts)
    has = sizes > 0
    median[has] = v[starts[has] + sizes[has] // 2]
    left = v < median[owner]
    empty = np.bincount(owner, weights=left, minlength=n_parts) == 0
    return left | (empty[owner] & (v <= median[owner]))


def _stratified_cut(codes, owner, n_parts) -> np.ndarray:
    """Rows sorted by (partition, value): left = the first half, in value order, of each SA
    code's rows of the partition; odd counts round up and down alternately (dichotomize)."""
    m = int(codes.max()) + 1 if len(codes) else 1
    order = stable_argsort(owner * m + codes)   # stable: value order within each (owner, code)
    o, c = owner[order], codes[order]
    new = np.r_[True, (o[1:] != o[:-1]) | (c[1:] != c[:-1])]
    group = np.cumsum(new) - 1
    first = np.flatnonzero(new)
    count = np.diff(np.r_[first, len(o)])
    rank = np.arange(len(o)) - first[group]
    odd = count & 1
    new_owner = np.r_[True, o[first][1:] != o[first][:-1]]
    owner_of_group = np.cumsum(new_owner) - 1
    odd_rank = np.cumsum(odd) - odd             # odd groups before, counted from the table's start
    odd_rank -= (odd_rank - 0)[np.flatnonzero(new_owner)][owner_of_group]
    half = count // 2 + (odd * ((odd_rank & 1) == 0))
    left = np.empty(len(o), dtype=bool)
    left[order] = rank < half[group]
    return left


def mondrian(qis, sa_codes, domain: SADomain, t: float, k: int,
             part: np.ndarray | None = None, reference=None) -> np.ndarray:
    """t-Mondrian: the class id (0..C-1) of every row.  ``part`` (optional): a partition of
    the rows into t-close, k-anonymous classes to cut further (default: the whole table).
    ``reference``: SA counts of a larger table holding these rows, every class measured
    against its distribution (:class:`Partitioner`)."""
    p = Partitioner(qis, sa_codes, domain, t, k, reference)
    n = len(p.codes)
    part = np.zeros(n, dtype=np.int64) if part is None else _compact(part)
    return split_all(p, part)


def joint_mondrian(qis, sa_codes: np.ndarray, domains, ts, k: int, references=None) -> np.ndarray:
    """t-Mondrian with several SAs (``sa_codes``: n x s, one column per SA, each with its domain
    and t): a cut is kept only if both parts are t_i-close on every SA i.  Class ids 0..C-1.
    ``references``: per SA, its counts in a larger table holding these rows (or None)."""
    codes = np.asarray(sa_codes, dtype=np.int64)
    refs = references or [None] * codes.shape[1]
    p = Partitioner(qis, codes[:, 0], domains[0], ts[0], k, refs[0])
    for i in range(1, codes.shape[1]):
        p.add_sa(codes[:, i], domains[i], ts[i], refs[i])
    return split_all(p, np.zeros(len(codes), dtype=np.int64))


def split_all(p: Partitioner, part: np.ndarray) -> np.ndarray:
    """Cut every partition of ``part`` (ids 0..P-1) while a cut is allowed; class ids 0..C-1.

    Each partition tries its QIs widest first (its spans computed once: a refused cut leaves
    them unchanged); a round cuts every partition not final at the median of its QI
    (:func:`cut_round`'s rule, the same classes and ids).  The rows of the partitions not
    final are kept in one order per QI, grouped by partition in the same segments in every
    order and sorted by (value, row) inside: a round reads spans and medians at segment
    positions, counts each median's rows by a binary search in its segment, checks the cuts
    exactly (:func:`.segments.grouped`: no sort) and splits every order stably in linear time
    (:func:`.segments.split_segments`; the compiled loop on a large table, :mod:`.kernels`), so
    no round sorts rows (1M census-like rows: 7.2 s with a sort per round, docs/evaluation.md).
    ``old[q]``: partition q's id in :func:`cut_round`'s numbering (children after the
    partitions not cut, in their parent's order, left first), the class ids returned.
    Memory: the d orders and their segments' partitions (two int64 per row and QI on a large
    table) and ``p.columns``; ``p.ranks`` is dropped once the orders are made."""
    n, d = p.columns.shape
    part = np.asarray(part, dtype=np.int64)
    n_parts = int(part.max()) + 1 if n else 0
    if n_parts == 0:
        return _compact(part)
    K = kernels.for_rows(n)
    orders = [p.value_order(j, part) for j in range(d)]
    p.ranks = None          # (n x d; remade if asked for again): the orders hold the same
    owner = part[orders[0]]                 # the partition at each position (every order's)
    tries = np.zeros(n_parts, dtype=np.int64)    # cuts already refused, per partition
    final = np.zeros(n_parts, dtype=bool)
    spans = np.zeros((n_parts, d))
    known = np.zeros(n_parts, dtype=bool)        # spans[q] computed
    old = np.arange(n_parts)
    right = np.zeros(n, dtype=np.uint8)
    while not final.all():
        checkpoint()
        sizes = np.bincount(owner, minlength=n_parts)       # rows in the orders
        starts = np.cumsum(sizes) - sizes
        need = np.flatnonzero(~final & ~known)
        for j in range(d):          # a segment's ends: its smallest and largest value
            o, column = orders[j], p.columns[:, j]
            spans[need, j] = p.span(j, column[o[starts[need]]], column[o[starts[need] + sizes[need] - 1]])
        known[need] = True
        attempt = np.minimum(tries, d - 1)
        pick = np.argsort(-spans, axis=1, kind="stable")[np.arange(n_parts), attempt]
        usable = ~final & (tries < d) & (spans[np.arange(n_parts), pick] > 0)
        final |= ~usable
        u = np.flatnonzero(usable)
        n_left = _median_counts(p, orders, pick[u], starts[u], sizes[u])
        splittable = (n_left > 0) & (n_left < sizes[u])
        c, n_left = u[splittable], n_left[splittable]
        at = segment_indices(starts[c], sizes[c])       # the candidates' positions
        seg = segment_ids(sizes[c])
        rows = np.empty(len(at), dtype=np.int64)
        dim = pick[c][seg]
        for j in range(d):
            mine = dim == j
            if mine.any():
                rows[mine] = orders[j][at[mine]]
        side = at >= (starts[c] + n_left)[seg]      # 2i: left part of candidate i, 2i + 1: right
        good = _parts_close(p, 2 * seg + side, rows, 2 * len(c))
        cut = good[0::2] & good[1::2]
        tries[usable] += 1          # (a cut partition's parts start again at 0)
        moved = rows[side & cut[seg]]
        right[moved] = 1
        has = np.zeros(n_parts, dtype=bool)
        has[c[cut]] = True
        n_right = np.zeros(n_parts, dtype=np.int64)
        n_right[c[cut]] = (sizes[c] - n_left)[cut]
        part, n_parts, orders, owner, state = _next_round(
            p, part, right, has, sizes, n_right, orders, owner, K, old, final=final, tries=tries, spans=spans,
            known=known)
        right[moved] = 0
        final, tries, spans, known, old = state
    return old[part]


def _median_counts(p: Partitioner, orders, dim, starts, sizes) -> np.ndarray:
    """Rows going left in each segment's median cut on QI ``dim[i]`` (:func:`_median_cut`):
    those below the value at the middle position, or at most it when none is below; by a
    binary search in the segment, reading only the values it visits."""
    n_left = np.zeros(len(dim), dtype=np.int64)
    for j in np.unique(dim):
        i = np.flatnonzero(dim == j)
        o, column = orders[j], p.columns[:, j]
        first, size = starts[i], sizes[i]
        median = column[o[first + size // 2]]
        below = lower_bound(column, first, first + size, median, at=o) - first
        none = below == 0
        below[none] = lower_bound(column, first[none], (first + size)[none], median[none], True, o) - first[none]
        n_left[i] = below
    return n_left


def _parts_close(p: Partitioner, labels: np.ndarray, rows: np.ndarray, n_groups: int) -> np.ndarray:
    """Whether each group (``labels``, non-decreasing, of ``rows``) has >= k rows and an exact
    EMD <= t to the table on every SA (:meth:`Partitioner.t_close`, counted without a sort)."""
    good = np.ones(n_groups, dtype=bool)
    for codes, domain, t, table in [(p.codes, p.domain, p.t, p.table_counts)] + p.other_sas:
        group, code, count = grouped(labels, codes[rows], domain.m)
        exact, keep = against_table(group, code, count, table, domain)
        ok = np.zeros(n_groups, dtype=bool)
        ok[exact.class_ids[keep]] = ~exact.violating(t, p.k)[keep]
        good &= ok
    return good


def _next_round(p: Partitioner, part, right, has, sizes, n_right, orders, owner, K, old, **state):
    """The round's cuts applied (``has[q]``: q was cut, its rows with ``right[row]`` going right):
    new partition ids in segment order (q's slots 3q (q not cut), 3q + 1 and 3q + 2 (its parts)),
    the orders split and rid of the rows of final partitions and of partitions too small to cut,
    the per-partition ``state`` carried over (:func:`.segments.carried`: new parts start at zero)
    and ``old``, the partitions' ids in :func:`cut_round`'s numbering, renumbered.  Returns
    (part, n_parts, orders, owner, the state's arrays and then ``old``)."""
    n_new, new_id = slot_ids(has, np.bincount(part, minlength=len(has)))
    state = {name: carried(a, new_id, ~has, n_new) for name, a in state.items()}
    # cut_round's numbering: the partitions not cut in their order, then each cut one's parts
    by_old = np.argsort(old)
    uncut, cut = by_old[~has[by_old]], by_old[has[by_old]]
    new_old = np.zeros(n_new, dtype=np.int64)
    new_old[new_id[uncut]] = np.arange(len(uncut))
    new_old[new_id[cut]] = len(uncut) + 2 * np.arange(len(cut))
    new_old[new_id[cut] + 1] = len(uncut) + 2 * np.arange(len(cut)) + 1
    part = new_id[part] + (has[part] & (right > 0))
    new_sizes = np.zeros(n_new, dtype=np.int64)
    new_sizes[new_id] = sizes - n_right
    new_sizes[new_id[has] + 1] = n_right[has]
    state["final"] |= new_sizes < 2 * p.k        # no cut leaves both parts k rows
    keep = ~state["final"]
    new_owner = np.stack((new_id, new_id + 1), axis=1).ravel()
    present = sizes > 0
    owners = np.zeros(0, dtype=np.int64)
    for j in range(len(orders)):        # one at a time, in place: the old order is freed at once
        (o,), (owners,) = split_segments([orders[j]], [owner], right, sizes, n_right, new_owner, [present],
                                         K=K, keep=keep)
        if K is None and not keep[owners].all():
            mask = keep[owners]
            o, owners = o[mask], owners[mask]
        orders[j] = o
    return part, n_new, orders, owners, tuple(state[k] for k in ("final", "tries", "spans", "known")) + (new_old,)


def _compact(part: np.ndarray) -> np.ndarray:
    """Ids renumbered 0..C-1 in order of first appearance by id."""
    _, inverse = np.unique(np.asarray(part, dtype=np.int64), return_inverse=True)
    return np.asarray(inverse, dtype=np.int64).reshape(-1)
