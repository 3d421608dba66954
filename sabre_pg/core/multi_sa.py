"""Several sensitive attributes, each with its own t: (t_1, ..., t_d)-closeness.

A class is t-close on every SA i: ``EMD_i(class, table) <= t_i`` on each SA's marginal (the
thesis's Definition 5, for any number of SAs of any EMD kind).  Two ways are implemented and
compared in ``benchmarks/bench_multi_sa.py`` (docs/multiple-sa.md has the study):

* ``"fragments"``: joint bucketization
  (:mod:`.fragments`: FIND-FRAGMENTATION with global normalization, then class sizing that
  checks the relaxed bound of every SA), then SABRE's takeOut with the fragments as buckets;
* ``"merge"`` (SABRE §7; the study's winner on correlated SAs): SABRE on the most constraining SA alone (the one whose own plan
  gives the fewest classes), then classes are merged with a QI neighbour until every SA
  holds -- the EMD of a union is at most the largest EMD of its parts, and the whole table
  has EMD 0, so merging ends;
* ``"auto"`` (the default, the study's overall winner): ``"merge"``, and where merging
  collapsed the classes (Adult at t = 0.1), the fragments when they do better.

Both finish with the same **exact check and repair** (:func:`close_classes`): every class's
EMD on every SA is recomputed in integers (:mod:`.exact_emd`); a class over its t (which the
planning bounds exclude up to rounding for ``"fragments"``) is merged with the neighbour, in
QI order, whose union is closest, until none is.  Nothing over a t is ever returned.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import exact_emd as X
from . import metrics
from .buckets import Bucket, Bucketization
from .checkpoint import checkpoint
from .emd import SADomain
from .fragments import Fragmentation, JointCounts, find_fragmentation, joint_counts, size_classes
from .generalize import ECIndex
from .parameters import check_k, check_lookahead, check_t
from .redistribute import ECPlan
from .sabre import LOOKAHEAD_GAIN, PARTITIONING, SabreResult, SAPlan, anonymize, generalize_classes, plan_from_counts
from .stopwatch import Stopwatch

STRATEGIES = ("auto", "merge", "fragments")
AUTO_LOSS = 0.5                    # "auto" also tries the fragments when merging kept fewer classes
CHUNK_CELLS = 1 << 22              # class x value cells of one dense EMD evaluation
DENSE_CELLS = 1 << 25              # class x value counts per SA that the repair keeps in memory


@dataclass
class MultiSAPlan:
    """The joint bucketization and class templates of a table, from its joint SA counts."""
    joint: JointCounts
    fragmentation: Fragmentation
    plan: ECPlan
    ts: np.ndarray
    phases: dict = field(default_factory=dict)
    k: int | None = None               # the k it was made for (anonymize_multi refuses it for others)

    @property
    def n_classes(self) -> int:
        return self.plan.n_classes

    def sa_plan(self) -> SAPlan:
        """The plan as SABRE's single-SA engine takes it: one bucket per fragment."""
        counts = self.fragmentation.counts()
        buckets = [Bucket(j, j + 1, 0.0) for j in range(len(counts))]
        domain = SADomain("numerical", m=len(counts))
        return SAPlan(counts, Bucketization(buckets, 0.0, domain, counts / counts.sum()), self.plan,
                      dict(self.phases), 1.0, self.k)      # bounds are normalized by each SA's t


def check_ts(ts, d: int) -> np.ndarray:
    """One valid t per SA (ValueError otherwise)."""
    ts = list(ts)
    if len(ts) != d:
        raise ValueError("one t per sensitive attribute is needed: %d SAs, %d t" % (d, len(ts)))
    if d == 0:
        raise ValueError("at least one sensitive attribute is required")
    return np.array([check_t(t) for t in ts], dtype=np.float64)


