"""``sabre-pg bench --stream``: SABRE_W end to end in the database (docs/streams.md; the
paper's §6, Figs 15-16).

A census-like stream (``bench_census_<rows>``: all 7 QIs with their hierarchies, SA salary,
t = 0.35, k = 6) arrives in arrival order: the source table starts empty and receives the
census rows I at a time; after each batch ``sabre_stream_advance`` runs in its own transaction
(the client's wall time of that call is the advance's time; inserting the batch is not
counted).  Per stream: advances, seconds per advance (mean, median, max), the total, the
server's seconds per phase (``<output>_log.phases``), AIL of the output
(``sabre_utility`` against the whole census table, so every AIL shares one normalization).

* **main**: ``rows`` rows with omega = 20,000 and I = 5,000 (the stream created with the
  defaults: method 'refine', engine 'window'), checked by ``sabre_stream_verify``, against the
  **tumbling-window baselines**: ``sabre_anonymize`` on each block of I rows alone and on each
  block of omega rows alone with SABRE-AK (the paper's), and on each block of omega rows alone
  with the default method ('refine');
* **other t** (``ts``): the main stream and the default-method omega baseline again at each t;
* **Fig. 15**: omega = 20,000 with I in ``steps``; **Fig. 16**: I = 5,000 with omega in
  ``windows``; both on ``sweep_rows`` rows.

:data:`REDUCED` is the default (minutes); :data:`FULL` the issue's sizes.  Targets: an
advance with I = 5,000 and omega = 20,000 <= 0.3 s; the 500k stream <= 40 s.
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Callable

from psycopg import sql

from sabre_pg.census import CENSUS_CATEGORICAL, CENSUS_QIS, CENSUS_SENSITIVE
from sabre_pg.census_sql import generate_census

T, K = 0.35, 6
MAIN_WINDOW, MAIN_STEP = 20_000, 5_000
SOURCE, NAME = "bench_stream_src", "bench_w"
STEPS = [1_000, 2_000, 5_000, 10_000, 20_000]
WINDOWS = [5_000, 10_000, 20_000, 50_000]
OTHER_T = [0.1, 0.2]     # the targets: t = 0.1, 0.2 and T
REDUCED = dict(rows=100_000, sweep_rows=50_000, steps=STEPS, windows=WINDOWS, baselines=True, ts=OTHER_T)
FULL = dict(rows=500_000, sweep_rows=500_000, steps=STEPS, windows=WINDOWS, baselines=True, ts=OTHER_T)
DEFAULT_METHOD = "refine"    # sabre_anonymize's and sabre_stream_create's default
TARGETS = {"advance_seconds": 0.3, "total_seconds_500k": 40.0}
VERIFY = ("advances", "classes", "rows", "violations", "max_emd", "min_class_size", "published_twice",
          "expired_unpublished", "updated", "deleted", "late")
FIGURES = (("fig15", "sweep_step", "step", "Fig. 15: omega = 20,000, I varied"),
           ("fig16", "sweep_window", "window_size", "Fig. 16: I = 5,000, omega varied"))


def plan(cfg: dict) -> list[tuple]:
    """The experiments in the order they run: (part, rows, omega, I) for streams, (part, rows,
    block, None) for tumbling baselines; a part at another t than :data:`T` is named
    ``<part>@<t>``."""
    runs = [("main", cfg["rows"], MAIN_WINDOW, MAIN_STEP)]
    if cfg.get("baselines"):
        runs += [("tumbling_I", cfg["rows"], MAIN_STEP, None), ("tumbling_omega", cfg["rows"], MAIN_WINDOW, None),
                 ("tumbling_omega_default", cfg["rows"], MAIN_WINDOW, None)]
    for t in cfg.get("ts") or []:
        runs.append(("main@%g" % t, cfg["rows"], MAIN_WINDOW, MAIN_STEP))
        if cfg.get("baselines"):
            runs.append(("tumbling_omega_default@%g" % t, cfg["rows"], MAIN_WINDOW, None))
    runs += [("sweep_step", cfg["sweep_rows"], MAIN_WINDOW, s) for s in cfg.get("steps") or []]
    runs += [("sweep_window", cfg["sweep_rows"], w, MAIN_STEP) for w in cfg.get("windows") or []]
    return runs


def planned_steps(cfg: dict) -> int:
    """Progress ticks: one per batch of a stream, one per block of a baseline."""
    return sum(rows // (step or omega) for _, rows, omega, step in plan(cfg))


def census(conn, rows: int, schema: str, seed: int = 1) -> tuple[str, dict]:
    """(table, hierarchies) of the census table of ``rows`` rows, generated unless it exists with
    that many rows and its hierarchies registered."""
    table = f"bench_census_{rows}"
    names = {c: f"{table}_{c}" for c in CENSUS_CATEGORICAL}
    if conn.execute("SELECT to_regclass(%s)", (f"public.{table}",)).fetchone()[0]:
        n = conn.execute(sql.SQL("SELECT count(*) FROM public.{}").format(sql.Identifier(table))).fetchone()[0]
        have = conn.execute(sql.SQL("SELECT count(*) FROM {}.hierarchies WHERE name = ANY(%s)").format(
            sql.Identifier(schema)), (list(names.values()),)).fetchone()[0]
        if n == rows and have == len(names):
            return table, names
    made = generate_census(conn, table=table, rows=rows, seed=seed, replace=True, sabre_schema=schema)
    return table, made["hierarchies"]


def utility_ail(conn, output: str, table: str, hierarchies: dict, schema: str) -> float:
    return conn.execute(sql.SQL("SELECT ail FROM {}.sabre_utility(%s::regclass, %s::regclass, %s::text[], %s, "
                                "%s::jsonb)").format(sql.Identifier(schema)),
                        (output, table, CENSUS_QIS, CENSUS_SENSITIVE,
                         json.dumps({"hierarchies": hierarchies}))).fetchone()[0]


def fresh_stream(conn, table: str, hierarchies: dict, omega: int, step: int, schema: str, t: float = T,
                 engine: str | None = None):
    """An empty source shaped like ``table`` and the stream over it (earlier ones dropped);
    ``engine``: the window engine recorded for it instead of the one a new stream gets (to
    measure an earlier engine, as a stream created with it runs)."""
    qs = sql.Identifier(schema)
    if conn.execute(sql.SQL("SELECT 1 FROM {}.streams WHERE name = %s").format(qs), (NAME,)).fetchone():
        conn.execute(sql.SQL("SELECT {}.sabre_stream_drop(%s, purge => true)").format(qs), (NAME,))
    for name in (SOURCE,) + tuple(SOURCE + "_sabre_w" + x for x in ("", "_classes", "_keys", "_state", "_rows", "_log")):
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(name)))
    conn.execute(sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING ALL)").format(sql.Identifier(SOURCE),
                                                                          sql.Identifier(table)))
    conn.execute(sql.SQL("SELECT * FROM {}.sabre_stream_create(name => %s, source => %s::regclass, arrival => 'id', "
                         "quasi_identifiers => %s::text[], sensitive => %s, t => %s, k => %s, window_size => %s, "
                         "step => %s, options => %s::jsonb)").format(qs),
                 (NAME, SOURCE, CENSUS_QIS, CENSUS_SENSITIVE, t, K, omega, step,
                  json.dumps({"hierarchies": hierarchies})))
    if engine:
        conn.execute(sql.SQL("UPDATE {}.streams SET engine = %s WHERE name = %s").format(qs), (engine, NAME))


def run_stream(conn, table: str, hierarchies: dict, rows: int, omega: int, step: int, schema: str,
               tick: Callable[[], None], verify: bool = False, t: float = T, engine: str | None = None) -> dict:
    """The stream over the first ``rows`` census rows arriving I at a time (autocommit ``conn``)."""
    qs = sql.Identifier(schema)
    conn.execute(sql.SQL("SELECT {}.sabre_selftest()").format(qs))         # warm the interpreter
    fresh_stream(conn, table, hierarchies, omega, step, schema, t, engine)
    per, calls, loaded = [], [], 0
    for _ in range(rows // step):
        conn.execute(sql.SQL("INSERT INTO {} SELECT * FROM {} WHERE id > %s AND id <= %s").format(
            sql.Identifier(SOURCE), sql.Identifier(table)), (loaded, loaded + step))
        loaded += step
        started = time.perf_counter()
        got = conn.execute(sql.SQL("SELECT case_no, seconds, rows FROM {}.sabre_stream_advance(%s)").format(qs),
                           (NAME,)).fetchall()
        elapsed = time.perf_counter() - started
        if got:
            calls.append(elapsed)
            per.extend(got)
        tick()
    phases = conn.execute(sql.SQL(
        "SELECT p.key, avg(p.value::float8) FROM {} a, jsonb_each_text(a.phases) p GROUP BY 1").format(
        sql.Identifier(SOURCE + "_sabre_w_log"))).fetchall()
    out = summarize(per, calls)
    out.update(t=t, engine=conn.execute(sql.SQL("SELECT engine FROM {}.streams WHERE name = %s").format(qs),
                                        (NAME,)).fetchone()[0],
               rows=rows, window_size=omega, step=step, phases={k: round(v, 4) for k, v in sorted(phases)},
               ail=utility_ail(conn, SOURCE + "_sabre_w", table, hierarchies, schema) if out["published"] else None)
    if verify:
        v = conn.execute(sql.SQL("SELECT * FROM {}.sabre_stream_verify(%s)").format(qs), (NAME,)).fetchone()
        out["verify"] = dict(zip(VERIFY, v))
    return out


def summarize(per: list, calls: list) -> dict:
    """Counts and seconds of a stream's advances: ``per`` holds (case, server seconds, rows
    published) per advance, ``calls`` the client's seconds of each call that advanced."""
    seconds = [s for _, s, _ in per]
    return {"advances": len(per), "cases": {c: sum(1 for x, _, _ in per if x == c) for c in (1, 2, 3)},
            "published": sum(r for _, _, r in per), "total_seconds": round(sum(calls), 3),
            "advance_mean": round(statistics.mean(calls), 4) if calls else None,
            "advance_median": round(statistics.median(calls), 4) if calls else None,
            "advance_max": round(max(calls), 4) if calls else None,
            "server_mean": round(statistics.mean(seconds), 4) if seconds else None}


