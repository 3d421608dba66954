"""The speed of a plain ``sabre_anonymize`` call against the speed of moving the data (issue 26).

For each size and each method (default: the default method 'refine', 'ak', 'mondrian'), on the
census-like table ``public.bench_census_<rows>`` (generated once, reused):

1. in a fresh backend (after one ``sabre_selftest()``, the session's interpreter start, timed
   apart), one plain call -- no options but the hierarchies and ``keep: []`` -- with t = 0.35,
   k = 6, the 7 QIs, SA salary: the client's wall time, the function's own seconds, each phase
   of ``sabre.runs.phases``, ``sabre.runs.partitions`` (automatic partitions) and the
   backend's CPU seconds (utime + stime of /proc/<pid>/stat) and peak memory (``VmHWM`` of ``/proc/<pg_backend_pid()>/status``: the cluster must
   be local and the bench connect as a superuser or the server's OS user);
2. right after, in other fresh backends, the copy: ``CREATE TABLE ... AS SELECT * FROM`` the
   same table (its time and VmHWM), then dropped; the ratio run / copy is the figure of merit
   (targets: the default method <= 5, 'ak' <= 4 at 1M rows); and each I/O phase's own floor
   (:func:`floors`: a COPY of the same columns, a CTAS of the same rows or join) and the ratio;
   and the bound those floors set (:func:`floor_bound`): the run with every I/O phase at its
   floor and the rest as it ran, and what a target leaves for the rest.

The load average is recorded with every measurement: timings on a shared machine say so.
Used by ``benchmarks/bench_db.py`` and ``sabre-pg bench --speed``.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import psycopg
from psycopg import sql

from sabre_pg.bench.report import phase_order
from sabre_pg.census import CENSUS_CATEGORICAL, CENSUS_QIS, CENSUS_SENSITIVE
from sabre_pg.census_sql import generate_census

T, K = 0.35, 6
METHODS = ("refine", "ak", "mondrian")
# method -> largest ratio run / copy at 1M rows (issue 26)
TARGETS = {"refine": 5.0, "ak": 4.0}


def proc_memory(pid: int) -> dict | None:
    """VmHWM / VmRSS / RssAnon / RssShmem (MB) of a local postgres process, else None."""
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    if not comm.startswith("postgres"):
        return None              # same pid on this machine, but not a postgres backend
    out = {}
    for line in status.splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmHWM", "VmRSS", "RssAnon", "RssShmem"):
            out[key] = int(rest.split()[0]) / 1024.0   # kB -> MB
    return out or None


def _server_is_local(conn) -> bool:
    host = conn.info.host or ""
    return host.startswith("/") or host in ("localhost", "127.0.0.1", "::1", "")


def backend_memory(conn) -> dict | None:
    if not _server_is_local(conn):
        return None
    pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    return proc_memory(pid)


def proc_cpu(pid: int) -> float | None:
    """User + system CPU seconds of a local process so far (``/proc/<pid>/stat``), else None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def ensure_table(dsn: str, rows: int, schema: str, regenerate: bool = False) -> tuple[str, dict, str]:
    """(table, hierarchies, note): the census table of this size, generated when needed."""
    table = f"bench_census_{rows}"
    names = {c: f"{table}_{c}" for c in CENSUS_CATEGORICAL}
    with psycopg.connect(dsn, autocommit=True) as conn:
        if not regenerate:
            exists = conn.execute("SELECT to_regclass(%s)", (f"public.{table}",)).fetchone()[0]
            if exists:
                n = conn.execute(sql.SQL("SELECT count(*) FROM public.{}").format(sql.Identifier(table))).fetchone()[0]
                have = conn.execute(sql.SQL("SELECT count(*) FROM {}.hierarchies WHERE name = ANY(%s)")
                                    .format(sql.Identifier(schema)), (list(names.values()),)).fetchone()[0]
                if n == rows and have == len(names):
                    return table, names, "reused"
        res = generate_census(conn, table=table, rows=rows, seed=1, replace=True, sabre_schema=schema)
        return table, res["hierarchies"], f"generated in {res['seconds']:.2f} s"


