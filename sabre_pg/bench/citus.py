"""``sabre-pg bench --citus``: the default call on a hash-distributed table, with each class
design, against the same table on one node, on a Citus coordinator (issue 27; docs/scale-out.md,
"`sabre-pg bench --citus`").

For each size (``--rows`` or ``--sizes``, default 1,000,000; the issue asks 1M and 10M;
``--quick``: 5,000), on the census-like table ``public.bench_census_<rows>`` (local, generated
once in bulk) and its copy ``public.bench_census_<rows>_dist`` distributed by ``id`` (copied
once, ``INSERT ... SELECT``): one plain ``sabre_anonymize`` (the default method, t = 0.35, k = 6,
the 7 QIs, SA salary; ``keep: ["id"]`` on the distributed table so that its output is colocated
with it) in a fresh coordinator backend, first on the local table (the one-node baseline), then
on the distributed one once per class design of ``designs`` (``options.citus_design``:
'shard_local', 'qi_local'; a design the server refuses is reported ``available: false``, and
shard-local, today's only design, runs without the option when the server does not know it),
reporting

* the wall time and the function's own seconds, classes, AIL and the largest class EMD;
* ``sabre_verify`` of the output, read on the coordinator: classes over t or under k;
* when the coordinator runs on this machine: the bytes its backend received from and sent to the
  workers over its TCP sockets (:class:`sabre_pg.bench.netio.SocketBytes`, the kernel's per-socket
  counters; ``/proc/<pid>/io`` ``rchar`` misses them: libpq reads with ``recv()``), its file bytes
  read and written (``rchar``/``wchar``, what the one-node run reads) and its peak memory
  (``VmHWM``); beside them the table's size (``pg_total_relation_size``, over the shards for the
  distributed one);
* when every node runs on this machine, per node (the coordinator and each worker): the largest
  ``VmHWM`` of its backends that worked during the call and their CPU seconds
  (:class:`sabre_pg.bench.nodes.NodeProcesses`), the rows it holds (``rows_per_node``) and so the
  rows per CPU second of each worker; the bytes that crossed between the nodes, per node and in
  total, and per source row (:class:`sabre_pg.bench.netio.ClusterSockets`);
* how the output is placed (``pg_dist_partition``: distributed and colocated, or local).

The issue's target is that the coordinator receives less than a tenth of the table's size; the
run reports the ratio (bytes received from the workers over the table's size).
"""
from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import psycopg
from psycopg import sql

from sabre_pg.bench.netio import ClusterSockets, SocketBytes, between_nodes
from sabre_pg.bench.nodes import NodeProcesses, cluster_nodes, rows_per_node
from sabre_pg.bench.speed import K, T, backend_memory, ensure_table, load_average
from sabre_pg.census import CENSUS_QIS, CENSUS_SENSITIVE

DEFAULT_ROWS = (1_000_000,)    # the issue's sizes: --sizes 1000000,10000000
QUICK_ROWS = (5_000,)
DESIGNS = ("shard_local", "qi_local")   # options.citus_design's values (issue 27's two class designs)
QUICK_SHARDS = 4            # --quick: a few shards of the small table (each anonymized on its worker)


class NotCitus(RuntimeError):
    """The DSN's server is not a Citus coordinator with active workers."""


def require_citus(conn) -> int:
    """The number of active workers; NotCitus when there is no Citus or no worker."""
    if not conn.execute("SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus'").fetchone():
        raise NotCitus("the server has no citus extension: run sabre-pg bench --citus against a Citus coordinator")
    n = conn.execute("SELECT count(*) FROM pg_catalog.pg_dist_node WHERE isactive AND noderole = 'primary' "
                     "AND groupid <> 0").fetchone()[0]
    if n == 0:
        raise NotCitus("the Citus coordinator has no active worker (citus_add_node adds one)")
    return n


def _proc_io(conn) -> dict | None:
    """rchar/wchar of the connection's backend (file reads and writes, not its sockets' recv/send),
    when the server is local."""
    if backend_memory(conn) is None:
        return None
    pid = conn.execute("SELECT pg_catalog.pg_backend_pid()").fetchone()[0]
    try:
        text = Path(f"/proc/{pid}/io").read_text()
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    return {key: int(fields[key]) for key in ("rchar", "wchar") if key in fields}


