"""'refine' (cut search): cuts t-Mondrian refuses, found off the median or by stratifying, and
the exact check of candidate groups that share rows."""
from __future__ import annotations

import numpy as np
import pytest

from sabre_pg.core import exact_emd as X
from sabre_pg.core.cut_search import t_close_groups
from sabre_pg.core.emd import SADomain
from sabre_pg.core.mondrian import Partitioner, mondrian
from sabre_pg.core.refine import refine
from sabre_pg.core.sabre import QuasiIdentifier


def test_an_off_median_cut_where_mondrian_stops():
    """10 rows on one QI, table 50/50: the median cut (5 | 5) leaves 3/5 zeros left (EMD 0.1 >
    t), so t-Mondrian keeps one class; the search cuts 4 | 6 (both 50/50)."""
    qi = [QuasiIdentifier("x", np.arange(10, dtype=np.float64))]
    codes = np.array([0, 0, 1, 1, 0, 1, 1, 0, 0, 1])
    dom = SADomain("numerical", m=2)
    t, k = 0.05, 2
    assert mondrian(qi, codes, dom, t, k).tolist() == [0] * 10
    ec = refine(qi, codes, dom, t, k)
    e = X.ordered_class_emds(ec, codes, np.ones(10, dtype=np.int64), 2)
    assert e.violations(t, k) == 0 and e.classes >= 2
    assert len(set(ec[:4])) < 4 and not set(ec[:4]) & set(ec[4:])    # first cut at 4


def test_shared_rows_are_checked_against_the_table():
    """Groups that overlap (two candidate cuts of one partition) get the EMD each would have
    alone against the table's distribution; both histogram paths agree."""
    from sabre_pg.core.cut_search import _grouped
    rng = np.random.default_rng(3)
    codes = rng.integers(0, 6, 200)
    qi = [QuasiIdentifier("x", rng.random(200))]
    dom = SADomain("numerical", m=6)
    p = Partitioner(qi, codes, dom, 0.12, 5)
    rows = np.r_[np.arange(100), np.arange(100)]            # candidate 0 and 1 share rows 0..99
    labels = np.r_[np.arange(100) >= 40, 2 + (np.arange(100) >= 70)]
    ok, emd = t_close_groups(p, *_grouped(labels, codes[rows], 6), 2, np.array([0, 1]), True)
    for c, cut in enumerate((40, 70)):
        ec = np.r_[np.zeros(cut), np.ones(100 - cut), np.full(100, 2)].astype(np.int64)
        e = X.ordered_class_emds(ec, codes, np.ones(200, dtype=np.int64), 6)
        alone = ~e.violating(0.12, 5)
        assert ok[c] == (alone[0] and alone[1])
        assert emd[c] == max(e.emd[0], e.emd[1])


