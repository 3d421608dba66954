"""``sabre-pg bench``: the experiments of SABRE §6 on the census-like data, in the database.

    sabre-pg bench [--dsn DSN] [--out DIR] [--quick] [--rows N] [--queries Q] [--no-peer]
                   [--sizes 100000,250000,500000] [--seed S] [--keep]

Every configuration runs ``sabre_anonymize`` (SABRE-AK and SABRE-KNN) on a generated census
table and measures the output with the SQL metric functions (``sabre_utility``,
``sabre_query_error_stats``, ``sabre_kl_divergence``) and ``sabre_verify``.  The Mondrian
t-closeness peer (``anonypyx``, see ``sabre_pg.peer``) runs on the same rows with the SA as a
categorical attribute under a flat hierarchy, and so does SABRE for that comparison.

Outputs in ``--out``: ``results.json`` (configuration, every run, every figure's series),
``results.csv`` (one row per plotted point), ``summary.md`` and ``fig*.png``.
"""
from __future__ import annotations

import argparse
import csv
import json
import platform
import time
from pathlib import Path

from psycopg import sql

from sabre_pg import datasets, peer

ALL_QIS = ["age", "sex", "education", "marital", "race", "workclass", "birthplace"]
SA = "salary"
METHODS = ("ak", "knn")
LABEL = {"ak": "SABRE-AK", "knn": "SABRE-KNN", "mondrian": "Mondrian (anonypyx)"}

DEFAULT = dict(rows=100_000, k=6, t=0.35, qis=7, queries=10_000, lam=3, theta=0.1, level=2,
               t_values=[0.15, 0.25, 0.35, 0.45, 0.55], qi_counts=[3, 4, 5, 6, 7],
               sizes=[100_000, 250_000, 500_000], k_values=[2, 6, 10, 20],
               lambdas=[1, 2, 3], thetas=[0.05, 0.1, 0.15, 0.2], levels=[1, 2, 3],
               peer_t=[0.15, 0.25, 0.35, 0.45, 0.55])
QUICK = dict(rows=5_000, k=6, t=0.35, qis=7, queries=1_000, lam=3, theta=0.1, level=2,
             t_values=[0.25, 0.45], qi_counts=[3, 7], sizes=[5_000, 10_000], k_values=[6, 12],
             lambdas=[1, 3], thetas=[0.1, 0.2], levels=[1, 2], peer_t=[0.25, 0.45])


def parse(extra) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="sabre-pg bench", add_help=True)
    p.add_argument("--quick", action="store_true", help="small n, few points (< 1 minute)")
    p.add_argument("--rows", type=int, help="n of the default configuration")
    p.add_argument("--queries", type=int, help="queries per workload (default 10000; quick 1000)")
    p.add_argument("--sizes", help="comma-separated n values of the scalability sweep (e.g. 100000,500000,1000000)")
    p.add_argument("--no-peer", action="store_true", help="skip the Mondrian peer")
    p.add_argument("--seed", type=int, default=1, help="data and workload seed")
    p.add_argument("--keep", action="store_true", help="keep the output tables")
    return p.parse_args(extra)