def tumbling(conn, table: str, hierarchies: dict, rows: int, block: int, schema: str,
             tick: Callable[[], None], method: str = "ak", t: float = T, same_rows: int | None = None) -> dict:
    """``sabre_anonymize`` with ``method`` on each block of ``block`` rows alone; AIL over all
    blocks, and with ``same_rows`` (the rows a stream published, the first ones) also over the
    blocks within them (``ail_same_rows``: the stream's rows only, its last window being
    published only when more rows arrive)."""
    qs = sql.Identifier(schema)
    conn.execute("DROP TABLE IF EXISTS bench_tumbling_all")
    seconds, blocks, rest = 0.0, rows // block, None
    for b in range(blocks):
        conn.execute("DROP VIEW IF EXISTS bench_block CASCADE")
        conn.execute(sql.SQL("CREATE VIEW bench_block AS SELECT * FROM {} WHERE id > {} AND id <= {}").format(
            sql.Identifier(table), sql.Literal(b * block), sql.Literal((b + 1) * block)))
        started = time.perf_counter()
        conn.execute(sql.SQL("SELECT * FROM {}.sabre_anonymize('bench_block'::regclass, %s::text[], %s, %s, %s, "
                             "%s, 'bench_block_out', %s::jsonb)").format(qs),
                     (CENSUS_QIS, CENSUS_SENSITIVE, t, K, method, json.dumps({"hierarchies": hierarchies, "key": "id"})))
        seconds += time.perf_counter() - started
        if rest is None:
            conn.execute("CREATE TABLE bench_tumbling_all AS SELECT * FROM bench_block_out WITH NO DATA")
            rest = [sql.Identifier(r[0]) for r in conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = 'bench_block_out'::regclass AND attnum > 1 "
                "AND NOT attisdropped ORDER BY attnum").fetchall()]
        # ec_ids made distinct across blocks, so no two blocks' classes merge
        conn.execute(sql.SQL("INSERT INTO bench_tumbling_all SELECT ec_id + {}, {} FROM bench_block_out").format(
            sql.Literal(b * block), sql.SQL(", ").join(rest)))
        tick()
    ail = utility_ail(conn, "bench_tumbling_all", table, hierarchies, schema)
    same = None
    if same_rows and same_rows < blocks * block and same_rows % block == 0:
        conn.execute(sql.SQL("CREATE TABLE bench_tumbling_same AS SELECT * FROM bench_tumbling_all WHERE ec_id < {}")
                     .format(sql.Literal(same_rows)))
        same = utility_ail(conn, "bench_tumbling_same", table, hierarchies, schema)
        conn.execute("DROP TABLE bench_tumbling_same")
    conn.execute("DROP VIEW IF EXISTS bench_block CASCADE")
    conn.execute("DROP TABLE IF EXISTS bench_tumbling_all, bench_block_out, bench_block_out_classes, "
                 "bench_block_out_keys")
    return {"block": block, "blocks": blocks, "method": method, "t": t, "total_seconds": round(seconds, 3),
            "per_block": round(seconds / max(blocks, 1), 4), "ail": ail,
            "ail_same_rows": same if same is not None else ail, "same_rows": same_rows if same is not None else rows}


