"""sabre_estimate: what sabre_anonymize will do, from PostgreSQL's statistics alone.

No row of the source is read.  The sensitive attribute's (SA's) frequencies are estimated
from its ``pg_catalog.pg_stats`` row and the table's ``pg_class.reltuples`` (the model is
documented in docs/estimate.md); on that estimated SA summary the core's
``plan_from_counts`` -- the same code sabre_anonymize runs on its ``GROUP BY`` summary, here
through its counting twin ``PlanCounter`` -- gives the bucketization (§4.2) and the EC-size
tree (§4.3), hence buckets, U, the classes and their size, for every t asked.

The arguments are checked by the same rules as sabre_anonymize's (``request.py``,
``common.check_t``/``check_k``); the statistics are read only for columns the caller may
``SELECT`` (pg_stats shows nothing else), and ``ANALYZE`` runs only when ``options.analyze``
asks for it.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

import numpy as np

from sabre_pg.core import limits
from sabre_pg.core.checkpoint import checkpoint
from sabre_pg.core.emd import SADomain
from sabre_pg.core.hierarchy import Hierarchy
from sabre_pg.core.parameters import check_k
from sabre_pg.core.sabre import PlanCounter, plan_counts

from ..shared import citus
from ..shared import common as C
from ..shared import errors as E
from ..shared import safe_types
from ..stages import request, scan
from . import shard_statistics

OPTION_KEYS = ("hierarchies", "lookahead", "nulls", "analyze", "suggest")
OPTIONS_EXAMPLE = '{"suggest": true}'
STATISTICS_RELKINDS = ("r", "m", "p", "f")   # relations ANALYZE keeps statistics for
SUGGEST_GRID = tuple(round(0.05 * i, 2) for i in range(1, 20))   # 0.05 .. 0.95
HINT_STEP = 0.05                   # grid of the search for the smallest t that splits the table
HINT_TOLERANCE = 1e-4              # its bisection's precision
NEGLIGIBLE_MASS = 1e-6             # pg_stats stores frequencies as float4
OTHER_VALUE = "(estimated value %d)"   # names of the unseen values of a flat categorical SA
NO_STATISTICS_HINT = ("Statistics come from ANALYZE: run ANALYZE %s (%s) or pass options.analyze "
                      "(options => '{\"analyze\": true}').")
T_HINT = request.T_HINT + " Pass one t or an array, e.g. t => ARRAY[0.15, 0.25, 0.35]."
ROWS_PER_TARGET = shard_statistics.ROWS_PER_TARGET   # ANALYZE samples 300 x the statistics target rows
MAX_STATISTICS_TARGET = 10000      # PostgreSQL's largest statistics target
RESAMPLES = 16                     # resampled frequency vectors of a sampled pg_stats row (8 until
                                   # issue #28: the table's plan fell beyond all 8 too often)
RESAMPLE_SEED = 10                 # their fixed seed: the same statistics give the same spread
STABLE_CLASSES = 0.10              # stable: every resample within this share of the point's classes
STABLE_MARGIN = 0.02               # ... and of the resamples' range widened by this share each way
PLANNED = ("ak", "knn")            # methods whose classes are SABRE's plan (bucketization, EC-size tree)
BOUND_CHUNK = 256                  # class sizes tried at once by min_class_rows


# ------------------------------------------------------------------ the model (pure)

@dataclass(frozen=True)
class ColumnStatistics:
    """A column's ``pg_stats`` row and its table's ``reltuples``.  Values are floats for a
    numerical column (its sort order), text for a categorical one."""
    reltuples: float
    null_frac: float
    n_distinct: float
    mcv_values: tuple = ()
    mcv_freqs: tuple = ()
    histogram: tuple = ()          # histogram_bounds; () when none
    target: int = 0                # the column's effective statistics target (0: unknown)

    def sample_rows(self) -> int:
        """The rows ANALYZE sampled for these statistics: 300 x the statistics target, at
        most the table (without a target: the table, as if it were read whole)."""
        whole = int(round(max(self.reltuples, 0.0)))
        return min(whole, ROWS_PER_TARGET * self.target) if self.target > 0 else whole

    def sampled(self) -> bool:
        """True when the frequencies come from a sample smaller than the table."""
        return self.sample_rows() < int(round(self.reltuples))

    def distinct(self) -> int:
        """Distinct non-NULL values: n_distinct, or -n_distinct x reltuples when negative
        (PostgreSQL stores a count above 10% of the rows as minus its fraction of the rows)."""
        d = self.n_distinct if self.n_distinct >= 0 else -self.n_distinct * self.reltuples
        return int(round(d))

    def rest(self) -> float:
        """The share of rows neither NULL nor a most common value (0 when below float4 noise)."""
        r = 1.0 - self.null_frac - float(sum(self.mcv_freqs))
        return r if r > NEGLIGIBLE_MASS else 0.0

    def others(self) -> int:
        """Distinct values beyond the most common ones (0: the MCV list is complete)."""
        return max(self.distinct() - len(self.mcv_values), 0) if self.rest() else 0


def apportion(weights, total: int) -> np.ndarray:
    """Integers proportional to ``weights`` summing to ``total`` (largest remainders; ties to
    the first)."""
    weights = np.asarray(weights, dtype=np.float64)
    if total <= 0 or weights.sum() <= 0:
        return np.zeros(len(weights), dtype=np.int64)
    raw = weights / weights.sum() * total
    base = np.floor(raw).astype(np.int64)
    short = int(total - base.sum())
    if short > 0:
        base[np.argsort(-(raw - base), kind="stable")[:short]] += 1
    return base


def fill(total: int, slots: int, room=None) -> np.ndarray:
    """``total`` items spread as equally as possible over ``slots``, none beyond its ``room``
    (water-filling: what a full slot cannot take goes equally to the others)."""
    room = np.full(slots, np.inf) if room is None else np.maximum(np.asarray(room, dtype=np.float64), 0)
    total = int(min(total, room.sum()))
    level = 0.0 if total == 0 else _level(total, room)
    base = np.minimum(np.floor(np.full(slots, level)), room).astype(np.int64)
    short = total - int(base.sum())
    open_ = np.flatnonzero(base < room)
    base[open_[:short]] += 1
    return base


def _level(total: int, room: np.ndarray) -> float:
    """The water level L with sum(min(L, room)) = total (room sorted ascending, finite total)."""
    order = np.sort(room)
    below = 0.0
    for i, r in enumerate(order):
        level = (total - below) / (len(order) - i)
        if level <= r:
            return level
        below += r
    return float(order[-1])


def histogram_mass(bounds, rest: float, others: int, mcv_values, integer: bool) -> tuple:
    """(values, shares) of the non-MCV values of a numerical column from its histogram.

    Each of the H buckets holds ``rest / H`` of the rows.  The bounds are values of the column;
    the ``others`` distinct values beyond the bounds are spread equally over the buckets (for an
    integer type, at most the integers strictly inside a bucket that are no MCV; the excess goes
    to the other buckets: :func:`fill`), evenly spaced inside it; a bucket's share is spread
    uniformly over its points, its two bounds counting half each (a bound is shared with the
    neighbouring bucket)."""
    b = np.asarray(bounds, dtype=np.float64)
    h = len(b) - 1
    room = None
    if integer:
        mcv = np.asarray(mcv_values, dtype=np.float64)
        room = np.maximum(np.ceil(b[1:]) - np.floor(b[:-1]) - 1, 0)
        room -= [np.count_nonzero((mcv > lo) & (mcv < hi)) for lo, hi in zip(b[:-1], b[1:])]
    inside = fill(max(others - len(np.unique(b)), 0), h, room)
    unit = rest / h / (inside + 1)                  # per interior point; a bound gets half
    values, shares = [b], [np.zeros(h + 1)]
    shares[0][:-1] += unit / 2
    shares[0][1:] += unit / 2
    for i in np.flatnonzero(inside):
        step = (b[i + 1] - b[i]) / (inside[i] + 1)
        values.append(b[i] + step * np.arange(1, inside[i] + 1))
        shares.append(np.full(inside[i], unit[i]))
    return np.concatenate(values), np.concatenate(shares)


def numerical_shares(stats: ColumnStatistics, integer: bool) -> tuple:
    """(distinct values ascending, their shares of the rows) of a numerical column: the most
    common values, then the histogram's (:func:`histogram_mass`) or, without one, values spread
    evenly over the MCVs' range.  Shared with sabre_instant's summary."""
    values = [np.asarray(stats.mcv_values, dtype=np.float64)]
    shares = [np.asarray(stats.mcv_freqs, dtype=np.float64)]
    others = stats.others()
    if others and len(stats.histogram) >= 2:
        v, s = histogram_mass(stats.histogram, stats.rest(), others, stats.mcv_values, integer)
        values.append(v)
        shares.append(s)
    elif others:                    # no histogram: spread evenly over the MCVs' range
        lo, hi = (min(stats.mcv_values), max(stats.mcv_values)) if len(stats.mcv_values) else (0.0, 1.0)
        values.append(np.linspace(lo, hi, others + 2)[1:-1])
        shares.append(np.full(others, stats.rest() / others))
    distinct, where = np.unique(np.concatenate(values), return_inverse=True)
    return distinct, np.bincount(where, np.concatenate(shares), minlength=len(distinct))


def numerical_counts(stats: ColumnStatistics, rows: int, integer: bool) -> tuple:
    """(counts, SADomain) of a numerical SA: counts per distinct value in value order, like
    the SA summary's; values estimated to hold no row are left out, as they would be absent."""
    _, shares = numerical_shares(stats, integer)
    counts = apportion(shares, rows)
    counts = counts[counts > 0]
    return counts, SADomain("numerical", m=max(len(counts), 1))


