"""SABRE_W (§5): the paper's Example 8 scripted, the three cases, and the guarantees of
Theorem 6 as properties over random streams, each class checked with the exact EMD."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sabre_pg.core import exact_emd as X
from sabre_pg.core import window as W
from sabre_pg.core.hierarchy import Hierarchy
from sabre_pg.core.sabre import QuasiIdentifier

A, B = 0, 1                         # SA leaves of a flat hierarchy (equal distance)
FLAT = Hierarchy.flat(["A", "B"], name="sa")


def scripted(classes_by_first_row):
    """A DIRECT partition that forms the given classes of row numbers (QI 'row' holds each
    row's number); keyed by the smallest unpublished row of the call."""
    def partition(qis, codes, domain, budget, k):
        rows = np.asarray(qis[0].values, dtype=np.int64)
        classes = classes_by_first_row[int(rows.min())]
        label = {r: c for c, members in enumerate(classes) for r in members}
        assert sorted(label) == sorted(rows.tolist()), (sorted(label), rows.tolist())
        return np.array([label[r] for r in rows.tolist()]), len(classes)
    return partition


def example8_stream():
    """20 rows, I = 2, omega = 8 (j = 4); rows 7, 9 and 10 carry A, the rest B."""
    rows = np.arange(1, 21)
    sa = np.where(np.isin(rows, [7, 9, 10]), A, B)
    return [QuasiIdentifier("row", rows.astype(float))], sa


def test_example_8():
    """W1 DIRECT, W2 DIRECT, W3 skips (its expiring rows went out with W1's classes), W4 is
    INDIRECT (the unpublished rows of W4 lack the A of rows 9 and 10, D = 5/24 >= t) and
    publishes S_G^2, W5 skips, W6 starts from scratch with D = 0."""
    qis, sa = example8_stream()
    partition = scripted({
        1: [[1, 5], [2, 6], [3, 4, 7, 8]],                 # W1 = rows 1..8: publish {1,5}, {2,6}
        3: [[3, 9], [4, 10], [7, 8]],                      # W2 = rows 3..10: S_G^2 = {7, 8}
        11: [[11, 12, 13, 14], [15, 16, 17, 18]],          # W6 = rows 11..18
    })
    run = W.StreamRun(qis, sa, 8, 2, t=0.2, k=2, hierarchy=FLAT, partition=partition)
    log = run.run()
    assert [a.case for _, a in log] == [W.DIRECT, W.DIRECT, W.SKIP, W.INDIRECT, W.SKIP, W.DIRECT]
    assert [a.d for _, a in log] == [0, Fraction(1, 8), None, Fraction(5, 24), None, 0]

    groups = []
    for n, a in log:
        if a.publication is None:
            groups.append(None)
            continue
        first = W.window_of(n, 8, 2).first
        rows = first + a.publication.rows
        groups.append(sorted(sorted(rows[a.publication.ec == c].tolist()) for c in range(a.publication.n_classes)))
    assert groups[0] == [[1, 5], [2, 6]]
    assert groups[1] == [[3, 9], [4, 10]]
    assert groups[3] == [[7, 8]]
    assert log[3][1].publication.window == W.Window(3, 8, 2)      # generated from W2
    assert groups[5] == [[11, 12, 13, 14]]
    assert run.published[:14].all() and not run.published[14:].any()
    assert log[3][1].publication.emds.tolist() == [0.125]         # {A, B} against W2's 3/8 A


def test_case_1_needs_every_expiring_row_published():
    qis, sa = example8_stream()
    window = W.Window(1, 8, 2)
    published = np.array([True, True] + [False] * 6)
    result = W.advance(window, [QuasiIdentifier("row", np.arange(1.0, 9))], sa[:8],
                       W.SADomain("categorical", hierarchy=FLAT), published, W.SG.empty(8), 0.2, 2)
    assert result.case == W.SKIP and result.publication is None and result.d is None


def test_indirect_without_sg_is_refused():
    """Theorem 5 as a checked invariant: a state where D >= t but S_G does not hold the
    expiring unpublished rows is inconsistent."""
    sa = np.array([A, A, B, B, B, B, B, B])
    published = np.array([False, False, True, True, False, False, False, False])
    with pytest.raises(ArithmeticError, match="Theorem 5"):
        W.advance(W.Window(1, 8, 2), [QuasiIdentifier("x", np.arange(8.0))], sa,
                  W.SADomain("categorical", hierarchy=FLAT), published,
                  W.SG.empty(8), 0.05, 1)


def test_budget_is_below_t_minus_d():
    for t, d in [(0.3, Fraction(1, 10)), (1.0, Fraction(0)), (0.2, Fraction(1, 7))]:
        b = W.budget(t, d)
        assert 0 < b and Fraction(b) < Fraction(t) - d


@pytest.mark.parametrize("args, message", [
    ((10, 3, 1), "not a multiple"), ((10, 5, 6), "smaller than k"), ((0, 5, 1), "window_size"),
    ((10, 0, 1), "step"), ((10, 5, 0), "k must"),
])
def test_check_window(args, message):
    with pytest.raises(ValueError, match=message):
        W.check_window(*args)


def test_rows_needed_and_ready():
    assert W.rows_needed(1, 20, 5) == 25 and W.rows_needed(3, 20, 5) == 35
    assert W.advances_ready(24, 0, 20, 5) == 0 and W.advances_ready(35, 0, 20, 5) == 3
    assert W.advances_ready(35, 2, 20, 5) == 1


def test_shifting_sa_forces_indirect_after_direct():
    """An SA whose distribution shifts (10% B, then 90% B) leaves a window's unpublished rows
    far from the window (Case 3): S_G is published; every guarantee still holds."""
    rng = np.random.default_rng(1)
    n = 3000
    sa = (rng.random(n) < np.where(np.arange(n) < 1200, 0.1, 0.9)).astype(np.int64)
    age = rng.integers(17, 90, n).astype(float)
    run = W.StreamRun([QuasiIdentifier("age", age)], sa, 800, 100, t=0.15, k=5, hierarchy=FLAT)
    log = run.run()
    cases = [a.case for _, a in log]
    assert W.INDIRECT in cases and cases.index(W.DIRECT) < cases.index(W.INDIRECT)
    indirect = log[cases.index(W.INDIRECT)][1]
    assert indirect.d >= Fraction(0.15) and indirect.publication.window.first < W.window_of(
        cases.index(W.INDIRECT) + 1, 800, 100).first
    check_guarantees(run, log)


def check_guarantees(run: W.StreamRun, log):
    """Theorem 6, checked independently: every row published exactly once and by its expiry;
    every class >= k rows and within t of its generating window (exact EMD over that window's
    own values); INDIRECT only after a DIRECT, never twice in a row (Lemmas 3-4)."""
    times = np.zeros(len(run.sa), dtype=np.int64)                 # advances publishing each row
    when = np.zeros(len(run.sa), dtype=np.int64)
    previous = None
    for n, a in log:
        window = W.window_of(n, run.window_size, run.step)
        if a.case == W.INDIRECT:
            assert previous == W.DIRECT or any(x.case == W.DIRECT for _, x in log[:n - 1])
            assert previous != W.INDIRECT
        if a.case != W.SKIP:
            previous = a.case
        if a.publication is None:
            continue
        p = a.publication
        rows = window.first - 1 + p.rows                           # 0-based stream positions
        times[rows] += 1
        when[rows] = n
        g = p.window
        generating = np.arange(g.first - 1, g.last)
        assert np.isin(rows, generating).all()
        _, codes, domain = run.window_data(g)
        labels = np.full(g.size, -1, dtype=np.int64)
        labels[rows - (g.first - 1)] = p.ec
        exact = _exact(codes, labels + 1, domain)                  # class 0: the rest of the window
        mine = exact.class_ids > 0
        assert (exact.sizes[mine] >= run.k).all()
        assert not exact.exceeds(run.t)[mine].any()
        assert np.allclose(exact.emd[mine], p.emds)
    expired = min(len(run.sa), (run.done) * run.step)
    assert (times <= 1).all()
    assert (times[:expired] == 1).all()
    # the row numbered r (0-based) expires at advance r // I + 1
    expiry = np.arange(len(run.sa)) // run.step + 1
    assert (when[:expired] <= expiry[:expired]).all()


def _exact(codes, labels, domain):
    ones = np.ones(len(codes), dtype=np.int64)
    if domain.numerical:
        return X.ordered_class_emds(labels, codes, ones, domain.m)
    return X.hierarchical_class_emds(labels, codes, ones, domain.hierarchy)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2 ** 31), j=st.integers(1, 5), step=st.integers(2, 30),
       extra=st.integers(0, 6), t=st.sampled_from([0.05, 0.1, 0.2, 0.35, 0.6]),
       k=st.integers(1, 4), numerical=st.booleans(), drift=st.booleans())
def test_guarantees_on_random_streams(seed, j, step, extra, t, k, numerical, drift):
    rng = np.random.default_rng(seed)
    k = min(k, step)
    omega = j * step
    n = omega + step * (2 + extra) + int(rng.integers(0, step))
    position = np.linspace(0, 1, n)
    if numerical:
        base = rng.integers(0, 12, n)
        sa = base + (np.round(position * 10).astype(np.int64) if drift else 0)
        hierarchy = None
    else:
        hierarchy = Hierarchy([["a1", "a", "*"], ["a2", "a", "*"], ["b1", "b", "*"], ["b2", "b", "*"]], name="h")
        p = np.where(rng.random(n) < (position if drift else 0.5), 2, 0)
        sa = p + rng.integers(0, 2, n)
    qis = [QuasiIdentifier("age", rng.integers(17, 90, n).astype(float)),
           QuasiIdentifier("zip", rng.integers(0, 100, n).astype(float))]
    run = W.StreamRun(qis, np.asarray(sa), omega, step, t=t, k=k, hierarchy=hierarchy)
    log = run.run()
    assert run.done == (n - omega) // step
    check_guarantees(run, log)
