"""Every script in benchmarks/ imports (issue 28 audit): bench_estimate.py, which measures the
estimate's accuracy and ``stable``'s calibration that docs/estimate.md states, and
bench_scale.py still imported ``ensure_table`` from bench_db after it moved to
sabre_pg.bench.speed, so they failed before doing anything.  Each script is loaded as a module
(its ``main`` does not run), in a subprocess so that their sys.path changes stay there."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"

LOAD = """
import importlib.util, sys
failed = []
for path in sys.argv[1:]:
    spec = importlib.util.spec_from_file_location("bench_" + path.rsplit("/", 1)[-1][:-3], path)
    try:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    except Exception as e:
        failed.append("%s: %r" % (path, e))
print("\\n".join(failed))
sys.exit(1 if failed else 0)
"""


def test_every_benchmark_script_imports():
    scripts = sorted(str(p) for p in BENCHMARKS.glob("*.py"))
    assert any(s.endswith("bench_estimate.py") for s in scripts)
    done = subprocess.run([sys.executable, "-c", LOAD, *scripts], capture_output=True, text=True,
                          cwd=BENCHMARKS, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
