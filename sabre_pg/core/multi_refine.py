"""The partitioning methods (``'refine'``, ``'mondrian'``) with several SAs, and the default's
guard against t-Mondrian.

**Several SAs.**  A class must be t_i-close on every SA i, each in its own metric (ordered,
equal distance or hierarchical; :mod:`.exact_emd`).  The cut search and t-Mondrian cut a
:class:`.mondrian.Partitioner` whose first SA (the *primary*: the most constraining one, see
:func:`.multi_sa.most_constraining`, or on a small table each SA in turn, :func:`partition`)
drives the stratified cuts and the rescue's rounding;
every further SA is registered with :meth:`.mondrian.Partitioner.add_sa` and every exact
check tests it too:

* t-Mondrian and the rescue of :mod:`.refine` check through :meth:`.Partitioner.t_close`,
  which tests every SA;
* the cut search (:mod:`.cut_search`) checks candidates on the primary SA from its running
  counts, then the candidates that passed on every other SA (:func:`other_sas_close`), from
  their rows, against that SA's own t and table distribution;
* the merge passes start from unions of classes that hold on every SA (EMD is convex in the
  class's distribution, on every SA) and keep only classes that passed the same checks.

So every class the methods return is k-anonymous and t_i-close on every SA i by the exact
arithmetic of ``sabre_verify``; :func:`.multi_sa.close_classes` measures it once more.

**The default's guard** (:func:`guarded_search`).  The searched cut is greedy: on some
tables (found by a random audit: skewed, tied or adversarial shapes) t-Mondrian's median cuts
end lower.  On a table of at most :data:`GUARD_ROWS` rows, where t-Mondrian costs a fraction of
a second, or of at most :data:`GUARD_ROWS` distinct QI tuples (:func:`guarded`), ``'refine'``
runs both and keeps the classes with the lower AIL (the metric of ``sabre_anonymize``'s
result: :func:`.metrics.ail` of :func:`.sabre.generalize_classes`), so the default is never
worse than ``'mondrian'`` there.  On a larger table of at most :data:`PARALLEL_GUARD_ROWS`
rows, t-Mondrian (about as costly as the search there: 1M census-like rows 8.5 s against 11.4 s)
runs in a second thread beside the search (:func:`partition`; the calling thread waits and
ticks, :func:`.checkpoint.map_checked`): about the search's wall time on a second core, both
in memory at once.  Above that (the parts of an automatic partitioned run are up to 2M rows)
the search measured below it on every large configuration (docs/evaluation.md) but not on
every table.
"""
from __future__ import annotations

import copy
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from . import metrics
from .checkpoint import map_checked
from .generalize import ECIndex
from .mondrian import Partitioner, joint_mondrian, mondrian
from .refine import refine

GUARD_ROWS = 50_000     # 'refine' also runs t-Mondrian and keeps the lower AIL up to this many rows (or QI tuples)
PARALLEL_GUARD_ROWS = 1_000_000   # above GUARD_ROWS and up to this many rows, t-Mondrian runs in a thread beside
                                  # the search (its wall time hidden by a second core; memory: both at once)
PRIMARY_ROWS = 50_000   # several SAs: 'refine' tries every SA as the primary up to this many rows


def sa_view(p: Partitioner, codes, domain, t, table) -> Partitioner:
    """``p`` measuring another SA: the same rows, QIs and orders, with that SA's ``codes``,
    ``domain``, ``t`` and table counts (for the cut search's per-SA row groups and check)."""
    v = copy.copy(p)
    v.codes, v.domain, v.t, v.table_counts, v.other_sas = codes, domain, t, table, []
    return v


