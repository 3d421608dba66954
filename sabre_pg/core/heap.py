"""The process keeps the memory it frees while the core works (glibc's malloc only).

The core makes many large temporary arrays (a row's worth of int64 per numpy operation).  By
default glibc gives a freed block of 128 KiB or more back to the kernel (``munmap``, or a trim
of the heap's top), so the next array of that size is new memory: the kernel maps and zeroes
it page by page.  On the virtual machines measured (docs/evaluation.md, "Speed of the core")
that costs about 20x the numpy operation itself (a cumulative sum of 1M rows into new memory:
24 ms; into memory the process had: 1.3 ms).  :func:`kept_heap` makes malloc serve every
block from its heap (``M_MMAP_MAX`` 0) and never trim it (``M_TRIM_THRESHOLD`` at its
largest) for the duration of the block; on leaving it restores glibc's defaults (128 KiB,
65536 mappings) and gives the free memory back at once (``malloc_trim(0)``).  The
high-water mark of the process is that of the arrays alive at once, as before; memory in
use is not changed.  Nested and concurrent uses (threads) count: the last one out restores.

Not glibc (e.g. musl, macOS): nothing is changed.  Nothing here changes a result."""
from __future__ import annotations

import contextlib
import ctypes
import threading

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4
DEFAULT_TRIM, DEFAULT_MMAP_THRESHOLD, DEFAULT_MMAP_MAX = 128 * 1024, 128 * 1024, 65536
KEEP_TRIM = 2 ** 31 - 1          # mallopt takes an int

_lock = threading.Lock()
_depth = 0
_libc = None


def _glibc():
    """glibc's mallopt and malloc_trim, or None when the C library has none."""
    global _libc
    if _libc is None:
        try:
            lib = ctypes.CDLL(None)
            lib.mallopt.argtypes, lib.mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
            lib.malloc_trim.argtypes, lib.malloc_trim.restype = (ctypes.c_size_t,), ctypes.c_int
            _libc = lib
        except (OSError, AttributeError):
            _libc = False
    return _libc or None


@contextlib.contextmanager
def kept_heap():
    """Inside the block, freed memory stays in the process for the next array (see the
    module); on leaving, glibc's defaults are back and the free memory is returned."""
    global _depth
    lib = _glibc()
    if lib is None:
        yield
        return
    with _lock:
        if _depth == 0:
            lib.mallopt(M_MMAP_MAX, 0)
            lib.mallopt(M_TRIM_THRESHOLD, KEEP_TRIM)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                lib.mallopt(M_MMAP_MAX, DEFAULT_MMAP_MAX)
                lib.mallopt(M_MMAP_THRESHOLD, DEFAULT_MMAP_THRESHOLD)
                lib.mallopt(M_TRIM_THRESHOLD, DEFAULT_TRIM)
                lib.malloc_trim(0)


def active() -> bool:
    """Whether a :func:`kept_heap` block is running (for tests)."""
    return _depth > 0
