"""Unit tests of ``sabre-pg bench --stream`` without a database: the plan and its progress
count, the dispatch of :func:`run`, the summary of a stream's advances, the options and the
report."""
from __future__ import annotations

import importlib.util
import json

import pytest

from sabre_pg import bench
from sabre_pg.bench import stream


def test_plan_runs_main_baselines_then_both_sweeps():
    cfg = dict(rows=100, sweep_rows=50, steps=[10, 20], windows=[20, 40], baselines=True)
    assert stream.plan(cfg) == [
        ("main", 100, stream.MAIN_WINDOW, stream.MAIN_STEP),
        ("tumbling_I", 100, stream.MAIN_STEP, None), ("tumbling_omega", 100, stream.MAIN_WINDOW, None),
        ("tumbling_omega_default", 100, stream.MAIN_WINDOW, None),
        ("sweep_step", 50, stream.MAIN_WINDOW, 10), ("sweep_step", 50, stream.MAIN_WINDOW, 20),
        ("sweep_window", 50, 20, stream.MAIN_STEP), ("sweep_window", 50, 40, stream.MAIN_STEP)]
    assert stream.plan(dict(cfg, baselines=False, steps=[], windows=[])) == [
        ("main", 100, stream.MAIN_WINDOW, stream.MAIN_STEP)]
    assert stream.plan(dict(cfg, steps=[], windows=[], ts=[0.1]))[-2:] == [
        ("main@0.1", 100, stream.MAIN_WINDOW, stream.MAIN_STEP),
        ("tumbling_omega_default@0.1", 100, stream.MAIN_WINDOW, None)]


def test_planned_steps_count_batches_and_blocks():
    cfg = dict(rows=100_000, sweep_rows=40_000, steps=[10_000], windows=[10_000], baselines=True)
    # main 20 batches, tumbling 20 + 5 + 5 blocks, sweep_step 4 batches, sweep_window 8 batches
    assert stream.planned_steps(cfg) == 20 + 20 + 5 + 5 + 4 + 8
    assert stream.planned_steps(stream.FULL) > stream.planned_steps(stream.REDUCED)
    assert stream.FULL["rows"] == 500_000 and stream.REDUCED["rows"] < stream.FULL["rows"]


def test_run_dispatches_each_part_and_generates_each_table_once(monkeypatch):
    calls = []
    monkeypatch.setattr(stream, "census", lambda conn, rows, schema: calls.append(("census", rows)) or
                        ("t%d" % rows, {"h": rows}))
    monkeypatch.setattr(stream, "run_stream", lambda conn, table, h, rows, omega, step, schema, tick, verify=False,
                        t=stream.T: calls.append(("stream", table, omega, step, verify, t)) or {"omega": omega,
                                                                                             "step": step})
    monkeypatch.setattr(stream, "tumbling", lambda conn, table, h, rows, block, schema, tick, method="ak", t=stream.T,
                        same_rows=None: calls.append(("tumbling", table, block, method, t)) or {"block": block, "method": method})
    cfg = dict(rows=100, sweep_rows=50, steps=[10], windows=[20, 40], baselines=True, ts=[0.1])
    got = stream.run(None, cfg, "sabre")
    assert [c for c in calls if c[0] == "census"] == [("census", 100), ("census", 50)]
    assert ("stream", "t100", stream.MAIN_WINDOW, stream.MAIN_STEP, True, stream.T) in calls
    assert ("stream", "t100", stream.MAIN_WINDOW, stream.MAIN_STEP, True, 0.1) in calls
    assert got["tumbling_I"] == {"block": stream.MAIN_STEP, "method": "ak"}
    assert got["tumbling_omega"] == {"block": stream.MAIN_WINDOW, "method": "ak"}
    assert got["tumbling_omega_default"] == {"block": stream.MAIN_WINDOW, "method": "refine"}
    assert ("tumbling", "t100", stream.MAIN_WINDOW, "refine", 0.1) in calls
    assert got["sweep_step"] == [{"omega": stream.MAIN_WINDOW, "step": 10}]
    assert [r["omega"] for r in got["sweep_window"]] == [20, 40]
    assert got["t"] == stream.T and got["k"] == stream.K and got["config"] == cfg