def other_sas_close(p: Partitioner, orders, cand, pick, copies, ok, with_emd=False, pmap=map, labelled=()):
    """The cut search's exact check (:func:`.cut_search._check`) extended to every further SA
    of ``p``: ``ok`` (per candidate of ``pick``: both parts k-anonymous and t-close on the
    primary SA; with ``with_emd``, (ok, larger EMD)) and, for the candidates that passed, both
    parts t_i-close on every other SA i, from the rows of the parts.  With ``with_emd`` the
    EMD returned is the largest ``EMD_i / t_i`` over the SAs, times the primary t (the cut
    search divides it by that t).

    ``labelled``: (order, mine, (label, row)) of the orders whose primary check grouped the
    rows of its candidates ``mine`` (:meth:`.cut_search._SortedPartitions.row_labels`): those
    rows are counted again by every other SA's codes, without finding them again, only the
    rows of the candidates still passing (the others' orders find theirs)."""
    from .cut_search import t_close_groups

    ok, emd = ok if with_emd else (ok, None)
    ok = ok.copy()
    shared = {id(order): (mine, rows) for order, mine, rows in labelled}
    alive = np.zeros(len(cand["owner"]), dtype=bool)
    for codes, domain, t, table in p.other_sas:
        live = pick[ok]
        if not len(live):
            break
        alive[:] = False
        alive[live] = True

        def groups(order):
            """(candidates, (local group, code, count)): group 2i or 2i + 1 for the parts of
            the i-th of the candidates, non-decreasing (the exact EMD need not sort them)."""
            if id(order) in shared:
                mine, (label, rows) = shared[id(order)]
                keep = alive[mine]
                if not keep.any():
                    return None
                if not keep.all():          # the rows of the candidates still passing
                    at = keep[label >> 1]
                    label, rows = label[at], rows[at]
                labelled = (label, rows)
            else:
                mine = live[cand["dim"][live] == order.j]
                if not len(mine):
                    return None
                labelled = None
            return mine, order.local_groups(codes, domain.m, mine, cand, labelled, p.kernels)

        found = [g for g in pmap(groups, orders) if g is not None]
        base = np.cumsum([0] + [len(mine) for mine, _ in found])
        ec, sa_codes, counts = (np.concatenate([g[i] + (2 * b if i == 0 else 0) for b, (_, g) in zip(base, found)])
                                for i in range(3))
        local = np.concatenate([mine for mine, _ in found])     # candidate of each local id
        passed = t_close_groups(sa_view(p, codes, domain, t, table), ec, sa_codes, counts, copies,
                                np.arange(len(local)), with_emd)
        by_cand = np.zeros(len(alive), dtype=bool)
        if with_emd:
            passed, e = passed
            e_cand = np.zeros(len(alive))
            e_cand[local] = e
            emd[ok] = np.maximum(emd[ok], e_cand[live] * p.t / t)
        by_cand[local] = passed
        ok[ok] = by_cand[live]
    return (ok, emd) if with_emd else ok


def partition(qis, codes, domains, ts, k: int, method: str, primary: int = 0, keys=None, key_order=None,
              search: str = "fast", threads: int = 1, weights=None, reference=None,
              parallel_guard: bool = True) -> np.ndarray:
    """The classes (ids 0..C-1) of ``method`` ('refine' or 'mondrian') over the SAs ``codes``
    (n x d), each with its domain and t, SA ``primary`` first: t_i-close on every SA i.

    'refine' with several SAs on a table of at most :data:`PRIMARY_ROWS` rows searches once
    with each SA as the primary (``primary``'s first) and keeps the lowest AIL: the primary
    drives the stratified cuts and the rescue, and which one suits a table is not known
    beforehand (Adult, t = (0.1, 0.1): AIL 0.561 with occupation first, 0.791 with education,
    the most constraining by SABRE's plans).  'refine' then keeps t-Mondrian's classes
    instead where they have the lower AIL, on tables of at most :data:`GUARD_ROWS` rows or
    tuples, or, computed in a second thread beside the search, of
    at most :data:`PARALLEL_GUARD_ROWS` rows (not with ``parallel_guard`` False: a part of a
    larger table, where the second thread's memory would add to the search's).  ``reference``: the SA's counts in a larger table holding
    these rows, which every class is measured against (:class:`.mondrian.Partitioner`); with
    several SAs a list, one per SA (a Citus shard's whole table)."""
    codes = np.asarray(codes, dtype=np.int64)
    if codes.ndim == 1:
        codes = codes[:, None]
    d = codes.shape[1]
    refs = None
    if reference is not None and d > 1:
        refs = list(reference)
        if len(refs) != d:
            raise ValueError("a reference distribution per sensitive attribute is needed (%d, got %d)"
                             % (d, len(refs)))
    elif reference is not None:
        if method == "mondrian":
            return mondrian(qis, codes[:, 0], domains[0], ts[0], k, reference=reference)
        return guarded_search(qis, len(codes), lambda: refine(
            qis, codes[:, 0], domains[0], ts[0], k, keys=keys, search=search, threads=threads, key_order=key_order,
            reference=reference), lambda: mondrian(qis, codes[:, 0], domains[0], ts[0], k, reference=reference),
            weights, keys, key_order, parallel_guard)
    if method == "mondrian":
        return _mondrian(qis, *_first(codes, domains, ts, primary), k, _ordered(refs, codes, primary))
    primaries = [primary] + [i for i in range(d) if i != primary] if len(codes) <= PRIMARY_ROWS else [primary]

    def searched():
        best, best_ail = None, np.inf
        for first in primaries:
            c, ds, us = _first(codes, domains, ts, first)
            rs = _ordered(refs, codes, first) or [None] * d
            ec = refine(qis, c[:, 0], ds[0], us[0], k, keys=keys, search=search, threads=threads,
                        key_order=key_order, other_sas=[(c[:, i], ds[i], us[i], rs[i]) for i in range(1, d)],
                        reference=rs[0])
            ail = ail_of(qis, ec, weights) if len(primaries) > 1 else 0.0
            if ail < best_ail * (1 - 1e-12):
                best, best_ail = ec, ail
        return best

    return guarded_search(qis, len(codes), searched, lambda: _mondrian(qis, codes, domains, ts, k, refs), weights,
                          keys, key_order, parallel_guard)


