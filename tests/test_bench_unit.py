"""Unit tests of ``sabre-pg bench`` without a database: the figure-spec table and its sweep,
the progress plan, and the report."""
from __future__ import annotations

import json

import pytest

from sabre_pg.bench import experiments
from sabre_pg.bench.experiments import DEFAULT, FIGURES, QUICK, Figure, Panel, planned_steps, sweep
from sabre_pg.bench.report import CSV_HEADER, Report, phase_order
from sabre_pg.bench.runner import kl_key, query_error_key, run_key
from sabre_pg.core.stopwatch import PHASES

FIGURE = {figure.id: figure for figure in FIGURES}


class FakeRunner:
    """Answers every run and measure with values that name what was asked for."""

    def __init__(self, cfg, phases=None):
        self.cfg = cfg
        self.calls = []
        self.phases = phases or (lambda key: {"read": 1.0, "total": 2.0})

    def anonymize(self, method, sa_flat=False, **parameters):
        self.calls.append(("anonymize", method, sa_flat, parameters))
        key = run_key(self.cfg, method, sa_flat=sa_flat, **parameters)
        return {"key": key, "phases": self.phases(key),
                **{field: (field, key) for field in ("ail", "seconds", "closeness", "classes",
                                                     "aecs_normalized", "violations")}}

    def query_error(self, record, **arguments):
        return ("query_error", record["key"], query_error_key(self.cfg, **arguments))

    def kl(self, record, **arguments):
        return ("kl", record["key"], kl_key(self.cfg, **arguments))


def key(method, cfg=QUICK, **parameters):
    return run_key(cfg, method, **parameters)


# ------------------------------------------------------------------ the table

def test_the_table_has_the_papers_figures_and_the_peer():
    assert list(FIGURE) == ["fig10", "fig11", "fig12", "fig13", "fig17", "fig18", "fig_peer"]
    for cfg in (DEFAULT, QUICK):
        for figure in FIGURES:
            assert figure.title % cfg
            for panel in figure.panels:
                assert isinstance(cfg[panel.xs], list) and cfg[panel.xs], (figure.id, panel.xs)
                assert panel.name % {**cfg, "method": "M"}


@pytest.mark.parametrize("arguments,message", [
    (dict(vary="t", measure_arg="lam"), "either"),
    (dict(), "either"),
    (dict(vary="sizes"), "vary must be one of"),
    (dict(measure_arg="level"), "no argument 'level'"),
])
def test_a_panel_spec_is_checked(arguments, message):
    with pytest.raises(ValueError, match=message):
        Panel("p", "x", "t_values", "y", "query_error", **arguments)


# ------------------------------------------------------------------ spec -> sweep

def test_a_run_parameter_panel_varies_the_run():
    runner = FakeRunner(QUICK)
    figure = sweep(runner, FIGURE["fig10"], QUICK, use_peer=True)
    assert figure["title"] == "Effect of t (n=5000, k=6, 7 QIs, numerical SA)"
    assert [p["name"] for p in figure["panels"]] == [
        "AIL vs t", "time vs t", "real closeness vs t", "classes vs t"]
    ail = figure["panels"][0]
    assert ail["x"] == "t" and ail["y"] == "AIL" and ail["xs"] == [0.25, 0.45]
    assert ail["series"] == {
        "SABRE-AK": [("ail", key("ak", t=0.25)), ("ail", key("ak", t=0.45))],
        "SABRE-KNN": [("ail", key("knn", t=0.25)), ("ail", key("knn", t=0.45))]}
    assert figure["panels"][3]["series"]["SABRE-KNN"][1] == ("classes", key("knn", t=0.45))
    assert {call[2] for call in runner.calls} == {False}, "numerical SA"
    # the calls go method by method, x by x, as the runs are recorded
    assert runner.calls[:4] == [("anonymize", "ak", False, {"t": 0.25}), ("anonymize", "ak", False, {"t": 0.45}),
                                ("anonymize", "knn", False, {"t": 0.25}), ("anonymize", "knn", False, {"t": 0.45})]


@pytest.mark.parametrize("figure_id,vary,xs", [("fig11", "qis", [3, 7]), ("fig12", "rows", [5000, 10000]),
                                               ("fig13", "k", [6, 12])])
def test_each_sweep_varies_its_parameter(figure_id, vary, xs):
    figure = sweep(FakeRunner(QUICK), FIGURE[figure_id], QUICK, use_peer=False)
    first = figure["panels"][0]
    assert first["xs"] == xs
    assert first["series"]["SABRE-AK"] == [(first["series"]["SABRE-AK"][i][0], key("ak", **{vary: x}))
                                           for i, x in enumerate(xs)]


