"""SABRE_W (§5): (ω, t)-closeness on a stream under the expiring constraint.

The stream numbers its tuples 1, 2, … in arrival order.  Windows have ω tuples and advance
by I, ω = j·I (Definition 7); the a-th advance is that of window W_a = rows
(a-1)·I + 1 … (a-1)·I + ω, triggered when the I tuples after it have arrived, and its first I
tuples expire.  Each advance is one of the paper's three cases:

* **Case 1** (SKIP): no expiring tuple is unpublished; nothing happens.
* **Case 2** (DIRECT): D = EMD(SA(W, ō), SA(W)) < t.  SABRE partitions the unpublished
  tuples R(W, ō) with budget t − D; the classes holding expiring tuples are published, the
  others are kept as S_G.  By the triangle inequality every class is within t of W.
* **Case 3** (INDIRECT): D ≥ t.  Every class of S_G (the last DIRECT's) is published;
  Theorem 5: S_G holds every expiring unpublished tuple.

Distances are taken in the window's own metric: a numerical SA's codes rank the distinct
values *present in the window* (ground distance |i − j| / (m_W − 1)), a categorical SA's codes
are leaf positions of its hierarchy (flat: equal distance) -- the normalization a batch run over
the window's rows uses.  SABRE runs on the unpublished tuples over that same domain (values
absent from them have frequency 0), so the budget t − D and the class EMDs share one metric.
D and every class's EMD against its window are exact (:mod:`.exact_emd`); a class beyond t
(which the triangle inequality excludes) raises.

:func:`advance` is stateless: the caller holds the state (published flags, S_G) -- in
memory (:class:`StreamRun`) or in database tables (``plpython/stream/stream.py``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable

import numpy as np

from . import exact_emd as X
from .checkpoint import checkpoint
from .emd import SADomain
from .generalize import ECIndex
from .parameters import check_k, check_t
from .hilbert import hilbert_keys
from .refine import refine
from .sabre import QuasiIdentifier, anonymize, generalize_classes

SKIP, DIRECT, INDIRECT = 1, 2, 3
CASES = {SKIP: "skip", DIRECT: "direct", INDIRECT: "indirect"}
# The engine's floating-point guarantee EMD <= budget is kept a hair below t - D, so the
# exact EMD against the window (<= budget + D by the triangle inequality) stays <= t.
BUDGET_MARGIN = 1e-9


@dataclass(frozen=True)
class Window:
    """Window W_a of a stream: rows ``first`` … ``first + size - 1``; its first ``step``
    rows expire when it advances."""
    first: int
    size: int
    step: int

    @property
    def last(self) -> int:
        return self.first + self.size - 1

    @property
    def rows(self) -> np.ndarray:
        return np.arange(self.first, self.last + 1, dtype=np.int64)


def check_window(window_size, step, k) -> tuple[int, int]:
    """(ω, I) as ints: I >= 1, ω a multiple of I, and I >= k (the unpublished tuples of a
    window include its last I, so SABRE always has k of them); raises ValueError."""
    k = check_k(k)
    for name, value in (("window_size", window_size), ("step", step)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError("%s must be an integer >= 1, got %r" % (name, value))
    if window_size % step:
        raise ValueError("window_size %d is not a multiple of step %d" % (window_size, step))
    if step < k:
        raise ValueError("step %d is smaller than k = %d" % (step, k))
    return int(window_size), int(step)


def window_of(advance_no: int, window_size: int, step: int) -> Window:
    """W_a, the window whose advance is the ``advance_no``-th (from 1)."""
    return Window((advance_no - 1) * step + 1, window_size, step)


def rows_needed(advance_no: int, window_size: int, step: int) -> int:
    """Rows that must have arrived for the ``advance_no``-th advance: W_a and the I after it."""
    return (advance_no - 1) * step + window_size + step


def advances_ready(rows: int, done: int, window_size: int, step: int) -> int:
    """How many advances ``rows`` arrived rows allow after ``done`` advances."""
    return max(0, (rows - window_size) // step - done)


def window_codes(values) -> tuple[np.ndarray, int]:
    """A numerical SA's codes in the window's own domain: ranks of the distinct values of
    the window, and their number m_W."""
    distinct, codes = np.unique(np.asarray(values), return_inverse=True)
    return np.asarray(codes, dtype=np.int64).reshape(-1), len(distinct)


def class_emds(codes, labels, domain: SADomain) -> X.ClassEMDs:
    """Exact EMD of every class (``labels``, one per window row) against the whole window."""
    codes = np.asarray(codes, dtype=np.int64)
    counts = np.ones(len(codes), dtype=np.int64)
    if domain.numerical:
        return X.ordered_class_emds(labels, codes, counts, domain.m)
    return X.hierarchical_class_emds(labels, codes, counts, domain.hierarchy)


def distance(codes, pending, domain: SADomain) -> Fraction:
    """D = EMD(SA(W, ō), SA(W)), exactly: the unpublished rows (``pending``) as a class of W."""
    pending = np.asarray(pending, dtype=bool)
    if pending.all():
        return Fraction(0)
    emds = class_emds(codes, pending.astype(np.int64), domain)
    return emds.fraction(int(np.flatnonzero(emds.class_ids == 1)[0]))


def budget(t: float, d: Fraction) -> float:
    """t − D as the engine's threshold: a float just below the exact difference."""
    exact = Fraction(t) - d
    value = float(exact)
    if Fraction(value) > exact:
        value = math.nextafter(value, 0.0)
    return value * (1.0 - BUDGET_MARGIN)


