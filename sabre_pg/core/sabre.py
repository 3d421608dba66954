"""The SABRE pipeline (Algorithm 1): bucketize -> redistribute -> Hilbert keys -> takeOut
-> generalize, with per-phase timings and the paper's metrics.

Input is columnar numpy data: each QI as values (numerical) or pre-order leaf positions
(categorical), and the SA as codes of an ``SADomain``.  The database layer
(``plpython/``) and the client share this entry point.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import metrics
from .buckets import Bucketization, bucketize
from .checkpoint import checkpoint
from .emd import SADomain, class_emds
from .generalize import ECIndex, generalize_categorical, generalize_numerical, stable_argsort
from .hierarchy import Hierarchy
from .hilbert import hilbert_keys
from .multi_refine import partition
from .parameters import check_k, check_lookahead, check_t
from .redistribute import BucketEMD, ECPlan, bucketization_key, ec_count, ec_counts, ec_size, max_classes
from .stopwatch import Stopwatch
from .takeout import takeout_ak, takeout_knn, takeout_sweep

METHODS = ("ak", "knn", "mondrian", "refine")
PARTITIONING = ("mondrian", "refine")   # methods that cut the QI space instead of using templates
TAKEOUTS = ("sweep", "random")
# A look-ahead bucketization replaces the current one only with this factor more classes:
# on the census-like data at t = 0.35, 4 buckets gave 16,384 classes against 3 buckets'
# 15,800 but raised AIL from 0.285 to 0.341; at t = 0.25, 16,384 against 3,973 lowered it.
LOOKAHEAD_GAIN = 1.25


@dataclass
class QuasiIdentifier:
    """A QI column: float values (numerical) or leaf positions in ``hierarchy`` (categorical)."""
    name: str
    values: np.ndarray
    hierarchy: Hierarchy | None = None

    @property
    def numerical(self) -> bool:
        return self.hierarchy is None

    def axis_range(self):
        if self.numerical:
            return float(np.min(self.values)), float(np.max(self.values))
        return 0.0, float(max(self.hierarchy.n_leaves - 1, 0))


@dataclass
class SabreResult:
    ec: np.ndarray                       # EC id per tuple, 0..C-1
    sizes: np.ndarray                    # per EC
    emds: np.ndarray                     # real EMD per EC
    buckets: Bucketization
    plan: ECPlan
    generalization: list                 # per QI: NumericalRange | CategoricalNode
    il: np.ndarray                       # IL(G) per EC
    keys: np.ndarray | None              # Hilbert keys (AK)
    bucket_of_tuple: np.ndarray
    k: int = 1                           # the run's k (for the normalized AECS)
    phases: dict = field(default_factory=dict)   # seconds per phase (Stopwatch.report)
    index: ECIndex | None = None         # tuples grouped by EC (order, starts)
    bucket_key_order: np.ndarray | None = None   # tuples sorted by (bucket, key), if known
    il_paper: np.ndarray | None = None   # IL(G) per EC with the paper's categorical L/N

    def by_bucket_and_key(self) -> np.ndarray:
        """Tuples sorted by (SA bucket, Hilbert key): the order of the side table's index."""
        if self.bucket_key_order is None:
            self.bucket_key_order = by_bucket(np.argsort(self.keys, kind="stable"), self.bucket_of_tuple)
        return self.bucket_key_order

    @property
    def n_classes(self) -> int:
        return len(self.sizes)

    def metrics(self) -> dict:
        """The paper's measures of this result (§3.2, §6) with its size and bucketization."""
        n = int(self.sizes.sum())
        return {
            "rows": n,
            "classes": self.n_classes,
            "buckets": self.buckets.n_buckets,
            "U": self.buckets.U,
            "min_class_size": int(self.sizes.min()),
            "max_class_size": int(self.sizes.max()),
            "max_emd": metrics.real_closeness(self.emds),
            "ail": metrics.ail(self.il, self.sizes),
            "ail_paper": metrics.ail(self.il_paper, self.sizes) if self.il_paper is not None else None,
            "discernibility": metrics.discernibility(self.sizes),
            "aecs": metrics.average_class_size(n, self.n_classes),
            "aecs_normalized": metrics.average_class_size(n, self.n_classes, self.k),
        }