class Bench:
    def __init__(self, conn, cfg: dict, out: Path, seed: int, keep: bool, use_peer: bool, schema: str):
        self.conn, self.cfg, self.out, self.seed, self.keep = conn, cfg, out, seed, keep
        self.schema = schema
        self.use_peer = use_peer
        self.tables: dict = {}
        self.runs: dict = {}
        self.records: list = []
        self.figures: dict = {}
        self.peer_note = None
        self.bar = None

    # ------------------------------------------------------------------ plumbing
    def tick(self, what: str):
        if self.bar is not None:
            self.bar.set_postfix_str(what[:50])
            self.bar.update(1)

    def table(self, n: int) -> str:
        if n not in self.tables:
            name = f"bench_census_{n}"
            r = datasets.generate_census(self.conn, name, rows=n, seed=self.seed, replace=True,
                                         sabre_schema=self.schema)
            flat = "".join(f"{v};*\n" for v in datasets.census_values(SA))
            datasets.define_hierarchy(self.conn, f"{name}_{SA}_flat", flat, ";", self.schema)
            self.tables[n] = {"name": name, "hierarchies": r["hierarchies"], "sa_flat": f"{name}_{SA}_flat"}
        return self.tables[n]["name"]

    def hier(self, n: int, sa_flat: bool) -> dict:
        h = dict(self.tables[n]["hierarchies"])
        if sa_flat:
            h[SA] = self.tables[n]["sa_flat"]
        return h

    def anonymize(self, method, n=None, t=None, k=None, qis=None, sa_flat=False) -> dict:
        c = self.cfg
        n, t, k, qis = n or c["rows"], t or c["t"], k or c["k"], qis or c["qis"]
        key = (method, n, t, k, qis, sa_flat)
        if key in self.runs:
            return self.runs[key]
        src = self.table(n)
        qi_list = ALL_QIS[:qis]
        out = "bench_%s_%d_%s_%d_%d%s" % (method, n, ("%g" % t).replace(".", ""), k, qis, "_cat" if sa_flat else "")
        hier = {q: h for q, h in self.hier(n, sa_flat).items() if q in qi_list or q == SA}
        rec = {"method": method, "rows": n, "t": t, "k": k, "qis": qis,
               "sa": "categorical-flat" if sa_flat else "numerical", "output": out}
        if method == "mondrian":
            res = peer.run_mondrian(self.conn, src, qi_list, SA, t, k, out, hier, self.schema)
            rec["seconds"] = res["seconds"]["total"]
            rec["phases"] = {p: round(v, 4) for p, v in res["seconds"].items()}
        else:
            t0 = time.perf_counter()
            row = self.conn.execute(
                "SELECT run_id FROM sabre_anonymize(%s::regclass, %s, %s, %s, %s, %s, %s, %s)",
                (src, qi_list, SA, t, k, method, out, json.dumps({"hierarchies": hier}))).fetchone()
            wall = time.perf_counter() - t0
            r = self.conn.execute("SELECT phases, seconds, max_emd FROM runs WHERE run_id = %s", row).fetchone()
            rec["phases"] = r[0]
            rec["seconds"] = r[1]
            rec["wall_seconds"] = wall
        v = self.conn.execute("SELECT * FROM sabre_verify(%s::regclass, %s, %s, %s, %s)",
                              (out, SA, t, k, hier.get(SA) if sa_flat else None)).fetchone()
        rec.update(classes=v[0], violations=v[1], closeness=v[2], min_class_size=v[3])
        u = self.conn.execute("SELECT ail, discernibility, aecs, aecs_normalized FROM "
                              "sabre_utility(%s::regclass, %s::regclass, %s, %s, %s)",
                              (out, src, qi_list, SA, json.dumps({"hierarchies": hier, "k": k}))).fetchone()
        rec.update(ail=u[0], discernibility=u[1], aecs=u[2], aecs_normalized=u[3])
        rec["hier"] = hier
        rec["source"] = src
        rec["qi_list"] = qi_list
        rec["query_error"] = {}
        rec["kl"] = {}
        self.runs[key] = rec
        self.records.append(rec)
        self.tick(f"{method} n={n} t={t} k={k} qis={qis}")
        return rec

    def query_error(self, rec, lam=None, theta=None) -> float:
        lam, theta = lam or self.cfg["lam"], theta or self.cfg["theta"]
        key = f"lambda={lam},theta={theta}"
        if key not in rec["query_error"]:
            r = self.conn.execute(
                "SELECT * FROM sabre_query_error_stats(%s::regclass, %s::regclass, %s, %s, %s, %s, %s, %s, %s)",
                (rec["output"], rec["source"], rec["qi_list"], SA, self.cfg["queries"], lam, theta, self.seed,
                 json.dumps({"hierarchies": rec["hier"]}))).fetchone()
            rec["query_error"][key] = {"median": r[0], "mean": r[1], "answered": r[2], "dropped": r[3]}
            self.tick(f"query error {rec['method']} {key}")
        return rec["query_error"][key]["median"]

    def kl(self, rec, level=None) -> float:
        level = level or self.cfg["level"]
        key = f"level={level}"
        if key not in rec["kl"]:
            rec["kl"][key] = self.conn.execute(
                "SELECT sabre_kl_divergence(%s::regclass, %s::regclass, %s, %s, %s, %s)",
                (rec["output"], rec["source"], rec["qi_list"], SA, level,
                 json.dumps({"hierarchies": rec["hier"]}))).fetchone()[0]
            self.tick(f"KL {rec['method']} {key}")
        return rec["kl"][key]

    def fig(self, fid, title, panels):
        self.figures[fid] = {"title": title, "panels": panels}

    def steps(self) -> int:
        c = self.cfg
        runs = 2 * len(set(c["t_values"]) | {c["t"]}) + 2 * len(set(c["qi_counts"]) - {c["qis"]}) \
            + 2 * len(set(c["sizes"]) - {c["rows"]}) + 2 * len(set(c["k_values"]) - {c["k"]})
        qe = 2 * (len(c["t_values"]) + len(c["lambdas"]) + len(c["thetas"]))
        kl = 2 * (len(c["t_values"]) + len(c["levels"]) + len(c["qi_counts"]))
        peer_steps = 3 * len(c["peer_t"]) if self.use_peer else 2 * len(c["peer_t"])
        return runs + qe + kl + peer_steps

    # ------------------------------------------------------------------ the suite
    def run(self):
        from tqdm import tqdm

        c = self.cfg
        T0 = time.perf_counter()
        with tqdm(total=self.steps(), desc="sabre-pg bench", unit="step") as self.bar:
            self.sweep_t()
            self.sweep_qi()
            self.sweep_n()
            self.sweep_k()
            self.workload()
            self.datacube()
            self.peer()
            self.bar.total = self.bar.n
            self.bar.refresh()
        total = time.perf_counter() - T0
        if not self.keep:
            for rec in self.records:
                for suffix in ("", "_classes", "_keys"):
                    self.conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(
                        sql.Identifier(rec["output"] + suffix)))
        self.write(total)
        return total

    def series(self, xs, fn, methods=METHODS):
        return {LABEL[m]: [fn(m, x) for x in xs] for m in methods}

    def sweep_t(self):
        c, ts = self.cfg, self.cfg["t_values"]
        recs = {(m, t): self.anonymize(m, t=t) for m in METHODS for t in ts}
        self.fig("fig10", "Effect of t (n=%d, k=%d, %d QIs, numerical SA)" % (c["rows"], c["k"], c["qis"]), [
            {"name": "AIL vs t", "x": "t", "xs": ts, "y": "AIL",
             "series": self.series(ts, lambda m, t: recs[m, t]["ail"])},
            {"name": "time vs t", "x": "t", "xs": ts, "y": "seconds",
             "series": self.series(ts, lambda m, t: recs[m, t]["seconds"])},
            {"name": "real closeness vs t", "x": "t", "xs": ts, "y": "max EMD",
             "series": self.series(ts, lambda m, t: recs[m, t]["closeness"])},
            {"name": "classes vs t", "x": "t", "xs": ts, "y": "classes",
             "series": self.series(ts, lambda m, t: recs[m, t]["classes"])},
        ])

    def sweep_qi(self):
        c, qs = self.cfg, self.cfg["qi_counts"]
        recs = {(m, q): self.anonymize(m, qis=q) for m in METHODS for q in qs}
        self.fig("fig11", "Effect of the number of QIs (n=%d, t=%g, k=%d)" % (c["rows"], c["t"], c["k"]), [
            {"name": "AIL vs QIs", "x": "QIs", "xs": qs, "y": "AIL",
             "series": self.series(qs, lambda m, q: recs[m, q]["ail"])},
            {"name": "time vs QIs", "x": "QIs", "xs": qs, "y": "seconds",
             "series": self.series(qs, lambda m, q: recs[m, q]["seconds"])},
            {"name": "real closeness vs QIs", "x": "QIs", "xs": qs, "y": "max EMD",
             "series": self.series(qs, lambda m, q: recs[m, q]["closeness"])},
        ])

    def sweep_n(self):
        c, ns = self.cfg, self.cfg["sizes"]
        recs = {(m, n): self.anonymize(m, n=n) for m in METHODS for n in ns}
        phases = ["validate", "read", "bucketize", "redistribute", "hilbert", "takeout", "generalize",
                  "metrics", "write_keys", "build_output"]
        seen = set()
        for r in recs.values():
            seen |= set(r["phases"])
        phases = [p for p in phases if p in seen] + sorted(seen - set(phases) - {"total"})
        panels = [
            {"name": "time vs n", "x": "n", "xs": ns, "y": "seconds",
             "series": self.series(ns, lambda m, n: recs[m, n]["seconds"])},
            {"name": "AIL vs n", "x": "n", "xs": ns, "y": "AIL",
             "series": self.series(ns, lambda m, n: recs[m, n]["ail"])},
        ]
        for m in METHODS:
            panels.append({"name": "%s phases vs n" % LABEL[m], "x": "n", "xs": ns, "y": "seconds", "stacked": True,
                           "series": {p: [float(recs[m, n]["phases"].get(p, 0.0)) for n in ns] for p in phases}})
        self.fig("fig12", "Scalability (t=%g, k=%d, %d QIs)" % (c["t"], c["k"], c["qis"]), panels)

    def sweep_k(self):
        c, ks = self.cfg, self.cfg["k_values"]
        recs = {(m, k): self.anonymize(m, k=k) for m in METHODS for k in ks}
        self.fig("fig13", "Effect of k (n=%d, t=%g, %d QIs)" % (c["rows"], c["t"], c["qis"]), [
            {"name": "AIL vs k", "x": "k", "xs": ks, "y": "AIL",
             "series": self.series(ks, lambda m, k: recs[m, k]["ail"])},
            {"name": "time vs k", "x": "k", "xs": ks, "y": "seconds",
             "series": self.series(ks, lambda m, k: recs[m, k]["seconds"])},
            {"name": "normalized AECS vs k", "x": "k", "xs": ks, "y": "n / (C k)",
             "series": self.series(ks, lambda m, k: recs[m, k]["aecs_normalized"])},
        ])

    def workload(self):
        c = self.cfg
        base = {m: self.anonymize(m) for m in METHODS}
        ls, ths, ts = c["lambdas"], c["thetas"], c["t_values"]
        self.fig("fig17", "Median relative error of COUNT queries (n=%d, k=%d, %d queries)"
                 % (c["rows"], c["k"], c["queries"]), [
            {"name": "vs lambda (theta=%g, t=%g)" % (c["theta"], c["t"]), "x": "lambda", "xs": ls,
             "y": "median relative error", "series": self.series(ls, lambda m, x: self.query_error(base[m], lam=x))},
            {"name": "vs theta (lambda=%d, t=%g)" % (c["lam"], c["t"]), "x": "theta", "xs": ths,
             "y": "median relative error", "series": self.series(ths, lambda m, x: self.query_error(base[m], theta=x))},
            {"name": "vs t (lambda=%d, theta=%g)" % (c["lam"], c["theta"]), "x": "t", "xs": ts,
             "y": "median relative error",
             "series": self.series(ts, lambda m, x: self.query_error(self.anonymize(m, t=x)))},
        ])

    def datacube(self):
        c = self.cfg
        base = {m: self.anonymize(m) for m in METHODS}
        lv, ts, qs = c["levels"], c["t_values"], c["qi_counts"]
        self.fig("fig18", "KL-divergence of the datacube (n=%d, k=%d)" % (c["rows"], c["k"]), [
            {"name": "vs level (t=%g)" % c["t"], "x": "level mu", "xs": lv, "y": "KL (nats)",
             "series": self.series(lv, lambda m, x: self.kl(base[m], level=x))},
            {"name": "vs t (level %d)" % c["level"], "x": "t", "xs": ts, "y": "KL (nats)",
             "series": self.series(ts, lambda m, x: self.kl(self.anonymize(m, t=x)))},
            {"name": "vs QIs (level %d)" % c["level"], "x": "QIs", "xs": qs, "y": "KL (nats)",
             "series": self.series(qs, lambda m, x: self.kl(self.anonymize(m, qis=x)))},
        ])

    def peer(self):
        c, ts = self.cfg, self.cfg["peer_t"]
        methods = list(METHODS)
        if self.use_peer:
            methods.append("mondrian")
        recs = {(m, t): self.anonymize(m, t=t, sa_flat=True) for m in methods for t in ts}
        self.fig("fig_peer", "SABRE vs Mondrian t-closeness, salary as categorical SA with a flat hierarchy "
                 "(equal-distance EMD; n=%d, k=%d, %d QIs)" % (c["rows"], c["k"], c["qis"]), [
            {"name": "AIL vs t", "x": "t", "xs": ts, "y": "AIL",
             "series": self.series(ts, lambda m, t: recs[m, t]["ail"], methods)},
            {"name": "time vs t", "x": "t", "xs": ts, "y": "seconds",
             "series": self.series(ts, lambda m, t: recs[m, t]["seconds"], methods)},
            {"name": "real closeness vs t", "x": "t", "xs": ts, "y": "max EMD",
             "series": self.series(ts, lambda m, t: recs[m, t]["closeness"], methods)},
            {"name": "t-closeness / k violations (sabre_verify)", "x": "t", "xs": ts, "y": "violating classes",
             "series": self.series(ts, lambda m, t: recs[m, t]["violations"], methods)},
        ])

    # ------------------------------------------------------------------ outputs
    def write(self, total):
        self.out.mkdir(parents=True, exist_ok=True)
        runs = [{k: v for k, v in r.items() if k not in ("hier",)} for r in self.records]
        meta = {"config": self.cfg, "seed": self.seed, "total_seconds": total, "peer": self.peer_note,
                "machine": {"python": platform.python_version(), "platform": platform.platform()},
                "server": self.conn.execute("SELECT version()").fetchone()[0]}
        doc = {"meta": meta, "runs": runs, "figures": self.figures}
        (self.out / "results.json").write_text(json.dumps(doc, indent=1, default=float) + "\n")
        with open(self.out / "results.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["figure", "panel", "series", "x_name", "x", "y_name", "y"])
            for fid, fg in self.figures.items():
                for p in fg["panels"]:
                    for s, ys in p["series"].items():
                        for x, y in zip(p["xs"], ys):
                            w.writerow([fid, p["name"], s, p["x"], x, p["y"], y])
        self.plots()
        (self.out / "summary.md").write_text(self.summary(total))

    def plots(self):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        markers = {"SABRE-AK": "o", "SABRE-KNN": "s", "Mondrian (anonypyx)": "^"}
        for fid, fg in self.figures.items():
            panels = fg["panels"]
            ncols = min(len(panels), 2 if len(panels) == 4 else 3)
            nrows = -(-len(panels) // ncols)
            fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 3.6 * nrows), squeeze=False)
            for ax in axes.ravel()[len(panels):]:
                ax.set_visible(False)
            for ax, p in zip(axes.ravel(), panels):
                xs = p["xs"]
                if p.get("stacked"):
                    pos = list(range(len(xs)))
                    bottom = [0.0] * len(xs)
                    colors = plt.get_cmap("tab20").colors
                    for ci, (s, ys) in enumerate(p["series"].items()):
                        if not any(ys):
                            continue
                        ax.bar(pos, ys, bottom=bottom, label=s, width=0.6, color=colors[ci % len(colors)])
                        bottom = [b + y for b, y in zip(bottom, ys)]
                    ax.set_xticks(pos, [_fmt_x(x) for x in xs])
                    ax.legend(fontsize=6, ncol=2)
                else:
                    for s, ys in p["series"].items():
                        ax.plot(xs, ys, marker=markers.get(s, "o"), label=s)
                    ax.legend(fontsize=7)
                ax.set_title(p["name"], fontsize=9)
                ax.set_xlabel(p["x"])
                ax.set_ylabel(p["y"])
                ax.grid(alpha=0.3)
            fig.suptitle(fg["title"], fontsize=9)
            fig.tight_layout()
            fig.savefig(self.out / f"{fid}.png", dpi=110)
            plt.close(fig)

    def summary(self, total) -> str:
        c = self.cfg
        L = ["# sabre-pg bench", "",
             "Census-like data (seed %d); defaults n = %d, k = %d, t = %g, %d QIs (%s), SA %s. "
             "Total %.1f s." % (self.seed, c["rows"], c["k"], c["t"], c["qis"], ", ".join(ALL_QIS[:c["qis"]]),
                                SA, total), "",
             "## Default configuration (numerical SA, ordered EMD)", "",
             "| method | AIL | real closeness | classes | violations | time (s) | median rel. error "
             "(lambda=%d, theta=%g) | KL (level %d) |" % (c["lam"], c["theta"], c["level"]),
             "|---|---|---|---|---|---|---|---|"]
        for m in METHODS:
            r = self.runs[(m, c["rows"], c["t"], c["k"], c["qis"], False)]
            qe = r["query_error"].get("lambda=%d,theta=%g" % (c["lam"], c["theta"]), {}).get("median")
            kl = r["kl"].get("level=%d" % c["level"])
            L.append("| %s | %.4f | %.4f | %d | %d | %.2f | %s | %s |" % (
                LABEL[m], r["ail"], r["closeness"], r["classes"], r["violations"], r["seconds"],
                "%.4f" % qe if qe is not None else "-", "%.4f" % kl if kl is not None else "-"))
        L += ["", "Time per phase (s): " + "; ".join(
            "%s: %s" % (LABEL[m], ", ".join("%s %.3f" % (p, v) for p, v in
                                           self.runs[(m, c["rows"], c["t"], c["k"], c["qis"], False)]["phases"].items()))
            for m in METHODS), ""]
        L += ["## Peer comparison (salary as categorical SA, flat hierarchy = equal-distance EMD)", ""]
        if self.peer_note:
            L += [self.peer_note, ""]
        L += ["| t | method | AIL | real closeness | classes | sabre_verify violations | time (s) |",
              "|---|---|---|---|---|---|---|"]
        for t in c["peer_t"]:
            for m in list(METHODS) + ["mondrian"]:
                r = self.runs.get((m, c["rows"], t, c["k"], c["qis"], True))
                if r is None:
                    continue
                L.append("| %g | %s | %.4f | %.4f | %d | %d | %.2f |" % (
                    t, LABEL[m], r["ail"], r["closeness"], r["classes"], r["violations"], r["seconds"]))
        L += ["", "## Figures", ""]
        for fid, fg in self.figures.items():
            L.append("* `%s.png`: %s" % (fid, fg["title"]))
        return "\n".join(L) + "\n"