def ensure_distributed(dsn: str, table: str, shards: int | None = None) -> str:
    """``<table>_dist``: a copy of the local table distributed by id (made once, reused), in
    ``shards`` shards (default: Citus's ``citus.shard_count``, 32); ``_dist<shards>`` then."""
    dist = table + "_dist" + (str(shards) if shards else "")
    with psycopg.connect(dsn, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = "
                              "pg_catalog.to_regclass(%s)", (f"public.{dist}",)).fetchone()
        if exists:
            return dist
        conn.execute(sql.SQL("DROP TABLE IF EXISTS public.{} CASCADE").format(sql.Identifier(dist)))
        conn.execute(sql.SQL("CREATE TABLE public.{} (LIKE public.{} INCLUDING ALL)").format(
            sql.Identifier(dist), sql.Identifier(table)))
        conn.execute("SELECT pg_catalog.create_distributed_table(%s, 'id', shard_count => %s::int)",
                     (f"public.{dist}", shards or conn.execute("SHOW citus.shard_count").fetchone()[0]))
        conn.execute(sql.SQL("INSERT INTO public.{} SELECT * FROM public.{}").format(
            sql.Identifier(dist), sql.Identifier(table)))
        conn.execute(sql.SQL("ANALYZE public.{}").format(sql.Identifier(dist)))
    return dist


def table_bytes(conn, table: str) -> int:
    distributed = conn.execute("SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = %s::regclass",
                               (f"public.{table}",)).fetchone()
    if distributed:
        return int(conn.execute("SELECT pg_catalog.citus_total_relation_size(%s::regclass)",
                                (f"public.{table}",)).fetchone()[0])
    return int(conn.execute("SELECT pg_catalog.pg_total_relation_size(%s::regclass)",
                            (f"public.{table}",)).fetchone()[0])


def placement(conn, relation) -> str:
    row = conn.execute("SELECT partmethod::text, pg_catalog.column_to_column_name(logicalrelid, partkey) "
                       "FROM pg_catalog.pg_dist_partition WHERE logicalrelid = %s::regclass", (relation,)).fetchone()
    if row is None:
        return "local table on the coordinator"
    return "reference table" if row[0] == "n" else f"distributed by {row[1]}"


def _anonymize(conn, qs, table: str, hierarchies: dict, keep: list, design: str | None) -> tuple:
    options = {"hierarchies": hierarchies, "keep": keep, **({"citus_design": design} if design else {})}
    return conn.execute(sql.SQL(
        "SELECT run_id, output::text, rows, classes, min_class_size, max_emd, ail, seconds FROM "
        "{}.sabre_anonymize(source => %s::regclass, quasi_identifiers => %s, sensitive => %s, t => %s, "
        "k => %s, options => %s::jsonb)").format(qs),
        (f"public.{table}", CENSUS_QIS, CENSUS_SENSITIVE, T, K, json.dumps(options))).fetchone()


