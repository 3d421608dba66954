"""sabre_anonymize on a hash-distributed Citus table (tests/citus/conftest.py's cluster): the
outputs become Citus tables (docs/scale-out.md, "Citus (built)"), the guarantees hold.  Calls
that keep the distribution column are pushed down to the shards (test_citus_pushdown.py has the
push-down's own tests); the others go through the coordinator."""
from __future__ import annotations

import psycopg
import pytest

from sabre_pg import cli

ROWS = 3000
QIS = "ARRAY['age', 'sex', 'education']"


@pytest.fixture(scope="module")
def census(citus_cluster):
    """sabre installed on every node, public.census (sabre-pg gen) distributed by id."""
    dsn = citus_cluster.dsn
    assert cli.main(["install", "--dsn", dsn]) == 0
    assert cli.main(["gen", "--dsn", dsn, "--rows", str(ROWS), "--replace"]) == 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        # 4 shards (each anonymized on its worker, one after another: a few keep the suite fast)
        conn.execute("SELECT pg_catalog.create_distributed_table('public.census', 'id', shard_count => 4)")
        conn.execute("SET search_path = public, sabre")
        yield conn
        conn.execute("DROP TABLE IF EXISTS public.census CASCADE")


def _citus_table(conn, relation: str) -> tuple:
    """(partmethod, distribution column, colocationid) of a Citus table; None for a local table."""
    return conn.execute("SELECT partmethod::text, pg_catalog.column_to_column_name(logicalrelid, partkey), colocationid "
                        "FROM pg_catalog.pg_dist_partition WHERE logicalrelid = %s::regclass", (relation,)).fetchone()


def _shard_nodes(conn, relation: str) -> int:
    return conn.execute("SELECT count(DISTINCT nodeport) FROM pg_catalog.citus_shards WHERE table_name = %s::regclass",
                        (relation,)).fetchone()[0]


def test_output_colocated_with_the_source_and_t_close(census):
    conn = census
    row = conn.execute(f"SELECT rows, classes, min_class_size, max_emd FROM sabre.sabre_anonymize("
                       f"source => 'public.census'::regclass, quasi_identifiers => {QIS}, sensitive => 'salary', "
                       f"t => 0.3, k => 5, output => 'public.census_anon', options => '{{\"keep\": [\"id\"]}}')"
                       ).fetchone()
    rows, classes, min_class_size, max_emd = row
    assert rows == ROWS and classes > 1 and min_class_size >= 5 and max_emd <= 0.3

    source = _citus_table(conn, "public.census")
    assert source[:2] == ("h", "id")
    assert _citus_table(conn, "public.census_anon") == source                    # colocated, same column
    # pushed down, QI-local by default (batch/citus_qi_local.py): the side table colocated with the
    # source too; the classes distributed by their part (colocated with the parts' staging table)
    assert _citus_table(conn, "public.census_anon_classes")[:2] == ("h", "shard_key")
    assert _citus_table(conn, "public.census_anon_keys") == ("h", "key", source[2])
    assert _shard_nodes(conn, "public.census_anon") == 2

    # every source row exactly once (a colocated join, pushed down to the workers)
    assert conn.execute("SELECT count(*), count(DISTINCT id) FROM public.census_anon").fetchone() == (ROWS, ROWS)
    assert conn.execute("SELECT count(*) FROM public.census c FULL JOIN public.census_anon o USING (id) "
                        "WHERE c.id IS NULL OR o.id IS NULL OR c.salary IS DISTINCT FROM o.salary").fetchone()[0] == 0
    # the exact verifier, reading the distributed output from the coordinator
    classes_v, violations, max_emd_v, min_v = conn.execute(
        "SELECT * FROM sabre.sabre_verify('public.census_anon'::regclass, 'salary', 0.3::float8, 5)").fetchone()
    assert (classes_v, violations, min_v) == (classes, 0, min_class_size)
    assert max_emd_v == pytest.approx(max_emd)
    assert conn.execute("SELECT count(*) FROM public.census_anon_classes").fetchone()[0] == classes

    # a second run replaces the distributed outputs (the swap drops and renames Citus tables)
    again = conn.execute(f"SELECT classes FROM sabre.sabre_anonymize('public.census'::regclass, {QIS}, 'salary', 0.3, 8, "
                         "output => 'public.census_anon', options => '{\"keep\": [\"id\"]}')").fetchone()[0]
    assert _citus_table(conn, "public.census_anon") == source
    assert conn.execute("SELECT * FROM sabre.sabre_verify('public.census_anon'::regclass, 'salary', 0.3::float8, 8)"
                        ).fetchone()[:2] == (again, 0)


def test_without_the_distribution_column_the_output_is_distributed_by_class(census):
    conn = census
    notices = []
    handler = lambda d: notices.append((d.message_primary, d.message_hint))  # noqa: E731
    conn.add_notice_handler(handler)
    try:
        conn.execute(f"SELECT * FROM sabre.sabre_anonymize('public.census'::regclass, {QIS}, 'salary', 0.3, 5, "
                     "output => 'public.census_anon2')").fetchone()
    finally:
        conn.remove_notice_handler(handler)
    assert _citus_table(conn, "public.census_anon2")[:2] == ("h", "ec_id")
    assert _citus_table(conn, "public.census_anon2_classes")[:2] == ("h", "shard_key")   # pushed down (QI-local)
    assert any("not colocated" in (m or "") and '"keep": ["id"]' in (h or "") for m, h in notices), notices
    assert conn.execute("SELECT violations FROM sabre.sabre_verify('public.census_anon2'::regclass, 'salary', "
                        "0.3::float8, 5)").fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM public.census_anon2").fetchone()[0] == ROWS