def categorical_counts(stats: ColumnStatistics, rows: int, hierarchy: Hierarchy | None, sa) -> tuple:
    """(counts, SADomain) of a categorical SA over the leaves of its named hierarchy (the
    non-MCV leaves share the rest equally) or, without one, of the flat hierarchy over the MCVs
    and ``others`` unseen values sharing the rest equally."""
    mcv = [str(v) for v in stats.mcv_values]
    freqs = dict(zip(mcv, stats.mcv_freqs))
    if hierarchy is None:
        unseen, i = [], 0
        while len(unseen) < stats.others():
            checkpoint()
            i += 1
            if OTHER_VALUE % i not in freqs:
                unseen.append(OTHER_VALUE % i)
        shares = dict(freqs, **{u: stats.rest() / len(unseen) for u in unseen})
        counts = apportion(list(shares.values()), rows)
        present = [v for v, n in zip(shares, counts) if n > 0]
        hierarchy = Hierarchy.flat(present, name=sa.name)
        by_value = dict(zip(shares, counts))
        return (np.array([by_value[leaf] for leaf in hierarchy.leaves], dtype=np.int64),
                SADomain("categorical", hierarchy=hierarchy))
    leaves = hierarchy.leaves
    missing = sorted(v for v in mcv if v not in set(leaves))
    if missing:
        raise scan.missing_error(sa, len(missing), missing[:5])
    rest = [leaf for leaf in leaves if leaf not in freqs]
    share = stats.rest() / len(rest) if rest else 0.0
    counts = apportion([freqs.get(leaf, share) for leaf in leaves], rows)
    return counts, SADomain("categorical", hierarchy=hierarchy)


