"""The bytes a local PostgreSQL backend receives from (and sends to) other servers over TCP, counted
by the kernel per socket (``ss``'s ``bytes_received``/``bytes_sent``), for ``sabre-pg bench
--citus`` and tests/citus: what a Citus coordinator's backend receives from its workers.

``/proc/<pid>/io`` ``rchar`` does NOT count this: libpq (and so Citus's connections to the
workers) reads its sockets with ``recv()``, which Linux leaves out of ``rchar`` (checked on the
test cluster: pulling 50,000 rows, 5.1 MB of tuple data by Citus's EXPLAIN ANALYZE, changed the
coordinator backend's ``rchar`` by 0, while its sockets received 6.0 MB).

Citus opens more connections than it keeps (one per shard task, closed at the end of the
statement or transaction), so a before/after snapshot of the backend's sockets misses the closed
ones. :class:`SocketBytes` therefore polls ``ss -tinp`` while the measured call runs (to learn
which sockets are the backend's) and listens to ``ss -tinE`` (the kernel's socket-destroy events,
which carry each closed socket's final counters). A socket closed before any poll saw it is not
attributed to the backend; its bytes, when its peer is one of the given ports, are reported apart
as ``unattributed_received`` (other backends of the machine talking to the same servers, or the
workers' own connections to each other on a one-machine test cluster).

Needs ``ss`` (iproute2) and the right to see the backend's sockets (root, or the server's OS
user); otherwise :meth:`SocketBytes.result` is None.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time

_COUNTER = re.compile(r"\b(bytes_received|bytes_sent):(\d+)")


def _parse(text: str) -> dict:
    """{(local, peer): (owner pid or None, bytes_received, bytes_sent)} from ``ss -ti[p]H`` output."""
    sockets = {}
    for block in re.split(r"\n(?=\S)", text):
        fields = block.split()
        if len(fields) < 5:
            continue
        counters = dict((k, int(v)) for k, v in _COUNTER.findall(block))
        owner = re.search(r"pid=(\d+),", block)
        sockets[(fields[3], fields[4])] = (int(owner.group(1)) if owner else None,
                                           counters.get("bytes_received", 0), counters.get("bytes_sent", 0))
    return sockets


def _port(address: str) -> int | None:
    try:
        return int(address.rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return None


class SocketBytes:
    """``with SocketBytes(pid, peer_ports) as s: ...``; then ``s.result()``: the bytes the backend
    ``pid`` received from and sent to peers on ``peer_ports`` (its TCP sockets to them, open
    before, opened during, closed during), ``{"received", "sent", "sockets",
    "unattributed_received"}``, or None when ``ss`` cannot see the backend's sockets."""

    def __init__(self, pid: int, peer_ports, interval: float = 0.02):
        self.pid, self.ports, self.interval = pid, set(peer_ports), interval
        self.available = shutil.which("ss") is not None and os.path.exists(f"/proc/{pid}")
        self.before: dict = {}
        self.owned: dict = {}       # (local, peer) -> latest (received, sent) seen while the pid owned it
        self._stop = threading.Event()

    def _snapshot(self) -> dict:
        out = subprocess.run(["ss", "-tinpH"], capture_output=True, text=True).stdout
        return {k: v for k, v in _parse(out).items() if v[0] == self.pid and _port(k[1]) in self.ports}

    def _poll(self) -> None:
        while not self._stop.is_set():
            for key, (_, received, sent) in self._snapshot().items():
                self.owned[key] = (received, sent)
            self._stop.wait(self.interval)

    def __enter__(self):
        if not self.available:
            return self
        self._events = subprocess.Popen(["ss", "-tinEH"], stdout=subprocess.PIPE, text=True)
        time.sleep(0.2)                                     # the listener is subscribed
        self.before = {k: (v[1], v[2]) for k, v in self._snapshot().items()}
        self.owned = dict(self.before)
        if not self.before and not any(v[0] is not None for v in _parse(
                subprocess.run(["ss", "-tinpH"], capture_output=True, text=True).stdout).values()):
            self.available = False                          # ss shows no process: no right to see them
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        if not hasattr(self, "_thread"):
            if hasattr(self, "_events"):
                self._events.terminate()
                self._events.communicate()
            return False
        self._stop.set()
        self._thread.join()
        final = {k: (v[1], v[2]) for k, v in self._snapshot().items()}
        time.sleep(0.2)                                     # the last destroy events arrive
        self._events.terminate()
        closed = _parse(self._events.communicate()[0])
        received = sent = unattributed = 0
        keys = set(self.owned) | set(final)
        for key in keys:
            if key in final:
                r, s = final[key]
            elif key in closed:
                r, s = closed[key][1:]
            else:                                           # closed, its event lost: its last poll
                r, s = self.owned[key]
            r0, s0 = self.before.get(key, (0, 0))
            received, sent = received + r - r0, sent + s - s0
        for key, (_, r, _s) in closed.items():
            if key not in keys and _port(key[1]) in self.ports:
                unattributed += r
        self._result = {"received": received, "sent": sent, "sockets": len(keys),
                        "unattributed_received": unattributed}
        return False

    def result(self) -> dict | None:
        return getattr(self, "_result", None) if self.available else None


