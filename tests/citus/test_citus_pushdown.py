"""The push-down of sabre_anonymize on a Citus distributed table (plpython/batch/citus_shards.py;
docs/scale-out.md, "Citus (built)"): the shard-local design (``options.citus_design``
'shard_local'; the default is QI-local, test_citus_qi_local.py), each shard anonymized on the
worker that holds it against the whole table's SA distribution, on tests/citus/conftest.py's cluster."""
from __future__ import annotations

import psycopg
import pytest

from tests.citus.helpers import (assert_old_output_intact, coordinator_received, fails_with_a_worker_stopped,
                                 distributed_table, leftovers, placement)

ROWS = 2400
SHARDS = 4
QIS = "ARRAY['age', 'sex', 'education']"
RUN = ("SELECT run_id, rows, classes, min_class_size, max_emd, ail FROM sabre.sabre_anonymize("
       "source => 'public.pd'::regclass, quasi_identifiers => " + QIS + ", sensitive => 'salary', t => 0.3, "
       "k => %s, output => %s, method => %s, options => '{\"keep\": [\"id\"], \"citus_design\": \"shard_local\"}')")


@pytest.fixture(scope="module")
def pd(citus_cluster):
    """sabre on every node; public.pd (sabre-pg gen) distributed by id in 4 shards."""
    yield from distributed_table(citus_cluster.dsn, "pd", ROWS, SHARDS)


def test_each_shard_is_anonymized_on_its_worker(pd):
    conn = pd
    run_id, rows, classes, min_size, max_emd, ail = conn.execute(RUN, (5, "public.pd_anon", "refine")).fetchone()
    assert rows == ROWS and classes > SHARDS and min_size >= 5 and max_emd <= 0.3 and 0 < ail < 1
    # the run says it was pushed down, shard by shard, over both workers
    parts = conn.execute("SELECT partitions FROM sabre.runs WHERE run_id = %s", (run_id,)).fetchone()[0]
    assert (parts["citus"], parts["parts"], parts["workers"]) == ("shard-local", SHARDS, 2)
    # every relation colocated with the source: the rows never left their shard's worker
    source = placement(conn, "public.pd")
    assert placement(conn, "public.pd_anon") == source
    assert placement(conn, "public.pd_anon_classes") == ("h", "shard_key", source[2])
    assert placement(conn, "public.pd_anon_keys") == ("h", "key", source[2])
    # every source row exactly once, with its own SA value (a colocated join, on the workers)
    assert conn.execute("SELECT count(*), count(DISTINCT id) FROM public.pd_anon").fetchone() == (ROWS, ROWS)
    assert conn.execute("SELECT count(*) FROM public.pd c FULL JOIN public.pd_anon o USING (id) WHERE c.id IS NULL "
                        "OR o.id IS NULL OR c.salary IS DISTINCT FROM o.salary").fetchone()[0] == 0
    # class ids unique over the shards; each class's rows on one shard (its shard_key's)
    assert conn.execute("SELECT count(*), count(DISTINCT ec_id) FROM public.pd_anon_classes").fetchone() \
        == (classes, classes)
    assert conn.execute("SELECT count(*) FROM (SELECT o.ec_id FROM public.pd_anon o GROUP BY o.ec_id "
                        "HAVING count(DISTINCT pg_catalog.get_shard_id_for_distribution_column('public.pd', o.id)) "
                        "> 1) x").fetchone()[0] == 0
    # the exact verifier, reading the distributed output from the coordinator: every class
    # within t of the WHOLE table and >= k
    assert conn.execute("SELECT * FROM sabre.sabre_verify('public.pd_anon'::regclass, 'salary', 0.3::float8, 5)"
                        ).fetchone() == (classes, 0, pytest.approx(max_emd), min_size)