def resampled_statistics(stats: ColumnStatistics, draws: int = RESAMPLES, seed: int = RESAMPLE_SEED) -> list:
    """Plausible pg_stats rows, had ANALYZE drawn another sample: ``draws`` copies of
    ``stats`` whose most common values' frequencies (and the rest's share) are redrawn around
    the sampled ones -- multinomial, fixed seed, of the sample's non-NULL rows corrected for
    sampling without replacement (the finite-population factor (N - 1) / (N - s)).  The
    parametric bootstrap: the redrawn frequencies scatter around the sampled ones as the
    sampled ones scatter around the table's.  [] when the sample is the table (exact)."""
    alive = 1.0 - stats.null_frac
    if not stats.sampled() or alive <= 0:
        return []
    shares = np.maximum(np.append(np.asarray(stats.mcv_freqs, dtype=np.float64), stats.rest()), 0.0)
    shares /= shares.sum()
    sample, table = stats.sample_rows() * alive, stats.reltuples * alive
    effective = max(int(round(sample * max(table - 1, 1.0) / max(table - sample, 1.0))), 1)
    drawn = np.random.default_rng(seed).multinomial(effective, shares, size=draws) / effective * alive
    return [replace(stats, mcv_freqs=tuple(row[:-1].tolist())) for row in drawn]


def within(value: int, draw: int, share: float = STABLE_CLASSES) -> bool:
    """True when ``value`` is within ``share`` of ``draw`` (|value - draw| <= share x draw):
    the issue's accuracy target, with ``draw`` a possible class count of the run."""
    return abs(value - draw) <= share * draw


def likeliest_classes(point: int, draws, share: float = STABLE_CLASSES) -> tuple:
    """(classes, draws covered): the class count within ``share`` of the most of ``point``
    and ``draws`` (the resamples' class counts), nearest ``point`` among equals (the smaller on
    a tie of distance).

    The point and the resamples are equally likely class counts of the run: the resampled
    frequencies scatter around the sampled ones as the sampled ones scatter around the
    table's.  The value covering most of them is the one most likely to be within ``share`` of
    the run's (the Bayes estimate for that target); the plug-in ``point`` is one draw of a
    skewed distribution.  A draw d covers the integers [ceil(d (1 - share)), floor(d (1 +
    share))]; the best-covered set is a union of such intervals, so its point nearest ``point``
    is ``point`` itself or one of their ends.  Without draws: ``point``."""
    values = [int(point)] + [int(d) for d in draws]
    ends = {values[0]}
    for d in values:                # each end and its neighbours: within() judges, float rounding aside
        for end in (math.ceil(d * (1 - share)), math.floor(d * (1 + share))):
            ends.update((end - 1, end, end + 1))
    candidates = [c for c in sorted(ends) if c >= 1] or [values[0]]
    cover = {c: sum(within(c, d, share) for d in values) for c in candidates}
    best = max(cover.values())
    chosen = min((c for c in candidates if cover[c] == best), key=lambda c: (abs(c - values[0]), c))
    return chosen, best


@dataclass(frozen=True)
class Spread:
    """The plan over the resampled frequencies: the range of the bucket count and of the
    classes (the point estimate included), the classes reported (:func:`likeliest_classes`) and
    whether the estimate is stable -- every resample plans the point's bucket count, and the
    classes reported are within STABLE_CLASSES of every resample's and of the point's."""
    buckets: tuple
    classes: tuple
    stable: bool
    estimate: int                  # the classes reported: the likeliest within STABLE_CLASSES

    @staticmethod
    def of(point, resampled) -> "Spread":
        buckets = [point.buckets.n_buckets] + [r.buckets.n_buckets for r in resampled]
        classes = [point.classes] + [r.classes for r in resampled]
        estimate, covered = likeliest_classes(classes[0], classes[1:])
        stable = covered == len(classes) and all(b == buckets[0] for b in buckets) and \
            (not resampled or within_margin(estimate, min(classes), max(classes)))
        return Spread((min(buckets), max(buckets)), (min(classes), max(classes)), stable, estimate)


def within_margin(classes: int, low: int, high: int, margin: float = STABLE_MARGIN) -> bool:
    """True when ``classes`` is within STABLE_CLASSES of the resamples' range [low, high]
    widened by ``margin`` each way.  The table's plan behaves like one more resample, so with
    D resamples it falls outside their range about 2 / (D + 1) of the time; a value that only
    just covers the extremes then misses (the calibration in docs/estimate.md)."""
    return within(classes, low * (1 - margin)) and within(classes, high * (1 + margin))


