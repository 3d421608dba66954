"""sabre_pg.bench.speed's report (issue 26): each method's run against the copy, its phases
against their floors, and the curve table; pure, no server."""
from __future__ import annotations

from sabre_pg.bench import speed


def record(method="refine", wall=10.0, partitions=None):
    return {"run_id": 1, "method": method, "rows": 1000, "classes": 100, "min_class_size": 6, "max_emd": 0.3,
            "ail": None, "seconds": wall - 0.5, "wall": wall, "cold_start": 0.1, "partitions": partitions,
            "phases": {"read": 1.0, "write_keys": 2.0, "total": wall - 0.5}, "load": 3.5,
            "mem_before": {"VmHWM": 50.0}, "mem_after": {"VmHWM": 700.4}}


def test_describe_reports_ratio_target_floors_and_parts():
    copy = {"wall": 2.0, "mem": {"VmHWM": 60.0}, "load": 3.0}
    text = speed.describe(1_000_000, record(), copy, {"read": 0.5, "write_keys": 1.0, "build_output_join": 4.0})
    assert "ratio 5.0   [target <= 5: OK]" in text and "one piece" in text
    assert "read 1.00/0.50 = 2.0x" in text and "write_keys 2.00/1.00 = 2.0x" in text and "VmHWM 700 MB" in text
    auto = speed.describe(1_000_000, record("ak", partitions={"parts": 5, "automatic": True}), copy)
    assert "[target <= 4: MISSED]" in auto and "5 parts (automatic)" in auto and "floor" not in auto


def test_curve_table_has_the_copy_beside_each_run():
    rows = [{"rows": 10_000_000, "method": "refine", "anonymize": record(partitions={"parts": 5, "automatic": True}),
             "copy": {"wall": 5.0, "mem": None, "load": 1.0}, "ratio": 2.0}]
    table = speed.curve_table(rows).splitlines()
    assert table[0].startswith("| rows | method | run (s) | copy (s) |")
    assert table[2] == "| 10,000,000 | refine | 10.00 | 5.00 | 2.0 | 700 | n/a | 5 | 3.5 |"


def test_the_floor_bound_takes_each_io_phase_at_its_floor_or_below():
    r = record("ak", wall=6.0)
    r["phases"] = {"read": 1.0, "write_keys": 2.0, "check": 0.2, "takeout": 0.5, "total": 5.5}
    copy = {"wall": 0.5, "mem": None, "load": 1.0}
    floor = {"read": 0.6, "write_keys": 0.25, "check": 0.5, "build_output_join": 1.0}
    b = speed.floor_bound(1_000_000, r, copy, floor)
    # read and write_keys at their floors, check at what it took (below its floor); the rest of
    # the wall time (6.0 - 3.2 s of I/O) as it ran
    assert abs(b["io"] - (0.6 + 0.25 + 0.2)) < 1e-9 and abs(b["rest"] - 2.8) < 1e-9
    assert abs(b["bound"] - 3.85) < 1e-9 and abs(b["ratio"] - 7.7) < 1e-9
    assert abs(b["budget"] - (4.0 * 0.5 - 1.05)) < 1e-9            # 'ak': 4x the copy
    text = speed.describe(1_000_000, r, copy, floor)
    assert "every I/O phase at its floor: 1.05 s (2.1x the copy) + the rest as run 2.80 s = 3.85 s (7.7x)" in text
    assert "at the target the rest would have 0.95 s" in text
    assert speed.floor_bound(100_000, r, copy, floor)["budget"] is None          # no target below 1M
    assert speed.floor_bound(1_000_000, record("mondrian"), copy, floor)["budget"] is None
    parts = record(partitions={"parts": 5, "automatic": True})
    assert speed.floor_bound(1_000_000, parts, copy, floor) is None and speed.floor_bound(1_000_000, r, copy, None) is None
    assert "every I/O phase" not in speed.describe(1_000_000, parts, copy, floor)