def guarded_search(qis, n: int, searched, mondrian_, weights, keys, key_order, parallel: bool = True) -> np.ndarray:
    """``searched()``'s classes, or ``mondrian_()``'s where their AIL is lower: after the search on
    a table the guard covers (:func:`guarded_rows`), in a second thread beside it on a larger one
    of at most :data:`PARALLEL_GUARD_ROWS` rows (the guard at about the search's wall time; the
    calling thread waits and ticks, :func:`.checkpoint.map_checked`), not above, nor with
    ``parallel`` False."""
    if guarded_rows(n, keys, key_order):
        return better(qis, searched(), mondrian_(), weights)
    if n > PARALLEL_GUARD_ROWS or not parallel:
        return searched()

    def measured(task):         # (each AIL in its own thread: 1M rows, about 0.15 s off the wall)
        ec = task()
        return ec, ail_of(qis, ec, weights)

    with ThreadPoolExecutor(2, thread_name_prefix="sabre-guard") as pool:
        (ec, ail), (other, other_ail) = map_checked(pool, measured, [searched, mondrian_])
    return other if lower(other_ail, ail) else ec


def _first(codes, domains, ts, primary):
    """The SAs (codes, domains, ts) reordered with SA ``primary`` first."""
    order = [primary] + [i for i in range(codes.shape[1]) if i != primary]
    return codes[:, order], [domains[i] for i in order], [float(ts[i]) for i in order]


def _ordered(refs, codes, primary):
    """The references ``refs`` (one per SA, or None) in :func:`_first`'s order."""
    if refs is None:
        return None
    return [refs[i] for i in [primary] + [i for i in range(codes.shape[1]) if i != primary]]


def better(qis, ec: np.ndarray, other: np.ndarray, weights=None) -> np.ndarray:
    """``other`` (t-Mondrian's classes) where its AIL is lower than ``ec``'s; ties keep ``ec``."""
    return other if lower(ail_of(qis, other, weights), ail_of(qis, ec, weights)) else ec


def lower(other_ail: float, ail: float) -> bool:
    """Whether t-Mondrian's AIL ``other_ail`` wins over the search's ``ail`` (ties keep the search's)."""
    return other_ail < ail * (1 - 1e-12)


def guarded_rows(n: int, keys=None, key_order=None) -> bool:
    """Whether the default's guard runs t-Mondrian beside the search: a table of at most
    :data:`GUARD_ROWS` rows, or of more rows but at most :data:`GUARD_ROWS` distinct QI tuples
    (distinct Hilbert ``keys``, sorted by ``key_order`` when given; a key may stand for several
    close tuples, which can only run the guard more often).  Many rows over few tuples is where
    the search lost most above GUARD_ROWS (a 400-row table of 331 tuples, each row 150 times:
    AIL 0.177 against t-Mondrian's 0.143), and where t-Mondrian is cheap beside it (its cuts
    stop at the tuples: 1.1 s against the search's 6.2 s there)."""
    if n <= GUARD_ROWS:
        return True
    if keys is None:
        return False
    keys = np.asarray(keys)
    ordered = keys[key_order] if key_order is not None else np.sort(keys)
    return int(np.count_nonzero(ordered[1:] != ordered[:-1])) + 1 <= GUARD_ROWS


def ail_of(qis, ec: np.ndarray, weights=None) -> float:
    """AIL of the classes ``ec`` (ids 0..C-1) as ``sabre_anonymize`` reports it."""
    from .sabre import generalize_classes
    index = ECIndex(ec, int(ec.max()) + 1 if len(ec) else 0)
    return metrics.ail(generalize_classes(qis, index, weights)[1], index.sizes)


def _mondrian(qis, codes, domains, ts, k, references=None) -> np.ndarray:
    if codes.shape[1] == 1:
        return mondrian(qis, codes[:, 0], domains[0], ts[0], k)
    return joint_mondrian(qis, codes, domains, ts, k, references)