@dataclass(frozen=True)
class Estimate:
    """One row of sabre_estimate."""
    t: float
    buckets: int | None            # None (with u, ec_size) when k cannot be met or no plan ('refine')
    u: float | None
    ec_size: float | None          # rows per class (mean of the EC-size tree's leaves)
    classes: int | None            # None for a partitioning method (bounds only: spread.classes)
    feasible: bool
    hint: str | None
    hint_t: float | None
    seconds: float
    spread: Spread | None = None   # None when k cannot be met

    def row(self, source_of_stats: str, knee=None, sample_rows=None, method="ak") -> tuple:
        ranges = (self.spread.buckets + self.spread.classes + (self.spread.stable,)) if self.spread \
            else (None,) * 5
        return (self.t, self.buckets, self.u, self.ec_size, self.classes, self.feasible, self.hint,
                source_of_stats, self.seconds, self.hint_t, knee) + ranges + (sample_rows, method)


def smallest_t(meets, start: float, stop: float = 1.0, step: float = HINT_STEP,
               tolerance: float = HINT_TOLERANCE) -> float | None:
    """The smallest t in (start, stop] with ``meets(t)``, ``meets(start)`` being false: the
    first grid point from ``start`` in steps of ``step`` that meets it, then bisection on the
    multiples of ``tolerance`` between it and the grid point before.  The t returned was
    itself checked to meet it (None: nothing up to ``stop`` does); it is a multiple of
    ``tolerance`` unless the rounded value does not meet it."""
    low = start
    while True:
        high = min(low + step, stop)
        if meets(high):
            break
        if high >= stop:
            return None
        low = high
    lowest, highest = int(np.floor(low / tolerance)), int(np.ceil(high / tolerance))
    at = lambda i: min(round(i * tolerance, 10), stop)      # noqa: E731
    if not meets(at(highest)):
        return high
    while highest - lowest > 1:
        middle = (lowest + highest) // 2
        if meets(at(middle)):
            highest = middle
        else:
            lowest = middle
    return at(highest)


def estimate_t(counts, domain: SADomain, t: float, k: int, lookahead: int, counter=None,
               plan=None, resampled=()) -> Estimate:
    """The plan sabre_anonymize would make at ``t``: the core's plan_from_counts on the
    estimated counts, through its counting twins (the same bucketization and class count
    without the EC-size tree's templates): ``plan``, its ``PlanCount`` when already made
    (``plan_counts``), else ``counter`` (a ``PlanCounter`` sharing its counts across the t of
    one call).  ``resampled``: the PlanCounts of the resampled frequencies at t, whose range
    is the estimate's :class:`Spread`; the classes reported are the likeliest to be within
    10% of the run's over the point and them (:func:`likeliest_classes`; the point's when the
    sample is the table).  k is met when the core accepts it for the estimated
    rows (then every class of the plan has >= k rows); a plan of one class (the whole table,
    every quasi-identifier fully generalized) gets a hint: the smallest t that splits it."""
    start = time.perf_counter()
    rows = int(counts.sum())
    try:
        check_k(k, rows)
    except ValueError:              # sabre_anonymize would stop here, before bucketization
        return Estimate(t, None, None, None, 0, False,
                        "k = %d exceeds the %d rows estimated: no t meets it; choose k <= %d."
                        % (k, rows, rows), None, time.perf_counter() - start)
    counter = counter or PlanCounter(counts, domain, k, lookahead)
    plan = plan or counter.at(t)
    spread = Spread.of(plan, resampled)
    classes = spread.estimate
    hint = hint_t = None
    if classes == 1:
        hint_t = smallest_t(lambda x: counter.at(x).classes > 1, t)
        hint = ("One class: every quasi-identifier fully generalized. t >= %.4f splits the table." % hint_t
                if hint_t is not None else "One class at every t <= 1 with k = %d: lower k." % k)
    return Estimate(t, plan.buckets.n_buckets, plan.buckets.U, rows / classes, classes, True, hint, hint_t,
                    time.perf_counter() - start, spread)


def knee(ts, classes) -> int:
    """The knee of the curve log(classes) against t (t ascending, classes >= 1): the point
    farthest above the chord joining its two ends, both axes scaled to [0, 1] (Kneedle's rule
    for an increasing concave curve).  Beyond it a larger t buys proportionally fewer classes.
    Ties go to the smallest t; a curve nowhere above its chord (straight, convex or flat) has
    its knee at the first point."""
    x = np.asarray(ts, dtype=np.float64)
    y = np.log(np.asarray(classes, dtype=np.float64))
    if len(x) < 3 or x[-1] == x[0]:
        return 0
    x = (x - x[0]) / (x[-1] - x[0])
    span = y.max() - y.min()
    if span == 0:
        return 0
    y = (y - y.min()) / span
    above = y - (y[0] + (y[-1] - y[0]) * x)
    best = int(np.argmax(above))
    return best if above[best] > 0 else 0