def plan_from_joint_counts(joint: JointCounts, domains, ts, k: int = 1, lookahead: int = 4) -> MultiSAPlan:
    """FIND-FRAGMENTATION and class sizing from the joint SA counts alone (no tuple needed).
    As :func:`.sabre.plan_from_counts`, up to ``lookahead`` further splits are tried and one
    replaces the current choice when it gives ``LOOKAHEAD_GAIN`` times as many classes."""
    ts = check_ts(ts, len(domains))
    k = check_k(k, joint.n)
    lookahead = check_lookahead(lookahead)
    stopwatch = Stopwatch()
    with stopwatch.phase("bucketize"):
        candidates = find_fragmentation(joint, domains, ts, lookahead)
    with stopwatch.phase("redistribute"):
        best, best_classes = candidates[0], None
        for candidate in candidates if len(candidates) > 1 else []:
            classes = size_classes(candidate, ts, k, count_only=True)
            if best_classes is None or classes >= LOOKAHEAD_GAIN * best_classes:
                best, best_classes = candidate, classes
        plan = size_classes(best, ts, k)
    return MultiSAPlan(joint, best, plan, ts, dict(stopwatch.phases), k)


def most_constraining(codes, domains, ts, k: int, lookahead: int = 4) -> tuple[int, SAPlan]:
    """The SA whose own SABRE plan gives the fewest classes, and that plan (ties: the first)."""
    return most_constraining_of([np.bincount(codes[:, i], minlength=d.m) for i, d in enumerate(domains)],
                                domains, ts, k, lookahead)


def most_constraining_of(counts, domains, ts, k: int, lookahead: int = 4) -> tuple[int, SAPlan]:
    """:func:`most_constraining` from each SA's frequencies (``counts``) alone."""
    plans = [plan_from_counts(c, d, t, k, lookahead) for c, d, t in zip(counts, domains, ts)]
    i = int(np.argmin([p.plan.n_classes for p in plans]))
    return i, plans[i]


def anonymize_multi(qis, codes, domains, ts, k: int = 1, method: str = "ak", seed: int = 0,
                    takeout: str = "sweep", weights=None, lookahead: int = 4, strategy: str = "auto",
                    plan: MultiSAPlan | None = None, base: tuple | None = None, search: str = "fast",
                    threads: int = 1) -> SabreResult:
    """SABRE for several SAs: ``codes`` (n x d) holds each tuple's code of every SA, ``domains``
    and ``ts`` one per SA.  Returns a :class:`MultiSAResult` whose classes are all exactly
    t_i-close on every SA i and >= k.  Plans made before the tuples were read: ``plan``, the
    :func:`plan_from_joint_counts` of the codes (``"fragments"``); ``base``, (SA index, its
    :func:`.sabre.plan_from_counts`) of the SA to start from (``"merge"``).

    ``"auto"`` (the default): ``"merge"``, unless merging lost more than half of the base SA's
    classes and the fragments' plan promises more classes than are left; then both are run
    and the lower AIL is kept (``AUTO_LOSS``).

    The strategies are those of ``'ak'`` and ``'knn'``.  ``'refine'`` and ``'mondrian'``
    (``strategy`` "auto") cut the QI space checking every SA at every cut, the base SA as the
    primary (:mod:`.multi_refine`; ``search``, ``threads``: the refinement's); the exact check
    of every class follows as for the strategies."""
    codes = np.asarray(codes, dtype=np.int64)
    if codes.ndim != 2 or codes.shape[1] != len(domains):
        raise ValueError("codes must have one column per SA (%d), got shape %s" % (len(domains), codes.shape))
    ts = check_ts(ts, len(domains))
    if strategy not in STRATEGIES:
        raise ValueError("strategy must be one of %s, got %r" % (", ".join(STRATEGIES), strategy))
    stopwatch = Stopwatch()
    args = (qis, codes, domains, ts, k, method, seed, takeout, weights, lookahead, stopwatch)
    if method in PARTITIONING:
        if strategy != "auto":
            raise ValueError("strategy %r is one of method 'ak' or 'knn', not of %r" % (strategy, method))
        closed = _by_merge(*args, base, search, threads)
    elif strategy == "fragments":
        closed = _by_fragments(*args, plan)
    else:
        closed = _by_merge(*args, base)
        if strategy == "auto" and closed.n_classes < AUTO_LOSS * (closed.n_classes + closed.merges):
            with stopwatch.phase("redistribute"):
                plan = plan_from_joint_counts(joint_counts(codes)[0], domains, ts, k, lookahead)
            if plan.n_classes > closed.n_classes:
                other = _by_fragments(*args, plan)
                if metrics.ail(other.il, other.sizes) < metrics.ail(closed.il, closed.sizes):
                    closed = other
    closed.phases = stopwatch.report()
    return closed