def test_a_worker_down_fails_the_run_and_keeps_the_old_output(census, citus_cluster):
    conn = census
    run = (f"SELECT run_id, classes FROM sabre.sabre_anonymize('public.census'::regclass, {QIS}, 'salary', 0.3, %s, "
           "output => 'public.census_kept', options => '{\"keep\": [\"id\"]}')")
    run_id, classes = conn.execute(run, (5,)).fetchone()
    worker = citus_cluster.workers[1]
    worker.stop()
    try:
        with pytest.raises(psycopg.Error) as ei:
            conn.execute(run, (8,))
        e = ei.value
        print("worker down:", e.sqlstate, e.diag.message_primary, "HINT:", e.diag.message_hint)
        assert e.sqlstate == "08006", (e.sqlstate, str(e))
        assert "could not reach a node" in e.diag.message_primary and f"127.0.0.1:{worker.port}" in str(e)
        assert "previous output" in e.diag.message_hint
    finally:
        citus_cluster.start_node(worker)
    # the old output, intact on every node: its rows, its classes, the run that made it
    assert conn.execute("SELECT count(*), count(DISTINCT id) FROM public.census_kept").fetchone() == (ROWS, ROWS)
    assert conn.execute("SELECT classes, violations FROM sabre.sabre_verify('public.census_kept'::regclass, 'salary', "
                        "0.3::float8, 5)").fetchone() == (classes, 0)
    assert f"sabre-pg run {run_id}," in conn.execute(
        "SELECT pg_catalog.obj_description('public.census_kept'::regclass, 'pg_class')").fetchone()[0]
    assert _citus_table(conn, "public.census_kept") == _citus_table(conn, "public.census")
    assert conn.execute("SELECT count(*) FROM pg_catalog.pg_class WHERE relname LIKE 'census_kept%'").fetchone()[0] \
        == conn.execute("SELECT count(*) FROM pg_catalog.pg_class WHERE relname IN "
                        "('census_kept', 'census_kept_classes', 'census_kept_keys', 'census_kept_classes_pkey', "
                        "'census_kept_keys_idx')").fetchone()[0]


def test_an_analyst_runs_on_the_distributed_table(census, citus_cluster):
    """The security suite's analyst (sec_alice): USAGE on sabre, SELECT on the source, her own
    schema; her run's outputs are hers, distributed and colocated, and her run is in her catalog."""
    dba = census
    dba.execute("DROP ROLE IF EXISTS sec_alice")
    dba.execute("CREATE ROLE sec_alice LOGIN")          # Citus propagates the role and the schema
    try:
        dba.execute("CREATE SCHEMA alice AUTHORIZATION sec_alice")
        dba.execute("GRANT USAGE ON SCHEMA sabre TO sec_alice")
        # sabre's schema is each node's own (not propagated): a pushed-down run calls sabre on
        # the workers as sec_alice, so the grant is made there too (docs/scale-out.md)
        dba.execute("SELECT pg_catalog.run_command_on_workers($$GRANT USAGE ON SCHEMA sabre TO sec_alice$$)")
        dba.execute("GRANT SELECT ON public.census TO sec_alice")
        with psycopg.connect(citus_cluster.dsn, user="sec_alice", autocommit=True) as alice:
            classes = alice.execute(f"SELECT classes FROM sabre.sabre_anonymize('public.census'::regclass, {QIS}, "
                                    "'salary', 0.3, 5, output => 'alice.c', options => '{\"keep\": [\"id\"]}')"
                                    ).fetchone()[0]
            assert alice.execute("SELECT count(*), min(run_by) FROM sabre.runs").fetchone() == (1, "sec_alice")
            assert alice.execute("SELECT classes, violations FROM sabre.sabre_verify('alice.c'::regclass, 'salary', "
                                 "0.3::float8, 5)").fetchone() == (classes, 0)
        assert _citus_table(dba, "alice.c") == _citus_table(dba, "public.census")
        assert _citus_table(dba, "alice.c_classes")[:2] == ("h", "shard_key")
        assert dba.execute("SELECT pg_catalog.pg_get_userbyid(relowner) FROM pg_catalog.pg_class "
                           "WHERE oid = 'alice.c'::regclass").fetchone()[0] == "sec_alice"
    finally:
        dba.execute("DROP SCHEMA IF EXISTS alice CASCADE")
        dba.execute("SELECT pg_catalog.run_command_on_workers($$REVOKE USAGE ON SCHEMA sabre FROM sec_alice$$)")
        dba.execute("DROP OWNED BY sec_alice")
        dba.execute("DROP ROLE sec_alice")


def test_a_partitioned_run_publishes_distributed_outputs_too(census):
    """options.partitions with the shard-local design runs through the coordinator (with the
    QI-local default it is the number of parts: test_citus_qi_local.py)."""
    conn = census
    rows, classes = conn.execute(f"SELECT rows, classes FROM sabre.sabre_anonymize('public.census'::regclass, {QIS}, "
                                 "'salary', 0.3, 5, output => 'public.census_parts', "
                                 "options => '{\"keep\": [\"id\"], \"partitions\": 2, "
                                 "\"citus_design\": \"shard_local\"}')").fetchone()
    assert rows == ROWS
    assert _citus_table(conn, "public.census_parts") == _citus_table(conn, "public.census")
    assert _citus_table(conn, "public.census_parts_classes")[0] == "n"
    assert conn.execute("SELECT classes, violations FROM sabre.sabre_verify('public.census_parts'::regclass, 'salary', "
                        "0.3::float8, 5)").fetchone() == (classes, 0)
    assert conn.execute("SELECT count(*), count(DISTINCT id) FROM public.census_parts").fetchone() == (ROWS, ROWS)
