"""``bench_db.py`` / ``sabre-pg bench --speed`` end to end on a small table (issue 26): a plain call
per method against a copy, each I/O phase against its floor, and the bound those floors set;
nothing of the measurement (copies, floors) is left behind.  The speed itself is measured by
the benchmark, not here."""
from __future__ import annotations

import psycopg

from sabre_pg.bench import speed

ROWS = 3000


def test_speed_reports_the_run_its_floors_and_their_bound(pg_dsn):
    lines = []
    try:
        results = speed.run_speed(pg_dsn, [ROWS], methods=("refine", "ak"), echo=lines.append)
        assert [r["method"] for r in results] == ["refine", "ak"]
        for x in results:
            r, floor, bound = x["anonymize"], x["floors"], x["bound"]
            assert r["rows"] == ROWS and r["min_class_size"] >= speed.K and r["max_emd"] <= speed.T + 1e-9
            assert x["ratio"] == r["wall"] / x["copy"]["wall"] > 0
            assert set(speed.IO_PHASES) | {"build_output_join"} <= set(floor) and min(floor.values()) > 0
            io = [p for p in speed.IO_PHASES if p in r["phases"]]
            assert {"read", "write_keys", "build_classes", "build_output", "check"} <= set(io)
            # each I/O phase at its floor or at what it took, if less; the rest of the wall as run
            assert abs(bound["io"] - sum(min(r["phases"][p], floor[p]) for p in io)) < 1e-6
            assert abs(bound["rest"] - (r["wall"] - sum(r["phases"][p] for p in io))) < 1e-6
            assert bound["bound"] <= r["wall"] + 1e-6 and bound["budget"] is None     # no target below 1M
        text = "\n".join(lines)
        assert text.count("every I/O phase at its floor:") == 2 and text.count("phase / its floor:") == 2
        with psycopg.connect(pg_dsn) as conn:
            left = conn.execute("SELECT relname FROM pg_class WHERE relname LIKE 'bench\\_copy\\_tmp%' "
                                "OR relname LIKE 'bench\\_floor\\_tmp%'").fetchall()
        assert left == []
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            table = f"bench_census_{ROWS}"
            for (out,) in conn.execute("SELECT DISTINCT output_name FROM sabre.runs WHERE output_name LIKE %s",
                                       (f"%{table}%",)).fetchall():
                named = [out[:-1] + suffix + '"' if out.endswith('"') else out + suffix
                         for suffix in ("", "_classes", "_keys")]
                conn.execute("DROP TABLE IF EXISTS %s" % ", ".join(named))
            conn.execute(f"DROP TABLE IF EXISTS public.{table}")
            for (name,) in conn.execute("SELECT name FROM sabre.hierarchies WHERE name LIKE %s",
                                        (f"{table}\\_%",)).fetchall():
                conn.execute("SELECT sabre.sabre_drop_hierarchy(%s)", (name,))
            assert conn.execute("SELECT count(*) FROM pg_class WHERE relname LIKE %s",
                                (f"{table}%",)).fetchone()[0] == 0
