"""``sabre-pg bench --multi-sa``: several sensitive attributes (docs/multiple-sa.md), in the database.

Every t vector runs, on the same table:

* ``refine``        -- ``sabre_anonymize`` with the array of SAs and its default method
  (``'refine'``: the cut search checking every SA, :mod:`sabre_pg.core.multi_refine`);
* ``auto``          -- the same with ``method => 'ak'`` (SABRE-AK on the most constraining SA,
  merged until every SA holds, the fragments' plan as fallback: strategy ``auto`` of
  :mod:`sabre_pg.core.multi_sa`);
* ``single:<sa>``   -- ``sabre_anonymize`` on each SA alone with its t and the default method,
  which need not hold for the other SAs (its classes over some t are counted);
* ``mondrian``      -- the reference: the product's t-Mondrian (:func:`mondrian`, the core's
  ``joint_mondrian`` run in the client) on the rows read from the table: median cuts of the
  widest normalized QI, a cut kept only if both parts have >= k rows and are t_i-close on every
  SA by exact EMD.

Each result's classes are checked on every SA with the exact EMD of ``core.exact_emd``
(:func:`measure`).  The *cost of the second SA* is a run's AIL above the worse single-SA run
(:func:`add_cost_of_second_sa`).  Data: the census-like table with ``hours`` as the second
numerical SA (``sabre_pg.census.hours_sql``), and Adult with occupation and education
(hierarchical) when ``public.adult`` and its hierarchies are loaded (``sabre-pg load-arx``).

``benchmarks/bench_multi_sa.py`` uses the reference Mondrian, :func:`measure`, the table of
:func:`markdown` and :func:`create_census_hours` from here.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
from psycopg import sql

from sabre_pg import census as domain
from sabre_pg.census_sql import generate_census
from sabre_pg.core import metrics
from sabre_pg.core.emd import SADomain
from sabre_pg.core.generalize import ECIndex
from sabre_pg.core.mondrian import joint_mondrian
from sabre_pg.core.multi_sa import violating
from sabre_pg.core.sabre import QuasiIdentifier, encode_numerical, generalize_classes
from sabre_pg.peer import _encode_qis, _read_source, load_hierarchy

DEFAULT = dict(rows=100_000, k=5, census_t=[[0.1, 0.1], [0.2, 0.15], [0.3, 0.25], [0.3, 0.3]],
               adult_t=[[0.1, 0.1], [0.2, 0.2], [0.25, 0.3], [0.3, 0.2]])
QUICK = dict(rows=5_000, k=5, census_t=[[0.2, 0.15]], adult_t=[[0.2, 0.2]])
CENSUS_SAS = ("salary", "hours")
ADULT = "adult"
ADULT_QIS = ("age", "sex", "race", "marital-status", "native-country", "workclass")
ADULT_SAS = ("occupation", "education")
KEY = "id"
#: the array form's default method, and the label of 'ak''s strategy (plpython/batch/anonymize.py)
DEFAULT_METHOD = "refine"
STRATEGY = "auto"
REFERENCE = "mondrian"
SUFFIXES = ("", "_classes", "_keys")


# ---------------------------------------------------------------------------- reference Mondrian
def mondrian(qis, codes, domains, ts, k):
    """The in-product t-Mondrian (``method => 'mondrian'``, :func:`core.mondrian.joint_mondrian`)
    with every SA checked: a cut of the widest normalized QI at its median is kept when both
    parts have >= k rows and an exact EMD_i <= t_i on every SA.
    Returns (class per row, ECIndex, information loss per class)."""
    ec = joint_mondrian(qis, codes, domains, ts, k)
    index = ECIndex(ec, int(ec.max()) + 1 if len(ec) else 0)
    return ec, index, generalize_classes(qis, index)[1]


# ---------------------------------------------------------------------------- measures
def measure(method, seconds, ec, ail, codes, domains, ts) -> dict:
    """One result checked on every SA: classes, AIL, classes over some t_i, max exact EMD per SA."""
    _, ec = np.unique(np.asarray(ec), return_inverse=True)
    bad, emds = violating(ec.reshape(-1), codes, domains, ts)
    return {"method": method, "t": [float(t) for t in ts], "seconds": round(float(seconds), 3),
            "classes": int(emds.shape[0]), "ail": round(float(ail), 4), "violations": int(bad.sum()),
            "max_emd": [round(float(v), 4) for v in emds.max(axis=0)]}


def add_cost_of_second_sa(rows: list) -> list:
    """``ail_above_worse_single`` on each run of one t vector: its AIL minus the worse
    (higher) AIL of the single-SA runs."""
    worse_single = max(r["ail"] for r in rows if r["method"].startswith("single:"))
    for r in rows:
        r["ail_above_worse_single"] = round(r["ail"] - worse_single, 4)
    return rows


def markdown(title, rows) -> str:
    lines = ["### " + title, "", "| t | method | classes | AIL | AIL - worse single | seconds | max EMD per SA | "
             "classes over some t |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append("| %s | %s | %d | %.4f | %+.4f | %.2f | %s | %d |" % (
            ", ".join("%g" % t for t in r["t"]), r["method"], r["classes"], r["ail"], r["ail_above_worse_single"],
            r["seconds"], ", ".join("%.3f" % v for v in r["max_emd"]), r["violations"]))
    return "\n".join(lines)


# ---------------------------------------------------------------------------- data in the database
def create_census_hours(conn, table: str, rows: int, seed: int = 1, schema: str = "sabre") -> dict:
    """``public.<table>``: the census-like rows of ``bench_census_<rows>`` (generated, seed) with
    the second SA ``hours`` (``census.hours_sql``), keyed by id, analyzed.  Returns the data set
    (:func:`data_set`'s shape)."""
    source = "bench_census_%d" % rows
    generated = generate_census(conn, source, rows=rows, seed=seed, replace=True, sabre_schema=schema)
    target = sql.Identifier(table)
    conn.execute(sql.SQL("DROP TABLE IF EXISTS public.{}").format(target))
    conn.execute(sql.SQL("CREATE TABLE public.{} AS SELECT c.*, {} AS hours FROM public.{} c").format(
        target, sql.SQL(domain.hours_sql("c.salary", "c.age", "c.id")), sql.Identifier(source)))
    conn.execute(sql.SQL("ALTER TABLE public.{} ADD PRIMARY KEY (id)").format(target))
    conn.execute(sql.SQL("ANALYZE public.{}").format(target))
    return {"name": "census", "table": table, "qis": list(domain.CENSUS_QIS), "sas": list(CENSUS_SAS),
            "hierarchies": dict(generated["hierarchies"])}


def adult_data_set(conn, schema: str = "sabre"):
    """Adult as loaded by ``sabre-pg load-arx`` (``public.adult`` with the hierarchies
    ``adult_<column>``), or None when the table or an SA's hierarchy is missing."""
    if conn.execute("SELECT pg_catalog.to_regclass('public.adult')").fetchone()[0] is None:
        return None
    wanted = ["adult_" + c for c in ADULT_QIS + ADULT_SAS]
    present = {r[0] for r in conn.execute(sql.SQL("SELECT name FROM {}.hierarchies WHERE name = ANY(%s)").format(
        sql.Identifier(schema)), (wanted,)).fetchall()}
    if not all("adult_" + sa in present for sa in ADULT_SAS):
        return None
    return {"name": "adult", "table": ADULT, "qis": list(ADULT_QIS), "sas": list(ADULT_SAS),
            "hierarchies": {c: "adult_" + c for c in ADULT_QIS + ADULT_SAS if "adult_" + c in present}}


def load_arrays(conn, data: dict, schema: str) -> tuple:
    """(QuasiIdentifiers, SA codes (rows x SAs), SADomains) of the table's rows in key order,
    encoded as the engine encodes them (numbers or hierarchy leaf positions; a numerical SA
    over its distinct values, a hierarchical SA over its hierarchy's leaves)."""
    qis, sas, hierarchies = data["qis"], data["sas"], data["hierarchies"]
    kinds, _, columns = _read_source(conn, data["table"], "public", [KEY] + qis + sas)
    order = np.argsort(np.asarray(columns[0], dtype=np.int64), kind="stable")
    columns = [[column[i] for i in order] for column in columns[1:]]
    qi_hierarchies = {c: h for c, h in hierarchies.items() if c in qis}
    _, encoded = _encode_qis(conn, qis, kinds, columns[:len(qis)], qi_hierarchies, schema)
    codes, domains = [], []
    for sa, values in zip(sas, columns[len(qis):]):
        if sa in hierarchies:
            hierarchy = load_hierarchy(conn, hierarchies[sa], schema)
            codes.append(hierarchy.codes([str(v) for v in values]))
            domains.append(SADomain("categorical", hierarchy=hierarchy))
        else:
            sa_codes, distinct = encode_numerical(np.asarray(values, dtype=np.float64))
            codes.append(sa_codes)
            domains.append(SADomain("numerical", m=len(distinct)))
    return ([QuasiIdentifier(name, values, hierarchy) for name, values, hierarchy in encoded],
            np.column_stack(codes).astype(np.int64), domains)


# ---------------------------------------------------------------------------- the experiment
class MultiSABench:
    """Runs the strategies of every t vector on one data set; ``outputs`` lists the tables made."""

    def __init__(self, conn, k: int, schema: str, progress=None):
        self.conn, self.k, self.schema = conn, k, schema
        self.progress = progress or (lambda what: None)
        self.outputs: list[str] = []

    def _sabre(self, data, method, sas, ts, output, arrays, engine=DEFAULT_METHOD) -> dict:
        """One ``sabre_anonymize`` run (array overload for several SAs) with ``engine`` as its
        method, labelled ``method``, checked on every SA."""
        several = len(sas) > 1
        used = set(data["qis"]) | set(sas)
        options = json.dumps({"hierarchies": {c: h for c, h in data["hierarchies"].items() if c in used},
                              "key": KEY})
        started = time.perf_counter()
        ail, seconds = self.conn.execute(sql.SQL(
            "SELECT ail, seconds FROM {}.sabre_anonymize(%s::regclass, %s::text[], {}, {}, %s, %s, %s, %s::jsonb)"
        ).format(sql.Identifier(self.schema), sql.SQL("%s::text[]" if several else "%s::text"),
                 sql.SQL("%s::float8[]" if several else "%s::float8")),
            ("public." + data["table"], data["qis"], list(sas) if several else sas[0],
             list(ts) if several else ts[0], self.k, engine, output, options)).fetchone()
        wall = time.perf_counter() - started
        self.outputs.append(output)
        keys = self.conn.execute(sql.SQL("SELECT key, ec_id FROM public.{} ORDER BY key").format(
            sql.Identifier(output + "_keys"))).fetchall()
        qis, codes, domains, all_ts = arrays
        record = measure(method, seconds, np.array([r[1] for r in keys]), ail, codes, domains, all_ts)
        record["wall_seconds"] = round(wall, 3)
        return record

    def run(self, data: dict, ts, tag: str) -> list:
        """The default ('refine'), 'ak' (auto), every SA alone, and the reference Mondrian at
        one t vector."""
        qis, codes, domains = data["arrays"]
        arrays = (qis, codes, domains, ts)
        prefix = "bench_multi_%s_%s_" % (data["name"], tag)
        rows = []
        for label, engine in ((DEFAULT_METHOD, DEFAULT_METHOD), (STRATEGY, "ak")):
            rows.append(self._sabre(data, label, data["sas"], ts, prefix + label, arrays, engine))
            self.progress("%s t=%s %s" % (data["name"], tag, label))
        for i, sa in enumerate(data["sas"]):
            rows.append(self._sabre(data, "single:" + sa, [sa], [ts[i]], "%ssingle%d" % (prefix, i), arrays))
            self.progress("%s t=%s single:%s" % (data["name"], tag, sa))
        started = time.perf_counter()
        ec, index, il = mondrian(qis, codes, domains, ts, self.k)
        seconds = time.perf_counter() - started
        rows.append(measure(REFERENCE, seconds, ec, metrics.ail(il, index.sizes), codes, domains, ts))
        self.progress("%s t=%s %s" % (data["name"], tag, REFERENCE))
        for r in rows:
            r.update(data=data["name"], rows=len(codes))
        return add_cost_of_second_sa(rows)

    def drop_outputs(self) -> None:
        for output in self.outputs:
            for suffix in SUFFIXES:
                self.conn.execute(sql.SQL("DROP TABLE IF EXISTS public.{}").format(sql.Identifier(output + suffix)))


def planned(cfg: dict, adult: bool) -> int:
    """Progress steps: per t vector, refine + auto + one per SA + Mondrian (two SAs in both data
    sets)."""
    return 5 * (len(cfg["census_t"]) + (len(cfg["adult_t"]) if adult else 0))


def t_tag(ts) -> str:
    return "_".join(("%g" % t).replace(".", "") for t in ts)


def title(data: dict, k: int, rows: int) -> str:
    kinds = "numerical" if data["name"] == "census" else "hierarchical"
    return "%s, %d rows, SAs %s (%s), k = %d" % (data["name"], rows, " + ".join(data["sas"]), kinds, k)


def plot(runs: list, out: Path) -> None:
    """fig_multi_sa.png: AIL and seconds per method and t vector, one row of panels per data set."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    names = list(dict.fromkeys(r["data"] for r in runs))
    fig, axes = plt.subplots(len(names), 2, figsize=(11, 3.4 * len(names)), squeeze=False)
    for row, name in enumerate(names):
        rs = [r for r in runs if r["data"] == name]
        vectors = list(dict.fromkeys(tuple(r["t"]) for r in rs))
        methods = list(dict.fromkeys(r["method"] for r in rs))
        width = 0.8 / len(methods)
        for j, method in enumerate(methods):
            for ax, key in zip(axes[row], ("ail", "seconds")):
                values = [next(r[key] for r in rs if r["method"] == method and tuple(r["t"]) == v) for v in vectors]
                ax.bar(np.arange(len(vectors)) + j * width, values, width, label=method)
        for ax, label in zip(axes[row], ("AIL", "seconds")):
            ax.set_xticks(np.arange(len(vectors)) + 0.4 - width / 2)
            ax.set_xticklabels(["t = " + ", ".join("%g" % t for t in v) for v in vectors])
            ax.set_ylabel(label)
            ax.set_title(name)
        axes[row][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "fig_multi_sa.png", dpi=110)
    plt.close(fig)


def below_reference(rows: list, run: dict) -> float:
    """``run``'s AIL relative to the reference Mondrian's at its t vector, in percent."""
    ref = next(r["ail"] for r in rows if r["method"] == REFERENCE and r["t"] == run["t"])
    return 100.0 * (run["ail"] / ref - 1) if ref else 0.0


def report(runs: list, cfg: dict, seconds: float) -> str:
    """multi_sa.md: one table per data set, with the cost of the second SA summarized."""
    lines = ["# Several sensitive attributes: %s and %s against each SA alone and the reference Mondrian"
             % (DEFAULT_METHOD, STRATEGY), "",
             "Configuration: %s; total %.1f s.  'AIL - worse single' is the cost of the second SA; a single-SA "
             "run ignores the other SA (its classes over some t are counted); every result is checked on every "
             "SA with the exact EMD." % (json.dumps(cfg), seconds), ""]
    for name in dict.fromkeys(r["data"] for r in runs):
        rs = [r for r in runs if r["data"] == name]
        lines += [markdown(rs[0]["title"], rs), ""]
        for method in (DEFAULT_METHOD, STRATEGY):
            costs = [r["ail_above_worse_single"] for r in rs if r["method"] == method]
            lines += ["Cost of the second SA (%s, %s): %s AIL above the worse single-SA run." % (
                name, method, ", ".join("%+.4f" % c for c in costs)), ""]
        lines += ["%s against the reference Mondrian (%s): %s." % (DEFAULT_METHOD, name, ", ".join(
            "%+.1f%%" % below_reference(rs, r) for r in rs if r["method"] == DEFAULT_METHOD)), ""]
    return "\n".join(lines)


def run_multi_sa_bench(conn, cfg: dict, out: Path, schema: str, seed: int, keep: bool) -> dict:
    """The experiment on the census-like data (and Adult when loaded); writes multi_sa.json,
    multi_sa.md and fig_multi_sa.png to ``out``."""
    from sabre_pg.progress import steps

    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    adult = adult_data_set(conn, schema)
    census_table = "bench_multi_census_%d" % cfg["rows"]
    runs = []
    with steps(planned(cfg, adult is not None), "sabre-pg bench --multi-sa", "run") as progress:
        bench = MultiSABench(conn, cfg["k"], schema, progress)
        census = create_census_hours(conn, census_table, cfg["rows"], seed, schema)
        for data, vectors in ((census, cfg["census_t"]), (adult, cfg["adult_t"])):
            if data is None:
                continue
            data["arrays"] = load_arrays(conn, data, schema)
            for ts in vectors:
                for r in bench.run(data, ts, t_tag(ts)):
                    runs.append(dict(r, title=title(data, cfg["k"], len(data["arrays"][1]))))
    total = time.perf_counter() - started
    if not keep:
        bench.drop_outputs()
        conn.execute(sql.SQL("DROP TABLE IF EXISTS public.{}").format(sql.Identifier(census_table)))
    (out / "multi_sa.json").write_text(json.dumps({"config": cfg, "adult": adult is not None, "runs": runs,
                                                   "seconds": total}, indent=1))
    (out / "multi_sa.md").write_text(report(runs, cfg, total))
    plot(runs, out)
    return {"runs": runs, "adult": adult is not None, "seconds": total}