@pytest.mark.parametrize("cells", [1, 7, 1 << 22])
def test_grouped_counts_every_group_and_code(cells, monkeypatch):
    """The check's (group, code, count) rows, counted by bincounts over a few (group, code)
    cells at a time, are those of a sort."""
    import sabre_pg.core.segments as CS
    rng = np.random.default_rng(5)
    labels = np.sort(rng.integers(0, 40, 500))
    codes = rng.integers(0, 6, 500)
    monkeypatch.setattr(CS, "GROUP_CELLS", cells)
    group, code, count = CS.grouped(labels, codes, 6)
    key, want = np.unique(labels * 6 + codes, return_counts=True)
    assert np.array_equal(group, key // 6) and np.array_equal(code, key % 6) and np.array_equal(count, want)
    assert all(len(x) == 0 for x in CS.grouped(labels[:0], codes[:0], 6))


@pytest.mark.parametrize("dense", [0, 1 << 30])
def test_row_and_running_count_checks_agree(dense, monkeypatch):
    """The exact check from gathered rows and from running SA counts gives the same classes."""
    import sabre_pg.core.cut_search as CS
    from sabre_pg.synthetic import census
    qis, codes, dom = census(1_500, seed=2)
    monkeypatch.setattr(CS, "DENSE_LIMIT", dense)
    monkeypatch.setattr(CS, "DENSE_GAIN", 1 << 20)
    ec = refine(qis, codes, dom, 0.3, 4)
    assert X.ordered_class_emds(ec, codes, np.ones(len(codes), dtype=np.int64), dom.m).violations(0.3, 4) == 0
    monkeypatch.setattr(CS, "DENSE_LIMIT", 1 << 30 if not dense else 0)
    assert np.array_equal(ec, refine(qis, codes, dom, 0.3, 4))


@pytest.mark.parametrize("setting", ["fast", "fast-large", "thorough", (2, 4, 400, 150)],
                         ids=["fast", "fast-large", "thorough", "sampled-narrow"])
def test_search_settings_keep_every_class_t_close(setting, monkeypatch):
    """Every search setting (a small-partition QI limit, a coarse grid and sampled scoring
    included; 'fast' as on a table above MERGE_ROWS: the stratified cut only on a retry, no
    merge passes) publishes t-close, k-anonymous classes only, and cuts the table."""
    import sabre_pg.core.cut_search as CS
    import sabre_pg.core.refine as R
    from sabre_pg.synthetic import census
    qis, codes, dom = census(3_000, seed=4)
    if setting == "fast-large":
        monkeypatch.setattr(R, "MERGE_ROWS", 1_000)
        setting = "fast"
    if not isinstance(setting, str):
        monkeypatch.setitem(CS.SEARCH, "fast", setting)
        setting = "fast"
    ec = refine(qis, codes, dom, 0.25, 5, search=setting)
    e = X.ordered_class_emds(ec, codes, np.ones(len(codes), dtype=np.int64), dom.m)
    assert e.violations(0.25, 5) == 0 and e.classes > 20
    with pytest.raises(ValueError, match="search"):
        refine(qis, codes, dom, 0.25, 5, search="quick")


def test_scores_are_the_parts_information_loss():
    """A cut's score is |L| IL(L) + |R| IL(R) of its parts, computed from the rows."""
    from sabre_pg.core.cut_search import _SortedPartitions
    from sabre_pg.synthetic import census
    qis, codes, dom = census(2_000, seed=5)
    p = Partitioner(qis, codes, dom, 0.3, 5)
    part = np.arange(2_000) % 3
    for j in range(len(qis)):
        rows = np.lexsort((p.columns[:, j], part))
        s = _SortedPartitions(p, rows, part[rows], j, np.bincount(part), grid=8)
        owners, pos = np.array([0, 0, 1, 2]), np.array([5, 300, 17, 600])
        got = s._scores(p, np.arange(3), owners, pos)[0]
        for g, q, x in zip(got, owners, pos):
            mine = rows[part[rows] == q]
            want = sum(len(r) * np.mean([p.span(i, p.columns[r, i].min(keepdims=True),
                                                p.columns[r, i].max(keepdims=True))[0]
                                         for i in range(len(qis))]) for r in (mine[:x], mine[x:]))
            assert g == pytest.approx(want)


def test_rescue_cuts_what_the_search_cannot():
    """14 rows, SA sorted along the one QI (7 zeros, then 7 ones; table 50/50), t = 0.05:
    every contiguous cut fails, and so does the stratified cut with alternate rounding (4 + 3
    | 3 + 4, EMD 1/14 each); the rescue's rounding search finds 3 + 3 | 4 + 4, and the search
    halves the 8-row half again (2 + 2 | 2 + 2)."""
    from sabre_pg.core.cut_search import cut_search
    qi = [QuasiIdentifier("x", np.arange(14, dtype=np.float64))]
    codes = np.array([0] * 7 + [1] * 7)
    dom = SADomain("numerical", m=2)
    t, k = 0.05, 3
    p = Partitioner(qi, codes, dom, t, k)
    assert cut_search(p, np.zeros(14, dtype=np.int64)).tolist() == [0] * 14
    ec = refine(qi, codes, dom, t, k)
    e = X.ordered_class_emds(ec, codes, np.ones(14, dtype=np.int64), 2)
    assert e.violations(t, k) == 0 and e.max_emd == 0
    assert sorted(np.bincount(ec).tolist()) == [4, 4, 6]


def test_balanced_halves_never_worse_than_alternation():
    """Per partition, the searched rounding's larger half EMD is at most the alternation's
    (lower for many of those the alternation puts above t, the same for the others), every
    left count is half rounded up or down, and the halves are not empty."""
    from sabre_pg.core.hierarchy import Hierarchy
    from sabre_pg.core.refine import _halves_emd, balanced_halves
    rng = np.random.default_rng(7)
    h = Hierarchy.flat(["v%d" % i for i in range(9)])
    dom = SADomain("categorical", hierarchy=h)
    table = rng.dirichlet(np.ones(9))
    counts = rng.multinomial(41, table, size=300)
    odd = (counts & 1).astype(bool)
    alternate = counts // 2 + (odd & ((np.cumsum(odd, axis=1) - 1) % 2 == 0))
    t = 0.1
    left = balanced_halves(counts, dom, table, t)
    assert (np.abs(2 * left - counts) <= 1).all()
    got, before = _halves_emd(left, counts, dom, table), _halves_emd(alternate, counts, dom, table)
    assert (got <= before + 1e-12).all() and (got < before - 1e-9).sum() > 100
    assert (got[before <= t] == before[before <= t]).all() and (got[before > t] <= t).sum() > 5
    assert np.isfinite(got).all()


def _padded_balanced_halves(counts, domain, table, t):
    """The rounding search as it was written first: every partition evaluates the width of the
    widest (its missing flips padded, their EMDs computed and then set infinite)."""
    from sabre_pg.core.redistribute import dichotomize
    from sabre_pg.core.refine import BALANCE_STEPS, _halves_emd, odd_values
    left = dichotomize(counts)[0]
    values, flips = odd_values(counts)          # (the same flips; what differs is their EMDs)
    width = values.shape[1]
    if not width:
        return left
    cost = _halves_emd(left, counts, domain, table)
    active = np.flatnonzero(cost > t)
    for _ in range(BALANCE_STEPS):
        a = active
        cand = np.repeat(left[a, None, :], width, axis=1)
        i, j, v = np.arange(len(a))[:, None], np.arange(width), values[a]
        cand[i, j, v] = counts[a][i, v] - cand[i, j, v]
        c = np.where(flips[a], _halves_emd(cand, np.broadcast_to(counts[a, None, :], cand.shape), domain, table), np.inf)
        best = np.argmin(c, axis=1)
        c = c[np.arange(len(a)), best]
        better = c < cost[a]
        left[a[better]], cost[a[better]] = cand[better, best[better]], c[better]
        active = a[better]
    return left


@pytest.mark.parametrize("kind", ["ordered", "equal", "hierarchical"])
def test_balanced_halves_evaluates_only_the_flips_that_exist(kind, monkeypatch):
    """The rounding search computes the EMDs of each partition's own flips only (not the
    widest partition's count, padded), in chunks: the same left counts to the bit as the
    padded search on skewed counts (one partition with many odd values, most with few), for
    every SA kind."""
    import sabre_pg.core.refine as R
    from sabre_pg.core.hierarchy import Hierarchy
    rng = np.random.default_rng({"ordered": 1, "equal": 2, "hierarchical": 3}[kind])
    m = 23
    if kind == "ordered":
        dom = SADomain("numerical", m=m)
    elif kind == "equal":
        dom = SADomain("categorical", hierarchy=Hierarchy.flat(["v%d" % i for i in range(m)]))
    else:
        dom = SADomain("categorical", hierarchy=Hierarchy([["v%d" % i, "g%d" % (i // 4), "h%d" % (i // 12), "*"]
                                                            for i in range(m)]))
    table = rng.dirichlet(np.ones(m) * 0.7)
    counts = np.vstack([rng.multinomial(int(n), table) for n in rng.integers(2, 30, size=400)]
                       + [rng.multinomial(400, table, size=3)])
    from sabre_pg.core.redistribute import dichotomize
    flipped = 0
    for t in (0.02, 0.08, 0.2):
        want = _padded_balanced_halves(counts, dom, table, t)
        flipped += int((want != dichotomize(counts)[0]).any(axis=1).sum())
        assert np.array_equal(R.balanced_halves(counts, dom, table, t), want), t
        monkeypatch.setattr(R, "BALANCE_CHUNK", 5 * m * int((counts & 1).sum(axis=1).max()))     # several chunks
        assert np.array_equal(R.balanced_halves(counts, dom, table, t), want), t
        monkeypatch.undo()
    assert flipped > 20             # (the search moved roundings: the comparison is not of the alternation only)


def test_rescue_keeps_every_class_t_close_and_lowers_il():
    """On a correlated hierarchical SA: the rescue (on by default) publishes only t-close,
    k-anonymous classes, and never a higher AIL than the cut search alone."""
    from sabre_pg.core.cut_search import cut_search
    from sabre_pg.core.hierarchy import Hierarchy
    from sabre_pg.core import refine as R
    rng = np.random.default_rng(11)
    n = 4_000
    a, b = rng.integers(0, 40, n).astype(np.float64), rng.normal(size=n)
    codes = np.clip((a // 4 + rng.integers(-2, 3, n)), 0, 9).astype(np.int64)
    h = Hierarchy.flat(["s%d" % i for i in range(10)])
    dom = SADomain("categorical", hierarchy=h)
    qis = [QuasiIdentifier("a", a), QuasiIdentifier("b", b)]
    t, k = 0.15, 4
    ec = refine(qis, codes, dom, t, k)
    e = X.domain_class_emds(ec, codes, np.ones(n, dtype=np.int64), dom)
    assert e.violations(t, k) == 0
    p = Partitioner(qis, codes, dom, t, k)
    plain = cut_search(p, np.zeros(n, dtype=np.int64))

    def ail(c):
        return (p.spans(c, int(c.max()) + 1).mean(axis=1) * np.bincount(c)).sum() / n
    assert ail(ec) < ail(plain) and e.classes > int(plain.max()) + 1
    assert R.rescue_round(p, plain, np.zeros(int(plain.max()) + 1, dtype=bool))[0] is plain


def _best_halves_every_qi(p, rows, owner, group, left_counts):
    """The rescue's halves as they were before single-valued QIs were scored once: every QI
    scored on every class (the reference the shortcut must match)."""
    from sabre_pg.core.cut_search import run_ranks
    from sabre_pg.core import refine as R
    n_q = len(left_counts)
    best, right = np.full(n_q, np.inf), np.zeros(len(rows), dtype=bool)
    for j in range(len(p.qis)):
        order = R._group_order(p, rows, group, j)
        r = np.empty(len(rows), dtype=bool)
        r[order] = run_ranks(group[order]) >= left_counts.reshape(-1)[group[order]]
        halves = R._summed_il(p, rows, 2 * owner + r, 2 * n_q)
        better = halves[0::2] + halves[1::2] < best
        best[better] = (halves[0::2] + halves[1::2])[better]
        right = np.where(better[owner], r, right)
    return best, right, R._summed_il(p, rows, owner, n_q)


@pytest.mark.parametrize("seed", [3, 4])
def test_rescue_scores_single_valued_qis_once_with_the_same_halves(seed, monkeypatch):
    """A class's halves along any QI with one value there are the same (the ties' order), so
    the rescue scores them once: its classes are those of scoring every QI on every class,
    on data where most classes have several single-valued QIs (and some none)."""
    from sabre_pg.core.cut_search import cut_search
    from sabre_pg.core.hierarchy import Hierarchy
    from sabre_pg.core import refine as R
    rng = np.random.default_rng(seed)
    n = 6_000
    a = rng.integers(0, 4, n).astype(np.float64)
    b = (rng.random(n) < 0.03).astype(np.int64)           # one leaf in most classes
    c = np.where(rng.random(n) < 0.985, 0, rng.integers(0, 5, n))
    d = rng.integers(0, 3, n).astype(np.float64) + (rng.random(n) < 0.5) * rng.normal(size=n)
    codes = np.clip(2 * a + rng.integers(-3, 4, n), 0, 9).astype(np.int64)
    hb, hc = Hierarchy.flat(["b0", "b1"]), Hierarchy.flat(["c%d" % i for i in range(5)])
    qis = [QuasiIdentifier("a", a), QuasiIdentifier("b", b, hb), QuasiIdentifier("c", c, hc),
           QuasiIdentifier("d", d)]
    p = Partitioner(qis, codes, SADomain("numerical", m=10), 0.2, 4)
    ec = cut_search(p, np.zeros(n, dtype=np.int64))
    todo = np.ones(int(ec.max()) + 1, dtype=bool)
    single = p.group_spans(np.arange(n), ec, len(todo), single=True)[1][np.bincount(ec) >= 2 * p.k]
    # classes with different QIs single-valued: the first of them is QI 0 in some, 1 in others
    assert len({tuple(x) for x in single.tolist()}) >= 3 and single[:, 0].any() and not single[:, 0].all()
    calls = []

    def both(p, rows, owner, group, left_counts):
        got, want = fast(p, rows, owner, group, left_counts), _best_halves_every_qi(p, rows, owner, group, left_counts)
        assert all(np.array_equal(x, y) for x, y in zip(got, want))
        calls.append(len(rows))
        return got

    fast = R._best_halves
    monkeypatch.setattr(R, "_best_halves", both)
    found = R.stratified_rescue(p, ec)
    assert len(calls) >= 3 and int(found.max()) - int(ec.max()) > 20


def test_group_spans_single_marks_groups_with_one_value():
    qis = [QuasiIdentifier("x", np.array([1.0, 1.0, 2.0, 5.0])), QuasiIdentifier("y", np.array([3.0, 3.0, 3.0, 4.0]))]
    p = Partitioner(qis, np.zeros(4, dtype=np.int64), SADomain("numerical", m=1), 1.0, 1)
    spans, single = p.group_spans(np.arange(4), np.array([0, 0, 1, 1]), 3, single=True)
    assert single.tolist() == [[True, True], [False, False], [True, True]]
    assert np.array_equal(spans, p.group_spans(np.arange(4), np.array([0, 0, 1, 1]), 3))
    assert spans[1].tolist() == [0.75, 1.0] and spans[0].tolist() == [0.0, 0.0]


def test_merge_passes_lower_il_and_stay_t_close():
    """Merge passes keep a union's new classes only where its summed IL falls: never a higher
    AIL than without them (lower on this data), every class exactly t-close and k-anonymous;
    the rescue alone is never above the search alone either."""
    from sabre_pg.core import refine as R
    from sabre_pg.synthetic import census
    qis, codes, dom = census(3_000, seed=4)
    t, k = 0.25, 5
    runs = {(m, r): refine(qis, codes, dom, t, k, merges=m, rescue=r) for m, r in ((0, False), (0, True), (2, True))}
    p = Partitioner(qis, codes, dom, t, k)
    ail = {}
    for key, ec in runs.items():
        e = X.ordered_class_emds(ec, codes, np.ones(len(codes), dtype=np.int64), dom.m)
        assert e.violations(t, k) == 0
        ail[key] = (p.spans(ec, e.classes).mean(axis=1) * e.sizes).sum() / len(codes)
    assert ail[(2, True)] < ail[(0, True)] <= ail[(0, False)]
    old = np.array([0, 0, 1, 1, 2, 2, 2])
    assert R._unchanged(old, np.array([1, 1, 0, 0, 2, 3, 3])).tolist() == [True, True, False, False]
    assert R._unions(np.arange(10) // 2, None, 5, 2).tolist() == [0, 0, 1, 1, 1]
    assert R._unions(np.arange(10) // 2, np.arange(10) // 6, 5, 0).tolist() == [0, 0, 0, 1, 1]
    assert R.merge_count("fast", R.MERGE_ROWS) == R.MERGES["fast"] > 0
    assert R.merge_count("fast", R.MERGE_ROWS + 1) == 0
    assert R.merge_count("thorough", 10 * R.MERGE_ROWS) == R.MERGES["thorough"]


def _canonical(ec):
    """Class ids renumbered by first row: equal arrays <=> the same partition of the rows."""
    _, first = np.unique(ec, return_index=True)
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first)] = np.arange(len(first))
    return rank[ec]


@pytest.mark.parametrize("flat", [False, True])
def test_threads_give_the_classes_of_one(flat, monkeypatch):
    """Searched in 2 or 3 threads (each of the first rounds' partitions a table of its own,
    taken by the next free thread), the classes are exactly those of one thread, and every
    one is t-close."""
    import sabre_pg.core.refine as R
    from sabre_pg.core.hierarchy import Hierarchy
    from sabre_pg.synthetic import census
    qis, codes, dom = census(6_000, seed=4)
    if flat:
        dom = SADomain("categorical", hierarchy=Hierarchy.flat(["s%d" % i for i in range(dom.m)]))
    monkeypatch.setattr(R, "THREAD_ROWS", 1_000)
    subsets = []
    monkeypatch.setattr(Partitioner, "subset", lambda self, rows, ranks=None, f=Partitioner.subset: subsets.append(len(rows)) or f(self, rows, ranks))
    one = _canonical(refine(qis, codes, dom, 0.25, 5, threads=1))
    assert not subsets
    for threads in (2, 3):
        many = refine(qis, codes, dom, 0.25, 5, threads=threads)
        assert np.array_equal(_canonical(many), one)
        assert len(subsets) >= threads and sum(subsets) == len(codes)     # one per partition
        subsets.clear()
    exact = X.domain_class_emds(one, codes, np.ones(len(codes), dtype=np.int64), dom)
    assert exact.violations(0.25, 5) == 0 and exact.classes > 50


def test_a_round_shares_its_qis_between_threads(monkeypatch):
    """The cut search given a thread pool's map (the whole table's first rounds with
    threads) runs each QI's candidates in a worker thread; the classes are those of map."""
    import threading
    from concurrent.futures import ThreadPoolExecutor
    import sabre_pg.core.cut_search as CS
    from sabre_pg.synthetic import census
    qis, codes, dom = census(3_000, seed=6)
    part = np.zeros(len(codes), dtype=np.int64)
    one = CS.cut_search(Partitioner(qis, codes, dom, 0.3, 5), part)
    seen = []
    monkeypatch.setattr(CS._SortedPartitions, "candidates", lambda self, p, f=CS._SortedPartitions.candidates:
                        seen.append(threading.current_thread() is threading.main_thread()) or f(self, p))
    with ThreadPoolExecutor(2) as pool:
        assert np.array_equal(CS.cut_search(Partitioner(qis, codes, dom, 0.3, 5), part, pmap=pool.map), one)
    assert seen and not any(seen)


def test_worker_threads_leave_signals_to_the_caller():
    """A search thread blocks every signal, so a backend's cancel reaches its own thread."""
    import signal
    import threading
    from sabre_pg.core.refine import _signals_to_caller
    seen = []
    worker = threading.Thread(target=lambda: (_signals_to_caller(), seen.append(signal.pthread_sigmask(signal.SIG_BLOCK, []))))
    worker.start()
    worker.join()
    assert set(seen[0]) >= {signal.SIGINT, signal.SIGTERM, signal.SIGUSR1}
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])


def test_segment_helpers_match_numpy():
    """The lock-free replacements of np.repeat and np.r_ in the search give numpy's arrays,
    empty segments included."""
    from sabre_pg.core.cut_search import _run_firsts, _segment_ids, _segment_indices, run_ranks
    rng = np.random.default_rng(7)
    for _ in range(100):
        sizes = rng.integers(0, 4, rng.integers(0, 8))
        starts = rng.integers(0, 50, len(sizes))
        assert np.array_equal(_segment_ids(sizes), np.repeat(np.arange(len(sizes)), sizes))
        assert np.array_equal(_segment_indices(starts, sizes),
                              np.repeat(starts - np.cumsum(sizes) + sizes, sizes) + np.arange(sizes.sum()))
        a = rng.integers(0, 3, rng.integers(1, 10))
        assert np.array_equal(_run_firsts(a), np.r_[True, a[1:] != a[:-1]])
        s = np.sort(a)
        assert np.array_equal(run_ranks(s), [int((s[:i] == s[i]).sum()) for i in range(len(s))])


def test_subsets_rank_as_one_subset_each():
    """Partitioner.subsets restricts every QI's order to each group in one pass: the same
    ranks, columns and codes as one subset per group."""
    from sabre_pg.synthetic import census
    qis, codes, dom = census(2_000, seed=8)
    p = Partitioner(qis, codes, dom, 0.3, 5)
    p.ranks_of(None)
    group = np.random.default_rng(8).integers(0, 3, len(codes))
    groups = [np.flatnonzero(group == g) for g in range(3)]
    for rows, sub in zip(groups, p.subsets(groups)):
        one = p.subset(rows)
        assert np.array_equal(sub.ranks, one.ranks) and np.array_equal(sub.columns, one.columns)
        assert np.array_equal(sub.codes, one.codes)


def test_orders_keep_only_partitions_where_the_qi_can_be_cut(monkeypatch):
    """After every round, QI j's order holds exactly the rows of the partitions still searched
    whose QI j has more than one value, grouped by partition and sorted by value inside each
    (ties by row): a partition whose QI j has one value is never cut on j again.  The
    partition of every row of an order, carried through the round, is the row's."""
    import sabre_pg.core.cut_search as CS
    from sabre_pg.synthetic import census
    qis, codes, dom = census(4_000, seed=7)
    p = Partitioner(qis, codes, dom, 0.3, 5)
    seen, dropped = [], [0]
    round_ = CS._search_round

    def checked(p, part, n_parts, final, wide, orders, *args):
        out = round_(p, part, n_parts, final, wide, orders, *args)
        new_part, new_n, new_final, _, new_orders, new_owners, counts = out
        sizes = np.bincount(new_part, minlength=new_n)
        assert np.array_equal(counts, sizes)            # the rows counted from the cuts
        for j, o in enumerate(new_orders):
            owner = new_part[o]
            assert np.array_equal(new_owners[j], owner)    # the partitions carried with the order
            assert (np.diff(owner) >= 0).all()          # grouped by partition
            values = p.columns[o, j]
            same = owner[1:] == owner[:-1]
            assert (np.diff(values)[same] >= 0).all()   # by value inside a partition
            present = np.unique(owner)
            assert (np.bincount(owner, minlength=new_n)[present] == sizes[present]).all()
            # every partition left out of order j is final, or has one value of QI j
            for q in np.setdiff1d(np.arange(new_n), present):
                assert new_final[q] or np.ptp(p.columns[new_part == q, j]) == 0
                dropped[0] += not new_final[q]
        seen.append(len(new_orders[0]))
        return out

    monkeypatch.setattr(CS, "_search_round", checked)
    ec = CS.cut_search(p, np.zeros(len(codes), dtype=np.int64))
    assert len(seen) > 5 and dropped[0] > 0
    exact = X.domain_class_emds(ec, codes, np.ones(len(codes), dtype=np.int64), dom)
    assert exact.violations(0.3, 5) == 0


@pytest.mark.parametrize("rows, small", [(20_000, 128), (65_536, 256)])
def test_fast_searches_every_qi_only_above_one_256th_of_the_table(rows, small, monkeypatch):
    """'fast' searches a partition on its widest QI when it has fewer than 128 rows or less
    than 1/256 of the table (every QI above); a subset searched apart (threads) keeps the
    whole table's threshold."""
    import sabre_pg.core.cut_search as CS
    from sabre_pg.synthetic import census
    qis, codes, dom = census(rows, seed=2)
    used = set()
    widest = CS._widest
    monkeypatch.setattr(CS, "_widest", lambda spans, every, sizes, count, s: used.add((count, s)) or
                        widest(spans, every, sizes, count, s))
    p = Partitioner(qis, codes, dom, 0.3, 5)
    CS.cut_search(p, np.zeros(rows, dtype=np.int64), max_rounds=2)
    assert used == {(1, small)}
    used.clear()
    CS.cut_search(p.subset(np.arange(rows // 3)), np.zeros(rows // 3, dtype=np.int64), max_rounds=1)
    assert used == {(1, small)}
    used.clear()
    CS.cut_search(p, np.zeros(rows, dtype=np.int64), search="thorough", max_rounds=1)
    assert used == {(None, 0)}


def test_widest_qis_match_the_ranks_of_a_stable_sort():
    """``_widest`` picks, in a partition below ``small`` rows, the ``count`` widest QIs by the
    ranks of a stable sort of the spans (the first of equal spans first; a NaN span last), and
    every QI above: the same choice as ranking every partition, on random spans with ties,
    zeros and NaNs."""
    import sabre_pg.core.cut_search as CS
    rng = np.random.default_rng(3)
    for trial in range(300):
        n, d = int(rng.integers(0, 40)), int(rng.integers(1, 8))
        spans = rng.choice([0.0, 0.25, 0.5, 1.0, rng.random()], size=(n, d))
        if trial % 5 == 0 and spans.size:
            spans.flat[rng.integers(0, spans.size)] = np.nan
        every = (rng.random((n, d)) < 0.8) & ~(spans == 0)
        sizes = rng.integers(0, 300, size=n)
        small = int(rng.integers(1, 300))
        for count in (None, 1, 2, d):
            got = CS._widest(spans, every, sizes, count, small)
            if count is None or count >= d:
                want = every
            else:
                rank = np.argsort(np.argsort(-spans, axis=1, kind="stable"), axis=1, kind="stable")
                want = every & ((rank < count) | (sizes >= small)[:, None])
            assert np.array_equal(got, want), (trial, count)


@pytest.mark.parametrize("dense, weight", [(0, 0.0), (1 << 30, 0.0), (0, 0.2)],
                         ids=["from rows", "running counts", "emd weight"])
def test_the_check_hands_the_exact_emd_its_groups_sorted(dense, weight, monkeypatch):
    """The cut search's exact check numbers every batch's parts by order and candidate, so
    the groups reach the exact EMD sorted by (group, code) and it sorts nothing (a batch
    numbered by candidate needed an argsort); the classes stay t-close and the same as
    with the groups sorted by the EMD itself."""
    import sabre_pg.core.cut_search as CS
    from sabre_pg.synthetic import census
    qis, codes, dom = census(2_500, seed=9)
    monkeypatch.setattr(CS, "DENSE_LIMIT", dense)
    monkeypatch.setattr(CS, "DENSE_GAIN", 1 << 20)
    group, unsorted = X.group, []

    def watched(ec, codes_, counts, m):
        ec = np.asarray(ec)
        key = ec * m + np.asarray(codes_)
        unsorted.append(bool(len(key) > 1 and (np.diff(key) <= 0).any()))
        return group(ec, codes_, counts, m)

    monkeypatch.setattr(X, "group", watched)
    ec = refine(qis, codes, dom, 0.3, 4, emd_weight=weight)
    assert len(unsorted) > 10 and not any(unsorted)
    assert X.ordered_class_emds(ec, codes, np.ones(len(codes), dtype=np.int64), dom.m).violations(0.3, 4) == 0
    # the same classes when the groups come shuffled (the EMD sorts them itself)
    rng = np.random.default_rng(0)

    def shuffled(ec_, codes_, counts, m):
        perm = rng.permutation(len(ec_))
        return group(np.asarray(ec_)[perm], np.asarray(codes_)[perm], np.asarray(counts)[perm], m)

    monkeypatch.setattr(X, "group", shuffled)
    assert np.array_equal(ec, refine(qis, codes, dom, 0.3, 4, emd_weight=weight))
