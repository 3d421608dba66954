"""``sabre-pg bench --instant``: S-INSTANT against the exact optimum, in the database.

Every configuration runs ``sabre_instant`` three ways on the same table:

* ``instant``: S-INSTANT on ``pg_stats`` marginals (the paper's histogram variant);
* ``instant+mcv``: S-INSTANT with a ``pg_stats_ext`` MCV list on the QIs
  (``options.statistics = 'create'``; the statistics object is made once per QI set);
* ``instant+expr``: S-INSTANT with an MCV list on the QIs' generalization expressions
  (``options.statistics = 'create_expressions'``: made, ANALYZEd, read and dropped per call);
* ``instant@0.8``: S-INSTANT on marginals with the paper's threshold 0.8 (default 0.5);
* ``exhaustive``: the optimal full-domain generalization (``options.search = 'exhaustive'``:
  Incognito's lattice top-down, one ``GROUP BY`` per node whose parents passed).

and records scans, the server's seconds, the client's wall time and the LM of the output.
The sweeps follow the paper's Figs 5 and 8: k, rows (N) and the number of QIs (d) for
k-anonymity, l for distinct l-diversity (salary as the SA).  The report checks the issue's
targets: <= 2 scans in >= 80% of the k-anonymity configurations, LM within 5% of the
optimum, >= 20x faster than the exhaustive search at the largest N, and fewer scans than
the exhaustive search in every l-diversity configuration.
"""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

from psycopg import sql

from sabre_pg.census import CENSUS_CATEGORICAL, CENSUS_QIS
from sabre_pg.datasets import generate_census

DEFAULT = dict(rows=100_000, k=10, qis=4, l=3, k_values=[10, 25, 50, 100], sizes=[100_000, 250_000, 1_000_000],
               qi_counts=[3, 4, 5, 6, 7], l_values=[2, 3, 4, 5])
QUICK = dict(rows=5_000, k=10, qis=4, l=3, k_values=[10, 50], sizes=[5_000], qi_counts=[3], l_values=[3])
METHODS = {"instant": {"statistics": "marginals"}, "instant+mcv": {"statistics": "create"},
           "instant+expr": {"statistics": "create_expressions"},
           "instant@0.8": {"statistics": "marginals", "threshold": 0.8},
           "exhaustive": {"search": "exhaustive", "statistics": "marginals"}}
SA = "salary"


class InstantBench:
    """Runs and remembers the configurations; tables generated once per size."""

    def __init__(self, conn, schema: str, seed: int = 1, progress=None):
        self.conn, self.schema, self.seed = conn, schema, seed
        self.tables = {}
        self.runs = []
        self.progress = progress or (lambda what: None)

    def table(self, rows: int) -> tuple:
        """(name, hierarchies) of ``bench_census_<rows>`` (the table benchmarks/bench_db.py makes
        with the same seed), generated unless it exists with its rows and hierarchies, analyzed."""
        if rows not in self.tables:
            name = "bench_census_%d" % rows
            names = {c: "%s_%s" % (name, c) for c in CENSUS_CATEGORICAL}
            exists = self.conn.execute("SELECT to_regclass(%s)", ("public.%s" % name,)).fetchone()[0]
            ok = exists and self.conn.execute(sql.SQL("SELECT count(*) FROM public.{}").format(
                sql.Identifier(name))).fetchone()[0] == rows and self.conn.execute(sql.SQL(
                    "SELECT count(*) FROM {}.hierarchies WHERE name = ANY(%s)").format(sql.Identifier(self.schema)),
                    (list(names.values()),)).fetchone()[0] == len(names)
            if not ok:
                names = generate_census(self.conn, table=name, rows=rows, seed=self.seed, replace=True,
                                        sabre_schema=self.schema)["hierarchies"]
            self.conn.execute(sql.SQL("ANALYZE public.{}").format(sql.Identifier(name)))
            self.tables[rows] = (name, names)
        return self.tables[rows]

    def run(self, sweep: str, x, rows: int, qis: int, k: int, l=None, table=None) -> dict:
        """One configuration, every method; returns {method: measured}."""
        name, hierarchies = (table or self.table(rows))[:2]
        columns = (CENSUS_QIS if table is None else list(table[2]))[:qis]
        found = {}
        for method, options in METHODS.items():
            opts = dict(options, hierarchies={c: hierarchies[c] for c in columns if c in hierarchies})
            output = "%s_%s" % (name, re.sub("[^a-z0-9]", "_", method))
            started = time.perf_counter()
            r = self.conn.execute(sql.SQL(
                "SELECT levels, scans, candidates_tried, predicted_probability, suppressed, lm, classes, seconds "
                "FROM {}.sabre_instant(source => %s::regclass, quasi_identifiers => %s::text[], k => %s, l => %s, "
                "sensitive => %s, output => %s, options => %s::jsonb)").format(sql.Identifier(self.schema)),
                ("public.%s" % name, columns, k, l, SA if l else None, output, json.dumps(opts))).fetchone()
            wall = time.perf_counter() - started
            phases = self.conn.execute(sql.SQL("SELECT phases FROM {}.runs WHERE output_oid = to_regclass(%s)")
                                       .format(sql.Identifier(self.schema)), ("public.%s" % output,)).fetchone()[0]
            found[method] = dict(zip(("levels", "scans", "tried", "probability", "suppressed", "lm", "classes",
                                      "seconds"), r), wall=wall, output=output, phases=phases)
            self.progress("%s %s=%s %s" % (sweep, sweep, x, method))
        record = dict(sweep=sweep, x=x, rows=rows, qis=qis, k=k, l=l, table=name, methods=found)
        self.runs.append(record)
        return record

    def drop_outputs(self):
        for rec in self.runs:
            for m in rec["methods"].values():
                self.conn.execute(sql.SQL("DROP TABLE IF EXISTS public.{}").format(sql.Identifier(m["output"])))


