"""sabre_pg.bench.speed reports the run's backend CPU (branch io26): read from /proc/<pid>/stat
(utime + stime), shown beside the wall time, 'n/a' when the server is not local; no server."""
from __future__ import annotations

import os

from sabre_pg.bench import speed
from tests.test_bench_speed_unit import record


def test_proc_cpu_of_this_process_and_of_none():
    before = speed.proc_cpu(os.getpid())
    sum(i * i for i in range(200_000))                  # spend some CPU
    after = speed.proc_cpu(os.getpid())
    assert before is not None and after >= before >= 0
    assert speed.proc_cpu(2 ** 22 + 12345) is None       # above pid_max's default: no such process


def test_describe_shows_backend_cpu():
    copy = {"wall": 2.0, "mem": None, "load": 1.0}
    assert "backend CPU 7.25 s" in speed.describe(1_000_000, dict(record(), cpu=7.25), copy)
    assert "backend CPU n/a" in speed.describe(1_000_000, record(), copy)