def run(conn, cfg: dict, schema: str, tick: Callable[[], None] = lambda: None) -> dict:
    """Every experiment of :func:`plan` on ``conn`` (autocommit): the results by part."""
    results = {"t": T, "k": K, "config": dict(cfg)}
    engine = {"engine": cfg["engine"]} if cfg.get("engine") else {}
    tables = {}
    for part, rows, omega, step in plan(cfg):
        if rows not in tables:
            tables[rows] = census(conn, rows, schema)
        table, hierarchies = tables[rows]
        kind, _, at = part.partition("@")
        t = float(at) if at else T
        if step is None:
            method = DEFAULT_METHOD if kind == "tumbling_omega_default" else "ak"
            stream_run = results.get("main" + ("@" + at if at else ""), {})
            results[part] = tumbling(conn, table, hierarchies, rows, omega, schema, tick, method=method, t=t,
                                     same_rows=stream_run.get("published"))
        elif kind == "main":
            results[part] = run_stream(conn, table, hierarchies, rows, omega, step, schema, tick, verify=True, t=t,
                                       **engine)
        else:
            results.setdefault(part, []).append(run_stream(conn, table, hierarchies, rows, omega, step, schema, tick,
                                                           **engine))
    return results


def _seconds(x, digits=3) -> str:
    return "–" if x is None else "%.*f" % (digits, x)


