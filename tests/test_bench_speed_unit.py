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
