"""``sabre-pg bench --citus`` (sabre_pg/bench/citus.py) on the test's Citus cluster: the default
call on a distributed copy of the census table against the local one, each verified from the
coordinator; and a clear refusal on a server without Citus."""
from __future__ import annotations

import json

from sabre_pg import cli


def test_bench_citus_quick(citus_cluster, tmp_path, capsys):
    dsn = citus_cluster.dsn
    assert cli.main(["install", "--dsn", dsn]) == 0
    out = tmp_path / "bench"
    assert cli.main(["bench", "--citus", "--quick", "--dsn", dsn, "--out", str(out)]) == 0
    results = json.loads((out / "citus.json").read_text())
    assert [r["distributed"] for r in results] == [False, True]
    local, dist = results
    for r in results:
        assert r["rows"] == 5000 and r["verify"]["violations"] == 0 and r["verify"]["min_class_size"] >= 6
        assert r["coordinator_io"]["rchar"] > 0 and r["table_bytes"] > 0
    assert local["placement"]["output"] == "local table on the coordinator"
    # pushed down (batch/citus_shards.py): the classes stay on the shards' workers, and the
    # coordinator backend receives far less than the table from the workers (aggregates and the
    # workers' replies, counted on its sockets), though it receives something
    assert dist["placement"] == {"output": "distributed by id", "_classes": "distributed by shard_key"}
    assert 0 < dist["coordinator_io"]["received"] < 0.5 * dist["table_bytes"]
    assert "| 5,000 | distributed |" in (out / "citus.md").read_text()
    assert "coordinator backend: received" in capsys.readouterr().out


def test_bench_citus_refuses_a_server_without_citus(pg_dsn, tmp_path, capsys):
    assert cli.main(["bench", "--citus", "--quick", "--dsn", pg_dsn, "--out", str(tmp_path)]) == 2
    assert "no citus extension" in capsys.readouterr().err
