"""The package as users get it: ``python -m build`` makes an sdist and, from it, a wheel that
carries the SQL and PL/Python sources; the wheel, installed into a fresh venv outside the
checkout, installs, checks and demos sabre-pg on the test cluster (docs/packaging.md).

The venv gets only the wheel (``pip install --no-deps --no-index``); its dependencies come
from this interpreter's site-packages through a ``.pth`` line, which puts that folder on
``sys.path`` without running its ``.pth`` files, so an editable install of the checkout
there is not seen.  The test asserts that sabre_pg is imported from the venv.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO_DIR = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "sabre_pg", "sql", "plpython", "docs")

pytestmark = pytest.mark.packaging


def _run(cmd, cwd, timeout=300, env=None):
    res = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                         env=env)
    assert res.returncode == 0, f"{cmd}\n{res.stdout}\n{res.stderr}"
    return res.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    """(sdist, wheel) built from a copy of the checkout (the build writes nothing into it)."""
    root = tmp_path_factory.mktemp("build")
    src = root / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "_sql", "_plpython")
    for name in SOURCES:
        path = REPO_DIR / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=ignore)
        else:
            shutil.copy2(path, src / name)
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", root / "dist", src], cwd=root)
    (sdist,), (wheel,) = (root / "dist").glob("*.tar.gz"), (root / "dist").glob("*.whl")
    return sdist, wheel


def test_sdist_and_wheel_carry_the_sources(dist):
    sdist, wheel = dist
    sql = sorted(p.name for p in (REPO_DIR / "sql").glob("*.sql"))
    plpython = sorted(p.relative_to(REPO_DIR / "plpython").as_posix()      # subfolders too
                      for p in (REPO_DIR / "plpython").rglob("*.py") if "__pycache__" not in p.parts)
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {f"sql/{f}" for f in sql} <= names and {f"plpython/{f}" for f in plpython} <= names
    assert "setup.py" in names and "MANIFEST.in" in names
    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())
        metadata = next(whl.read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
        for f in sql:
            assert whl.read(f"sabre_pg/_sql/{f}") == (REPO_DIR / "sql" / f).read_bytes()
        for f in plpython:
            assert whl.read(f"sabre_pg/_plpython/{f}") == (REPO_DIR / "plpython" / f).read_bytes()
    assert not any(n.startswith(("sql/", "plpython/", "tests/")) for n in names)
    assert "License-Expression: Apache-2.0" in metadata
    for extra in ("api", "bench", "test", "progress"):
        assert f"Provides-Extra: {extra}" in metadata


def test_wheel_in_a_fresh_venv_installs_checks_and_demos(dist, pg_dsn, tmp_path):
    venv, work = tmp_path / "venv", tmp_path / "work"
    work.mkdir()
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=work)
    python = venv / "bin" / "python"
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=work).strip())
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "_sabre_test_deps.pth").write_text("\n".join(sorted(deps)) + "\n")
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps", "--no-index",
          dist[1]], cwd=work)

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DATABASE_URL")}
    where = _run([python, "-c", "import sabre_pg, sabre_pg.installer as i; "
                  "print(sabre_pg.__file__); print(i.SQL_DIR); print(i.PLPYTHON_DIR)"], cwd=work, env=env).split()
    assert all(Path(w).is_relative_to(venv) for w in where), where
    assert where[1].endswith("sabre_pg/_sql") and where[2].endswith("sabre_pg/_plpython")

    cli = venv / "bin" / "sabre-pg"
    assert "installed in schema sabre" in _run([cli, "install", "--dsn", pg_dsn], cwd=work, env=env)
    report = _run([cli, "check", "--dsn", pg_dsn], cwd=work, env=env)
    assert "tampered" in report and "ok" in report
    out = _run([cli, "demo", "--dsn", pg_dsn, "--rows", "2000"], cwd=work, env=env)
    assert "verify:" in out and "0 violations" in out and "-> OK" in out