def encode_numerical(values) -> tuple[np.ndarray, np.ndarray]:
    """Codes 0..m-1 of a numerical SA over its sorted distinct values."""
    distinct, codes = np.unique(np.asarray(values), return_inverse=True)
    return np.asarray(codes, dtype=np.int64).reshape(-1), distinct


def normalized_points(qis) -> np.ndarray:
    """QI space scaled to [0, 1] per axis (for SABRE-KNN distances)."""
    cols = []
    for qi in qis:
        lo, hi = qi.axis_range()
        v = np.asarray(qi.values, dtype=np.float64)
        cols.append((v - lo) / (hi - lo) if hi > lo else np.zeros(len(v)))
    return np.column_stack(cols)


def validate(n: int, t: float, k: int, method: str, takeout: str, qis) -> list:
    """The arguments of :func:`anonymize` for a table of n tuples (t and k by
    :mod:`.parameters`, each QI by :func:`checked_qi`); raises ValueError naming the first bad
    one.  Returns the QIs with their values as checked numpy arrays."""
    check_t(t)
    check_k(k, n)
    if method not in METHODS:
        raise ValueError("method must be one of %s, got %r" % (", ".join(METHODS), method))
    if takeout not in TAKEOUTS:
        raise ValueError("takeout must be one of %s, got %r" % (", ".join(TAKEOUTS), takeout))
    if not qis:
        raise ValueError("at least one quasi-identifier is required")
    return [checked_qi(qi, n) for qi in qis]


def checked_qi(qi: QuasiIdentifier, n: int) -> QuasiIdentifier:
    """``qi`` with n values, all finite numbers (numerical) or all leaf positions of its
    hierarchy, integers in [0, leaves) (categorical); else ValueError naming the QI and row."""
    values = np.asarray(qi.values)
    if values.ndim != 1 or len(values) != n:
        raise ValueError("QI %s has %d values for %d tuples" % (qi.name, values.size, n))
    missing = [i for i, v in enumerate(values.tolist()) if v is None] if values.dtype == object else []
    if missing:
        raise ValueError("QI %s has a missing value (None) at row %d" % (qi.name, missing[0]))
    try:
        as_float = values.astype(np.float64)
    except (TypeError, ValueError):
        raise ValueError("QI %s has values that are not numbers (%s)" % (qi.name, values.dtype)) from None
    bad = np.flatnonzero(~np.isfinite(as_float))
    if len(bad):
        raise ValueError("QI %s has a non-finite value (%r) at row %d" % (qi.name, _item(values, bad[0]), bad[0]))
    if qi.numerical:      # numbers keep their dtype (integer ranges stay integers)
        return QuasiIdentifier(qi.name, values if values.dtype.kind in "iuf" else as_float)
    leaves = qi.hierarchy.n_leaves
    bad = np.flatnonzero((as_float != np.floor(as_float)) | (as_float < 0) | (as_float >= leaves))
    if len(bad):
        raise ValueError("QI %s: %r at row %d is not a leaf position of its hierarchy (integers 0..%d)"
                         % (qi.name, _item(values, bad[0]), bad[0], leaves - 1))
    return QuasiIdentifier(qi.name, as_float.astype(np.int64), qi.hierarchy)


def _item(values: np.ndarray, i: int):
    """values[i] as a Python object (for messages)."""
    v = values[i]
    return v.item() if isinstance(v, np.generic) else v


def checked_codes(sa_codes, domain: SADomain) -> np.ndarray:
    """The SA codes as int64, each in [0, m) of ``domain``; else ValueError."""
    try:
        codes = np.asarray(sa_codes, dtype=np.int64)
    except (TypeError, ValueError):
        raise ValueError("the SA codes must be integers 0..%d" % (domain.m - 1)) from None
    if codes.ndim != 1:
        raise ValueError("the SA codes must be one-dimensional")
    bad = np.flatnonzero((codes < 0) | (codes >= domain.m))
    if len(bad):
        raise ValueError("SA code %d at row %d is outside 0..%d" % (codes[bad[0]], bad[0], domain.m - 1))
    return codes


