"""Where a backend caches the compiled loops of the cut search (``sabre_pg.core.kernels``).

numba's cache holds pickles that the next backend loads and runs, so it must be writable by
the server's OS user only.  A backend runs in the data directory (PostgreSQL changes into it
at start; it is the server user's, mode 0700): the cache is its subdirectory
``sabre_numba_cache`` (made with mode 0700; ``kernels.cache_dir`` refuses it if it is a
symbolic link, another user's, or writable by group or others).  ``$SABRE_NUMBA_CACHE`` in
the server's environment overrides it.  README.md, "Compiled loops (optional)".
"""
from __future__ import annotations

import os

from sabre_pg.core import kernels

CACHE_NAME = "sabre_numba_cache"


def configure() -> None:
    """Point the kernels' cache at ``<data directory>/sabre_numba_cache`` when the working
    directory is a data directory (it has ``PG_VERSION``); else leave the kernels' default."""
    here = os.getcwd()
    if os.path.isfile(os.path.join(here, "PG_VERSION")):
        kernels.configure(os.path.join(here, CACHE_NAME))
