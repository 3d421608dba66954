"""The QI-local design of sabre_anonymize on a Citus distributed table
(plpython/batch/citus_qi_local.py; docs/scale-out.md, "Citus (built)"): the rows repartitioned
once by the QI-locality split into a staging table distributed by part, each part anonymized on
the worker that holds it against the whole table, the output moved back colocated with the
source; on tests/citus/conftest.py's cluster."""
from __future__ import annotations

import psycopg
import pytest

from tests.citus.helpers import (analyst_on_every_node, assert_old_output_intact, coordinator_received,
                                 fails_with_a_worker_stopped, distributed_table, leftovers, placement)

ROWS = 2400
SHARDS = 4
QIS = "ARRAY['age', 'sex', 'education']"
RUN = ("SELECT run_id, rows, classes, min_class_size, max_emd, ail FROM sabre.sabre_anonymize("
       "source => 'public.ql'::regclass, quasi_identifiers => " + QIS + ", sensitive => 'salary', t => 0.3, "
       "k => %s, output => %s, options => %s::jsonb)")


def _opts(design=None, **more):
    import json
    return json.dumps({"keep": ["id"], **({"citus_design": design} if design else {}), **more})


@pytest.fixture(scope="module")
def ql(citus_cluster):
    """sabre on every node; public.ql (sabre-pg gen, seeded) distributed by id in 4 shards."""
    yield from distributed_table(citus_cluster.dsn, "ql", ROWS, SHARDS)


def test_the_default_is_qi_local_colocated_t_close_every_row_once_better_than_shard_local(ql, citus_cluster):
    conn = ql
    table = conn.execute("SELECT pg_catalog.citus_table_size('public.ql')").fetchone()[0]
    got = {}
    received = coordinator_received(conn, lambda: got.setdefault("run", conn.execute(
        RUN, (5, "public.ql_anon", _opts())).fetchone()))
    run_id, rows, classes, min_size, max_emd, ail = got["run"]
    # the rows moved worker to worker: the coordinator received aggregates only (the split's
    # histograms and SA counts, the parts' replies), far less than the table
    print("coordinator received:", received, "table:", table)
    assert 0 < received < table / 2       # (measured: 0.31x on these 2,400 rows)
    assert rows == ROWS and classes > 2 and min_size >= 5 and max_emd <= 0.3 and 0 < ail < 1
    # the design recorded: QI-local, one part per worker, on both workers
    parts = conn.execute("SELECT partitions FROM sabre.runs WHERE run_id = %s", (run_id,)).fetchone()[0]
    assert (parts["citus_design"], parts["citus"], parts["parts"], parts["workers"]) == ("qi_local", "qi-local", 2, 2)
    assert sum(parts["part_rows"]) == ROWS and parts["automatic"] is True
    # the output and side table colocated with the source; the classes by their part
    source = placement(conn, "public.ql")
    assert placement(conn, "public.ql_anon") == source
    assert placement(conn, "public.ql_anon_keys") == ("h", "key", source[2])
    assert placement(conn, "public.ql_anon_classes")[:2] == ("h", "shard_key")
    # every source row exactly once, with its own SA value (a colocated join, on the workers)
    assert conn.execute("SELECT count(*), count(DISTINCT id) FROM public.ql_anon").fetchone() == (ROWS, ROWS)
    assert conn.execute("SELECT count(*) FROM public.ql c FULL JOIN public.ql_anon o USING (id) WHERE c.id IS NULL "
                        "OR o.id IS NULL OR c.salary IS DISTINCT FROM o.salary").fetchone()[0] == 0
    assert conn.execute("SELECT count(*), count(DISTINCT ec_id) FROM public.ql_anon_classes").fetchone() \
        == (classes, classes)
    # the exact verifier from the coordinator: every class within t of the WHOLE table, >= k
    assert conn.execute("SELECT * FROM sabre.sabre_verify('public.ql_anon'::regclass, 'salary', 0.3::float8, 5)"
                        ).fetchone() == (classes, 0, pytest.approx(max_emd), min_size)
    # the staging table, the staged relations and the driver are gone from every node
    assert leftovers(citus_cluster) == 0
    # not worse than shard-local: parts that are regions of the QI space give narrower classes
    # than hash shards, which are random samples of it (a lower AIL, both with 0 violations)
    run_id, _, _, _, _, shard_ail = conn.execute(RUN, (5, "public.ql_shard_local", _opts("shard_local"))).fetchone()
    assert conn.execute("SELECT partitions->>'citus_design' FROM sabre.runs WHERE run_id = %s",
                        (run_id,)).fetchone()[0] == "shard_local"
    assert conn.execute("SELECT violations FROM sabre.sabre_verify('public.ql_shard_local'::regclass, 'salary', "
                        "0.3::float8, 5)").fetchone()[0] == 0
    print("AIL: qi_local", ail, "shard_local", shard_ail)
    assert ail < shard_ail