@dataclass
class SAPlan:
    """Bucketization (§4.2) and the EC-size tree (§4.3) of a table, computed from the
    frequencies of its SA values alone -- no tuple is needed until takeOut."""
    counts: np.ndarray                   # tuples per SA code
    buckets: Bucketization
    plan: ECPlan
    phases: dict = field(default_factory=dict)   # seconds: bucketize, redistribute
    t: float | None = None               # the parameters it was made for: a plan holds for
    k: int | None = None                 # these alone (anonymize refuses it for others)
    lookahead: int | None = None

    def check_made_for(self, t: float, k: int) -> None:
        """Raise ValueError unless this plan was made for t and k."""
        if self.t != t or self.k != k:
            raise ValueError("the SA plan was made for t = %r, k = %r, not t = %r, k = %r"
                             % (self.t, self.k, t, k))


def plan_from_counts(counts, domain: SADomain, t: float, k: int = 1,
                     lookahead: int = 4) -> SAPlan:
    """Bucketize the SA frequencies ``counts`` (tuples per code) and redistribute (ECSize).

    ``lookahead``: the paper stops bucketization at the first U < t, which can leave little
    room (t - U) for redistribution, so a larger t can give fewer, larger classes.  Bucketization
    continues for up to ``lookahead`` more greedy splits (each still has U < t, so Theorem 4's
    guarantee is unchanged); a later candidate is used when its EC-size tree has at least
    ``LOOKAHEAD_GAIN`` times as many classes as the current choice.
    ``lookahead=0`` is the paper's rule.
    """
    lookahead = check_lookahead(lookahead)
    counts = np.asarray(counts, dtype=np.int64)
    if len(counts) != domain.m:
        raise ValueError("the SA frequencies have %d counts for %d SA values"
                         % (len(counts), domain.m))
    n = int(counts.sum())
    t = check_t(t)
    k = check_k(k, n)
    stopwatch = Stopwatch()
    with stopwatch.phase("bucketize"):
        distribution = counts / n
        candidates = bucketize(distribution, t, domain, lookahead=lookahead) if lookahead \
            else [bucketize(distribution, t, domain)]
    # Redistribution for the paper's bucketization and each look-ahead candidate.  A further
    # split costs utility (every class must draw from one more bucket), so a candidate replaces
    # the current choice only if its EC-size tree has LOOKAHEAD_GAIN times as many classes.
    # The candidates are compared by class count alone (no templates); only the chosen one's
    # EC-size tree is expanded.
    with stopwatch.phase("redistribute"):
        best = best_classes = None
        for candidate in candidates:
            checkpoint()
            bucket_counts = candidate.counts(counts)
            if len(candidates) == 1:
                best = candidate
                break
            classes = ec_count(bucket_counts, BucketEMD(candidate, bucket_counts), candidate.U, t, k)
            if best is None or classes >= LOOKAHEAD_GAIN * best_classes:
                best, best_classes = candidate, classes
        bucket_counts = best.counts(counts)
        plan = ec_size(bucket_counts, BucketEMD(best, bucket_counts), best.U, t, k)
    return SAPlan(counts, best, plan, dict(stopwatch.phases), t, k, lookahead)


@dataclass
class PlanCount:
    """What :func:`plan_from_counts` chooses at t, without its EC-size tree: the chosen
    bucketization (its ``.buckets``) and the number of classes (its ``.plan.n_classes``)."""
    t: float
    buckets: Bucketization
    classes: int


