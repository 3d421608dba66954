"""sabre-pg on a Citus cluster (coordinator + 2 workers, tests/citus/conftest.py): the cluster
itself, then ``sabre-pg install`` and ``check`` on every node."""
from __future__ import annotations

import psycopg


def test_cluster_has_citus_and_two_workers(citus_cluster):
    with psycopg.connect(citus_cluster.dsn, autocommit=True) as conn:
        assert conn.execute("SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'citus'"
                            ).fetchone()[0].startswith("13.2")
        ports = sorted(r[0] for r in conn.execute(
            "SELECT nodeport FROM pg_catalog.pg_dist_node WHERE groupid OPERATOR(pg_catalog.<>) 0"))
        assert ports == sorted(w.port for w in citus_cluster.workers)
        # a distributed table spreads over both workers, and Citus's own node-to-node connections work
        conn.execute("CREATE TABLE public.t_smoke (id int, v int)")
        conn.execute("SELECT pg_catalog.create_distributed_table('public.t_smoke', 'id')")
        conn.execute("INSERT INTO public.t_smoke SELECT g, g FROM pg_catalog.generate_series(1, 100) g")
        assert conn.execute("SELECT count(*), sum(v) FROM public.t_smoke").fetchone() == (100, 5050)
        nodes = conn.execute("SELECT count(DISTINCT nodeport) FROM pg_catalog.citus_shards "
                             "WHERE table_name = 'public.t_smoke'::regclass").fetchone()[0]
        assert nodes == 2
        conn.execute("DROP TABLE public.t_smoke")


def _worker_state(dsn: str, schema: str = "sabre") -> dict:
    """What a worker holds of ``schema``: its functions, its relations, and whether a PL/Python
    function loads its code there (the self-test, called on the worker directly)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        nsp = f"'{schema}'::regnamespace"
        if not conn.execute("SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = %s", (schema,)).fetchone():
            return {"functions": 0, "relations": 0, "selftest": None}
        return {
            "functions": conn.execute(f"SELECT count(*) FROM pg_catalog.pg_proc WHERE pronamespace = {nsp}").fetchone()[0],
            "relations": conn.execute(f"SELECT count(*) FROM pg_catalog.pg_class WHERE relnamespace = {nsp}"
                                      " AND relkind IN ('r', 'p', 'v')").fetchone()[0],
            "selftest": conn.execute(f"SELECT ({schema}.sabre_selftest())->>'ok'").fetchone()[0],
        }


def test_install_and_check_every_node(citus_cluster, capsys):
    from sabre_pg import cli

    dsn = citus_cluster.dsn
    assert cli.main(["install", "--dsn", dsn, "--schema", "sabre_ci"]) == 0
    out = capsys.readouterr().out
    assert "installed in schema sabre_ci" in out
    for w in citus_cluster.workers:
        assert f"Citus worker 127.0.0.1:{w.port}" in out
    with psycopg.connect(dsn, autocommit=True) as conn:
        coordinator = {
            "functions": conn.execute("SELECT count(*) FROM pg_catalog.pg_proc WHERE pronamespace = 'sabre_ci'::regnamespace").fetchone()[0],
            "relations": conn.execute("SELECT count(*) FROM pg_catalog.pg_class WHERE relnamespace = 'sabre_ci'::regnamespace"
                                      " AND relkind IN ('r', 'p', 'v')").fetchone()[0],
        }
        # nothing of the install became a Citus distributed object (each node holds its own)
        assert conn.execute("SELECT count(*) FROM pg_catalog.pg_dist_object o JOIN pg_catalog.pg_namespace n"
                            " ON o.classid = 'pg_namespace'::regclass AND o.objid = n.oid"
                            " WHERE n.nspname = 'sabre_ci'").fetchone()[0] == 0
    assert coordinator["functions"] > 20 and coordinator["relations"] > 5
    for wdsn in citus_cluster.worker_dsns:
        state = _worker_state(wdsn, "sabre_ci")
        assert state == {**coordinator, "selftest": "true"}, (wdsn, state, coordinator)

    assert cli.main(["check", "--dsn", dsn, "--schema", "sabre_ci"]) == 0
    out = capsys.readouterr().out
    assert out.count("Citus worker") == 2 and "tampered" in out
    assert cli.main(["check", "--dsn", dsn, "--schema", "sabre_ci", "--json"]) == 0
    import json
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True
    assert [n["node"] for n in report["citus_workers"]] == [f"127.0.0.1:{w.port}" for w in citus_cluster.workers]
    assert all(n["ok"] and n["tampered"] == [] for n in report["citus_workers"])

    # a worker whose installation is broken makes check fail, and says which worker
    with psycopg.connect(citus_cluster.worker_dsns[1], autocommit=True) as conn:
        conn.execute("UPDATE sabre_ci.modules SET source = source || '\n# changed' WHERE name = 'sabre_pg.core.emd'")
    assert cli.main(["check", "--dsn", dsn, "--schema", "sabre_ci", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    bad = {n["node"]: n["ok"] for n in report["citus_workers"]}
    assert bad == {f"127.0.0.1:{citus_cluster.workers[0].port}": True, f"127.0.0.1:{citus_cluster.workers[1].port}": False}
    # install again repairs every node
    assert cli.main(["install", "--dsn", dsn, "--schema", "sabre_ci"]) == 0
    assert cli.main(["check", "--dsn", dsn, "--schema", "sabre_ci"]) == 0
    capsys.readouterr()
