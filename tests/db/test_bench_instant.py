"""``sabre-pg bench --quick --instant`` runs end to end and its results hold their guarantees."""
from __future__ import annotations

import json

import psycopg

from sabre_pg import cli


def test_bench_instant_quick(pg_dsn, tmp_path):
    out = tmp_path / "bench-out"
    assert cli.main(["bench", "--dsn", pg_dsn, "--out", str(out), "--quick", "--instant"]) == 0
    doc = json.loads((out / "instant.json").read_text())
    assert {r["sweep"] for r in doc["runs"]} == {"k", "N", "d", "l"}
    for r in doc["runs"]:
        exact = r["methods"]["exhaustive"]
        for method in ("instant", "instant+mcv", "instant+expr", "instant@0.8"):
            m = r["methods"][method]
            # the exhaustive search is the optimum over the same lattice and LM
            assert m["lm"] >= exact["lm"] - 1e-9 and m["scans"] < exact["scans"]
    assert "## Targets" in (out / "instant.md").read_text() and "| instant+expr |" in (out / "instant.md").read_text()
    with psycopg.connect(pg_dsn) as conn:             # outputs dropped, sources kept
        left = conn.execute("SELECT relname FROM pg_class WHERE relname LIKE 'bench\\_census\\_%\\_%' "
                            "AND relkind = 'r'").fetchall()
    assert left == []