class PlanCounter:
    """:func:`plan_from_counts`'s choice and class count at any number of t, for one table
    (SA ``counts``), k and ``lookahead``: what sabre_estimate asks, at a fraction of the cost.

    * No templates: the classes come from ``ec_count``, as plan_from_counts compares its
      candidates, and the chosen one is not expanded.
    * A candidate is counted only if it could replace the current choice.  Its class count is
      at most ``max_classes(n, k)`` and, for a bucketization already counted at other t, at
      least its count at a smaller t and at most its count at a larger t (a larger t refuses
      no split a smaller t allows: the EC-size tree only grows), so the comparison with
      ``LOOKAHEAD_GAIN`` times the current choice is often settled without counting.
    * Counts are kept per bucketization across calls, so several t (and the bisection of a
      hint) share them.
    The choices and counts are those of plan_from_counts (tests/core/test_plan_counter.py)."""

    def __init__(self, counts, domain: SADomain, k: int = 1, lookahead: int = 4):
        self.lookahead = check_lookahead(lookahead)
        self.counts = np.asarray(counts, dtype=np.int64)
        if len(self.counts) != domain.m:
            raise ValueError("the SA frequencies have %d counts for %d SA values"
                             % (len(self.counts), domain.m))
        self.n = int(self.counts.sum())
        self.k = check_k(k, self.n)
        self.domain = domain
        self.cap = max_classes(self.n, self.k)
        self.known: dict = {}                     # bucketization -> {t: classes}

    def bounds(self, candidate: Bucketization, t: float) -> tuple:
        """(lowest, highest) class count ``candidate`` can have at t, from what is known."""
        seen = self.known.get(_bucketization_key(candidate), {})
        return (max([c for s, c in seen.items() if s <= t], default=1),
                min([c for s, c in seen.items() if s >= t], default=self.cap))

    def classes(self, candidate: Bucketization, t: float) -> int:
        """The class count of ``candidate``'s EC-size tree at t (ec_count unless known)."""
        low, high = self.bounds(candidate, t)
        if low == high:
            return low
        bucket_counts = candidate.counts(self.counts)
        found = ec_count(bucket_counts, BucketEMD(candidate, bucket_counts), candidate.U, t, self.k)
        self.known.setdefault(_bucketization_key(candidate), {})[t] = found
        return found

    def at(self, t: float) -> PlanCount:
        """plan_from_counts(counts, domain, t, k, lookahead)'s bucketization and class count."""
        t = check_t(t)
        distribution = self.counts / self.n
        candidates = bucketize(distribution, t, self.domain, lookahead=self.lookahead) \
            if self.lookahead else [bucketize(distribution, t, self.domain)]
        best = best_classes = None
        for candidate in candidates:
            checkpoint()
            if best is not None and self.bounds(candidate, t)[1] < LOOKAHEAD_GAIN * best_classes:
                continue                          # cannot replace the current choice
            classes = self.classes(candidate, t)
            if best is None or classes >= LOOKAHEAD_GAIN * best_classes:
                best, best_classes = candidate, classes
        return PlanCount(t, best, best_classes)


def _bucketization_key(bz: Bucketization) -> tuple:
    return tuple((b.lo, b.hi) for b in bz.buckets), bz.U


def plan_classes(counts, domain: SADomain, ts, k: int = 1, lookahead: int = 4) -> list:
    """:class:`PlanCount` of every t in ``ts``: plan_from_counts's choice and class count."""
    counter = PlanCounter(counts, domain, k, lookahead)
    return [counter.at(t) for t in ts]


def plan_counts(tables, ts, k: int = 1, lookahead: int = 4) -> list:
    """:class:`PlanCount` at every t of ``ts`` for each of many tables (``tables``: (SA
    counts, SADomain) pairs): what ``PlanCounter(counts, domain, k, lookahead).at(t)`` gives.
    The look-ahead candidates are counted in rounds, one ``ec_counts`` call per round for all
    tables and t (their trees grow together); as in PlanCounter, a candidate is counted only
    if it could replace the current choice (``max_classes`` >= LOOKAHEAD_GAIN x its classes).
    sabre_estimate evaluates its resampled frequencies with it.  Returns one list per table."""
    lookahead = check_lookahead(lookahead)
    ts = [check_t(t) for t in ts]
    jobs = []                                     # [t, candidates, counts, cap, best, best classes]
    for counts, domain in tables:
        counts = np.asarray(counts, dtype=np.int64)
        n = int(counts.sum())
        cap = max_classes(n, check_k(k, n))
        for t, candidates in zip(ts, bucketizations(counts / n, ts, domain, lookahead)):
            checkpoint()
            jobs.append([t, candidates, counts, cap, None, None])
    ground: dict = {}                             # one bucket EMD per bucketization and domain
    for i in range(lookahead + 1):
        due = [job for job in jobs if i < len(job[1]) and (job[4] is None or job[3] >= LOOKAHEAD_GAIN * job[5])]
        roots = []
        for t, candidates, counts, _, _, _ in due:
            checkpoint()
            bz, bucket_counts = candidates[i], candidates[i].counts(counts)
            key = bucketization_key(bz)
            if key not in ground:
                ground[key] = BucketEMD(bz, bucket_counts)
            roots.append((ground[key], bucket_counts, bz.U, t))
        for job, found in zip(due, ec_counts(roots, k) if roots else []):
            if job[4] is None or found >= LOOKAHEAD_GAIN * job[5]:
                job[4], job[5] = job[1][i], found
    chosen = [PlanCount(job[0], job[4], job[5]) for job in jobs]
    return [chosen[i:i + len(ts)] for i in range(0, len(chosen), len(ts))]