def _fmt_x(x):
    return "%dk" % (x // 1000) if isinstance(x, int) and x >= 1000 else str(x)


PEER_OPTIONS = ("anonypyx %s: mondrian.Mondrian(df, <QIs>).partition([models.kAnonymity(k), "
                "models.tCloseness(t, df, salary, models.earth_movers_distance_categorical)]); "
                "salary as pandas category (all 50 values), categorical QIs as pre-order leaf positions")


def main(args) -> int:
    from sabre_pg.connect import connect

    opts = parse(getattr(args, "extra", []) or [])
    cfg = dict(QUICK if opts.quick else DEFAULT)
    cfg = {k: (list(v) if isinstance(v, list) else v) for k, v in cfg.items()}
    if opts.rows:
        cfg["rows"] = opts.rows
    if opts.queries:
        cfg["queries"] = opts.queries
    if opts.sizes:
        cfg["sizes"] = [int(s) for s in opts.sizes.split(",") if s.strip()]
    use_peer = not opts.no_peer and peer.available()
    schema = getattr(args, "sabre_schema", "sabre") or "sabre"
    with connect(args, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path = public, {}").format(sql.Identifier(schema)))
        b = Bench(conn, cfg, Path(getattr(args, "out", None) or "bench-out"), opts.seed, opts.keep,
                  use_peer, schema)
        if use_peer:
            import anonypyx  # noqa: F401
            from importlib.metadata import version

            b.peer_note = "Peer options: " + PEER_OPTIONS % version("anonypyx")
        elif not opts.no_peer:
            b.peer_note = "Peer skipped: anonypyx is not installed (pip install -e '.[bench]')."
        else:
            b.peer_note = "Peer skipped (--no-peer)."
        total = b.run()
    print(f"bench finished in {total:.1f} s; results in {b.out}/ (results.json, results.csv, summary.md, fig*.png)")
    return 0