def best_class_emd(counts: np.ndarray, domain: SADomain, sizes: np.ndarray) -> np.ndarray:
    """A lower bound on the EMD to the table (SA ``counts``) of any class of each of ``sizes``
    rows.  Numerical (ordered distance): exact -- the s rows closest to the table in W1 are the
    medians of its s equal slices of mass (one row per slice: monotone transport).  Categorical:
    the root's term of the hierarchical EMD (moving mass between the root's children costs the
    whole distance 1), whose least value over s rows is the largest-remainder rounding of the
    children's shares; exact for a flat SA."""
    q = counts / counts.sum()
    sizes = np.asarray(sizes, dtype=np.int64)
    if domain.numerical:
        cdf = np.cumsum(q)
        out = np.empty(len(sizes))
        for i, size in enumerate(sizes):
            at = np.searchsorted(cdf, (np.arange(size) + 0.5) / size - 1e-12)
            p = np.bincount(np.minimum(at, len(q) - 1), minlength=len(q)) / size
            out[i] = domain.emd(p, q)
        return out
    h = domain.hierarchy
    groups = [(h.lo[c], h.hi[c]) for c in h.children(h.root)] or [(0, len(q))]
    share = np.array([q[lo:hi].sum() for lo, hi in groups])
    out = np.empty(len(sizes))
    for i, size in enumerate(sizes):
        out[i] = 0.5 * np.abs(apportion(share, int(size)) / size - share).sum()
    return out


def min_class_rows(counts: np.ndarray, domain: SADomain, t: float, k: int) -> int | None:
    """The fewest rows a class can have and be within t of the table (by :func:`best_class_emd`)
    and k-anonymous: every class of any partitioning method has at least as many, so a run
    makes at most n // this many classes.  None when no class smaller than the table is."""
    n = int(counts.sum())
    for start in range(k, n, BOUND_CHUNK):
        checkpoint()
        sizes = np.arange(start, min(start + BOUND_CHUNK, n))
        ok = np.flatnonzero(best_class_emd(counts, domain, sizes) <= t + 1e-12)
        if len(ok):
            return int(sizes[ok[0]])
    return None