@dataclass
class Publication:
    """The classes one advance publishes: ``rows`` (window offsets), their class ``ec``
    (0..C-1), and per class its size, exact EMD against its generating window, and
    generalization; ``window`` is that generating window.  Shaped like the engine's result
    where the publishing stage reads it (``n_classes``, ``ec``, ``sizes``, ``emds``,
    ``generalization``)."""
    rows: np.ndarray
    ec: np.ndarray
    sizes: np.ndarray
    emds: np.ndarray
    generalization: list
    il: np.ndarray
    window: Window

    @property
    def n_classes(self) -> int:
        return len(self.sizes)

    @property
    def max_emd(self) -> float:
        return float(self.emds.max()) if len(self.emds) else 0.0


@dataclass
class SG:
    """S_G: classes of the last DIRECT not yet published.  ``classes`` per window row (-1:
    none), ``emds`` per class (exact, against ``window``, the last DIRECT's window)."""
    classes: np.ndarray
    emds: np.ndarray
    window: Window | None

    @staticmethod
    def empty(n: int) -> "SG":
        return SG(np.full(n, -1, dtype=np.int64), np.zeros(0), None)


@dataclass
class Advance:
    case: int
    d: Fraction | None
    publication: Publication | None
    sg: SG

    @property
    def rows(self) -> int:
        return 0 if self.publication is None else len(self.publication.rows)

    @property
    def classes(self) -> int:
        return 0 if self.publication is None else self.publication.n_classes


def sabre_partition(method="ak", seed=1, takeout="sweep", weights=None, lookahead=4, search="fast",
                    threads=1):
    """The DIRECT partition: :func:`.sabre.anonymize` with ``method`` on the unpublished rows
    with budget t − D (with 'refine', the batch runs' default, its whole pipeline: cut search,
    rescue, merge passes, t-Mondrian kept where better; the 'window' engine's partition)."""
    def partition(qis, codes, domain, t, k):
        result = anonymize(qis, codes, domain, t, k, method=method, seed=seed, takeout=takeout,
                           weights=weights, with_emds=False, lookahead=lookahead, search=search,
                           threads=threads)
        return result.ec, result.n_classes
    return partition


def refine_partition(merges: int | None = 0, search: str = "fast", expiring_first: bool = True):
    """The DIRECT partition with the searched cuts (:func:`.refine.refine`, the batch runs'
    default method) on the unpublished rows with budget t − D; ``merges``: its merge passes
    (None: refine's default for ``search``).  With ``expiring_first``, rows
    with equal values of a QI are ordered expiring rows first (then by Hilbert key), so a cut
    through ties keeps the expiring rows together: the classes that must be published carry
    fewer rows that could wait for a fuller window."""
    def partition(qis, codes, domain, t, k, expiring=None):
        keys = hilbert_keys([qi.values for qi in qis], [qi.axis_range() for qi in qis])
        if expiring_first and expiring is not None:
            order = np.lexsort((keys, ~np.asarray(expiring, dtype=bool)))
            keys = np.empty(len(order), dtype=np.int64)
            keys[order] = np.arange(len(order))
        ec = refine(qis, codes, domain, t, k, keys=keys, merges=merges, search=search)
        return ec, int(ec.max()) + 1 if len(ec) else 0
    partition.takes_expiring = True
    return partition