def test_summarize_counts_cases_rows_and_seconds():
    per = [(2, 0.2, 100), (1, 0.01, 0), (3, 0.1, 40)]
    s = stream.summarize(per, [0.3, 0.1, 0.2])
    assert s["advances"] == 3 and s["cases"] == {1: 1, 2: 1, 3: 1} and s["published"] == 140
    assert s["total_seconds"] == pytest.approx(0.6) and s["advance_median"] == pytest.approx(0.2)
    assert s["advance_max"] == pytest.approx(0.3) and s["server_mean"] == pytest.approx(0.1033, abs=1e-4)
    empty = stream.summarize([], [])
    assert empty["advances"] == 0 and empty["advance_mean"] is None and empty["total_seconds"] == 0


def test_stream_options():
    opts = bench.parse(["--stream"])
    assert opts.stream and bench.stream_configuration(opts) == stream.REDUCED
    opts = bench.parse(["--stream", "--full", "--rows", "200000"])
    cfg = bench.stream_configuration(opts)
    assert cfg["rows"] == 200_000 and cfg["sweep_rows"] == stream.FULL["sweep_rows"]
    assert stream.FULL["rows"] == 500_000                      # the constant is not changed
    assert not bench.parse([]).stream


def stream_run(x, key, ail, advances=4):
    return {"rows": 1000, "window_size": x if key == "window_size" else 20_000,
            "step": x if key == "step" else 5_000, "advances": advances, "advance_mean": 0.2,
            "advance_median": 0.19, "advance_max": 0.4, "total_seconds": 0.8, "ail": ail,
            "cases": {1: 0, 2: advances, 3: 0}, "phases": {"engine": 0.05, "number": 0.02}}


@pytest.fixture
def results():
    main = stream_run(5_000, "step", 0.40)
    main["verify"] = {"violations": 0, "published_twice": 0}
    return {"t": 0.35, "k": 6, "main": main,
            "tumbling_I": {"block": 5_000, "blocks": 4, "total_seconds": 0.5, "per_block": 0.125, "ail": 0.45},
            "tumbling_omega": {"block": 20_000, "blocks": 1, "total_seconds": 0.2, "per_block": 0.2, "ail": 0.38},
            "tumbling_omega_default": {"block": 20_000, "blocks": 1, "total_seconds": 0.9, "per_block": 0.9,
                                       "ail": 0.21, "method": "refine"},
            "main@0.1": dict(stream_run(5_000, "step", 0.30), verify={"violations": 0}),
            "tumbling_omega_default@0.1": {"block": 20_000, "blocks": 1, "ail": 0.29, "method": "refine"},
            "sweep_step": [stream_run(1_000, "step", 0.41), stream_run(20_000, "step", None, advances=0)],
            "sweep_window": [stream_run(5_000, "window_size", 0.44), stream_run(50_000, "window_size", 0.34)]}


def test_markdown_tables(results):
    md = stream.markdown(results)
    assert "| SABRE_W | 0.8 | 0.200 / 0.190 / 0.400 | 0.4000 |" in md
    assert "| tumbling, blocks of I = 5000 alone | 0.5 (4 runs) | 0.125 per block | 0.4500 |" in md
    assert "| tumbling, blocks of omega = 20000 alone | 0.2 (1 runs) | 0.200 per block | 0.3800 |" in md
    assert "violations 0" in md and "engine 0.050" in md
    assert "| tumbling (default method), blocks of omega = 20000 alone | 0.9 (1 runs) | 0.900 per block | 0.2100 |" in md
    assert "| 0.1 | 0.3000 | 0.190 | 0 | 0.2900 |" in md and "| 0.35 | 0.4000 | 0.190 | 0 | 0.2100 |" in md
    assert "## Fig. 15" in md and "| 1000 | 4 | 0.200 / 0.190 | 0.8 | 0.4100 |" in md
    assert "| 20000 | 0 | 0.200 / 0.190 | 0.8 | – |" in md             # nothing published: no AIL
    assert "## Fig. 16" in md and "| 50000 | 4 | 0.200 / 0.190 | 0.8 | 0.3400 |" in md


def test_write(results, tmp_path):
    written = stream.write(results, tmp_path)
    assert json.loads((tmp_path / "stream.json").read_text())["main"]["ail"] == 0.40
    assert (tmp_path / "stream.md").read_text().startswith("# sabre-pg bench --stream")
    if importlib.util.find_spec("matplotlib") is None:
        assert len(written) == 2
        return
    assert {p.name for p in written} == {"stream.json", "stream.md", "fig15.png", "fig16.png"}
    assert (tmp_path / "fig15.png").stat().st_size > 0
