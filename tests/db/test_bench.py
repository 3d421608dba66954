"""``sabre-pg bench --quick`` runs end to end against the test database and writes its files."""
from __future__ import annotations

import csv
import json

import psycopg

from sabre_pg import cli, peer

FIGURES = {"fig10", "fig11", "fig12", "fig13", "fig17", "fig18", "fig_peer"}


def test_bench_quick_writes_its_files(pg_dsn, tmp_path):
    out = tmp_path / "bench-out"
    assert peer.available(), "anonypyx (the Mondrian peer) is in the test extra and must be installed"
    assert cli.main(["bench", "--dsn", pg_dsn, "--out", str(out), "--quick"]) == 0
    # its outputs (with their classes and side tables) are dropped afterwards
    with psycopg.connect(pg_dsn) as conn:
        left = conn.execute("SELECT relname FROM pg_class WHERE relname LIKE 'bench\\_%' "
                            "AND relkind = 'r' AND relname NOT LIKE 'bench\\_census%'").fetchall()
    assert left == []

    doc = json.loads((out / "results.json").read_text())
    assert set(doc) == {"meta", "runs", "figures"}
    assert set(doc["figures"]) == FIGURES
    assert doc["meta"]["config"]["rows"] == 5000
    for fid, fg in doc["figures"].items():
        assert fg["title"] and fg["panels"]
        for p in fg["panels"]:
            assert {"name", "x", "xs", "y", "series"} <= set(p)
            for ys in p["series"].values():
                assert len(ys) == len(p["xs"])
    for r in doc["runs"]:
        assert {"method", "rows", "t", "k", "qis", "ail", "closeness", "classes", "violations",
                "seconds", "phases"} <= set(r)
        if r["method"] in ("ak", "knn"):
            assert r["violations"] == 0 and r["closeness"] <= r["t"] + 1e-9
            assert {"takeout", "total"} <= set(r["phases"])
    methods = {r["method"] for r in doc["runs"]}
    assert {"ak", "knn"} <= methods
    assert "mondrian" in methods
    assert "anonypyx" in doc["meta"]["peer"]
    fig17 = doc["figures"]["fig17"]["panels"]
    assert all(0 <= y < 100 for p in fig17 for ys in p["series"].values() for y in ys)

    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert rows and set(rows[0]) == {"figure", "panel", "series", "x_name", "x", "y_name", "y"}
    assert {r["figure"] for r in rows} == FIGURES

    for fid in FIGURES:
        png = (out / f"{fid}.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000

    md = (out / "summary.md").read_text()
    assert "| SABRE-AK |" in md and "| SABRE-KNN |" in md and "Peer" in md
