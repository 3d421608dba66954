"""CPU seconds and peak memory of the PostgreSQL processes of each node of a local Citus cluster,
for ``sabre-pg bench --citus`` (issue 27: "peak memory per backend on each node", "rows per
CPU second per worker").

Every node of the test cluster is a PostgreSQL server on this machine, so each node's processes
are the children of its postmaster (``/proc/<postmaster>/task/<postmaster>/children``). While
the measured call runs, :class:`NodeProcesses` polls them (every ``interval`` seconds) and reads
for each child

* ``utime + stime`` (``/proc/<pid>/stat``, in clock ticks): the CPU it used; a child's CPU at
  the first poll is subtracted (what it did before the call);
* ``VmHWM`` (``/proc/<pid>/status``): its peak resident memory, a lifetime peak: the call's own
  for a backend opened during the call (the worker backends serving a fresh coordinator backend);
* its command line, which says whether it is a backend (``postgres: <user> <db> <host>(<port>)
  ...``, or a parallel worker) or one of the server's own processes (checkpointer, the Citus
  maintenance daemon, autovacuum ...).

A backend that exits during the call is counted as its last poll saw it (up to ``interval``
seconds of CPU missed); what no poll saw of the children the postmaster reaped during the call
(a child born and gone between two polls, a child's last moments) is the postmaster's ``cutime +
cstime`` (the CPU of its reaped children) at the end less at the start, less what the polls saw
of them: reported apart (``unseen_exited_cpu_s``), not in a node's CPU.

A backend "worked" when its CPU grew during the call; a node's memory is the largest ``VmHWM``
among its backends that worked, its CPU the sum of theirs. The server's own processes
(autovacuum, the Citus maintenance daemon ...) are reported apart.
Needs the right to read the postgres processes' ``/proc`` files (root or the server's OS user).
"""
from __future__ import annotations

import os
import re
import threading
from pathlib import Path

import psycopg
from psycopg import sql

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
BACKEND = re.compile(r"^postgres: (\S+ \S+ (\[local\]|\S+\(\d+\))|parallel worker)")


def _stat(pid: int) -> tuple[int, float, float] | None:
    """(ppid, own CPU seconds, reaped children's CPU seconds) of a process, else None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()        # after "pid (comm)": state is fields[0]
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK, (int(fields[13]) + int(fields[14])) / TICK


def _vmhwm(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0       # kB -> MB
    except OSError:
        return None
    return None


def _children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def postmaster_of(conn) -> int | None:
    """The postmaster pid of the server ``conn`` is connected to, when it runs on this machine
    and its backend's /proc is readable; else None."""
    host = conn.info.host or ""
    if not (host.startswith("/") or host in ("localhost", "127.0.0.1", "::1", "")):
        return None
    pid = conn.execute("SELECT pg_catalog.pg_backend_pid()").fetchone()[0]
    found = _stat(pid)
    return None if found is None or not _cmdline(pid).startswith("postgres") else found[0]


def cluster_nodes(conn) -> list[dict]:
    """The coordinator ``conn`` is connected to and its primary workers: ``{"node": name, "port",
    "postmaster": pid or None}``, the coordinator first (named "coordinator", the workers
    "worker <host>:<port>")."""
    from sabre_pg.citus import worker_conninfo, workers

    nodes = [{"node": "coordinator", "port": int(conn.info.port), "postmaster": postmaster_of(conn)}]
    for w in workers(conn) or []:
        with psycopg.connect(worker_conninfo(conn, w["host"], w["port"]), connect_timeout=10) as wconn:
            nodes.append({"node": f"worker {w['node']}", "port": int(w["port"]), "postmaster": postmaster_of(wconn)})
    return nodes