def time_anonymize(dsn: str, table: str, hierarchies: dict, schema: str, method: str = "refine",
                   options: dict | None = None) -> dict:
    """One plain call in a fresh backend (see the module doc, 1.)."""
    with psycopg.connect(dsn, autocommit=True) as conn:       # fresh backend: its peak is this run's
        qs = sql.Identifier(schema)
        t0 = time.perf_counter()
        conn.execute(sql.SQL("SELECT {}.sabre_selftest()").format(qs))
        cold = time.perf_counter() - t0
        before = backend_memory(conn)
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0] if _server_is_local(conn) else None
        cpu0 = proc_cpu(pid) if pid else None
        load = load_average()
        t0 = time.perf_counter()
        row = conn.execute(
            sql.SQL("SELECT run_id, rows, classes, min_class_size, max_emd, ail, seconds FROM "
                    "{}.sabre_anonymize(source => %s::regclass, quasi_identifiers => %s, sensitive => %s, "
                    "t => %s, k => %s, method => %s, options => %s::jsonb)").format(qs),
            (f"public.{table}", CENSUS_QIS, CENSUS_SENSITIVE, T, K, method,
             json.dumps({"hierarchies": hierarchies, "keep": [], **(options or {})})),
        ).fetchone()
        wall = time.perf_counter() - t0
        cpu1 = proc_cpu(pid) if pid else None
        after = backend_memory(conn)
        run_id = row[0]
        phases, partitions = conn.execute(sql.SQL("SELECT phases, to_jsonb(r)->'partitions' FROM {}.runs r "
                                                  "WHERE run_id = %s").format(qs), (run_id,)).fetchone()
    return {"run_id": run_id, "method": method, "rows": row[1], "classes": row[2], "min_class_size": row[3],
            "max_emd": row[4], "ail": row[5], "seconds": row[6], "wall": wall, "cold_start": cold,
            "cpu": None if cpu0 is None or cpu1 is None else cpu1 - cpu0,
            "phases": phases, "partitions": partitions, "load": load, "mem_before": before, "mem_after": after}


def time_copy(dsn: str, table: str) -> dict:
    """The copy in a fresh backend: ``CREATE TABLE AS SELECT *`` of the table, then dropped."""
    tmp = f"bench_copy_tmp_{os.getpid()}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS public.{}").format(sql.Identifier(tmp)))
        load = load_average()
        t0 = time.perf_counter()
        conn.execute(sql.SQL("CREATE TABLE public.{} AS SELECT * FROM public.{}").format(
            sql.Identifier(tmp), sql.Identifier(table)))
        wall = time.perf_counter() - t0
        mem = backend_memory(conn)
        conn.execute(sql.SQL("DROP TABLE public.{}").format(sql.Identifier(tmp)))
    return {"wall": wall, "mem": mem, "load": load}


def _timed(conn, statement, params=None, copy: bool = False) -> float:
    t0 = time.perf_counter()
    if copy:
        with conn.cursor() as cur, cur.copy(statement, params) as cp:
            for _ in cp:
                pass
    else:
        conn.execute(statement, params)
    return time.perf_counter() - t0


