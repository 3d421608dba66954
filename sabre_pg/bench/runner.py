"""The bench's runner: one anonymization per configuration, measured in the database.

A *configuration* is ``(method, rows, t, k, qis, sa_flat)`` (:func:`run_key`); arguments left
out take the bench configuration's defaults.  :meth:`Runner.anonymize` runs it once (SABRE-AK
or SABRE-KNN through ``sabre_anonymize``, or the Mondrian peer through
:func:`sabre_pg.peer.run_mondrian`) on the generated ``bench_census_<rows>`` table, then
measures the output with ``sabre_verify`` and ``sabre_utility``; :meth:`Runner.query_error`
and :meth:`Runner.kl` add the workload measures to a run, each computed once.
"""
from __future__ import annotations

import json
import time
from typing import Callable

from psycopg import sql

from sabre_pg import peer
from sabre_pg.catalog import define_hierarchy
from sabre_pg.census import CENSUS_QIS, CENSUS_SENSITIVE, census_values
from sabre_pg.census_sql import generate_census
from sabre_pg.core.hierarchy import Hierarchy

METHODS = ("ak", "knn")
PEER = "mondrian"
#: the in-database peer: sabre_anonymize's method 'mondrian' (t-Mondrian, exact EMD check)
IN_DB_PEER = "tmondrian"
SQL_METHOD = {IN_DB_PEER: "mondrian"}
LABEL = {"ak": "SABRE-AK", "knn": "SABRE-KNN", PEER: "Mondrian (anonypyx)", IN_DB_PEER: "t-Mondrian (sabre)"}
#: what every output leaves behind: the output, its classes and its side table
OUTPUT_SUFFIXES = ("", "_classes", "_keys")


def run_key(cfg: dict, method: str, rows: int | None = None, t: float | None = None,
            k: int | None = None, qis: int | None = None, sa_flat: bool = False) -> tuple:
    """The configuration of a run, the defaults of ``cfg`` filled in."""
    return (method, rows or cfg["rows"], t or cfg["t"], k or cfg["k"], qis or cfg["qis"], sa_flat)


def query_error_key(cfg: dict, lam: float | None = None, theta: float | None = None) -> str:
    return f"lambda={lam or cfg['lam']},theta={theta or cfg['theta']}"


def kl_key(cfg: dict, level: int | None = None) -> str:
    return f"level={level or cfg['level']}"