def advance(window: Window, qis, codes, domain: SADomain, published, sg: SG, t: float, k: int,
            partition: Callable | None = None, defer: bool = False) -> Advance:
    """One advance of SABRE_W over the window's rows (in row order).

    ``qis``: :class:`QuasiIdentifier` per QI over the window's rows; ``codes``: SA codes in the
    window's domain ``domain``; ``published``: per row, whether it was published before;
    ``sg``: S_G over the window's rows.  ``partition(qis, codes, domain, budget, k) -> (ec,
    C)`` partitions the unpublished rows (default SABRE-AK, :func:`sabre_partition`).

    ``defer`` (the 'window' engine): while S_G holds every expiring unpublished row, the
    advance publishes only S_G's classes that hold one (:func:`_deferred`, case 3) and keeps
    the others for the advances where their rows expire; a DIRECT runs only when S_G does
    not cover the expiring rows, which happens when S_G is exhausted: every row of its window
    is published, so the next DIRECT partitions a window none of whose rows is published
    (D = 0, budget t).  Every class is then formed among the ω rows of its window, as a
    tumbling run over blocks of ω rows forms it.  Such a case 3 reads only the QIs of the rows
    it publishes (:func:`deferred_rows`): the others may hold any values.
    """
    t = check_t(t)
    published = np.asarray(published, dtype=bool)
    if len(published) != window.size or len(codes) != window.size:
        raise ValueError("the window has %d rows, got %d codes and %d flags"
                         % (window.size, len(codes), len(published)))
    pending = ~published
    expiring = np.arange(window.size) < window.step
    if not (pending & expiring).any():
        return Advance(SKIP, None, None, sg)
    if defer and deferred_rows(window, published, sg) is not None:
        return _deferred(window, qis, expiring, sg)
    d = distance(codes, pending, domain)
    if d < Fraction(t):
        return _direct(window, qis, codes, domain, pending, expiring, d, t, k,
                       partition or sabre_partition())
    return _indirect(window, qis, pending, expiring, d, sg)


def _direct(window, qis, codes, domain, pending, expiring, d, t, k, partition) -> Advance:
    idx = np.flatnonzero(pending)
    sub = [QuasiIdentifier(q.name, np.asarray(q.values)[idx], q.hierarchy) for q in qis]
    extra = {"expiring": expiring[idx]} if getattr(partition, "takes_expiring", False) else {}
    ec, n_classes = partition(sub, np.asarray(codes)[idx], domain, budget(t, d), k, **extra)
    ec = np.asarray(ec, dtype=np.int64)
    labels = np.full(window.size, n_classes, dtype=np.int64)     # published rows: one extra class
    labels[idx] = ec
    exact = class_emds(codes, labels, domain)
    exact_classes = exact.class_ids < n_classes
    sizes = exact.sizes[exact_classes]
    if len(sizes) != n_classes or (sizes < k).any() or exact.exceeds(t)[exact_classes].any():
        raise ArithmeticError("a class of the DIRECT partition is not within t = %r of its window "
                              "or has fewer than k = %d rows" % (t, k))
    emds = exact.emd[exact_classes]
    out = np.zeros(n_classes, dtype=bool)
    out[ec[expiring[idx]]] = True                                # classes holding expiring rows
    new_id = np.full(n_classes, -1, dtype=np.int64)
    new_id[~out] = np.arange(int((~out).sum()))
    sg_classes = np.full(window.size, -1, dtype=np.int64)
    sg_classes[idx] = new_id[ec]
    kept = SG(sg_classes, emds[~out], window)
    return Advance(DIRECT, d, _publication(window, qis, idx, ec, out, emds, window), kept)


def _indirect(window, qis, pending, expiring, d, sg: SG) -> Advance:
    if sg.window is None or (pending & expiring & (sg.classes < 0)).any():
        raise ArithmeticError("INDIRECT without an S_G holding every expiring unpublished row "
                              "(Theorem 5): the stream's state is inconsistent")
    n = len(sg.emds)
    idx = np.flatnonzero(sg.classes >= 0)
    publication = _publication(window, qis, idx, sg.classes[idx], np.ones(n, dtype=bool), sg.emds, sg.window)
    return Advance(INDIRECT, d, publication, SG.empty(window.size))


def deferred_rows(window: Window, published, sg: SG) -> np.ndarray | None:
    """The window offsets the 'window' engine's advance publishes without partitioning (the
    rows of S_G's classes that hold an expiring unpublished row), or None when the advance is
    no such case 3 (S_G does not hold every expiring unpublished row, or there is none)."""
    expiring = np.arange(window.size) < window.step
    due = ~np.asarray(published, dtype=bool) & expiring
    if sg.window is None or not due.any() or (due & (sg.classes < 0)).any():
        return None
    return np.flatnonzero(np.isin(sg.classes, np.unique(sg.classes[due])))