def _by_merge(qis, codes, domains, ts, k, method, seed, takeout, weights, lookahead, stopwatch, base,
              search="fast", threads=1):
    """SABRE §7: SABRE on the base SA, then the exact check's merges (with 'refine' and
    'mondrian': the QI space cut checking every SA, the base SA first; nothing to merge)."""
    if base is None:
        base = most_constraining(codes, domains, ts, k, lookahead)
        stopwatch.merge(base[1].phases)
    sa, sa_plan = base
    others = [(codes[:, i], domains[i], ts[i]) for i in range(len(ts)) if i != sa] if method in PARTITIONING else ()
    result = anonymize(qis, codes[:, sa], domains[sa], ts[sa], k, method, seed, takeout, weights,
                       with_emds=False, sa_plan=sa_plan, search=search, threads=threads, other_sas=others)
    U = np.full(len(ts), np.nan)
    U[sa] = sa_plan.buckets.U
    return _closed(result, qis, codes, domains, ts, weights, stopwatch, sa_plan.buckets.n_buckets, U,
                   method if method in PARTITIONING else "merge")


def _by_fragments(qis, codes, domains, ts, k, method, seed, takeout, weights, lookahead, stopwatch, plan):
    """Joint bucketization: takeOut with the fragments as buckets, then the exact check."""
    joint, cell = joint_counts(codes)
    if plan is None:
        plan = plan_from_joint_counts(joint, domains, ts, k, lookahead)
        stopwatch.merge(plan.phases)
    elif not (np.array_equal(plan.joint.cells, joint.cells) and np.array_equal(plan.joint.counts, joint.counts)):
        raise ValueError("the SA codes do not have the joint frequencies the plan was made from")
    elif plan.k != k or not np.array_equal(plan.ts, ts):
        raise ValueError("the plan was made for t = %s, k = %r, not t = %s, k = %r"
                         % (list(plan.ts), plan.k, list(ts), k))
    fragment = plan.fragmentation.fragment_of_cell()[cell]
    result = anonymize(qis, fragment, plan.sa_plan().buckets.domain, 1.0, k, method, seed, takeout,
                       weights, with_emds=False, sa_plan=plan.sa_plan())
    return _closed(result, qis, codes, domains, ts, weights, stopwatch, plan.fragmentation.n_fragments,
                   plan.fragmentation.U, "fragments")


def _closed(result, qis, codes, domains, ts, weights, stopwatch, fragments, U, strategy):
    stopwatch.merge(result.phases)
    with stopwatch.phase("metrics"):
        closed, merges = close_classes(result, qis, codes, domains, ts, weights)
    closed.fragments, closed.U_by_sa, closed.strategy, closed.merges = fragments, np.asarray(U), strategy, merges
    return closed


@dataclass
class MultiSAResult(SabreResult):
    """A :class:`.sabre.SabreResult` for several SAs: ``emds`` is the first SA's;
    ``emds_by_sa[c, i]`` the exact EMD of class c on SA i (correctly rounded)."""
    emds_by_sa: np.ndarray | None = None
    ts: np.ndarray | None = None
    fragments: int = 0               # fragments ("fragments") or the chosen SA's buckets ("merge")
    U_by_sa: np.ndarray | None = None
    strategy: str = "merge"
    merges: int = 0                  # classes merged away by the exact check's repair

    def metrics(self) -> dict:
        n = int(self.sizes.sum())
        return {
            "rows": n, "classes": self.n_classes, "buckets": int(self.fragments),
            "U": [None if np.isnan(u) else float(u) for u in self.U_by_sa],
            "min_class_size": int(self.sizes.min()), "max_class_size": int(self.sizes.max()),
            "max_emd": [float(v) for v in self.emds_by_sa.max(axis=0)],
            "ail": metrics.ail(self.il, self.sizes),
            "discernibility": metrics.discernibility(self.sizes),
            "aecs": metrics.average_class_size(n, self.n_classes),
            "aecs_normalized": metrics.average_class_size(n, self.n_classes, self.k),
            "merges": int(self.merges),
        }


