"""Memory pages of the engine's arrays.

numpy asks the kernel for transparent huge pages (``madvise(MADV_HUGEPAGE)``) for every array
of 4 MB or more.  Where the kernel's THP mode is ``madvise`` (Debian 12's), each such array's
first touch then faults and zeroes 2 MB pages, and the engine makes and frees many short-lived
arrays of the table's size: measured at 1M rows ('refine', census-like data, t = 0.35,
k = 6), 8.70 s on average with huge pages against 7.93 s without (inside a backend, 3 runs
each; 8.8 s against 8.0 s in a plain interpreter, 7 runs each, and a smaller spread).
:func:`small_pages` turns numpy's advice off for a block and restores it after; where THP is
``always`` or ``never`` the advice changes nothing either way.
"""
from __future__ import annotations

import importlib
from contextlib import contextmanager


def _hugepage_setter():
    """numpy's ``_set_madvise_hugepage`` (it moved to ``numpy._core`` in numpy 2), or None."""
    for name in ("numpy._core.multiarray", "numpy.core.multiarray"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        setter = getattr(module, "_set_madvise_hugepage", None)
        if setter is not None:
            return setter
    return None


@contextmanager
def small_pages():
    """Inside the block, numpy does not advise huge pages for new arrays (the setting is the
    process's: it is restored when the block ends, also on an error)."""
    setter = _hugepage_setter()
    if setter is None:
        yield
        return
    before = setter(False)
    try:
        yield
    finally:
        setter(before)
