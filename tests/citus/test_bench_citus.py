"""``sabre-pg bench --citus`` (sabre_pg/bench/citus.py) on the test's Citus cluster: the default
call on a distributed copy of the census table against the local one, each verified from the
coordinator, with each node's backends' peak memory and CPU seconds, the rows per CPU second of
each worker and the bytes between the nodes; a class design the server refuses is reported "not
available"; and a clear refusal on a server without Citus."""
from __future__ import annotations

import json

from sabre_pg import cli


def _assert_nodes(r: dict, workers: int) -> None:
    """Every node reported (its processes visible); the nodes that worked (all of them for the
    distributed table, the coordinator for the local one) with a peak memory and CPU seconds."""
    nodes = r["nodes"]
    assert list(nodes)[0] == "coordinator" and len(nodes) == 1 + workers
    for name, m in nodes.items():
        assert m is not None and m["cpu_s"] >= 0 and m["backends"] >= 0, name
        if r["distributed"] or name == "coordinator":
            assert m["vmhwm_mb"] is not None and m["vmhwm_mb"] > 0 and m["cpu_s"] > 0, name


def test_bench_citus_quick(citus_cluster, tmp_path, capsys):
    dsn = citus_cluster.dsn
    assert cli.main(["install", "--dsn", dsn]) == 0
    out = tmp_path / "bench"
    assert cli.main(["bench", "--citus", "--quick", "--dsn", dsn, "--out", str(out),
                     "--designs", "shard_local,no_such_design"]) == 0
    results = json.loads((out / "citus.json").read_text())
    assert [(r["distributed"], r.get("design")) for r in results] == [
        (False, None), (True, "shard_local"), (True, "no_such_design")]
    local, dist, refused = results
    for r in (local, dist):
        assert r["rows"] == 5000 and r["verify"]["violations"] == 0 and r["verify"]["min_class_size"] >= 6
        assert r["coordinator_io"]["rchar"] > 0 and r["table_bytes"] > 0
        _assert_nodes(r, len(citus_cluster.workers))
    assert local["placement"]["output"] == "local table on the coordinator"
    assert local["rows_per_node"] == {"coordinator": 5000}
    # pushed down (batch/citus_shards.py): the classes stay on the shards' workers, and the
    # coordinator backend receives far less than the table from the workers (aggregates and the
    # workers' replies, counted on its sockets), though it receives something
    assert dist["placement"] == {"output": "distributed by id", "_classes": "distributed by shard_key"}
    assert 0 < dist["coordinator_io"]["received"] < 0.5 * dist["table_bytes"]
    # each worker holds rows, anonymizes them with CPU of its own, at a positive rate per CPU second
    workers = [n for n in dist["nodes"] if n != "coordinator"]
    assert sorted(dist["rows_per_node"]) == sorted(workers) and sum(dist["rows_per_node"].values()) == 5000
    for w in workers:
        assert dist["nodes"][w]["cpu_s"] > 0 and dist["nodes"][w]["backends"] >= 1
    # bytes between the nodes: at least what the coordinator backend exchanged with the workers,
    # and (shard-local moves no row) less than the table
    net = dist["between_nodes"]
    io = dist["coordinator_io"]
    assert io["received"] + io["sent"] <= net["total"] < dist["table_bytes"]
    assert net["nodes"]["coordinator"]["received"] >= io["received"] > 0
    assert not refused["available"] and "citus_design" in refused["reason"]
    md = (out / "citus.md").read_text()
    assert "| 5,000 | distributed, shard_local |" in md and "not available" in md
    text = capsys.readouterr().out
    assert "coordinator backend: received" in text and "rows per CPU second" in text
    assert "bytes per source row" in text and "(distributed, no_such_design): not available" in text


def test_bench_citus_refuses_a_server_without_citus(pg_dsn, tmp_path, capsys):
    assert cli.main(["bench", "--citus", "--quick", "--dsn", pg_dsn, "--out", str(tmp_path)]) == 2
    assert "no citus extension" in capsys.readouterr().err