def _measured_call(dsn: str, table: str, hierarchies: dict, schema: str, keep: list, design: str | None) -> dict:
    """The call in a fresh coordinator backend, inside the monitors: the coordinator backend's
    sockets to the workers (SocketBytes), every node's processes (NodeProcesses), the sockets
    between the nodes (ClusterSockets); the call's row, the wall time and what they measured."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("SELECT {}.sabre_selftest()").format(sql.Identifier(schema)))
        size = table_bytes(conn, table)
        nodes = cluster_nodes(conn)
        io_before, load = _proc_io(conn), load_average()
        pid = conn.execute("SELECT pg_catalog.pg_backend_pid()").fetchone()[0]
        sockets = SocketBytes(pid, [n["port"] for n in nodes[1:]]) if io_before is not None else None
        procs = NodeProcesses(nodes)
        cluster = ClusterSockets({n["node"]: n["port"] for n in nodes}, procs.owners, kind=procs.kind)
        t0 = time.perf_counter()
        with procs, cluster, sockets or contextlib.nullcontext():
            row = _anonymize(conn, sql.Identifier(schema), table, hierarchies, keep, design)
        wall = time.perf_counter() - t0
        io_after, mem = _proc_io(conn), backend_memory(conn)
    received = None if io_before is None or io_after is None or sockets.result() is None else {
        **{key: io_after[key] - io_before[key] for key in io_before}, **sockets.result()}
    return {"row": row, "wall": wall, "load": load, "table_bytes": size, "coordinator_io": received,
            "coordinator_vmhwm_mb": (mem or {}).get("VmHWM"), "nodes": procs.result(),
            "between_nodes": between_nodes(cluster.result())}


def _checked(dsn: str, schema: str, run_id) -> dict:
    """sabre_verify of the run's output and where it and its _classes were placed, from the coordinator."""
    qs = sql.Identifier(schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        output_oid = conn.execute(sql.SQL("SELECT output_oid FROM {}.runs WHERE run_id = %s").format(qs),
                                  (run_id,)).fetchone()[0]
        checked = conn.execute(sql.SQL("SELECT classes, violations, max_emd, min_class_size FROM "
                                       "{}.sabre_verify(%s::regclass, %s, %s, %s)").format(qs),
                               (output_oid, CENSUS_SENSITIVE, T, K)).fetchone()
        where = {"output": placement(conn, output_oid)}
        classes_oid = conn.execute(                         # <output>_classes, beside the output
            "SELECT c.oid FROM pg_catalog.pg_class c JOIN pg_catalog.pg_class o "
            "ON o.relnamespace = c.relnamespace AND c.relname = o.relname || '_classes' WHERE o.oid = %s",
            (output_oid,)).fetchone()
        if classes_oid is not None:
            where["_classes"] = placement(conn, classes_oid[0])
    return {"verify": {"classes": checked[0], "violations": checked[1], "max_emd": checked[2],
                       "min_class_size": checked[3]}, "placement": where}


def time_run(dsn: str, table: str, hierarchies: dict, schema: str, keep: list, design: str | None = None) -> dict:
    """One plain default call (``options.citus_design = design`` when given) in a fresh coordinator
    backend, measured, then its verification."""
    m = _measured_call(dsn, table, hierarchies, schema, keep, design)
    row = m.pop("row")
    return {"table": table, "output": row[1], "rows": row[2], "classes": row[3], "min_class_size": row[4],
            "max_emd": row[5], "ail": row[6], "seconds": row[7], **m, **_checked(dsn, schema, row[0])}


def _refused_design(e: psycopg.Error) -> bool:
    """The server refused options.citus_design (unknown key, or unknown value): 22023 naming it."""
    text = " ".join(filter(None, (e.diag.message_primary, e.diag.message_hint)))
    return e.sqlstate == "22023" and "citus_design" in text


def run_design(dsn: str, table: str, hierarchies: dict, schema: str, design: str) -> dict:
    """The distributed table's call with one class design. Shard-local is today's only design:
    when the server does not know ``options.citus_design``, it runs without it
    (``design_option: false``). Another design the server refuses, or whose run fails, is
    reported ``available: false`` with the server's error, not raised."""
    try:
        return {"design": design, "available": True, "design_option": True,
                **time_run(dsn, table, hierarchies, schema, ["id"], design)}
    except psycopg.Error as e:
        reason = f"{e.sqlstate}: {e.diag.message_primary}"
        if design == "shard_local" and _refused_design(e):
            return {"design": design, "available": True, "design_option": False, "refused": reason,
                    **time_run(dsn, table, hierarchies, schema, ["id"], None)}
        if design == "shard_local":
            raise
        return {"design": design, "available": False, "table": table, "reason": reason}


def coordinator_share(r: dict) -> float | None:
    """What the coordinator backend took in over the table's size: for the distributed table the
    bytes received from the workers (sockets), for the local one the file bytes it read."""
    io = r["coordinator_io"]
    if io is None:
        return None
    return (io["received"] if r.get("distributed") else io["rchar"]) / max(r["table_bytes"], 1)


def network_per_row(r: dict) -> float | None:
    """The coordinator backend's socket bytes to and from the workers over the source rows."""
    io = r["coordinator_io"]
    if io is None or not r.get("distributed"):
        return None
    return (io["received"] + io["sent"]) / max(r["rows"], 1)


def between_per_row(r: dict) -> float | None:
    """The bytes that crossed between the nodes (all of them, both ways) over the source rows."""
    net = r.get("between_nodes")
    return None if net is None or not r.get("distributed") else net["total"] / max(r["rows"], 1)


def throughput(r: dict) -> dict:
    """{node: rows it holds per CPU second of its backends}: each worker of a distributed run
    (its shards' rows), the coordinator for the one-node run."""
    out = {}
    for node, rows in (r.get("rows_per_node") or {}).items():
        used = (r.get("nodes") or {}).get(node)
        if used and used["cpu_s"] > 0:
            out[node] = rows / used["cpu_s"]
    return out


def workers_rate(r: dict) -> float | None:
    """The distributed run's source rows per CPU second of all the workers' backends together
    (design-independent: QI-local's workers anonymize parts, not the shards they hold)."""
    used = [m["cpu_s"] for n, m in (r.get("nodes") or {}).items() if n != "coordinator" and m]
    return r["rows"] / sum(used) if r.get("distributed") and used and sum(used) > 0 else None


def _num(value, spec: str) -> str:
    """A number, or n/a (a partitioned run, automatic at more than auto_partition_rows, reports no AIL)."""
    return "n/a" if value is None else format(value, spec)


def _label(r: dict) -> str:
    return f"distributed, {r['design']}" if r.get("distributed") else "one node"


def _nodes_lines(r: dict) -> list:
    per_row = between_per_row(r)
    speed = throughput(r)
    lines = [f"      {node}: " + ("n/a (not visible from here)" if m is None else (
        "peak VmHWM of a backend " + ("n/a (none worked)" if m["vmhwm_mb"] is None else f"{m['vmhwm_mb']:.0f} MB")
        + f", CPU {m['cpu_s']:.2f} s in {m['backends']} backend(s) (of which exited {m['exited_cpu_s']:.2f} s; "
        f"the server's own processes {m['other_processes_cpu_s']:.2f} s, "
        f"children unseen {m.get('unseen_exited_cpu_s', 0):.2f} s)" + (f"; {r['rows_per_node'][node]:,} rows, "
                                                  f"{speed[node]:,.0f} rows per CPU second" if node in speed else "")))
        for node, m in (r.get("nodes") or {}).items()]
    if workers_rate(r) is not None:
        lines.append(f"      all workers: {workers_rate(r):,.0f} source rows per CPU second of their backends")
    net = r.get("between_nodes")
    if net is not None and r.get("distributed"):
        lines.append(f"      between the nodes: {net['total'] / 1e6:.3f} MB = {per_row:.2f} bytes per source row ("
                     + ", ".join(f"{n} sent {v['sent'] / 1e6:.3f} MB, received {v['received'] / 1e6:.3f} MB"
                                 for n, v in net["nodes"].items())
                     + f"; the servers' own processes {net['background'] / 1e6:.3f} MB more, "
                     f"unattributed {net['unattributed_bytes']} bytes)")
    return lines


def describe(r: dict) -> str:
    if not r.get("available", True):
        return f"   {r['table']} ({_label(r)}): not available: {r['reason']}"
    io = r["coordinator_io"]
    share = "n/a (coordinator not local, or its sockets not visible)" if io is None else (
        f"received {io['received'] / 1e6:.3f} MB from the workers, sent {io['sent'] / 1e6:.3f} MB "
        f"({io['sockets']} sockets); files read {io['rchar'] / 1e6:.1f} MB, written {io['wchar'] / 1e6:.1f} MB; "
        f"{coordinator_share(r):.4f}x the table's {r['table_bytes'] / 1e6:.1f} MB "
        + ("received" if r.get("distributed") else "read") + " (target < 0.1x)")
    v = r["verify"]
    return "\n".join([
        f"   {r['table']} ({_label(r)}): {r['wall']:.2f} s wall ({_num(r['seconds'], '.2f')} s inside), "
        f"{r['classes']:,} classes, AIL {_num(r['ail'], '.4f')}, max EMD {_num(r['max_emd'], '.4f')}; load {r['load']}"
        + ("" if r.get("design_option", True) else " [options.citus_design not known to the server: run without it]"),
        f"      sabre_verify: {v['violations']} violations in {v['classes']:,} classes (smallest {v['min_class_size']})",
        f"      coordinator backend: {share}; VmHWM "
        + ("n/a" if r["coordinator_vmhwm_mb"] is None else f"{r['coordinator_vmhwm_mb']:.0f} MB"),
        *_nodes_lines(r),
        "      placement: " + ", ".join(f"{k} {w}" for k, w in r["placement"].items()),
    ])


def run_citus(dsn: str, sizes, schema: str = "sabre", echo=print, shards: int | None = None,
              designs=DESIGNS, out=None) -> list:
    """Each size: the local table on one node (the baseline), then its distributed copy
    (``shards``: see :func:`ensure_distributed`) with each class design of ``designs``; the records
    (also written to the folder ``out`` after each run, when given: a long run keeps what it did)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        workers = require_citus(conn)
    results = []
    for rows in sizes:
        table, hierarchies, note = ensure_table(dsn, rows, schema)
        dist = ensure_distributed(dsn, table, shards)
        with psycopg.connect(dsn, autocommit=True) as conn:
            held = {table: rows_per_node(conn, table), dist: rows_per_node(conn, dist)}
            shard_count = conn.execute("SELECT pg_catalog.count(*) FROM pg_catalog.pg_dist_shard WHERE logicalrelid "
                                       "OPERATOR(pg_catalog.=) %s::regclass", (f"public.{dist}",)).fetchone()[0]
        echo(f"== {rows:,} rows (table {note}); Citus with {workers} worker(s), {shard_count} shards")
        runs = [(table, None)] + [(dist, d) for d in designs]
        for name, design in runs:
            r = time_run(dsn, name, hierarchies, schema, []) if design is None else run_design(
                dsn, name, hierarchies, schema, design)
            r = {"rows": rows, "workers": workers, "shards": shard_count if design else None,
                 "distributed": design is not None, "rows_per_node": held[name], **r}
            results.append(r)
            if out is not None:
                write(results, out)
            echo(describe(r))
    return results


def _mb(m: dict | None) -> str:
    return "n/a" if not m or m["vmhwm_mb"] is None else f"{m['vmhwm_mb']:.0f}"


def table_md(results: list) -> str:
    lines = ["| rows | table | seconds | classes | AIL | max EMD | violations | coordinator received (distributed) "
             "or read (local) / table | coordinator network bytes per row | bytes between nodes per row | "
             "peak VmHWM per backend (MB): coordinator / workers | CPU s: coordinator / workers | "
             "rows per CPU s per worker (one node: coordinator) | rows per CPU s, all workers | output |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if not r.get("available", True):
            lines.append(f"| {r['rows']:,} | {_label(r)} | not available: {r['reason']} |" + " |" * 12)
            continue
        share, net, between = coordinator_share(r), network_per_row(r), between_per_row(r)
        nodes = r.get("nodes") or {}
        workers = [m for n, m in nodes.items() if n != "coordinator"]
        cpu = "n/a" if nodes.get("coordinator") is None else f"{nodes['coordinator']['cpu_s']:.1f} / " + ", ".join(
            "n/a" if m is None else f"{m['cpu_s']:.1f}" for m in workers)
        lines.append(
            f"| {r['rows']:,} | {_label(r)} | {r['wall']:.2f} | {r['classes']:,} | {_num(r['ail'], '.4f')} | "
            f"{_num(r['max_emd'], '.4f')} | {r['verify']['violations']} | {'n/a' if share is None else f'{share:.4f}'} | "
            f"{'-' if net is None else f'{net:.2f}'} | {'-' if between is None else f'{between:.2f}'} | "
            f"{_mb(nodes.get('coordinator'))} / {', '.join(_mb(m) for m in workers)} | {cpu} | "
            f"{', '.join(f'{v:,.0f}' for v in throughput(r).values()) or 'n/a'} | "
            f"{'-' if workers_rate(r) is None else f'{workers_rate(r):,.0f}'} | {r['placement']['output']} |")
    return "\n".join(lines)


def write(results: list, out) -> None:
    """``citus.json`` (the records) and ``citus.md`` (:func:`table_md`) in the folder ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "citus.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    (out / "citus.md").write_text(table_md(results) + "\n")