def partition_bounds(counts: np.ndarray, domain: SADomain, t: float, k: int) -> Estimate:
    """The estimate for a partitioning method ('refine', 'mondrian'): no plan to count, only
    bounds -- at least 1 class, at most n // :func:`min_class_rows` (every class needs that
    many rows to be within t and k-anonymous).  ``classes`` is NULL: how finely the QI space
    can be cut depends on the joint distribution of QIs and SA, which pg_stats does not hold."""
    start = time.perf_counter()
    n = int(counts.sum())
    if k > n:
        return Estimate(t, None, None, None, 0, False,
                        "k = %d exceeds the %d rows estimated: no t meets it; choose k <= %d." % (k, n, n),
                        None, time.perf_counter() - start)
    least = min_class_rows(counts, domain, t, k)
    most = 1 if least is None else max(n // least, 1)
    hint = ("This method cuts the quasi-identifiers' space: its class count depends on how the QIs and the SA "
            "vary together, which pg_stats does not hold, so only bounds are given: 1 to %d classes (a class "
            "within t = %g with >= %d rows needs at least %d rows). method => 'ak' predicts SABRE's plan, "
            "exactly when the statistics cover the table." % (most, t, k, least or n))
    return Estimate(t, None, None, None, None, True, hint, None, time.perf_counter() - start,
                    Spread((None, None), (1, most), False, None))


# ------------------------------------------------------------------ the entry point

@E.entry_point
def estimate(plpy, source, quasi_identifiers, sensitive, t, k, options, method="refine"):
    """sabre_estimate: one row per t (or, with options.suggest, per t of the curve)."""
    started = time.perf_counter()
    given = C.parse_options(plpy, options, OPTION_KEYS, OPTIONS_EXAMPLE)
    ts = t_values(t)
    k = C.check_k(k, request.K_HINT)
    request.check_method(method)
    analyze = request.boolean_option(given, "analyze", False,
                               "true runs ANALYZE on the source's columns first (the table's owner only).")
    suggest = request.boolean_option(given, "suggest", False,
                               "true returns the curve of classes over t and marks its knee.")
    src = C.resolve_relation(plpy, source)
    if src["relkind"] not in STATISTICS_RELKINDS:
        raise E.invalid_parameter("%s is %s: PostgreSQL keeps no statistics for it" % (
            src["qname"], "a view" if src["relkind"] == "v" else "not a table"),
            "Estimate on the table it reads, or run sabre_anonymize.")
    columns = C.columns(plpy, src["oid"])
    qis, sa = request.attributes(columns, quasi_identifiers, sensitive, given.get("hierarchies"))
    opts = request.parse_options(given, columns, qis)
    safe_types.check(columns, [a.name for a in qis + [sa]])      # pg_stats prints values with their output function
    check_privileges(plpy, src, qis + [sa])
    named = C.load_hierarchies(plpy, [(a.hierarchy_name, 'for column "%s"' % a.name)
                                      for a in qis + [sa] if a.hierarchy_name is not None])
    hierarchies = {a.name: named[a.hierarchy_name] for a in qis + [sa] if a.hierarchy_name is not None}
    needed = [sa] + (qis if opts.nulls == "drop" else [])
    if analyze:
        run_analyze(plpy, src, needed)
    stats, analyzed = read_statistics(plpy, src, needed, analyze)
    rows = estimated_rows(stats, sa, qis if opts.nulls == "drop" else [])
    if rows < 1:
        raise scan.no_rows(src["qname"], opts.nulls == "drop")
    described = describe(stats[sa.name], src, sa, rows, analyzed, analyze,
                         citus.distribution_column(plpy, src["oid"]) is not None)
    if suggest:
        ts = sorted(set(ts)) if len(ts) >= 3 else list(SUGGEST_GRID)
    if method not in PLANNED:
        counts, domain = sa_counts(stats[sa.name], rows, sa, hierarchies.get(sa.name))
        found = [partition_bounds(counts, domain, x, k) for x in ts]
        shared = time.perf_counter() - started - sum(e.seconds for e in found)
        return [replace(e, seconds=shared + e.seconds).row(described, None, stats[sa.name].sample_rows(), method)
                for e in found]
    found = estimate_all(stats[sa.name], rows, sa, hierarchies.get(sa.name), ts, k, opts.lookahead)
    shared = time.perf_counter() - started - sum(e.seconds for e in found)
    marks = [None] * len(found)
    feasible = [i for i, e in enumerate(found) if e.feasible]
    if suggest and feasible:
        chosen = feasible[knee([found[i].t for i in feasible], [found[i].classes for i in feasible])]
        marks = [i == chosen for i in range(len(found))]
    return [replace(e, seconds=shared + e.seconds, hint=with_sampling_hint(e, stats[sa.name], src, sa))
            .row(described, mark, stats[sa.name].sample_rows(), method) for e, mark in zip(found, marks)]


def estimate_all(stats: ColumnStatistics, rows: int, sa, hierarchy, ts, k: int, lookahead: int) -> list:
    """An :class:`Estimate` per t: the plans of the estimated counts and of their resamples
    (:func:`resampled_statistics`; none when the sample is the table) made together by the
    core's ``plan_counts``, and each t's spread over the resamples.  The Estimates' seconds
    are their own hints' (the shared work is the caller's)."""
    counts, domain = sa_counts(stats, rows, sa, hierarchy)
    if k > int(counts.sum()):
        return [estimate_t(counts, domain, x, k, lookahead) for x in ts]
    tables = [(counts, domain)] + [jittered(*sa_counts(r, rows, sa, hierarchy), seed=RESAMPLE_SEED + i)
                                   for i, r in enumerate(resampled_statistics(stats))]
    plans = plan_counts(tables, ts, k, lookahead)
    counter = PlanCounter(counts, domain, k, lookahead)
    return [estimate_t(counts, domain, x, k, lookahead, counter, plans[0][i], [p[i] for p in plans[1:]])
            for i, x in enumerate(ts)]


def jittered(counts: np.ndarray, domain: SADomain, seed: int) -> tuple:
    """A resample's counts as a table would hold them: the rows drawn one by one (multinomial,
    fixed ``seed``) with the resample's shares.  Counts apportioned from frequencies lie on a
    lattice of about table / sample rows, and the EC-size tree's last splits depend on the
    counts' low-order digits: without the draw the resamples agreed among themselves more
    than with the table (census 500k, t = 0.25: 17 of 77 stable estimates missed)."""
    total = int(counts.sum())
    if total <= 0:
        return counts, domain
    drawn = np.random.default_rng(seed).multinomial(total, counts / total).astype(np.int64)
    if domain.numerical and not drawn.all():     # a value drawn no row is absent, as from a summary
        drawn = drawn[drawn > 0]
        domain = SADomain("numerical", m=len(drawn))
    return drawn, domain


def with_sampling_hint(e: Estimate, stats: ColumnStatistics, src, sa) -> str | None:
    """``e``'s hint, followed, when the estimate is not stable, by the spread and how to get
    an exact prediction: a statistics target whose sample (300 x target rows) covers the
    table.  The function changes nothing itself: the statements are the caller's to run."""
    if e.spread is None or e.spread.stable:
        return e.hint
    rows, sample = int(round(stats.reltuples)), stats.sample_rows()
    kind = {"m": "MATERIALIZED VIEW", "f": "FOREIGN TABLE"}.get(src["relkind"], "TABLE")
    target = math.ceil(rows / ROWS_PER_TARGET)
    statements = "ALTER %s %s ALTER COLUMN %s SET STATISTICS %d; ANALYZE %s (%s);" % (
        kind, src["qname"], C.ident(sa.name), min(target, MAX_STATISTICS_TARGET), src["qname"], C.ident(sa.name))
    text = ("Unstable estimate: pg_stats comes from ANALYZE's sample of %d of ~%d rows, and with its frequencies "
            "redrawn %d times the plan has %s buckets and %s classes. " % (
                sample, rows, RESAMPLES, span_text(e.spread.buckets), span_text(e.spread.classes)))
    if target <= MAX_STATISTICS_TARGET:
        text += "For an exact prediction let ANALYZE read the whole table: %s" % statements
    else:
        text += ("The largest statistics target samples %d rows, fewer than the table's: %s narrows the spread; "
                 "the run's own plan (sabre.runs) is exact." % (ROWS_PER_TARGET * MAX_STATISTICS_TARGET, statements))
    return text if e.hint is None else e.hint + " " + text


def span_text(span: tuple) -> str:
    return "%d" % span[0] if span[0] == span[1] else "%d-%d" % span


def t_values(t) -> list:
    """t as a list (one t, or an array's elements), each checked by the core's rule."""
    if t is None:
        raise E.null_not_allowed("t must not be NULL", T_HINT)
    values = t if isinstance(t, list) else [t]
    if not values:
        raise E.invalid_parameter("t is an empty array", T_HINT)
    E.cap("t values", len(values), limits.ESTIMATE_T_VALUES,
          "Estimate a coarser grid (options.suggest gives the curve over 19 values of t), or split the call.")
    return [C.check_t(x, T_HINT) for x in values]


def check_privileges(plpy, src, attrs, caller: str = "sabre_estimate"):
    """The caller must be allowed to read every attribute: pg_stats shows nothing else, and
    an estimate must not reveal statistics of columns the caller cannot read."""
    denied = plpy.execute(plpy.prepare(
        "SELECT a.name FROM pg_catalog.unnest($2::pg_catalog.text[]) WITH ORDINALITY AS a(name, i) "
        "WHERE NOT pg_catalog.has_column_privilege($1, a.name, 'SELECT') ORDER BY a.i",
        ["oid", "text[]"]), [src["oid"], [a.name for a in attrs]])
    if len(denied):
        raise E.insufficient_privilege(
            "permission denied for table %s (column %s)" % (src["qname"], ", ".join(
                '"%s"' % r["name"] for r in denied)),
            "%s reads statistics only of columns you may SELECT; ask the table's owner " % caller +
            "for SELECT on them.")


def run_analyze(plpy, src, attrs):
    """``ANALYZE source (columns)``, which PostgreSQL lets only the table's owner, the
    database's owner or a superuser run (for anyone else it skips the table with a warning,
    so the check comes first: the estimate must not claim fresh statistics)."""
    check_owner(plpy, src, "options.analyze: only the owner of %s can ANALYZE it" % src["qname"],
                "Ask its owner to run ANALYZE, or call without options.analyze to use the statistics it has.")
    if citus.distribution_column(plpy, src["oid"]) is not None:
        shard_statistics.analyze(plpy, src, attrs)     # a Citus distributed table: its shards, on the workers
        return
    plpy.execute("ANALYZE %s (%s)" % (src["qname"], ", ".join(C.ident(a.name) for a in attrs)))


def check_owner(plpy, src, message: str, hint: str):
    """42501 unless the caller may ANALYZE ``src`` (its owner, the database's owner or a superuser)."""
    allowed = plpy.execute(plpy.prepare(
        "SELECT pg_catalog.pg_has_role(c.relowner, 'USAGE') OR (NOT c.relisshared AND pg_catalog.pg_has_role("
        "(SELECT d.datdba FROM pg_catalog.pg_database AS d WHERE d.datname = pg_catalog.current_database()), "
        "'USAGE')) AS ok FROM pg_catalog.pg_class AS c WHERE c.oid = $1", ["oid"]), [src["oid"]])[0]["ok"]
    if not allowed:
        raise E.insufficient_privilege(message, hint)


STATISTICS_SQL = (
    "SELECT DISTINCT ON (s.attname) s.attname::pg_catalog.text AS name, s.null_frac::pg_catalog.float8 AS null_frac, "
    "s.n_distinct::pg_catalog.float8 AS n_distinct, s.most_common_vals::pg_catalog.text AS mcv, "
    "s.most_common_freqs::pg_catalog.float8[] AS freqs, s.histogram_bounds::pg_catalog.text AS histogram, "
    "(SELECT CASE WHEN a.attstattarget IS NULL OR a.attstattarget < 0 "
    "THEN pg_catalog.current_setting('default_statistics_target')::pg_catalog.int4 ELSE a.attstattarget END "
    "FROM pg_catalog.pg_attribute AS a WHERE a.attrelid = $4 AND a.attname = s.attname) AS target "
    "FROM pg_catalog.pg_stats AS s WHERE s.schemaname = $1 AND s.tablename = $2 "
    "AND s.attname = ANY ($3::pg_catalog.name[]) ORDER BY s.attname, s.inherited DESC")
RELATION_SQL = (
    "SELECT c.reltuples::pg_catalog.float8 AS reltuples, "
    "GREATEST(pg_catalog.pg_stat_get_last_analyze_time(c.oid), "
    "pg_catalog.pg_stat_get_last_autoanalyze_time(c.oid))::pg_catalog.text AS analyzed "
    "FROM pg_catalog.pg_class AS c WHERE c.oid = $1")


def read_statistics(plpy, src, attrs, analyzed_now: bool) -> tuple:
    """({attribute: ColumnStatistics}, when the table was last analyzed) from pg_stats (the
    statistics of the whole inheritance tree when there are) and pg_class.reltuples; of a Citus
    distributed table, its shards' combined (:mod:`.shard_statistics`)."""
    if citus.distribution_column(plpy, src["oid"]) is not None:   # a Citus distributed table: its shards'
        rel, found = shard_statistics.read(plpy, src, attrs, decode_values)
    else:
        rel = plpy.execute(plpy.prepare(RELATION_SQL, ["oid"]), [src["oid"]])[0]
        by_name = {a.name: a for a in attrs}
        found = {r["name"]: dict(r, mcv=decode_values(plpy, by_name[r["name"]], r["mcv"]),
                                 histogram=decode_values(plpy, by_name[r["name"]], r["histogram"]))
                 for r in plpy.execute(plpy.prepare(STATISTICS_SQL, ["name", "name", "text[]", "oid"]), [
                     src["nspname"], src["relname"], [a.name for a in attrs], src["oid"]])}
    missing = [a.name for a in attrs if a.name not in found]
    if rel["reltuples"] == 0 and (missing or analyzed_now):
        raise scan.no_rows(src["qname"], False)
    if missing or rel["reltuples"] < 0:
        raise E.not_in_prerequisite_state(
            "%s has no statistics for %s" % (src["qname"], ", ".join('"%s"' % m for m in missing) or "its rows"),
            NO_STATISTICS_HINT % (src["qname"], ", ".join(C.ident(a.name) for a in attrs)))
    stats = {}
    for a in attrs:
        r = found[a.name]
        mcv, freqs = by_value(r["mcv"], r["freqs"] or ())
        stats[a.name] = ColumnStatistics(rel["reltuples"], r["null_frac"], r["n_distinct"], tuple(mcv),
                                         freqs, tuple(r["histogram"]), int(r["target"] or 0))
        seen = np.asarray(mcv + list(stats[a.name].histogram), float) if a.numerical else np.zeros(0)
        if not np.all(np.isfinite(seen)):
            names = sorted({repr(float(v)).replace("nan", "NaN").replace("inf", "Infinity")
                            for v in seen[~np.isfinite(seen)]})
            raise scan.nonfinite_error([(a.name, int(rel["reltuples"]))], {a.name: names})
    return stats, rel["analyzed"]


def by_value(values, freqs) -> tuple:
    """([most common values], (their frequencies)) in value order, not pg_stats' order by
    sampled frequency: ANALYZE's random sample orders near-equal frequencies at random, and the
    resamples' fixed seed must see the same statistics in the same order to give the same
    spread (and float sums the same rounding)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    return [values[i] for i in order], tuple(freqs[i] for i in order)


def decode_values(plpy, attr, text) -> list:
    """A pg_stats value array (anyarray, read as text) as the attribute's values: floats in
    its order for a numerical attribute (the read's conversion), text for a categorical one."""
    if text is None:
        return []
    return decode_list(plpy, attr, text, "pg_catalog.text")


def decode_list(plpy, attr, values, given_as: str = "pg_catalog.text[]") -> list:
    """Values of ``attr`` given as text (an array literal, or a list of texts with
    ``given_as`` text[]) converted as :func:`decode_values` does."""
    column = C.ident(attr.name)
    # (clamped: a numeric beyond float8 in pg_stats is estimated at +-1e300, not a 22003)
    value = C.numeric_expr(plpy, attr.name, attr.col, "u.", clamp=True) if attr.numerical else \
        "(u.%s)::pg_catalog.text" % column
    cast = "$1::pg_catalog.text::%s[]" % attr.col["type"] if given_as == "pg_catalog.text" else \
        "$1::pg_catalog.text[]::%s[]" % attr.col["type"]
    return plpy.execute(plpy.prepare(
        "SELECT pg_catalog.array_agg(%s ORDER BY u.i) AS vs FROM pg_catalog.unnest(%s) "
        "WITH ORDINALITY AS u(%s, i)" % (value, cast, column), [given_as.split(".")[-1]]), [values])[0]["vs"] or []


def estimated_rows(stats: dict, sa, dropped_with_nulls) -> int:
    """The rows sabre_anonymize would anonymize: reltuples x the SA's non-NULL share, times
    each quasi-identifier's non-NULL share when options.nulls = 'drop' (taken as independent)."""
    share = 1.0 - stats[sa.name].null_frac
    for a in dropped_with_nulls:
        share *= 1.0 - stats[a.name].null_frac
    return int(round(stats[sa.name].reltuples * share))


def sa_counts(stats: ColumnStatistics, rows: int, sa, hierarchy) -> tuple:
    if sa.numerical:
        return numerical_counts(stats, rows, sa.typname in C.INTEGER_TYPES)
    return categorical_counts(stats, rows, hierarchy, sa)


def describe(stats: ColumnStatistics, src, sa, rows: int, analyzed, analyzed_now: bool, shards: bool = False) -> str:
    """source_of_stats: where the estimate comes from, and which part of it is exact
    (``shards``: combined from a Citus distributed table's shards)."""
    covered = 100.0 * float(sum(stats.mcv_freqs))
    if stats.others():
        shape = "histogram of %d buckets, %d other values" % (max(len(stats.histogram) - 1, 0), stats.others())
    else:
        shape = "MCV list complete"
    sample = "sample of %d rows (statistics target %d): %s" % (
        stats.sample_rows(), stats.target, "frequencies sampled, spread over %d resamples" % RESAMPLES
        if stats.sampled() else "the whole table")
    return "%s%spg_stats of %s.%s (analyzed %s): %d most common values (%.1f%% of rows), %s; n_distinct %g, " \
           "null_frac %g, reltuples %.0f; %s; %d rows estimated" % (
               "ANALYZE run by this call; " if analyzed_now else "",
               "the Citus shards' combined " if shards else "", src["qname"], C.ident(sa.name),
               analyzed or "at an unknown time", len(stats.mcv_values), covered, shape, stats.n_distinct,
               stats.null_frac, stats.reltuples, sample, rows)