_INODE = re.compile(r"\bino:(\d+)")


def _socket_inodes(pids) -> dict:
    """{socket inode: pid} over the open files of the given processes."""
    found = {}
    for pid in pids:
        try:
            names = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for name in names:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{name}")
            except OSError:
                continue
            if target.startswith("socket:["):
                found[int(target[8:-1])] = pid
    return found


class ClusterSockets:
    """The bytes that cross between the nodes of a cluster running on this machine, per pair of
    nodes: ``with ClusterSockets(ports, owners) as s: ...``; then ``s.result()``.

    ``ports``: {node name: its server port}; ``owners()``: {pid: node name} of the nodes' live
    processes (:class:`sabre_pg.bench.nodes.NodeProcesses` ``.owners``). Every connection between
    two nodes has its client end in a process of one node and its server end at another node's
    port, so the client ends are counted (each byte once): TCP sockets whose peer port is a node's
    port, owned by a process of a node (its socket inode among that process's open files). The
    bench's own connections to the coordinator are not a node's and are left out. Polls
    ``ss -tineH`` (no ``-p``: the inode, then only the nodes' open files are read, which is far
    cheaper than ``ss -p``'s scan of every process) every ``interval`` seconds and listens to the
    socket-destroy events (``ss -tinE``) as :class:`SocketBytes` does; a socket closed before any
    poll saw it is reported apart (``unattributed_bytes``)."""

    def __init__(self, ports: dict, owners, interval: float = 0.2, kind=None):
        self.ports, self.owners, self.interval = dict(ports), owners, interval
        self.kind = kind or (lambda pid: "backend")
        self.node_of_port = {p: n for n, p in self.ports.items()}
        self.available = shutil.which("ss") is not None
        self.seen: dict = {}     # (local, peer) -> [client node, inode, received and sent at the start, now, kind]
        self._stop = threading.Event()

    def _snapshot(self, start: bool = False) -> None:
        out = subprocess.run(["ss", "-tineH"], capture_output=True, text=True).stdout
        for block in re.split(r"\n(?=\S)", out):
            fields = block.split()
            if len(fields) < 5 or _port(fields[4]) not in self.node_of_port:
                continue
            counters = dict((k, int(v)) for k, v in _COUNTER.findall(block))
            received, sent = counters.get("bytes_received", 0), counters.get("bytes_sent", 0)
            key = (fields[3], fields[4])
            if key not in self.seen:
                inode = _INODE.search(block)
                self.seen[key] = [None, int(inode.group(1)) if inode else 0,
                                  *((received, sent) if start else (0, 0)), received, sent, None]
            self.seen[key][4:6] = [received, sent]
        self._attribute()

    def _attribute(self) -> None:
        """The node of each socket not attributed yet (the bench's own sockets are marked once)."""
        pending = {v[1]: v for v in self.seen.values() if v[0] is None and v[1]}
        if not pending:
            return
        owners = self.owners()
        for inode, pid in {**_socket_inodes(owners), **_socket_inodes([os.getpid()])}.items():
            if inode in pending:
                pending[inode][0] = owners.get(pid, "bench")
                pending[inode][6] = self.kind(pid) if pid in owners else None

    def _poll(self) -> None:
        while not self._stop.wait(self.interval):
            self._snapshot()

    def __enter__(self):
        if not self.available:
            return self
        self._events = subprocess.Popen(["ss", "-tinEH"], stdout=subprocess.PIPE, text=True)
        time.sleep(0.2)                                     # the listener is subscribed
        self._snapshot(start=True)
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        if not self.available:
            return False
        self._stop.set()
        self._thread.join()
        self._snapshot()
        time.sleep(0.2)                                     # the last destroy events arrive
        self._events.terminate()
        self._result = self._tally(_parse(self._events.communicate()[0]))
        return False

    def _tally(self, closed: dict) -> dict:
        pairs: dict = {}
        unattributed = 0
        for key, (_owner, received, sent) in closed.items():
            if key in self.seen:
                self.seen[key][4:6] = [received, sent]
            elif _port(key[1]) in self.node_of_port:
                unattributed += received + sent
        for (local, peer), (node, _inode, r0, s0, received, sent, kind) in self.seen.items():
            if node in (None, "bench"):
                continue                                    # the bench's own, or no owner found
            pair = pairs.setdefault((node, self.node_of_port[_port(peer)], kind), [0, 0, 0])
            pair[0], pair[1], pair[2] = pair[0] + sent - s0, pair[1] + received - r0, pair[2] + 1
        return {"pairs": [{"client": a, "server": b, "kind": k, "client_sent": s, "client_received": r,
                           "sockets": n} for (a, b, k), (s, r, n) in sorted(pairs.items())],
                "unattributed_bytes": unattributed}

    def result(self) -> dict | None:
        """``{"pairs": [{client node, server node, kind (``kind(pid)`` of the client end's process),
        client_sent, client_received, sockets}], "unattributed_bytes"}`` (a node connecting to
        itself is a pair too), or None."""
        return getattr(self, "_result", None) if self.available else None


