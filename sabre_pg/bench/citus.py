"""``sabre-pg bench --citus``: the default call on a hash-distributed table against the same table
on one node, on a Citus coordinator (issue 27; docs/scale-out.md, "Citus (built so far)").

For each size (``--rows``; ``--quick``: 5,000), on the census-like table ``public.bench_census_<rows>``
(local, generated once) and its copy ``public.bench_census_<rows>_dist`` distributed by ``id``:
one plain ``sabre_anonymize`` (the default method, t = 0.35, k = 6, the 7 QIs, SA salary;
``keep: ["id"]`` on the distributed table so that its output is colocated with it) in a fresh
coordinator backend, reporting

* the wall time and the function's own seconds, classes, AIL and the largest class EMD;
* ``sabre_verify`` of the output, read on the coordinator: classes over t or under k;
* when the coordinator runs on this machine: the bytes its backend received from and sent to the
  workers over its TCP sockets (:class:`sabre_pg.bench.netio.SocketBytes`, the kernel's per-socket
  counters; ``/proc/<pid>/io`` ``rchar`` misses them: libpq reads with ``recv()``), its file bytes
  read and written (``rchar``/``wchar``, what the one-node run reads) and its peak memory
  (``VmHWM``); beside them the table's size (``pg_total_relation_size``, over the shards for the
  distributed one);
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

from sabre_pg.bench.netio import SocketBytes
from sabre_pg.bench.speed import K, T, backend_memory, ensure_table, load_average
from sabre_pg.census import CENSUS_QIS, CENSUS_SENSITIVE

DEFAULT_ROWS = (100_000,)
QUICK_ROWS = (5_000,)
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


def time_run(dsn: str, table: str, hierarchies: dict, schema: str, keep: list) -> dict:
    """One plain default call in a fresh coordinator backend, then its verification."""
    qs = sql.Identifier(schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("SELECT {}.sabre_selftest()").format(qs))
        size = table_bytes(conn, table)
        io_before, load = _proc_io(conn), load_average()
        pid = conn.execute("SELECT pg_catalog.pg_backend_pid()").fetchone()[0]
        ports = [p for (p,) in conn.execute("SELECT nodeport FROM pg_catalog.pg_dist_node WHERE groupid <> 0")]
        sockets = SocketBytes(pid, ports) if io_before is not None else None
        t0 = time.perf_counter()
        with sockets or contextlib.nullcontext():
            row = conn.execute(sql.SQL(
                "SELECT run_id, output::text, rows, classes, min_class_size, max_emd, ail, seconds FROM "
                "{}.sabre_anonymize(source => %s::regclass, quasi_identifiers => %s, sensitive => %s, t => %s, "
                "k => %s, options => %s::jsonb)").format(qs),
                (f"public.{table}", CENSUS_QIS, CENSUS_SENSITIVE, T, K,
                 json.dumps({"hierarchies": hierarchies, "keep": keep}))).fetchone()
        wall = time.perf_counter() - t0
        io_after, mem = _proc_io(conn), backend_memory(conn)
        run_id, output = row[0], row[1]
        output_oid = conn.execute(sql.SQL("SELECT output_oid FROM {}.runs WHERE run_id = %s").format(qs),
                                  (run_id,)).fetchone()[0]
    with psycopg.connect(dsn, autocommit=True) as conn:     # the check, from the coordinator alone
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
    received = None if io_before is None or io_after is None or sockets.result() is None else {
        **{key: io_after[key] - io_before[key] for key in io_before}, **sockets.result()}
    return {"table": table, "output": output, "rows": row[2], "classes": row[3], "min_class_size": row[4],
            "max_emd": row[5], "ail": row[6], "seconds": row[7], "wall": wall, "load": load,
            "table_bytes": size, "coordinator_io": received, "coordinator_vmhwm_mb": (mem or {}).get("VmHWM"),
            "verify": {"classes": checked[0], "violations": checked[1], "max_emd": checked[2],
                       "min_class_size": checked[3]}, "placement": where}


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


def describe(r: dict) -> str:
    io = r["coordinator_io"]
    share = "n/a (coordinator not local, or its sockets not visible)" if io is None else (
        f"received {io['received'] / 1e6:.3f} MB from the workers, sent {io['sent'] / 1e6:.3f} MB "
        f"({io['sockets']} sockets); files read {io['rchar'] / 1e6:.1f} MB, written {io['wchar'] / 1e6:.1f} MB; "
        f"{coordinator_share(r):.4f}x the table's {r['table_bytes'] / 1e6:.1f} MB "
        + ("received" if r.get("distributed") else "read") + " (target < 0.1x)")
    v = r["verify"]
    if io is not None and r.get("distributed"):
        share += (f"; network {network_per_row(r):.2f} bytes per source row to and from the coordinator "
                  "(shard-local moves no row between workers)")
    return "\n".join([
        f"   {r['table']}: {r['wall']:.2f} s wall ({r['seconds']:.2f} s inside), {r['classes']:,} classes, "
        f"AIL {r['ail']:.4f}, max EMD {r['max_emd']:.4f}; load {r['load']}",
        f"      sabre_verify: {v['violations']} violations in {v['classes']:,} classes (smallest {v['min_class_size']})",
        f"      coordinator backend: {share}; VmHWM "
        + ("n/a" if r["coordinator_vmhwm_mb"] is None else f"{r['coordinator_vmhwm_mb']:.0f} MB"),
        "      placement: " + ", ".join(f"{k} {w}" for k, w in r["placement"].items()),
    ])


def run_citus(dsn: str, sizes, schema: str = "sabre", echo=print, shards: int | None = None) -> list:
    """Each size: the local table, then its distributed copy (``shards``: see
    :func:`ensure_distributed`); the records."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        workers = require_citus(conn)
    results = []
    for rows in sizes:
        table, hierarchies, note = ensure_table(dsn, rows, schema)
        dist = ensure_distributed(dsn, table, shards)
        echo(f"== {rows:,} rows (table {note}); Citus with {workers} worker(s)")
        for name, keep in ((table, []), (dist, ["id"])):
            r = {"rows": rows, "workers": workers, "distributed": name == dist,
                 **time_run(dsn, name, hierarchies, schema, keep)}
            echo(describe(r))
            results.append(r)
    return results


def table_md(results: list) -> str:
    lines = ["| rows | table | seconds | classes | AIL | violations | coordinator received (distributed) or "
             "read (local) / table | coordinator network bytes per row | output |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        share, net = coordinator_share(r), network_per_row(r)
        ratio = "n/a" if share is None else f"{share:.4f}"
        net = "-" if net is None else f"{net:.2f}"
        lines.append(f"| {r['rows']:,} | {'distributed' if r['distributed'] else 'local'} | {r['wall']:.2f} | "
                     f"{r['classes']:,} | {r['ail']:.4f} | {r['verify']['violations']} | {ratio} | {net} | "
                     f"{r['placement']['output']} |")
    return "\n".join(lines)