class Runner:
    """Runs configurations on one connection (autocommit, ``search_path`` holding sabre).

    ``runs`` maps :func:`run_key` to the run's record, in the order they ran; ``progress``
    is called with a short description after every run and every measure.
    """

    def __init__(self, conn, cfg: dict, seed: int, schema: str,
                 progress: Callable[[str], None] | None = None):
        self.conn, self.cfg, self.seed, self.schema = conn, cfg, seed, schema
        self.progress = progress or (lambda what: None)
        self.sources: dict[int, dict] = {}
        self.runs: dict[tuple, dict] = {}

    def source(self, rows: int) -> dict:
        """The census table of ``rows`` rows (generated once): its name, the hierarchies of
        its categorical columns, and a flat hierarchy over the SA's values."""
        if rows not in self.sources:
            name = f"bench_census_{rows}"
            generated = generate_census(self.conn, name, rows=rows, seed=self.seed, replace=True,
                                        sabre_schema=self.schema)
            sa_flat = f"{name}_{CENSUS_SENSITIVE}_flat"
            define_hierarchy(self.conn, sa_flat, Hierarchy.flat(census_values(CENSUS_SENSITIVE)).to_arx(),
                             ";", self.schema)
            self.sources[rows] = {"name": name, "hierarchies": generated["hierarchies"], "sa_flat": sa_flat}
        return self.sources[rows]

    def anonymize(self, method: str, rows: int | None = None, t: float | None = None,
                  k: int | None = None, qis: int | None = None, sa_flat: bool = False) -> dict:
        """The record of one configuration, run and measured on first use."""
        key = run_key(self.cfg, method, rows, t, k, qis, sa_flat)
        if key in self.runs:
            return self.runs[key]
        method, rows, t, k, qis, sa_flat = key
        source = self.source(rows)
        qi_list = CENSUS_QIS[:qis]
        output = "bench_%s_%d_%s_%d_%d%s" % (method, rows, ("%g" % t).replace(".", ""), k, qis,
                                            "_cat" if sa_flat else "")
        hierarchies = {column: name for column, name in source["hierarchies"].items() if column in qi_list}
        if sa_flat:
            hierarchies[CENSUS_SENSITIVE] = source["sa_flat"]
        record = {"method": method, "rows": rows, "t": t, "k": k, "qis": qis,
                  "sa": "categorical-flat" if sa_flat else "numerical", "output": output}
        if method == PEER:
            record.update(self._run_peer(source["name"], qi_list, t, k, output, hierarchies))
        else:
            record.update(self._run_sabre(source["name"], qi_list, t, k, method, output, hierarchies))
        record.update(self._measure(output, source["name"], qi_list, t, k, hierarchies, sa_flat))
        record.update(hier=hierarchies, source=source["name"], qi_list=qi_list, query_error={}, kl={})
        self.runs[key] = record
        self.progress(f"{method} n={rows} t={t} k={k} qis={qis}")
        return record

    def _run_peer(self, source, qi_list, t, k, output, hierarchies) -> dict:
        result = peer.run_mondrian(self.conn, source, qi_list, CENSUS_SENSITIVE, t, k, output,
                                   hierarchies, self.schema)
        return {"seconds": result["seconds"]["total"],
                "phases": {phase: round(seconds, 4) for phase, seconds in result["seconds"].items()}}

    def _run_sabre(self, source, qi_list, t, k, method, output, hierarchies) -> dict:
        started = time.perf_counter()
        (run_id,) = self.conn.execute(
            "SELECT run_id FROM sabre_anonymize(%s::regclass, %s, %s, %s, %s, %s, %s, %s)",
            (source, qi_list, CENSUS_SENSITIVE, t, k, SQL_METHOD.get(method, method), output,
             json.dumps({"hierarchies": hierarchies}))).fetchone()
        wall = time.perf_counter() - started
        phases, seconds = self.conn.execute(
            "SELECT phases, seconds FROM runs WHERE run_id = %s", (run_id,)).fetchone()
        return {"phases": phases, "seconds": seconds, "wall_seconds": wall}

    def _measure(self, output, source, qi_list, t, k, hierarchies, sa_flat) -> dict:
        """``sabre_verify`` (classes, violations, real closeness) and ``sabre_utility``."""
        verified = self.conn.execute(
            "SELECT * FROM sabre_verify(%s::regclass, %s, %s, %s, %s)",
            (output, CENSUS_SENSITIVE, t, k, hierarchies.get(CENSUS_SENSITIVE) if sa_flat else None)
        ).fetchone()
        utility = self.conn.execute(
            "SELECT ail, discernibility, aecs, aecs_normalized FROM "
            "sabre_utility(%s::regclass, %s::regclass, %s, %s, %s)",
            (output, source, qi_list, CENSUS_SENSITIVE,
             json.dumps({"hierarchies": hierarchies, "k": k}))).fetchone()
        return {**dict(zip(("classes", "violations", "closeness", "min_class_size"), verified[:4])),
                **dict(zip(("ail", "discernibility", "aecs", "aecs_normalized"), utility))}

    def query_error(self, record: dict, lam: float | None = None, theta: float | None = None) -> float:
        """Median relative error of ``cfg["queries"]`` COUNT queries (``sabre_query_error_stats``)."""
        key = query_error_key(self.cfg, lam, theta)
        if key not in record["query_error"]:
            median, mean, answered, dropped = self.conn.execute(
                "SELECT * FROM sabre_query_error_stats(%s::regclass, %s::regclass, %s, %s, %s, %s, %s, %s, %s)",
                (record["output"], record["source"], record["qi_list"], CENSUS_SENSITIVE,
                 self.cfg["queries"], lam or self.cfg["lam"], theta or self.cfg["theta"], self.seed,
                 json.dumps({"hierarchies": record["hier"]}))).fetchone()[:4]
            record["query_error"][key] = {"median": median, "mean": mean, "answered": answered,
                                          "dropped": dropped}
            self.progress(f"query error {record['method']} {key}")
        return record["query_error"][key]["median"]

    def kl(self, record: dict, level: int | None = None) -> float:
        """KL-divergence of the datacube at ``level`` (``sabre_kl_divergence``)."""
        key = kl_key(self.cfg, level)
        if key not in record["kl"]:
            record["kl"][key] = self.conn.execute(
                "SELECT sabre_kl_divergence(%s::regclass, %s::regclass, %s, %s, %s, %s)",
                (record["output"], record["source"], record["qi_list"], CENSUS_SENSITIVE,
                 level or self.cfg["level"], json.dumps({"hierarchies": record["hier"]}))).fetchone()[0]
            self.progress(f"KL {record['method']} {key}")
        return record["kl"][key]

    def drop_outputs(self) -> None:
        """Drop every run's output with its classes and side table (the sources stay)."""
        for record in self.runs.values():
            for suffix in OUTPUT_SUFFIXES:
                self.conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(
                    sql.Identifier(record["output"] + suffix)))