def between_nodes(result: dict | None) -> dict | None:
    """From :meth:`ClusterSockets.result`: ``{"total": bytes crossing between different nodes on
    connections opened by backends, "nodes": {node: {"sent", "received"}}, "background": the same
    on connections of the servers' own processes (Citus's maintenance daemon), "unattributed_bytes",
    "pairs"}``; a node's connections to itself are left out of the sums. ``total`` includes the
    unattributed bytes: sockets to a node's port that no poll saw (Citus's short repartition
    connections between workers; the bench's own connections are all open before the call), which
    the nodes' sums cannot place."""
    if result is None:
        return None
    nodes: dict = {}
    total = background = 0
    for p in result["pairs"]:
        if p["client"] == p["server"]:
            continue
        if p["kind"] != "backend":
            background += p["client_sent"] + p["client_received"]
            continue
        total += p["client_sent"] + p["client_received"]
        for node, sent, received in ((p["client"], p["client_sent"], p["client_received"]),
                                     (p["server"], p["client_received"], p["client_sent"])):
            mine = nodes.setdefault(node, {"sent": 0, "received": 0})
            mine["sent"], mine["received"] = mine["sent"] + sent, mine["received"] + received
    total += result["unattributed_bytes"]   # sockets to a node's port closed between two polls
    return {"total": total, "nodes": nodes, "background": background,
            "unattributed_bytes": result["unattributed_bytes"],
            "pairs": result["pairs"]}