def _deferred(window, qis, expiring, sg: SG) -> Advance:
    """Case 3 of the 'window' engine: S_G's classes that hold an expiring row are published
    (each was checked exactly against S_G's window when it was formed: Theorem 6's argument
    for INDIRECT holds for any subset of S_G), the others stay in S_G, renumbered."""
    n = len(sg.emds)
    idx = np.flatnonzero(sg.classes >= 0)
    out = np.zeros(n, dtype=bool)
    out[sg.classes[idx][expiring[idx]]] = True
    publication = _publication(window, qis, idx, sg.classes[idx], out, sg.emds, sg.window)
    new_id = np.full(n, -1, dtype=np.int64)
    new_id[~out] = np.arange(int((~out).sum()))
    classes = np.full(window.size, -1, dtype=np.int64)
    classes[idx] = new_id[sg.classes[idx]]
    kept = SG(classes, np.asarray(sg.emds)[~out], sg.window if (~out).any() else None)
    return Advance(INDIRECT, None, publication, kept)


def _publication(window, qis, idx, ec, out, emds, generating) -> Publication:
    """The classes ``out`` of the partition ``ec`` of rows ``idx``, renumbered 0..C-1."""
    mask = out[ec]
    rows = idx[mask]
    new_id = np.cumsum(out) - 1
    local = new_id[ec[mask]]
    n = int(out.sum())
    sub = [QuasiIdentifier(q.name, np.asarray(q.values)[rows], q.hierarchy) for q in qis]
    index = ECIndex(local, n)
    generalization, il = generalize_classes(sub, index)
    return Publication(rows, local, index.sizes, np.asarray(emds)[out], generalization, il, generating)


@dataclass
class StreamRun:
    """SABRE_W over a stream held in memory: the reference driver of :func:`advance` (tests,
    benchmarks).  ``qis`` hold every row's QI values in arrival order; ``sa`` the SA codes
    (numerical: any values, re-ranked per window; categorical: leaf positions of
    ``hierarchy``)."""
    qis: list
    sa: np.ndarray
    window_size: int
    step: int
    t: float
    k: int
    hierarchy: object = None
    partition: Callable | None = None
    defer: bool = False
    done: int = 0
    published: np.ndarray = None
    sg_classes: np.ndarray = None
    sg: SG | None = None
    log: list = field(default_factory=list)   # (advance_no, Advance)

    def __post_init__(self):
        self.window_size, self.step = check_window(self.window_size, self.step, self.k)
        n = len(self.sa)
        self.published = np.zeros(n, dtype=bool)
        self.sg_classes = np.full(n, -1, dtype=np.int64)
        self.sg = SG(self.sg_classes, np.zeros(0), None)

    def window_data(self, window: Window):
        """(QIs, codes, domain) of the window's rows."""
        rows = slice(window.first - 1, window.last)
        qis = [QuasiIdentifier(q.name, np.asarray(q.values)[rows], q.hierarchy) for q in self.qis]
        if self.hierarchy is None:
            codes, m = window_codes(self.sa[rows])
            return qis, codes, SADomain("numerical", m=m)
        return qis, np.asarray(self.sa[rows], dtype=np.int64), SADomain("categorical", hierarchy=self.hierarchy)

    def step_once(self) -> Advance | None:
        """The next advance, if its rows have arrived (else None)."""
        if advances_ready(len(self.sa), self.done, self.window_size, self.step) < 1:
            return None
        a = self.done + 1
        window = window_of(a, self.window_size, self.step)
        rows = slice(window.first - 1, window.last)
        qis, codes, domain = self.window_data(window)
        current = SG(self.sg_classes[rows], self.sg.emds, self.sg.window)
        result = advance(window, qis, codes, domain, self.published[rows], current, self.t, self.k,
                         self.partition, defer=self.defer)
        if result.publication is not None:
            self.published[window.first - 1 + result.publication.rows] = True
        if result.case != SKIP:
            self.sg_classes[:] = -1
            self.sg_classes[rows] = result.sg.classes
            self.sg = result.sg
        self.done = a
        self.log.append((a, result))
        return result

    def run(self) -> list:
        while self.step_once() is not None:
            checkpoint()
            pass
        return self.log