# ---------------------------------------------------------------------------- exact check, repair
def exact_class_emds(ec, codes, domain: SADomain) -> X.ClassEMDs:
    """Exact EMD of every class (ids 0..C-1, all non-empty) on one SA (:mod:`.exact_emd`)."""
    ec, codes = np.asarray(ec, dtype=np.int64), np.asarray(codes, dtype=np.int64)
    span = int(ec.max()) + 1
    if span * domain.m <= max(8 * len(ec), 1 << 22):         # by counting, else by sorting
        counts = np.bincount(ec * domain.m + codes, minlength=span * domain.m)
        keys = np.flatnonzero(counts)
        counts = counts[keys]
    else:
        keys, counts = np.unique(ec * domain.m + codes, return_counts=True)
    if domain.numerical:
        return X.ordered_class_emds(keys // domain.m, keys % domain.m, counts, domain.m)
    return X.hierarchical_class_emds(keys // domain.m, keys % domain.m, counts, domain.hierarchy)


def violating(ec, codes, domains, ts) -> tuple[np.ndarray, np.ndarray]:
    """(classes over their t on some SA, exact EMD per class and SA)."""
    found = [exact_class_emds(ec, codes[:, i], d) for i, d in enumerate(domains)]
    bad = np.zeros(found[0].classes, dtype=bool)
    for f, t in zip(found, ts):
        bad |= f.exceeds(t)
    return bad, np.column_stack([f.emd for f in found])


def close_classes(result: SabreResult, qis, codes, domains, ts, weights=None):
    """The exact check of every class on every SA and the repair of any class over its t:
    merged with its QI neighbour (classes ordered by mean Hilbert key) whose union has the
    smaller largest EMD / t (:func:`merge_rounds`), until no class violates in exact
    arithmetic.  Returns (MultiSAResult, merges)."""
    ec, n_classes = result.ec, result.n_classes
    bad, emds = violating(ec, codes, domains, ts)
    index, generalization, il = result.index, result.generalization, result.il
    if bad.any():
        mean_key = np.bincount(ec, weights=result.keys.astype(np.float64), minlength=n_classes) / result.sizes
        rank = np.empty(n_classes, dtype=np.int64)
        rank[np.argsort(mean_key, kind="stable")] = np.arange(n_classes)
        ec, bad = rank[ec], bad[np.argsort(rank)]          # class ids in QI order
        while bad.any():
            checkpoint()
            ec = merge_rounds(ec, bad, codes, domains, ts)
            bad, emds = violating(ec, codes, domains, ts)
        index = ECIndex(ec)
        generalization, il = generalize_classes(qis, index, weights)
    return MultiSAResult(ec, index.sizes, emds[:, 0], result.buckets, result.plan, generalization, il,
                         result.keys, result.bucket_of_tuple, k=result.k, index=index,
                         emds_by_sa=emds, ts=np.asarray(ts)), n_classes - index.n_classes


def class_counts(ec, n_classes, codes, domains) -> list | None:
    """Per SA, tuples per class (rows) and code; None beyond ``DENSE_CELLS`` cells per SA."""
    if any(n_classes * d.m > DENSE_CELLS for d in domains):
        return None
    return [np.bincount(ec * d.m + codes[:, i], minlength=n_classes * d.m).reshape(n_classes, d.m)
            for i, d in enumerate(domains)]


def merge_rounds(ec, bad, codes, domains, ts) -> np.ndarray:
    """Repair rounds until no class is over (or within ``1e-9 t`` of) its t in float: each
    violating class (ids in QI order) is united with the previous or next class, whichever
    union has the smaller ``max_i EMD_i / t_i``; chains unite.  The rounds work on class x
    value counts (a union adds its rows into its first class's and only merged classes are
    measured again); with more than ``DENSE_CELLS`` counts per SA, one round on the tuples.
    The caller checks exactly."""
    n_classes = len(bad)
    counts = class_counts(ec, n_classes, codes, domains)
    if counts is None:
        return _unite(bad, lambda v, w: union_scores(ec, np.stack([v, w], 1), codes, domains, ts))[ec]
    tables = [c.sum(axis=0) / len(ec) for c in counts]
    label = np.arange(n_classes)
    heads = np.arange(n_classes)          # the row of ``counts`` holding each class's counts
    while bad.any():
        checkpoint()
        new_id = _unite(bad, lambda v, w: _ratio([c[heads[v]] + c[heads[w]] for c in counts], domains, tables, ts))
        starts = np.flatnonzero(np.r_[True, np.diff(new_id) > 0])
        joined = np.flatnonzero(np.diff(new_id) == 0) + 1          # classes united with the one before
        for c in counts:
            np.add.at(c, heads[starts][new_id[joined]], c[heads[joined]])
        heads, label = heads[starts], new_id[label]
        merged = np.flatnonzero(np.diff(np.r_[starts, len(new_id)]) > 1)
        bad = np.zeros(len(starts), dtype=bool)
        bad[merged] = _ratio([c[heads[merged]] for c in counts], domains, tables, ts) > 1.0 - 1e-9
    return label[ec]


def _ratio(rows, domains, tables, ts) -> np.ndarray:
    """``max_i EMD_i / t_i`` of classes given as count rows per SA (float EMDs of :mod:`.emd`)."""
    out = np.zeros(len(rows[0]))
    for c, d, q, t in zip(rows, domains, tables, ts):
        p = c / np.maximum(c.sum(axis=1, keepdims=True), 1)
        out = np.maximum(out, np.atleast_1d(d.emd(p, q[None, :])) / t)
    return out


def _unite(bad, score) -> np.ndarray:
    """New id of every class after one round: each violating class v joins v - 1 or v + 1,
    whichever ``score(v, w)`` is smaller."""
    n_classes = len(bad)
    v = np.flatnonzero(bad)
    scores = []
    for neighbour in (v - 1, v + 1):
        ok = (neighbour >= 0) & (neighbour < n_classes)
        found = np.full(len(v), np.inf)
        found[ok] = score(v[ok], neighbour[ok])
        scores.append(found)
    to_next = np.zeros(n_classes - 1, dtype=bool)      # to_next[c]: c and c + 1 unite
    with_next = scores[1] <= scores[0]
    to_next[v[with_next]] = True
    to_next[v[~with_next] - 1] = True
    return np.concatenate(([0], np.cumsum(~to_next)))


def union_scores(ec, pairs, codes, domains, ts) -> np.ndarray:
    """``max_i EMD_i(a U b) / t_i`` for each pair (a, b) of classes (float EMDs of :mod:`.emd`)."""
    sizes = np.bincount(ec).astype(np.float64)
    out = np.zeros(len(pairs))
    for i, d in enumerate(domains):
        q = np.bincount(codes[:, i], minlength=d.m) / len(ec)
        step = max(1, CHUNK_CELLS // max(d.m, 1))
        for lo in range(0, len(pairs), step):
            checkpoint()
            p = pairs[lo:lo + step]
            wanted = np.full(len(sizes), -1, dtype=np.int64)
            rows = np.zeros((len(p), d.m))
            for side in (0, 1):
                wanted[:] = -1
                wanted[p[:, side]] = np.arange(len(p))
                row = wanted[ec]
                take = row >= 0
                rows += np.bincount(row[take] * d.m + codes[take, i], minlength=len(p) * d.m).reshape(len(p), d.m)
            rows /= rows.sum(axis=1, keepdims=True)
            out[lo:lo + step] = np.maximum(out[lo:lo + step], np.atleast_1d(d.emd(rows, q[None, :])) / ts[i])
    return out
