"""The 'window' engine of SABRE_W (issue #28, docs/streams.md "Engines"): each published class
is formed among the rows of its generating window, checked here again by the exact EMD against
that window (not the engine's own figures), has >= k rows, every row is published exactly once
by its expiry; and its AIL is not above a tumbling run of the default method over the same
rows in blocks of omega (the old 'refine' engine's was)."""
from __future__ import annotations

import numpy as np
import pytest

from sabre_pg.core import metrics
from sabre_pg.core import window as W
from sabre_pg.core.emd import SADomain
from sabre_pg.core.generalize import ECIndex
from sabre_pg.core.hierarchy import Hierarchy
from sabre_pg.core.sabre import QuasiIdentifier, anonymize, generalize_classes
from sabre_pg.synthetic import census
from tests.core.test_window_refine import stream

OMEGA, STEP, K = 1600, 400, 5


def window_run(qis, sa, t, hierarchy=None, omega=OMEGA, step=STEP, k=K):
    run = W.StreamRun(qis, sa, omega, step, t, k, hierarchy=hierarchy, partition=W.sabre_partition("refine"),
                      defer=True)
    return run, run.run()


def labels_of(log, n, omega=OMEGA, step=STEP):
    """Per stream row its published class (ids unique across advances), -1 if unpublished;
    and per class its generating window."""
    labels, windows = np.full(n, -1, dtype=np.int64), []
    for a, adv in log:
        p = adv.publication
        if p is None:
            continue
        window = W.window_of(a, omega, step)
        rows = window.first - 1 + p.rows
        assert (labels[rows] == -1).all(), "a row published twice"
        labels[rows] = p.ec + len(windows)
        windows += [p.window] * p.n_classes
    return labels, windows


@pytest.mark.parametrize("seed, shift, t, categorical", [(0, False, 0.2, False), (1, True, 0.1, False),
                                                        (2, False, 0.15, True), (3, True, 0.3, True)])
def test_every_class_is_t_close_to_its_generating_window(seed, shift, t, categorical):
    n = 6000
    qis, sa = stream(seed, n=n, shift=shift)
    h = Hierarchy([[str(v), "lo" if v < 5 else "hi", "*"] for v in range(9)]) if categorical else None
    run, log = window_run(qis, sa, t, hierarchy=h)
    labels, windows = labels_of(log, n)
    expired = W.window_of(len(log), OMEGA, STEP).first + STEP - 1
    assert (labels[:expired] >= 0).all()                     # every expired row published
    for c, window in enumerate(windows):
        rows = np.flatnonzero(labels == c)
        assert len(rows) >= K
        assert window.first - 1 <= rows.min() and rows.max() <= window.last - 1
        in_window = np.zeros(window.size, dtype=np.int64)
        in_window[rows - (window.first - 1)] = 1
        span = slice(window.first - 1, window.last)
        if h is None:
            codes, m = W.window_codes(sa[span])
            domain = SADomain("numerical", m=m)
        else:
            codes, domain = sa[span], SADomain("categorical", hierarchy=h)
        exact = W.class_emds(codes, in_window, domain)
        assert not exact.exceeds(t)[exact.class_ids == 1].any()


def test_deferred_advances_publish_only_classes_of_the_last_partition():
    """A DIRECT happens only on a window none of whose rows is published (D = 0); the other
    advances publish classes of that DIRECT's window (case 3) or nothing (case 1)."""
    qis, sa = stream(4, n=6000)
    run, log = window_run(qis, sa, 0.2)
    direct = [a for a, adv in log if adv.case == W.DIRECT]
    assert direct[:3] == [1, 5, 9]
    for a, adv in log:
        if adv.case == W.DIRECT:
            assert adv.d == 0
        elif adv.case == W.INDIRECT:
            d = max(x for x in direct if x < a)
            assert adv.publication.window == W.window_of(d, OMEGA, STEP)


def ail(qis, labels):
    """AIL of the published rows' classes (ids in ``labels``, -1: not published), as
    sabre_anonymize reports it, over the QIs of the published rows."""
    shown = labels >= 0
    ids, ec = np.unique(labels[shown], return_inverse=True)
    index = ECIndex(ec, len(ids))
    sub = [QuasiIdentifier(q.name, np.asarray(q.values)[shown], q.hierarchy) for q in qis]
    return metrics.ail(generalize_classes(sub, index)[1], index.sizes)


def tumbling(qis, sa, rows, t, block=OMEGA, k=K):
    """The default method on each block of ``block`` rows alone, the first ``rows`` rows."""
    labels, offset = np.full(len(sa), -1, dtype=np.int64), 0
    for b in range(rows // block):
        span = slice(b * block, (b + 1) * block)
        codes, m = W.window_codes(sa[span])
        part = [QuasiIdentifier(q.name, np.asarray(q.values)[span], q.hierarchy) for q in qis]
        result = anonymize(part, codes, SADomain("numerical", m=m), t, k, method="refine", with_emds=False)
        labels[span] = result.ec + offset
        offset += result.n_classes
    return labels


@pytest.mark.parametrize("t", [0.1, 0.35])
def test_window_engine_is_not_coarser_than_tumbling_omega_with_the_default_method(t):
    """On a seeded census-like table the stream's classes (window engine) have an AIL at or
    below the tumbling-omega default-method run over the same rows; the 'refine' engine (searched
    cuts on the unpublished rows at every DIRECT) stays above it."""
    qis, sa, _ = census(4800, seed=5)
    run, log = window_run(qis, sa, t)
    labels, _ = labels_of(log, len(sa))
    published = int((labels >= 0).sum())
    assert published % OMEGA == 0
    base = ail(qis, tumbling(qis, sa, published, t))
    assert ail(qis, labels) <= base + 1e-12
    old = W.StreamRun(qis, sa, OMEGA, STEP, t, K, partition=W.refine_partition())
    old_labels, _ = labels_of(old.run(), len(sa))
    old_labels[published:] = -1                  # the same rows
    assert ail(qis, old_labels) > base