def floors(dsn: str, run_id: int, table: str, schema: str = "sabre") -> dict:
    """Each I/O phase's own floor, right after the run (its relations exist), in a fresh backend:
    what moving the same rows costs without sabre.  {phase: seconds}:

    - ``summary``: ``SELECT salary, count(*) ... GROUP BY`` of the source;
    - ``read``: ``COPY (SELECT id, the QIs, the SA FROM source) TO STDOUT (FORMAT binary)``;
    - ``write_keys``: ``CREATE UNLOGGED TABLE AS SELECT *`` of ``<output>_keys``;
    - ``build_classes``: ``CREATE TABLE AS SELECT *`` of ``<output>_classes``;
    - ``build_output``: ``CREATE TABLE AS SELECT *`` of ``<output>`` (``build_output_join``: the CTAS
      of the join source x side table x classes that would build it from the source);
    - ``check``: ``COPY (SELECT ec_id, SA FROM <output>) TO STDOUT (FORMAT binary)``."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        out = conn.execute(sql.SQL("SELECT output_name FROM {}.runs WHERE run_id = %s").format(
            sql.Identifier(schema)), (run_id,)).fetchone()[0]
        gen = [r[0] for r in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped "
            "AND attname NOT IN ('ec_id', %s) ORDER BY attnum", (out, CENSUS_SENSITIVE)).fetchall()]
        src = sql.SQL("public.{}").format(sql.Identifier(table))
        rel = {suffix: sql.SQL(out[:-1] + suffix + '"' if out.endswith('"') else out + suffix)
               for suffix in ("", "_classes", "_keys")}
        tmp = sql.Identifier(f"bench_floor_tmp_{os.getpid()}")
        cols = sql.SQL(", ").join(map(sql.Identifier, ["id"] + list(CENSUS_QIS) + [CENSUS_SENSITIVE]))
        sa = sql.Identifier(CENSUS_SENSITIVE)
        found = {"summary": _timed(conn, sql.SQL("SELECT {}, count(*) FROM {} GROUP BY 1").format(sa, src)),
                 "read": _timed(conn, sql.SQL("COPY (SELECT {} FROM {}) TO STDOUT (FORMAT binary)").format(cols, src),
                                copy=True)}
        for phase, suffix, unlogged in (("write_keys", "_keys", True), ("build_classes", "_classes", False),
                                        ("build_output", "", False)):
            found[phase] = _timed(conn, sql.SQL("CREATE {}TABLE public.{} AS SELECT * FROM {}").format(
                sql.SQL("UNLOGGED " if unlogged else ""), tmp, rel[suffix]))
            conn.execute(sql.SQL("DROP TABLE public.{}").format(tmp))
        found["build_output_join"] = _timed(conn, sql.SQL(
            "CREATE TABLE public.{} AS SELECT k.ec_id, {}, s.{} FROM {} s JOIN {} k ON k.key = s.id "
            "JOIN {} c ON c.ec_id = k.ec_id").format(
                tmp, sql.SQL(", ").join(sql.SQL("c.{}").format(sql.Identifier(g)) for g in gen), sa, src,
                rel["_keys"], rel["_classes"]))
        conn.execute(sql.SQL("DROP TABLE public.{}").format(tmp))
        found["check"] = _timed(conn, sql.SQL("COPY (SELECT ec_id, {} FROM {}) TO STDOUT (FORMAT binary)").format(
            sa, rel[""]), copy=True)
    return {k: round(v, 4) for k, v in found.items()}


IO_PHASES = ("summary", "read", "write_keys", "build_classes", "build_output", "check")


def floor_bound(rows: int, r: dict, copy: dict, floor: dict | None) -> dict | None:
    """What the run would cost with every I/O phase at its own floor (or at what it took, where
    that is less) and the rest of its wall time (the engine, validation, swap, commit) as it
    ran: ``io`` (the I/O phases so), ``rest``, ``bound`` (their sum), its ``ratio`` to the copy,
    and ``budget``: the seconds the method's target ratio (:data:`TARGETS`, from 1M rows) leaves
    for the rest once the I/O is at its floors (None without a target).  None for a run in
    parts (its phases are the parts', not the table's) or without floors."""
    if not floor or r.get("partitions") or copy["wall"] <= 0:
        return None
    phases = r["phases"]
    io_run = sum(phases[p] for p in IO_PHASES if p in phases)
    io = sum(min(phases[p], floor[p]) if floor.get(p) else phases[p] for p in IO_PHASES if p in phases)
    rest = max(r["wall"] - io_run, 0.0)
    target = TARGETS.get(r["method"]) if rows >= 1_000_000 else None
    return {"io": io, "rest": rest, "bound": io + rest, "ratio": (io + rest) / copy["wall"],
            "io_ratio": io / copy["wall"], "budget": None if target is None else target * copy["wall"] - io}


def mb(mem: dict | None, key: str = "VmHWM") -> str:
    return "n/a" if not mem or key not in mem else f"{mem[key]:.0f} MB"


def describe(rows: int, r: dict, copy: dict, floor: dict | None = None) -> str:
    """Lines of one measurement (a run and its copy)."""
    ratio = r["wall"] / copy["wall"] if copy["wall"] > 0 else float("inf")
    target = TARGETS.get(r["method"]) if rows >= 1_000_000 else None
    verdict = "" if target is None else f"   [target <= {target:g}: {'OK' if ratio <= target else 'MISSED'}]"
    parts = r["partitions"]
    split = "one piece" if not parts else "%d parts (%s)" % (parts["parts"], "automatic" if parts.get("automatic")
                                                            else "options.partitions")
    return "\n".join([
        f"   {r['method']:9s} {r['wall']:8.2f} s wall ({r['seconds']:.2f} s inside); copy {copy['wall']:.2f} s; "
        f"ratio {ratio:.1f}{verdict}; backend CPU "
        f"{'n/a' if r.get('cpu') is None else '%.2f s' % r['cpu']}",
        f"             {r['classes']:,} classes (smallest {r['min_class_size']}), max EMD {r['max_emd']:.4f}, "
        f"AIL {'n/a' if r['ail'] is None else '%.4f' % r['ail']}; {split}; load {r['load']}",
        f"             VmHWM {mb(r['mem_after'])} (before the run {mb(r['mem_before'])}); copy's VmHWM "
        f"{mb(copy['mem'])}",
        "             phases (s) " + "  ".join(f"{p} {r['phases'][p]:.2f}" for p in phase_order(r["phases"])),
    ] + ([] if not floor else [
        "             phase / its floor: " + "  ".join(
            f"{p} {r['phases'][p]:.2f}/{floor[p]:.2f} = {r['phases'][p] / floor[p]:.1f}x"
            # (a phase of a few milliseconds, e.g. a partitioned run's read making its parts' views, has
            # no work to compare with a floor)
            for p in phase_order(floor) if p in r["phases"] and floor[p] > 0 and r["phases"][p] >= 0.05)
        + f"  (CTAS of the join source x keys x classes {floor['build_output_join']:.2f})"]) + bound_line(rows, r, copy, floor))


def bound_line(rows: int, r: dict, copy: dict, floor: dict | None) -> list:
    """The line of :func:`floor_bound` (none when it does not apply)."""
    b = floor_bound(rows, r, copy, floor)
    if b is None:
        return []
    budget = "" if b["budget"] is None else "; at the target the rest would have %.2f s" % b["budget"]
    return ["             every I/O phase at its floor: %.2f s (%.1fx the copy) + the rest as run %.2f s = %.2f s "
            "(%.1fx)%s" % (b["io"], b["io_ratio"], b["rest"], b["bound"], b["ratio"], budget)]


def run_speed(dsn: str, sizes, methods=METHODS, repeat: int = 1, schema: str = "sabre", regenerate: bool = False,
              echo=print, with_floors: bool = True) -> list:
    """Every method at every size, ``repeat`` times, each followed by its copy and (``with_floors``)
    its phases' floors; the records."""
    results = []
    for rows in sizes:
        table, hierarchies, note = ensure_table(dsn, rows, schema, regenerate)
        for repetition in range(max(1, repeat)):
            echo(f"== {rows:,} rows (table {note if repetition == 0 else 'reused'}), repetition {repetition + 1}")
            for method in methods:
                r = time_anonymize(dsn, table, hierarchies, schema, method)
                copy = time_copy(dsn, table)
                floor = floors(dsn, r["run_id"], table, schema) if with_floors else None
                echo(describe(rows, r, copy, floor))
                results.append({"rows": rows, "table": table, "method": method, "anonymize": r, "copy": copy,
                                "ratio": r["wall"] / copy["wall"], "floors": floor,
                                "bound": floor_bound(rows, r, copy, floor)})
    return results


def curve_table(results: list) -> str:
    """Markdown: time and peak memory against rows, per method, with the copy's line."""
    lines = ["| rows | method | run (s) | copy (s) | ratio | run VmHWM (MB) | copy VmHWM (MB) | parts | load |",
             "|---:|---|---:|---:|---:|---:|---:|---|---:|"]
    for x in results:
        r, c = x["anonymize"], x["copy"]
        parts = r["partitions"]["parts"] if r["partitions"] else 1
        lines.append("| {:,} | {} | {:.2f} | {:.2f} | {:.1f} | {} | {} | {} | {} |".format(
            x["rows"], x["method"], r["wall"], c["wall"], x["ratio"], mb(r["mem_after"]).replace(" MB", ""),
            mb(c["mem"]).replace(" MB", ""), parts, r["load"]))
    return "\n".join(lines)
