"""Compiled loops of the cut search's rounds (issue 26, "the core"): optional, with numba.

Each function here is plain Python over numpy arrays, written as one sequential pass, and
computes exactly what the numpy code of :mod:`.cut_search` computes (the classes are the
same bit for bit: ``tests/core/test_refine_identity.py``).  numba compiles them when it is
importable and the table is large enough to pay for it (:func:`for_rows`); otherwise the
cut search keeps its numpy code.  :func:`status` says which path runs.

The compiled code is cached on disk only in a directory that is the process user's own
(mode 0700, not a symbolic link; :func:`cache_dir`): numba's cache holds pickles, so a cache
another OS user could write would run their code as this process's user.  The directory is
``$SABRE_NUMBA_CACHE`` or one set by :func:`configure` (the server: ``sabre_numba_cache``
in the data directory, ``plpython/shared/kernel_cache.py``), else ``~/.cache/sabre-pg-numba``;
where none is usable, every process compiles again (seconds) and caches nothing.  Entries are
keyed by the hash of this module's source (its file may not exist: in the server the module
is loaded from the database), numba's version and the function's bytecode.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import stat
import sys
import threading

import numpy as np

__all__ = ["for_rows", "status", "configure", "cache_dir", "MIN_ROWS"]

MIN_ROWS = 500_000      # tables of at least this many rows are searched with the compiled loops
                        # (fresh process, warm cache: 100k loses 0.2-0.5 s CPU, 300k breaks even,
                        # 1M saves 2.1-2.4 s of 10; docs/evaluation.md)
ENV_DISABLE = "SABRE_NUMBA"          # "0": never compile (the numpy code runs)
ENV_CACHE = "SABRE_NUMBA_CACHE"      # the cache directory


# --- the kernels (plain Python; compiled by numba when it is there) ---------------------------
# Results of one call share one allocation: two fresh arrays of millions of rows each cost
# page faults on every call (glibc returns the second to the system on free), measured
# 32 ms against 1.8 ms for one (2 x n) array at 1M rows under load.

def split_order(o, owner, right, sizes, n_left, new_owner, keep):
    """:func:`.cut_search._split_segments` for one order: each partition's segment (``sizes[q]``
    rows, in partition order) split stably, rows with ``right[row] == 0`` first; returns the
    rows and their new partitions ``new_owner[2 q + side]``, without the rows of new
    partitions that are not ``keep`` (the next round's filter, done here)."""
    n = len(o)
    both = np.empty((2, n), np.int64)
    out, out_owner = both[0], both[1]
    i = w = 0
    while i < n:
        q = owner[i]
        end = i + sizes[q]
        id_left, id_right = new_owner[2 * q], new_owner[2 * q + 1]
        keep_left, keep_right = keep[id_left], sizes[q] > n_left[q] and keep[id_right]
        left, rt = w, w + (n_left[q] if keep_left else 0)
        if keep_left or keep_right:
            for x in range(i, end):
                row = o[x]
                if right[row]:
                    if keep_right:
                        out[rt] = row
                        out_owner[rt] = id_right
                        rt += 1
                elif keep_left:
                    out[left] = row
                    out_owner[left] = id_left
                    left += 1
        w += (n_left[q] if keep_left else 0) + (sizes[q] - n_left[q] if keep_right else 0)
        i = end
    return out[:w], out_owner[:w]


def keep_rows(o, owner, keep):
    """The rows of ``o`` (and their ``owner``) whose partition has ``keep[owner]``, in order
    (``o`` and ``owner`` themselves when they all have)."""
    n = len(o)
    c = 0
    for x in range(n):
        if keep[owner[x]]:
            c += 1
    if c == n:
        return o, owner
    both = np.empty((2, c), np.int64)
    out, out_owner = both[0], both[1]
    c = 0
    for x in range(n):
        q = owner[x]
        if keep[q]:
            out[c] = o[x]
            out_owner[c] = q
            c += 1
    return out, out_owner


def segment_minmax(block, rows, idx, bounds):
    """(lo, hi), each (d x segments): ``np.minimum/maximum.reduceat(block[rows[idx]], bounds)``
    per column (a segment whose bound is not below the next one is its first element).  One
    column at a time, in registers (1.3x the speed of all columns per row, 1M rows)."""
    nb, d, n = len(bounds), block.shape[1], len(idx)
    both = np.empty((2, d, nb), np.int64)
    for s in range(nb):
        a = bounds[s]
        b = max(bounds[s + 1] if s + 1 < nb else n, a + 1)
        for i in range(d):
            lo = block[rows[idx[a]], i]
            hi = lo
            for x in range(a + 1, b):
                v = block[rows[idx[x]], i]
                lo = min(lo, v)
                hi = max(hi, v)
            both[0, i, s] = lo
            both[1, i, s] = hi
    return both[0], both[1]


def cut_ranges(lo, hi, group, at):
    """(4 x d x cuts): the smallest and largest code of every QI left of each cut (segments of
    its partition before ``at``) and right of it (from ``at`` on); segments ``lo``/``hi``
    (d x segments) of partitions ``group`` (non-decreasing): the running minima and maxima of
    :meth:`.cut_search._SortedPartitions._scores`, restarted at every partition."""
    d, nb = lo.shape
    nc = len(at)
    out = np.empty((4, d, nc), np.int64)
    run = np.empty((2, nb), np.int64)
    for i in range(d):
        for s in range(nb):                     # prefix: left parts
            if s == 0 or group[s] != group[s - 1]:
                run[0, s], run[1, s] = lo[i, s], hi[i, s]
            else:
                run[0, s] = min(run[0, s - 1], lo[i, s])
                run[1, s] = max(run[1, s - 1], hi[i, s])
        for c in range(nc):
            out[0, i, c] = run[0, at[c] - 1]
            out[1, i, c] = run[1, at[c] - 1]
        for s in range(nb - 1, -1, -1):         # suffix: right parts
            if s == nb - 1 or group[s] != group[s + 1]:
                run[0, s], run[1, s] = lo[i, s], hi[i, s]
            else:
                run[0, s] = min(run[0, s + 1], lo[i, s])
                run[1, s] = max(run[1, s + 1], hi[i, s])
        for c in range(nc):
            out[2, i, c] = run[0, at[c]]
            out[3, i, c] = run[1, at[c]]
    return out


def part_counts(starts, sizes, pos, strat, strat_left, rows, codes, m):
    """(group, code, count), sorted by (group, code), of the two parts (group 2c: left, 2c + 1:
    right) of every candidate c cutting the segment ``starts[c] .. + sizes[c]`` at ``pos[c]``
    (or, ``strat[c]``, by ``strat_left``): :meth:`.cut_search._SortedPartitions.local_groups`."""
    n_c = len(starts)
    cap = 0
    for c in range(n_c):
        cap += min(sizes[c], 2 * m)
    out = np.empty((3, cap), np.int64)
    group, code, count = out[0], out[1], out[2]
    hist = np.zeros(2 * m, np.int64)
    k = 0
    for c in range(n_c):
        a = starts[c]
        for at in range(sizes[c]):
            x = a + at
            if strat[c]:
                r = 0 if strat_left[x] else 1
            else:
                r = 1 if at >= pos[c] else 0
            hist[r * m + codes[rows[x]]] += 1
        for g in range(2 * m):
            h = hist[g]
            if h:
                group[k] = 2 * c + g // m
                code[k] = g % m
                count[k] = h
                hist[g] = 0
                k += 1
    return group[:k], code[:k], count[:k]


def mark_right(right, starts, sizes, pos, strat, strat_left, rows):
    """``right[row]`` of every row of the segments ``starts[c] .. + sizes[c]``: whether it goes
    right in the cut (``pos[c]``, or ``strat[c]``: not ``strat_left``)
    (:meth:`.cut_search._SortedPartitions.members`)."""
    for c in range(len(starts)):
        a = starts[c]
        for at in range(sizes[c]):
            x = a + at
            if strat[c]:
                right[rows[x]] = 0 if strat_left[x] else 1
            else:
                right[rows[x]] = 1 if at >= pos[c] else 0


def relabel(part, right, has, new_id, n_parts):
    """(new partition of every row, right rows per old partition): ``new_id[part] + (has[part]
    and right)`` and ``bincount(part, weights=right)``."""
    n_right = np.zeros(n_parts, np.int64)
    out = np.empty(len(part), np.int64)
    for x in range(len(part)):
        q = part[x]
        r = right[x] != 0
        if r:
            n_right[q] += 1
        out[x] = new_id[q] + (1 if (has[q] and r) else 0)
    return out, n_right


KERNELS = ("split_order", "keep_rows", "segment_minmax", "cut_ranges", "part_counts", "mark_right",
           "relabel")


# --- compilation, cache, status ----------------------------------------------------------------

_lock = threading.Lock()
_compiled = None        # namespace of the compiled kernels, once made
_state = {"cache_dir": None, "configured": None, "error": None, "cached": None}


class _Kernels:
    """The compiled kernels as attributes."""


def configure(directory: str | None) -> None:
    """Use ``directory`` for the compiled code's cache (made with mode 0700 if missing); it is
    used only if :func:`cache_dir` finds it safe.  Must precede the first compilation."""
    _state["configured"] = directory


def _safe_dir(path: str) -> bool:
    """Whether ``path`` is a directory (not a symbolic link) owned by this process's user and
    writable by no one else, in a parent that no other user can write either."""
    try:
        st = os.lstat(path)
        parent = os.stat(os.path.dirname(os.path.abspath(path)))
    except OSError:
        return False
    uid = os.geteuid()
    return (stat.S_ISDIR(st.st_mode) and st.st_uid == uid and not st.st_mode & 0o077
            and parent.st_uid in (uid, 0) and not parent.st_mode & 0o022)


def cache_dir() -> str | None:
    """The directory of the on-disk cache (created 0700 if missing), or None when none is safe:
    ``$SABRE_NUMBA_CACHE``, else :func:`configure`'s, else ``$XDG_CACHE_HOME`` or
    ``~/.cache``, subdirectory ``sabre-pg-numba``."""
    path = os.environ.get(ENV_CACHE) or _state["configured"]
    if not path:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        path = os.path.join(base, "sabre-pg-numba")
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError:
        return None
    return path if _safe_dir(path) else None


def _source_hash() -> str:
    """sha256 of this module's source (from its loader: the database's in the server)."""
    spec = importlib.util.find_spec(__name__) if __spec__ is None else __spec__
    source = None
    if spec is not None and spec.loader is not None and hasattr(spec.loader, "get_source"):
        try:
            source = spec.loader.get_source(__name__)
        except (ImportError, OSError):
            source = None
    if source is None:
        with open(__file__, encoding="utf-8") as f:
            source = f.read()
    return hashlib.sha256(source.encode()).hexdigest()


def _locator_class(numba, directory, digest):
    """A numba cache locator for this module's functions: ``directory``/<source hash>."""
    from numba.core import caching

    class SabreLocator(caching._CacheLocator):
        def __init__(self, py_func):
            self._lineno = py_func.__code__.co_firstlineno
            self._path = os.path.join(directory, digest[:32])

        def ensure_cache_path(self):
            os.makedirs(self._path, mode=0o700, exist_ok=True)
            if not _safe_dir(self._path):
                raise OSError("unsafe numba cache directory %s" % self._path)

        def get_cache_path(self):
            return self._path

        def get_source_stamp(self):
            return digest

        def get_disambiguator(self):
            return str(self._lineno)

        @classmethod
        def from_function(cls, py_func, py_file):
            if getattr(py_func, "__module__", None) != __name__:
                return None
            self = cls(py_func)
            try:
                self.ensure_cache_path()
            except OSError:
                return None
            return self

    return SabreLocator


def _compile():
    """The compiled kernels (numba imported and the locator registered on first use), or None
    when numba is missing or fails."""
    global _compiled
    with _lock:
        if _compiled is not None or _state["error"] is not None:
            return _compiled
        try:
            import numba
            from numba.core import caching
        except Exception as e:          # not installed, or broken: the numpy code runs
            _state["error"] = "numba unavailable: %s" % e
            return None
        directory = cache_dir()
        cache = False
        if directory is not None:
            locator = _locator_class(numba, directory, _source_hash())
            caching.CacheImpl._locator_classes = [locator] + [
                c for c in caching.CacheImpl._locator_classes if c.__name__ != "SabreLocator"]
            cache = True
        _state["cache_dir"], _state["cached"] = directory, cache
        ns = _Kernels()
        for name in KERNELS:
            kernel = numba.njit(cache=cache, nogil=True)(globals()[name])
            # only our locator's directory: if it refused (numba then tries its own, e.g. a
            # __pycache__ beside the file or $NUMBA_CACHE_DIR), no cache at all
            if cache and os.path.dirname(kernel._cache.cache_path) != directory:
                kernel._cache = caching.NullCache()
            setattr(ns, name, kernel)
        _compiled = ns
        return ns


def for_rows(n: int):
    """The compiled kernels for a table of ``n`` rows, or None (the numpy code runs): None
    below :data:`MIN_ROWS` rows (the compilation would cost more than it saves), with
    ``SABRE_NUMBA=0``, or without numba."""
    if n < MIN_ROWS or os.environ.get(ENV_DISABLE) == "0":
        return None
    return _compile()


def status() -> dict:
    """Which path the cut search takes: ``compiled`` (numba importable and compiled),
    ``numba`` (its version or None), ``cache_dir`` (None: no on-disk cache), ``error``."""
    ns = _compile() if os.environ.get(ENV_DISABLE) != "0" else None
    numba = sys.modules.get("numba")
    return {"compiled": ns is not None, "numba": getattr(numba, "__version__", None),
            "cache_dir": _state["cache_dir"], "min_rows": MIN_ROWS, "error": _state["error"]}