def test_the_coordinator_reads_far_less_than_the_table(pd):
    """Behaviour, not time: the bytes the coordinator backend receives from the workers in a
    pushed-down run against a run of the same call through the coordinator (without the
    distribution column in options.keep, which reads every row on the coordinator), and the
    workers' replies."""
    conn = pd
    table = conn.execute("SELECT pg_catalog.citus_table_size('public.pd')").fetchone()[0]
    read = {}
    runs = {}
    for how, run in (("through", RUN.replace('"keep": ["id"], ', "")), ("pushed", RUN)):
        read[how] = coordinator_received(conn, lambda: runs.setdefault(
            how, conn.execute(run, (5, "public.pd_io_" + how, "mondrian")).fetchone()[0]))
    run_id = runs["pushed"]
    parts = conn.execute("SELECT partitions FROM sabre.runs WHERE run_id = %s", (run_id,)).fetchone()[0]
    print("coordinator read:", read, "table bytes:", table, "replies:", parts["reply_bytes"])
    assert parts["citus"] == "shard-local" and parts["reply_bytes"] < table / 10
    assert conn.execute("SELECT partitions FROM sabre.runs WHERE run_id = %s", (runs["through"],)).fetchone()[0] \
        is None
    assert read["through"] > table / 2          # through the coordinator: every row is received (once:
    # without keep the output is not joined with the source again; measured 315 kB against 39 kB pushed down)
    assert read["pushed"] < table / 2 and read["pushed"] < read["through"] / 5


def test_a_worker_stopped_mid_run_fails_it_and_keeps_the_old_output(pd, citus_cluster):
    conn = pd
    run_id, _, classes = conn.execute(RUN, (5, "public.pd_kept", "refine")).fetchone()[:3]
    # stop the second worker while the first shard is being anonymized on the first
    e = fails_with_a_worker_stopped(citus_cluster, lambda: conn.execute(RUN, (8, "public.pd_kept", "refine")))
    print("worker stopped mid-run:", e.sqlstate, e.diag.message_primary, "HINT:", e.diag.message_hint)
    assert e.sqlstate == "08006", (e.sqlstate, str(e))
    assert "could not reach a node" in e.diag.message_primary and "previous output" in e.diag.message_hint
    # the old output, intact on every node
    assert_old_output_intact(conn, "public.pd_kept", run_id, classes, ROWS)
    # nothing of the failed run left behind: no temporary relation on the coordinator or a worker
    assert leftovers(citus_cluster) == 0


def test_a_shard_that_cannot_meet_t_publishes_nothing(pd):
    """A shard's rows alone too far from the whole table for t: a clear error, nothing published."""
    conn = pd
    with pytest.raises(psycopg.Error) as ei:
        conn.execute(RUN.replace("t => 0.3", "t => 0.001"), (5, "public.pd_tight", "refine"))
    e = ei.value
    print(e.sqlstate, e.diag.message_primary, "HINT:", e.diag.message_hint)
    assert e.sqlstate == "22023" and "against the whole table" in e.diag.message_primary
    assert "fewer shards" in e.diag.message_hint
    assert conn.execute("SELECT pg_catalog.to_regclass('public.pd_tight')").fetchone()[0] is None


def test_an_analyst_without_usage_on_sabre_on_a_worker_gets_a_clear_error(pd, citus_cluster):
    """sabre's schema is each node's own: a grant made on the coordinator alone is not enough for
    a pushed-down run, and the error says what the DBA grants on the workers."""
    dba = pd
    dba.execute("DROP ROLE IF EXISTS sec_bob")
    dba.execute("CREATE ROLE sec_bob LOGIN")
    try:
        dba.execute("CREATE SCHEMA bob AUTHORIZATION sec_bob")
        dba.execute("GRANT USAGE ON SCHEMA sabre TO sec_bob")      # the coordinator's sabre only
        dba.execute("GRANT SELECT ON public.pd TO sec_bob")
        with psycopg.connect(citus_cluster.dsn, user="sec_bob", autocommit=True) as bob:
            with pytest.raises(psycopg.Error) as ei:
                bob.execute(RUN, (5, "bob.pd", "refine"))
            e = ei.value
            assert e.sqlstate == "42501" and "Citus worker" in e.diag.message_primary
            assert "run_command_on_workers($$GRANT USAGE ON SCHEMA sabre TO sec_bob$$)" in e.diag.message_hint
            assert bob.execute("SELECT pg_catalog.to_regclass('bob.pd')").fetchone()[0] is None
    finally:
        dba.execute("DROP SCHEMA IF EXISTS bob CASCADE")
        dba.execute("DROP OWNED BY sec_bob")
        dba.execute("DROP ROLE sec_bob")