def sweeps(bench: InstantBench, cfg: dict, adult=None):
    """The paper's Figs 5 and 8 on the census-like data; Adult when given ((table, hierarchies, QIs))."""
    for k in cfg["k_values"]:
        bench.run("k", k, cfg["rows"], cfg["qis"], k)
    for rows in cfg["sizes"]:
        bench.run("N", rows, rows, cfg["qis"], cfg["k"])
    for d in cfg["qi_counts"]:
        bench.run("d", d, cfg["rows"], d, cfg["k"])
    for l in cfg["l_values"]:
        bench.run("l", l, cfg["rows"], cfg["qis"], cfg["k"], l)
    if adult is not None:
        for k in cfg["k_values"]:
            bench.run("adult-k", k, None, len(adult[2]), k, table=adult)


def planned(cfg: dict, adult: bool) -> int:
    return len(METHODS) * (len(cfg["k_values"]) * (2 if adult else 1) + len(cfg["sizes"]) + len(cfg["qi_counts"])
                           + len(cfg["l_values"]))


def search_seconds(m: dict) -> float:
    """Phase 1 and the validation scans: the search, without writing the output (which both
    searches do alike)."""
    return m["phases"]["phase1"] + m["phases"]["validate"]


def targets(runs: list) -> dict:
    """The issue's targets over the recorded runs."""
    k_runs = [r for r in runs if r["l"] is None]
    l_runs = [r for r in runs if r["l"] is not None]
    few = [r["methods"]["instant"]["scans"] <= 2 for r in k_runs]
    gaps = [r["methods"]["instant"]["lm"] / max(r["methods"]["exhaustive"]["lm"], 1e-12) - 1 for r in runs]
    largest = max((r for r in runs if r["sweep"] == "N"), key=lambda r: r["rows"], default=None)
    speedup = (largest["methods"]["exhaustive"]["wall"] / largest["methods"]["instant"]["wall"]) if largest else None
    search = (search_seconds(largest["methods"]["exhaustive"]) / search_seconds(largest["methods"]["instant"])
              if largest else None)
    return {"k_configs": len(k_runs), "k_configs_2_scans": sum(few),
            "share_2_scans": sum(few) / len(few) if few else None,
            "worst_lm_gap": max(gaps) if gaps else None,
            "lm_within_5pct": sum(g <= 0.05 + 1e-9 for g in gaps), "configs": len(runs),
            "speedup_largest_n": speedup, "search_speedup_largest_n": search,
            "largest_n": largest["rows"] if largest else None,
            "l_fewer_scans": all(r["methods"]["instant"]["scans"] < r["methods"]["exhaustive"]["scans"]
                                 for r in l_runs) if l_runs else None}


SUMMARIES = ("instant", "instant+mcv", "instant+expr")


def summaries(runs: list) -> list:
    """Per summary (marginals, MCV list on the columns, on the expressions): configurations,
    scans, candidates tried, LM gap to the optimum, seconds (the summary's own: reading or
    creating and ANALYZEing statistics; the search; wall)."""
    out = []
    for method in SUMMARIES:
        ms = [(r["methods"][method], r["methods"]["exhaustive"]) for r in runs if method in r["methods"]]
        if not ms:
            continue
        gaps = sorted(m["lm"] / max(e["lm"], 1e-12) - 1 for m, e in ms)
        out.append({"method": method, "configs": len(ms), "scans": _median([m["scans"] for m, _ in ms]),
                    "max_scans": max(m["scans"] for m, _ in ms), "two_scans": sum(m["scans"] <= 2 for m, _ in ms),
                    "tried": _median([m["tried"] for m, _ in ms]), "optimal": sum(g <= 1e-9 for g in gaps),
                    "mean_gap": sum(gaps) / len(gaps), "worst_gap": gaps[-1],
                    "summary_s": _median([m["phases"].get("summary", 0.0) for m, _ in ms]),
                    "search_s": _median([search_seconds(m) for m, _ in ms]), "wall_s": _median([m["wall"] for m, _ in ms])})
    return out