def test_a_measure_argument_panel_measures_the_default_run():
    fig17 = sweep(FakeRunner(QUICK), FIGURE["fig17"], QUICK, use_peer=True)
    by_lambda, by_theta, by_t = fig17["panels"]
    assert by_lambda["name"] == "vs lambda (theta=0.1, t=0.35)" and by_lambda["xs"] == [1, 3]
    assert by_lambda["series"]["SABRE-AK"] == [("query_error", key("ak"), "lambda=1,theta=0.1"),
                                               ("query_error", key("ak"), "lambda=3,theta=0.1")]
    assert by_theta["series"]["SABRE-KNN"] == [("query_error", key("knn"), "lambda=3,theta=0.1"),
                                               ("query_error", key("knn"), "lambda=3,theta=0.2")]
    assert by_t["series"]["SABRE-AK"] == [("query_error", key("ak", t=0.25), "lambda=3,theta=0.1"),
                                          ("query_error", key("ak", t=0.45), "lambda=3,theta=0.1")]
    fig18 = sweep(FakeRunner(QUICK), FIGURE["fig18"], QUICK, use_peer=True)
    by_level, _, by_qis = fig18["panels"]
    assert by_level["series"]["SABRE-KNN"] == [("kl", key("knn"), "level=1"), ("kl", key("knn"), "level=2")]
    assert by_qis["series"]["SABRE-AK"] == [("kl", key("ak", qis=3), "level=2"), ("kl", key("ak", qis=7), "level=2")]


def test_phase_panels_stack_each_methods_phases_in_stopwatch_order():
    def phases(run):
        method, rows = run[0], run[1]
        return ({"zeta": 0.5, "total": 9.0, "write_keys": rows / 1e4, "read": 1.0} if method == "ak"
                else {"takeout": 3.0, "validate": 0.25, "total": 9.0})

    fig12 = sweep(FakeRunner(QUICK, phases), FIGURE["fig12"], QUICK, use_peer=True)
    assert [p["name"] for p in fig12["panels"]] == [
        "time vs n", "AIL vs n", "SABRE-AK phases vs n", "SABRE-KNN phases vs n"]
    ak, knn = fig12["panels"][2:]
    assert ak["stacked"] and knn["stacked"] and ak["xs"] == [5000, 10000]
    # every phase either method recorded, PHASES order, unknown ones last, total left out
    assert list(ak["series"]) == ["validate", "read", "takeout", "write_keys", "zeta"]
    assert ak["series"]["write_keys"] == [0.5, 1.0] and ak["series"]["takeout"] == [0.0, 0.0]
    assert knn["series"]["takeout"] == [3.0, 3.0] and knn["series"]["zeta"] == [0.0, 0.0]


@pytest.mark.parametrize("use_peer", [True, False])
def test_the_peer_figure_runs_a_flat_categorical_sa(use_peer):
    runner = FakeRunner(QUICK)
    figure = sweep(runner, FIGURE["fig_peer"], QUICK, use_peer)
    expected = ["SABRE-AK", "SABRE-KNN", "t-Mondrian (sabre)"] + (["Mondrian (anonypyx)"] if use_peer else [])
    for panel in figure["panels"]:
        assert list(panel["series"]) == expected and panel["xs"] == [0.25, 0.45]
    assert {call[2] for call in runner.calls} == {True}
    assert figure["panels"][3]["series"]["SABRE-AK"][0] == ("violations", key("ak", t=0.25, sa_flat=True))
    # the other figures never run the peers
    series = sweep(runner, FIGURE["fig10"], QUICK, use_peer)["panels"][0]["series"]
    assert "Mondrian (anonypyx)" not in series and "t-Mondrian (sabre)" not in series


def test_a_new_figure_is_a_new_row():
    figure = Figure("fig_x", "k sweep at n=%(rows)d", (
        Panel("KL vs k", "k", "k_values", "KL", "kl", vary="k"),))
    swept = sweep(FakeRunner(QUICK), figure, QUICK, use_peer=True)
    assert swept == {"title": "k sweep at n=5000", "panels": [
        {"name": "KL vs k", "x": "k", "xs": [6, 12], "y": "KL", "series": {
            label: [("kl", key(method, k=k), "level=2") for k in (6, 12)]
            for method, label in (("ak", "SABRE-AK"), ("knn", "SABRE-KNN"))}}]}


def test_planned_steps_count_each_run_and_measure_once():
    # quick: 20 runs (12 numerical-SA, 8 peer-figure: AK, KNN, t-Mondrian in the database,
    # anonypyx), 10 query errors, 10 KL divergences
    assert planned_steps(QUICK, use_peer=True) == 40
    assert planned_steps(QUICK, use_peer=False) == 38
    # default: runs 10 (t) + 8 (QIs) + 4 (n) + 6 (k) + 15 (peer figure); query errors 6 (lambda)
    # + 6 (theta) + 8 (t); KL 6 (level) + 8 (t) + 8 (QIs): the default point is shared;
    # the peer figure's runs include t-Mondrian in the database (5 more)
    plan = experiments.Plan(DEFAULT)
    for figure in FIGURES:
        sweep(plan, figure, DEFAULT, use_peer=True)
    assert (len(plan.runs), len(plan.measures)) == (48, 42)
    assert planned_steps(DEFAULT, use_peer=True) == 90
    assert len([run for run in plan.runs if run[0] == "mondrian"]) == len(DEFAULT["peer_t"])