def markdown(results: dict) -> str:
    """The report: main stream against the baselines, its phases, and the two sweeps."""
    m = results["main"]
    lines = ["# sabre-pg bench --stream (SABRE_W, t = %g, k = %d)" % (results["t"], results["k"]), "",
             "Main: %d rows, omega = %d, I = %d, engine %s: %d advances (cases %s); verify: %s" % (
                 m["rows"], m["window_size"], m["step"], m.get("engine"), m["advances"], m["cases"],
                 ", ".join("%s %s" % kv for kv in (m.get("verify") or {}).items())), "",
             "| | total s | per advance s (mean / median / max) | AIL |", "|---|---|---|---|",
             "| SABRE_W | %.1f | %s / %s / %s | %.4f |" % (m["total_seconds"], _seconds(m["advance_mean"]),
                                                        _seconds(m["advance_median"]), _seconds(m["advance_max"]),
                                                        m["ail"])]
    for part, label in (("tumbling_I", "tumbling, blocks of I"), ("tumbling_omega", "tumbling, blocks of omega"),
                        ("tumbling_omega_default", "tumbling (default method), blocks of omega")):
        if part in results:
            b = results[part]
            lines.append("| %s = %d alone | %.1f (%d runs) | %s per block | %.4f |" % (
                label, b["block"], b["total_seconds"], b["blocks"], _seconds(b["per_block"]), b["ail"]))
    by_t = sorted([(results["t"], m, results.get("tumbling_omega_default"))] + [
        (float(p.split("@")[1]), results[p], results.get("tumbling_omega_default@" + p.split("@")[1]))
        for p in results if p.startswith("main@")], key=lambda x: x[0])
    if len(by_t) > 1:
        lines += ["", "By t (omega = %d, I = %d): the stream against tumbling omega with the default method" % (
            m["window_size"], m["step"]), "", "| t | SABRE_W AIL | advance median s | verify violations | "
            "tumbling omega (default method) AIL | the same, over the stream's rows |", "|---|---|---|---|---|---|"]
        lines += ["| %g | %s | %s | %s | %s | %s |" % (t, _seconds(r["ail"], 4), _seconds(r["advance_median"]),
                                                     (r.get("verify") or {}).get("violations", "–"),
                                                     _seconds((b or {}).get("ail"), 4),
                                                     _seconds((b or {}).get("ail_same_rows"), 4)) for t, r, b in by_t]
    lines += ["", "Server seconds per phase of an advance (mean): " +
              ", ".join("%s %.3f" % kv for kv in m.get("phases", {}).items()), ""]
    for fig, part, x, title in FIGURES:
        runs = results.get(part) or []
        if not runs:
            continue
        lines += ["## %s (%d rows)" % (title, runs[0]["rows"]), "", "| %s | advances | per advance s (mean / median) "
                  "| total s | AIL |" % x, "|---|---|---|---|---|"]
        lines += ["| %d | %d | %s / %s | %.1f | %s |" % (r[x], r["advances"], _seconds(r["advance_mean"]),
                                                       _seconds(r["advance_median"]), r["total_seconds"],
                                                       _seconds(r["ail"], 4)) for r in runs]
        lines.append("")
    return "\n".join(lines)