def _median(xs):
    xs = sorted(xs)
    return (xs[(len(xs) - 1) // 2] + xs[len(xs) // 2]) / 2 if xs else None


def markdown(runs: list, note: str = "") -> str:
    lines = ["# S-INSTANT against the exhaustive optimum", "", note, "",
             "| sweep | x | rows | d | k | l | method | scans | tried | search s | output s | wall s | LM | levels |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        for method, m in r["methods"].items():
            lines.append("| %s | %s | %s | %d | %d | %s | %s | %d | %d | %.2f | %.2f | %.2f | %.4f | %s |" % (
                r["sweep"], r["x"], r["rows"] or r["table"], r["qis"], r["k"], r["l"] or "", method, m["scans"],
                m["tried"], search_seconds(m), m["phases"]["write"], m["wall"], m["lm"], m["levels"]))
    t = targets(runs)
    lines += ["", "## Targets", "",
              "* <= 2 scans: %d of %d k-anonymity configurations (%.0f%%; target >= 80%%)" % (
                  t["k_configs_2_scans"], t["k_configs"], 100 * (t["share_2_scans"] or 0)),
              "* LM within 5%% of the optimum: %d of %d configurations (worst gap %.2f%%)" % (
                  t["lm_within_5pct"], t["configs"], 100 * (t["worst_lm_gap"] or 0)),
              "* speed-up over the exhaustive search at N = %s: %.1fx end to end (target >= 20x); "
              "%.1fx for the search alone (both write the output alike)" % (
                  t["largest_n"], t["speedup_largest_n"] or 0, t["search_speedup_largest_n"] or 0),
              "* l-diversity: fewer scans than the exhaustive search in every configuration: %s" % t["l_fewer_scans"]]
    lines += ["", "## Summaries", "",
              "| summary | configs | scans median (max) | <= 2 scans | tried median | optimal LM | mean LM gap | "
              "worst LM gap | summary s | search s | wall s (medians) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for x in summaries(runs):
        lines.append("| %s | %d | %g (%d) | %d | %g | %d | %.2f%% | %.2f%% | %.2f | %.2f | %.2f |" % (
            x["method"], x["configs"], x["scans"], x["max_scans"], x["two_scans"], x["tried"], x["optimal"],
            100 * x["mean_gap"], 100 * x["worst_gap"], x["summary_s"], x["search_s"], x["wall_s"]))
    return "\n".join(lines) + "\n"


def plot(runs: list, out: Path):
    """fig_instant_<sweep>.png: time, scans and LM against the swept value, one line per method."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    for sweep in sorted({r["sweep"] for r in runs}):
        rs = [r for r in runs if r["sweep"] == sweep]
        fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
        for method in METHODS:
            xs = [r["x"] for r in rs]
            for ax, key in zip(axes, ("wall", "scans", "lm")):
                ax.plot(xs, [r["methods"][method][key] for r in rs], marker="o", label=method)
                ax.set_xlabel(sweep)
                ax.set_ylabel({"wall": "seconds", "scans": "scans", "lm": "LM"}[key])
                if key != "lm":
                    ax.set_yscale("log")
        axes[0].legend()
        fig.tight_layout()
        fig.savefig(out / ("fig_instant_%s.png" % sweep), dpi=110)
        plt.close(fig)


def run_instant_bench(conn, cfg: dict, out: Path, schema: str, seed: int, keep: bool, adult=None) -> dict:
    from sabre_pg.progress import steps

    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with steps(planned(cfg, adult is not None), "sabre-pg bench --instant", "run") as progress:
        bench = InstantBench(conn, schema, seed, progress)
        sweeps(bench, cfg, adult)
    total = time.perf_counter() - started
    if not keep:
        bench.drop_outputs()
    note = "Configuration: %s; total %.1f s." % (json.dumps(cfg), total)
    (out / "instant.json").write_text(json.dumps({"config": cfg, "runs": bench.runs, "targets": targets(bench.runs),
                                                  "seconds": total}, indent=1, default=str))
    (out / "instant.md").write_text(markdown(bench.runs, note))
    plot(bench.runs, out)
    return {"runs": bench.runs, "targets": targets(bench.runs), "seconds": total}