def bucketizations(q, ts, domain: SADomain, lookahead: int) -> list:
    """The candidates ``bucketize(q, t, domain, lookahead)`` gives (as a list) for every t of
    ``ts``, from one greedy run.  The greedy splits do not depend on t -- t only says where
    the candidates start (the first state with U < t) -- so the states with U below the
    largest t hold every t's candidates; the run is extended (doubled) until they reach the
    smallest t's last candidate or the domain is split into single values.  A state's U is
    summed afresh (``math.fsum``) in both, so the candidates are the same objects' equals."""
    extra = 8
    while True:
        checkpoint()
        run = bucketize(q, max(ts), domain, lookahead=lookahead + extra)
        starts = [next((i for i, bz in enumerate(run) if bz.U < t), len(run)) for t in ts]
        if len(run) < lookahead + extra + 1 or max(starts) + lookahead < len(run):
            return [run[i:i + lookahead + 1] for i in starts]
        extra *= 2


def _takeout(method, takeout, bucket, qis, keys, plan, seed):
    """(class of every tuple, (bucket, key) order or None) of SABRE-KNN or SABRE-AK's takeOut."""
    if method == "knn":
        return takeout_knn(bucket, normalized_points(qis), keys, plan.templates, seed=seed), None
    if takeout == "sweep":
        return takeout_sweep(bucket, keys, plan.templates, return_order=True)
    return takeout_ak(bucket, keys, plan.templates, seed=seed), None


def anonymize(qis, sa_codes, domain: SADomain, t: float, k: int = 1, method: str = "ak",
              seed: int = 0, takeout: str = "sweep", weights=None,
              with_emds: bool = True, lookahead: int = 4,
              sa_plan: SAPlan | None = None, search: str = "fast", threads: int = 1,
              other_sas=(), reference=None, parallel_guard: bool = True) -> SabreResult:
    """Run SABRE-AK (``method='ak'``), SABRE-KNN (``'knn'``), the paper's baseline
    t-Mondrian (``'mondrian'``, :mod:`.mondrian`: exact EMD check per cut) or t-Mondrian
    with a searched cut (``'refine'``, :mod:`.refine`: the t-close cut that lowers IL most).

    The SA plan (bucketization, EC-size tree) and the Hilbert keys are made for every method:
    the database's side table records each tuple's bucket and key; t-Mondrian's classes do
    not depend on them.

    ``takeout='random'`` uses the paper's random seeds for AK; ``'sweep'`` (default for AK)
    takes seeds in Hilbert order.  KNN always uses random seeds.  ``search``: the refinement's
    cut search setting ('fast' or 'thorough', :func:`.cut_search.cut_search`); ``threads``: its
    threads (:func:`.refine.search_threads`).  'refine' keeps t-Mondrian's classes where they
    have the lower AIL on a small table (:func:`.multi_refine.guarded_search`).

    ``other_sas``: (codes, domain, t) of further SAs every class of 'refine' and 'mondrian'
    must also be t-close on (several SAs, :mod:`.multi_refine`; ``emds`` stay this SA's);
    with ``reference``, (codes, domain, t, reference counts) each.

    ``reference``: 'refine' and 'mondrian': SA counts of a larger table holding these rows (a
    Citus shard's whole table); every class is cut t-close to, and ``emds`` measure against,
    its distribution (on every SA, with ``other_sas``' references).  ``parallel_guard`` False:
    'refine' runs no t-Mondrian beside the search on a table over
    :data:`.multi_refine.GUARD_ROWS` rows (a part of a larger table: memory bounded by the parts).

    ``sa_plan``: the :func:`plan_from_counts` of the SA frequencies, when it was made before
    the tuples were read (the database computes them with a GROUP BY); the codes must have
    exactly its counts, and it must have been made for this t and k.  Without it the plan is
    made here (``lookahead`` as there).

    ``phases`` of the result: seconds per phase of this call and ``total``, its wall time.
    A plan made here adds its bucketize and redistribute; a given plan's stay in its own
    ``phases`` (they were spent before the call), so a caller adds both without counting twice.
    """
    sa_codes = checked_codes(sa_codes, domain)
    n = len(sa_codes)
    qis = validate(n, t, k, method, takeout, qis)
    stopwatch = Stopwatch()
    counts = np.bincount(sa_codes, minlength=domain.m)
    if sa_plan is None:
        sa_plan = plan_from_counts(counts, domain, t, k, lookahead)
        stopwatch.merge(sa_plan.phases)
    else:
        sa_plan.check_made_for(check_t(t), check_k(k, n))
    if not np.array_equal(sa_plan.counts, counts):
        raise ValueError("the SA codes do not have the frequencies the plan was made from "
                         "(%d tuples against %d)" % (n, int(sa_plan.counts.sum())))
    bucketization, plan = sa_plan.buckets, sa_plan.plan
    with stopwatch.phase("redistribute"):
        bucket = bucketization.bucket_of_code()[sa_codes]
    with stopwatch.phase("hilbert"):
        keys = hilbert_keys([qi.values for qi in qis], [qi.axis_range() for qi in qis])
    bucket_key_order = None
    if method in PARTITIONING:      # one SA or several (other_sas): multi_refine.py
        with stopwatch.phase("refine" if method == "refine" else "partition"):
            key_order = np.argsort(keys, kind="stable") if method == "refine" else None
            ec = _partitioned(qis, sa_codes, domain, t, k, method, keys, key_order, other_sas, reference,
                              search=search, threads=threads, weights=weights, parallel_guard=parallel_guard)
            if key_order is not None:
                bucket_key_order = by_bucket(key_order, bucket)
    else:
        if reference is not None:
            raise ValueError("a reference distribution takes method 'refine' or 'mondrian'")
        with stopwatch.phase("takeout"):
            ec, bucket_key_order = _takeout(method, takeout, bucket, qis, keys, plan, seed)
    n_classes = int(ec.max()) + 1
    with stopwatch.phase("generalize"):
        index = ECIndex(ec, n_classes)
        generalization, il, il_paper = generalize_classes(qis, index, weights, paper=True)
    with stopwatch.phase("metrics"):
        table = counts / n if reference is None else np.asarray(reference, dtype=np.float64) / np.sum(reference)
        emds = class_emds(ec, sa_codes, domain, n_classes, table, order=index.order) \
            if with_emds else np.zeros(n_classes)
    return SabreResult(ec, index.sizes, emds, bucketization, plan, generalization, il, keys, bucket,
                       k=int(k), phases=stopwatch.report(), index=index,
                       bucket_key_order=bucket_key_order, il_paper=il_paper)