# ------------------------------------------------------------------ the report

def record(method, cfg, **fields):
    base = {"method": method, "ail": 0.5, "closeness": 0.2, "classes": 100, "violations": 0,
            "seconds": 1.25, "phases": {"total": 1.25, "read": 0.5, "validate": 0.25},
            "query_error": {}, "kl": {}, "hier": {"sex": "h"}, "output": "o"}
    return {**base, **fields}


@pytest.fixture
def report():
    cfg = QUICK
    runs = {
        key("ak"): record("ak", cfg, ail=0.45894, closeness=0.19612, classes=512, seconds=0.1,
                          query_error={query_error_key(cfg): {"median": 2.02221}},
                          kl={kl_key(cfg): 1.04781},
                          phases={"total": 0.104, "read": 0.008, "redistribute": 0.079, "swap": 0.001,
                                  "validate": 0.005, "custom": 0.002}),
        key("knn"): record("knn", cfg, ail=0.3971, classes=512),
        key("ak", t=0.45, sa_flat=True): record("ak", cfg, ail=0.7929, classes=256),
        key("mondrian", t=0.25, sa_flat=True): record("mondrian", cfg, ail=0.767, classes=11, seconds=0.68),
        key("ak", t=0.25, sa_flat=True): record("ak", cfg, ail=0.8407, classes=117),
    }
    figures = {"fig10": {"title": "Effect of t", "panels": [
        {"name": "AIL vs t", "x": "t", "xs": [0.25, 0.45], "y": "AIL",
         "series": {"SABRE-AK": [0.5, 0.4], "SABRE-KNN": [0.45, 0.35]}}]},
        "fig12": {"title": "Scalability", "panels": [
            {"name": "SABRE-AK phases vs n", "x": "n", "xs": [5000, 10000], "y": "seconds", "stacked": True,
             "series": {"read": [0.1, 0.2], "takeout": [0.0, 0.0]}}]}}
    return Report(cfg, 1, runs, figures, "Peer skipped (--no-peer).", 30.7, "PostgreSQL 15")


def test_phase_order_follows_the_stopwatch():
    assert phase_order({"total", "zz", "read", "aa", "validate"}) == ["validate", "read", "total", "aa", "zz"]
    assert phase_order(reversed(PHASES)) == list(PHASES)


def test_markdown(report):
    lines = report.markdown().splitlines()
    assert lines[0] == "# sabre-pg bench"
    assert lines[2] == ("Census-like data (seed 1); defaults n = 5000, k = 6, t = 0.35, 7 QIs (age, sex, "
                        "education, marital, race, workclass, birthplace), SA salary. Total 30.7 s.")
    assert "| SABRE-AK | 0.4589 | 0.1961 | 512 | 0 | 0.10 | 2.0222 | 1.0478 |" in lines
    assert "| SABRE-KNN | 0.3971 | 0.2000 | 512 | 0 | 1.25 | - | - |" in lines, "measures not taken: -"
    phases = next(line for line in lines if line.startswith("Time per phase"))
    assert phases.startswith("Time per phase (s): SABRE-AK: validate 0.005, read 0.008, redistribute 0.079, "
                             "swap 0.001, total 0.104, custom 0.002; SABRE-KNN: validate 0.250")
    assert "Peer skipped (--no-peer)." in lines
    peer_rows = [line for line in lines if line.startswith("| 0.")]
    assert peer_rows == ["| 0.25 | SABRE-AK | 0.8407 | 0.2000 | 117 | 0 | 1.25 |",
                         "| 0.25 | Mondrian (anonypyx) | 0.7670 | 0.2000 | 11 | 0 | 0.68 |",
                         "| 0.45 | SABRE-AK | 0.7929 | 0.2000 | 256 | 0 | 1.25 |"]
    assert lines[-2:] == ["* `fig10.png`: Effect of t", "* `fig12.png`: Scalability"]


def test_document_and_csv(report):
    document = report.document()
    assert document["meta"]["config"] is QUICK and document["meta"]["server"] == "PostgreSQL 15"
    assert [run["method"] for run in document["runs"]] == ["ak", "knn", "ak", "mondrian", "ak"]
    assert all("hier" not in run for run in document["runs"])
    assert document["figures"] is report.figures
    rows = report.csv_rows()
    assert len(rows) == 4 + 4 and all(len(row) == len(CSV_HEADER) for row in rows)
    assert rows[0] == ["fig10", "AIL vs t", "SABRE-AK", "t", 0.25, "AIL", 0.5]
    assert rows[-1] == ["fig12", "SABRE-AK phases vs n", "takeout", "n", 10000, "seconds", 0.0]


def test_write(report, tmp_path):
    report.write(tmp_path)
    assert json.loads((tmp_path / "results.json").read_text())["meta"]["total_seconds"] == 30.7
    assert (tmp_path / "summary.md").read_text() == report.markdown()
    assert (tmp_path / "results.csv").read_text().splitlines()[0] == ",".join(CSV_HEADER)
    for figure_id in report.figures:
        assert (tmp_path / f"{figure_id}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
