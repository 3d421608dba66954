"""The compiled loops of the cut search (``sabre_pg.core.kernels``, issue 26): which path runs,
the same classes on both paths, and a cache directory no other OS user can write.

The project's .venv usually has no numba (the numpy code runs there); the server's Python
(/usr/bin/python3, Debian's python3-numba) does: the compiled path is checked in it, in a
subprocess, against the hashes pinned by test_refine_identity.py."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sabre_pg.core import kernels
from tests.core.test_refine_identity import ADULT, CENSUS

REPO = Path(__file__).resolve().parents[2]
SERVER_PYTHON = "/usr/bin/python3"


def has_numba(python: str) -> bool:
    return subprocess.run([python, "-c", "import numba"], capture_output=True).returncode == 0


def test_status_says_which_path_runs(monkeypatch):
    monkeypatch.delenv(kernels.ENV_DISABLE, raising=False)
    status = kernels.status()
    try:
        import numba  # noqa: F401
        present = True
    except ImportError:
        present = False
    assert status["compiled"] is present
    assert (status["error"] is None) is present
    print("kernels in this Python:", json.dumps(status))      # the suite says which path ran
    assert kernels.for_rows(kernels.MIN_ROWS - 1) is None     # small tables: always numpy
    monkeypatch.setenv(kernels.ENV_DISABLE, "0")
    assert kernels.for_rows(10 ** 9) is None and not kernels.status()["compiled"]


def test_cache_dir_must_be_private(tmp_path, monkeypatch):
    private = tmp_path / "private"
    monkeypatch.setenv(kernels.ENV_CACHE, str(private))
    assert kernels.cache_dir() == str(private)
    assert private.stat().st_mode & 0o777 == 0o700         # made 0700
    private.chmod(0o770)                                    # group-writable: refused
    assert kernels.cache_dir() is None
    private.chmod(0o700)
    link = tmp_path / "link"
    link.symlink_to(private)                                # a symbolic link: refused
    monkeypatch.setenv(kernels.ENV_CACHE, str(link))
    assert kernels.cache_dir() is None
    shared = tmp_path / "shared"                            # in a directory others can write
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv(kernels.ENV_CACHE, str(shared / "cache"))
    assert kernels.cache_dir() is None


SCRIPT = """
import hashlib, json, sys
from pathlib import Path
import numpy as np
sys.path.insert(0, sys.argv[1])
from sabre_pg.core import kernels
from sabre_pg.core.refine import refine
from sabre_pg.synthetic import adult, census
kernels.MIN_ROWS = 0
h = lambda ec: hashlib.sha256(np.ascontiguousarray(ec, dtype=np.int64).tobytes()).hexdigest()[:16]
out = {"status": kernels.status()}
qis, codes, dom = adult(Path(sys.argv[2]) / "adult")
out["adult"] = h(refine(qis, codes, dom, 0.2, 5))
qis, codes, dom = census(100_000, seed=1)
out["census"] = {t: h(refine(qis, codes, dom, 0.35, 6, threads=t)) for t in (1, 2)}
print(json.dumps(out))
"""


@pytest.mark.skipif(not os.path.exists(SERVER_PYTHON) or not has_numba(SERVER_PYTHON),
                    reason="the server's Python has no numba: only the numpy path exists here")
def test_compiled_path_makes_the_same_classes(shared_dir, tmp_path):
    env = dict(os.environ, SABRE_NUMBA_CACHE=str(tmp_path / "cache"))
    env.pop(kernels.ENV_DISABLE, None)
    done = subprocess.run([SERVER_PYTHON, "-c", SCRIPT, str(REPO), str(shared_dir)], env=env,
                          capture_output=True, text=True, check=True)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["status"]["compiled"] and out["status"]["cache_dir"] == str(tmp_path / "cache")
    assert out["adult"] == ADULT
    assert out["census"] == {"1": CENSUS[1], "2": CENSUS[2]}
    # the cache was written, privately
    files = list((tmp_path / "cache").rglob("*.nbi"))
    assert files and all(f.parent.stat().st_mode & 0o077 == 0 for f in files)
    shutil.rmtree(tmp_path / "cache")