def _partitioned(qis, sa_codes, domain, t, k, method, keys, key_order, other_sas, reference, **search):
    """The classes of 'refine' or 'mondrian' (:func:`.multi_refine.partition`) over this SA and
    ``other_sas``; with ``reference``, one reference per SA (``other_sas``' fourth items)."""
    if reference is not None and other_sas:
        reference = [reference] + [o[3] if len(o) > 3 else None for o in other_sas]
    return partition(qis, np.column_stack([sa_codes] + [o[0] for o in other_sas]),
                     [domain] + [o[1] for o in other_sas], [t] + [o[2] for o in other_sas], k,
                     method, keys=keys, key_order=key_order, reference=reference, **search)


def by_bucket(key_order: np.ndarray, bucket: np.ndarray) -> np.ndarray:
    """The tuples of ``key_order`` (sorted by Hilbert key) sorted stably by bucket: by
    (bucket, key), as ``np.lexsort((keys, bucket))`` but in linear time once the keys are
    sorted (1M tuples: 0.09 s against 0.33 s)."""
    return key_order[stable_argsort(bucket[key_order])]


def generalize_classes(qis, index: ECIndex, weights=None, paper: bool = False):
    """Each QI's generalization per EC (ranges, LCAs) and IL(G) per EC; with ``paper``, also
    IL(G) with the paper's categorical L/N (a third element)."""
    generalization, ils, papers = [], [], []
    for qi in qis:
        if qi.numerical:
            ranges = generalize_numerical(index, qi.values)
            lo, hi = qi.axis_range()
            ils.append(metrics.il_numerical(ranges, lo, hi))
            papers.append(ils[-1])
            generalization.append(ranges)
        else:
            nodes = generalize_categorical(index, qi.values, qi.hierarchy)
            ils.append(metrics.il_categorical(nodes))
            papers.append(metrics.il_categorical(nodes, paper=True))
            generalization.append(nodes)
    il = metrics.il_per_class(ils, weights)
    if paper:
        return generalization, il, metrics.il_per_class(papers, weights)
    return generalization, il