class NodeProcesses:
    """``with NodeProcesses(nodes) as m: <the call>``; then ``m.result()``: per node name, its
    backends' CPU seconds and peak memory during the call (see the module doc), or None for a
    node whose postmaster is not visible. ``nodes``: :func:`cluster_nodes`'s list."""

    def __init__(self, nodes: list[dict], interval: float = 0.1):
        self.nodes = [n for n in nodes if n.get("postmaster")]
        self.names = [n["node"] for n in nodes]
        self.interval = interval
        self.first: dict = {}        # pid -> CPU at its first poll (0 for a child born during the call)
        self.last: dict = {}         # pid -> (node, CPU, VmHWM, cmdline) at its latest poll
        self.reaped: dict = {}       # node -> [reaped children's CPU at the start, at the end]
        self.alive: set = set()      # the children at the latest poll
        self._stop = threading.Event()

    def owners(self) -> dict:
        """{pid: node name} of the nodes' processes now (for :class:`sabre_pg.bench.netio.ClusterSockets`)."""
        return {pid: n["node"] for n in self.nodes for pid in _children(n["postmaster"])}

    def kind(self, pid: int) -> str:
        """'backend' (a client backend or a parallel worker) or 'server process' (the others)."""
        cmd = self.last[pid][3] if pid in self.last else _cmdline(pid)
        return "backend" if BACKEND.match(cmd) else "server process"

    def _poll(self, start: bool = False) -> None:
        alive = set()
        for n in self.nodes:
            pm = _stat(n["postmaster"])
            if pm is not None:
                self.reaped.setdefault(n["node"], [pm[2], pm[2]])[1] = pm[2]
            for pid in _children(n["postmaster"]):
                found = _stat(pid)
                if found is None:
                    continue
                alive.add(pid)
                if pid not in self.first:
                    self.first[pid] = found[1] if start else 0.0
                cmd = self.last[pid][3] if pid in self.last else _cmdline(pid)
                self.last[pid] = (n["node"], found[1], _vmhwm(pid), cmd)
        self.alive = alive

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._poll()

    def __enter__(self):
        self._poll(start=True)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._poll()
        return False

    def _node(self, name: str) -> dict:
        mine = {pid: v for pid, v in self.last.items() if v[0] == name}
        used = {pid: (cpu - self.first[pid], hwm, bool(BACKEND.match(cmd))) for pid, (_n, cpu, hwm, cmd) in mine.items()}
        worked = [(pid, cpu, hwm) for pid, (cpu, hwm, backend) in used.items() if backend and cpu > 0]
        # the children reaped during the call: their CPU after their last poll, or of those no poll saw
        start, end = self.reaped.get(name, [0.0, 0.0])
        unseen = max(0.0, end - start - sum(mine[pid][1] for pid in mine if pid not in self.alive))
        peak = max(worked, key=lambda w: w[2] or 0, default=None)
        return {"backends": len(worked), "cpu_s": round(sum(w[1] for w in worked), 3),
                "exited_cpu_s": round(sum(c for pid, (c, _h, b) in used.items() if b and pid not in self.alive), 3),
                "unseen_exited_cpu_s": round(unseen, 3),
                "other_processes_cpu_s": round(sum(c for c, _h, b in used.values() if not b), 3),
                "vmhwm_mb": None if peak is None or peak[2] is None else round(peak[2], 1),
                "per_backend": [{"pid": p, "cpu_s": round(c, 3), "vmhwm_mb": h and round(h, 1),
                                 "exited": p not in self.alive} for p, c, h in sorted(worked)]}

    def result(self) -> dict:
        """{node name: {"backends" (that worked), "cpu_s" (theirs, those that exited included),
        "exited_cpu_s" (of that, the backends that exited), "unseen_exited_cpu_s" (children reaped
        during the call: CPU no poll saw), "other_processes_cpu_s" (the server's own: autovacuum,
        Citus's daemon ...), "vmhwm_mb" (the largest among the backends that worked),
        "per_backend"}}, None for a node whose processes are not visible."""
        out = {name: None for name in self.names}
        for n in self.nodes:
            out[n["node"]] = self._node(n["node"])
        return out


def rows_per_node(conn, table: str) -> dict:
    """``{node name: rows}`` of the table ``public.<table>``: for a distributed one the rows of each worker's shards
    (``run_command_on_shards`` counts, grouped by ``citus_shards``' node), else all on the
    coordinator."""
    distributed = conn.execute("SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid "
                               "OPERATOR(pg_catalog.=) %s::regclass", (f"public.{table}",)).fetchone()
    if not distributed:
        return {"coordinator": conn.execute(sql.SQL("SELECT pg_catalog.count(*) FROM public.{}").format(
            sql.Identifier(table))).fetchone()[0]}
    rows = conn.execute(
        "SELECT s.nodename, s.nodeport, pg_catalog.sum(r.result::bigint) "
        "FROM pg_catalog.run_command_on_shards(%s::regclass, 'SELECT pg_catalog.count(*) FROM %%s') r "
        "JOIN pg_catalog.citus_shards s ON s.shardid OPERATOR(pg_catalog.=) r.shardid "
        "GROUP BY 1, 2 ORDER BY 2", (f"public.{table}",)).fetchall()
    return {f"worker {host}:{port}": int(n) for host, port, n in rows}