def test_partitions_sets_the_number_of_parts(ql, citus_cluster):
    conn = ql
    run_id, rows, classes = conn.execute(RUN, (5, "public.ql_4", _opts("qi_local", partitions=4))).fetchone()[:3]
    parts = conn.execute("SELECT partitions FROM sabre.runs WHERE run_id = %s", (run_id,)).fetchone()[0]
    assert (parts["citus_design"], parts["parts"], parts["part_workers"], parts["automatic"]) == ("qi_local", 4, 2,
                                                                                                  False)
    assert rows == ROWS and conn.execute("SELECT classes, violations FROM sabre.sabre_verify('public.ql_4'::regclass, "
                                         "'salary', 0.3::float8, 5)").fetchone() == (classes, 0)
    # without options.partitions: a part per worker, more when a part would exceed
    # options.auto_partition_rows (a worker backend's memory bound)
    run_id, classes = conn.execute(RUN, (5, "public.ql_4", _opts(auto_partition_rows=700))).fetchone()[:3:2]
    parts = conn.execute("SELECT partitions FROM sabre.runs WHERE run_id = %s", (run_id,)).fetchone()[0]
    print("auto parts:", parts["part_rows"])
    assert parts["automatic"] is True and parts["parts"] >= 4 and sum(parts["part_rows"]) == ROWS
    assert conn.execute("SELECT classes, violations FROM sabre.sabre_verify('public.ql_4'::regclass, "
                        "'salary', 0.3::float8, 5)").fetchone() == (classes, 0)
    assert leftovers(citus_cluster) == 0


def test_a_bad_design_is_an_error_with_a_hint(ql):
    conn = ql
    with pytest.raises(psycopg.Error) as ei:
        conn.execute(RUN, (5, "public.ql_bad", _opts("qi-local")))
    e = ei.value
    assert e.sqlstate == "22023" and "options.citus_design must be 'qi_local' or 'shard_local'" \
        in e.diag.message_primary
    assert "'shard_local'" in e.diag.message_hint
    # without a numerical quasi-identifier there is nothing to cut: QI-local asked is an error,
    # the default falls back to shard-local
    only_text = RUN.replace(QIS, "ARRAY['sex', 'marital']")
    with pytest.raises(psycopg.Error) as ei:
        conn.execute(only_text, (5, "public.ql_bad", _opts("qi_local")))
    assert ei.value.sqlstate == "22023" and "numerical quasi-identifier" in ei.value.diag.message_primary
    assert "shard_local" in ei.value.diag.message_hint
    run_id = conn.execute(only_text, (5, "public.ql_text", _opts())).fetchone()[0]
    assert conn.execute("SELECT partitions->>'citus_design' FROM sabre.runs WHERE run_id = %s",
                        (run_id,)).fetchone()[0] == "shard_local"


def test_a_worker_stopped_mid_run_fails_it_and_keeps_the_old_output(ql, citus_cluster):
    conn = ql
    run_id, _, classes = conn.execute(RUN, (5, "public.ql_kept", _opts())).fetchone()[:3]
    # stop the second worker once a part runs on the first
    e = fails_with_a_worker_stopped(citus_cluster, lambda: conn.execute(RUN, (8, "public.ql_kept", _opts())))
    assert e.sqlstate == "08006", (e.sqlstate, str(e))
    assert "could not reach a node" in e.diag.message_primary and "previous output" in e.diag.message_hint
    assert_old_output_intact(conn, "public.ql_kept", run_id, classes, ROWS)
    assert leftovers(citus_cluster) == 0


def test_an_analyst_runs_qi_local(ql, citus_cluster, analyst_role):
    """The security suite's analyst: USAGE on sabre on every node, SELECT on the source, her own
    schema; her staging table and outputs are hers, and nobody else may read the side table."""
    dba = ql
    with analyst_on_every_node(dba, analyst_role, "sec_qil", "qil", "public.ql"):
        with psycopg.connect(citus_cluster.dsn, user="sec_qil", autocommit=True) as analyst:
            run_id, _, classes = analyst.execute(RUN, (5, "qil.o", _opts())).fetchone()[:3]
            assert analyst.execute("SELECT partitions->>'citus_design', run_by FROM sabre.runs WHERE run_id = %s",
                                   (run_id,)).fetchone() == ("qi_local", "sec_qil")
            assert analyst.execute("SELECT classes, violations FROM sabre.sabre_verify('qil.o'::regclass, "
                                   "'salary', 0.3::float8, 5)").fetchone() == (classes, 0)
        assert placement(dba, "qil.o") == placement(dba, "public.ql")
        assert dba.execute("SELECT pg_catalog.pg_get_userbyid(relowner), relacl FROM pg_catalog.pg_class "
                           "WHERE oid = 'qil.o_keys'::regclass").fetchone()[0] == "sec_qil"