def plot(results: dict, out: Path) -> list:
    """fig15.png and fig16.png (seconds per advance and AIL against I, resp. omega; the
    tumbling baselines' AIL as lines); the files written (none without matplotlib)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written = []
    for fig, part, x, title in FIGURES:
        runs = [r for r in results.get(part) or [] if r["advances"]]
        if not runs:
            continue
        figure, axes = plt.subplots(1, 2, figsize=(9, 3.5))
        xs = [r[x] for r in runs]
        axes[0].plot(xs, [r["advance_mean"] for r in runs], marker="o", label="SABRE_W")
        axes[0].set_xlabel(x), axes[0].set_ylabel("seconds per advance")
        axes[1].plot(xs, [r["ail"] for r in runs], marker="o", label="SABRE_W")
        for baseline, style, color in (("tumbling_I", "--", "grey"), ("tumbling_omega", ":", "grey"),
                                       ("tumbling_omega_default", "-.", "black")):
            if baseline in results:
                b = results[baseline]
                axes[1].axhline(b["ail"], linestyle=style, color=color,
                                label="tumbling %d (%s)" % (b["block"], b.get("method", "ak")))
        axes[1].set_xlabel(x), axes[1].set_ylabel("AIL"), axes[1].legend(fontsize=7)
        figure.suptitle(title)
        figure.tight_layout()
        path = out / ("%s.png" % fig)
        figure.savefig(path)
        plt.close(figure)
        written.append(path)
    return written


def write(results: dict, out: Path) -> list:
    """stream.json, stream.md and the figures into ``out``; the files written."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "stream.json").write_text(json.dumps(results, indent=1, default=str))
    (out / "stream.md").write_text(markdown(results))
    return [out / "stream.json", out / "stream.md"] + plot(results, out)
