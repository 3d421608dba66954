"""sabre_verify and sabre_estimate on Citus distributed tables (tests/citus/conftest.py's
cluster; docs/scale-out.md, "Citus: verify, estimate and the other entry points").

* verify: on a distributed output the per-class, per-SA-value counts are a ``GROUP BY`` run on
  the shards (Citus's log of the commands it sends the workers shows it), and every result
  equals the single-node verify of a local copy of the same rows -- also on a broken output;
* estimate: on the coordinator a distributed table has no pg_stats of its own; the estimate
  combines the workers' shard statistics and comes close to the single-node estimate.
"""
from __future__ import annotations

import psycopg
import pytest

ROWS = 3000
QIS = "ARRAY['age', 'sex', 'education']"


@pytest.fixture(scope="module")
def cluster_census(citus_cluster, distributed_census):
    """sabre installed on every node; public.vcensus (sabre-pg gen) distributed by id in 4 shards
    (750 rows each: the shards' statistics have histograms, as a large table's do) and a
    local copy public.vcensus_local of the same rows; a distributed output of it."""
    distributed_census("vcensus", ROWS, local_copy="vcensus_local")
    with psycopg.connect(citus_cluster.dsn, autocommit=True) as conn:
        conn.execute("SELECT * FROM sabre.sabre_anonymize('public.vcensus'::regclass, " + QIS + ", 'salary', 0.3, 5, "
                     "output => 'public.vout', options => '{\"keep\": [\"id\", \"marital\"]}')").fetchone()
        conn.execute("CREATE TABLE public.vout_local AS TABLE public.vout")   # a plain table on the coordinator
        yield conn
        for t in ("vcensus", "vcensus_local", "vout", "vout_classes", "vout_keys", "vout_local", "vbroken",
                  "vbroken_local"):
            conn.execute(f"DROP TABLE IF EXISTS public.{t} CASCADE")


def _citus_table(conn, relation: str):
    return conn.execute("SELECT partmethod::text, pg_catalog.column_to_column_name(logicalrelid, partkey) "
                        "FROM pg_catalog.pg_dist_partition WHERE logicalrelid = %s::regclass", (relation,)).fetchone()


def _remote_commands(conn, query: str, params=()) -> tuple:
    """(the rows of ``query``, the SELECTs Citus sent the workers while it ran)."""
    sent = []
    handler = lambda d: sent.append(d.message_primary or "")  # noqa: E731
    conn.add_notice_handler(handler)
    try:
        conn.execute("SET citus.log_remote_commands = on")
        rows = conn.execute(query, params).fetchall()
    finally:
        conn.execute("RESET citus.log_remote_commands")
        conn.remove_notice_handler(handler)
    return rows, [s.removeprefix("issuing ") for s in sent if s.startswith("issuing SELECT")]


VERIFY_CALLS = [
    "sabre.sabre_verify({rel}::regclass, 'salary', 0.3::float8, 5)",                            # integer SA
    "sabre.sabre_verify({rel}::regclass, 'salary', 0.2::float8, 8)",
    "sabre.sabre_verify({rel}::regclass, 'marital', 0.3::float8, 5, 'vcensus_marital')",          # hierarchical
    "sabre.sabre_verify({rel}::regclass, 'marital', 0.3::float8, 5)",                           # categorical
    "sabre.sabre_verify({rel}::regclass, 'salary', NULL::float8, 5, l => 3)",                    # k and l alone
    "sabre.sabre_verify({rel}::regclass, 'salary', 0.3::float8, 5, l => 2)",
    "sabre.sabre_verify({rel}::regclass, ARRAY['salary', 'marital'], ARRAY[0.3, 0.4]::float8[], 5, "
    "ARRAY[NULL, 'vcensus_marital'])",                                                            # several SAs
]


@pytest.mark.parametrize("call", VERIFY_CALLS)
def test_verify_on_a_distributed_output_equals_the_single_node_verify(cluster_census, call):
    conn = cluster_census
    assert _citus_table(conn, "public.vout") == ("h", "id") and _citus_table(conn, "public.vout_local") is None
    distributed, sent = _remote_commands(conn, "SELECT * FROM " + call.format(rel="'public.vout'"))
    local = conn.execute("SELECT * FROM " + call.format(rel="'public.vout_local'")).fetchall()
    assert distributed == local
    # the shards were read by grouped queries only: counts per class (and value), never the rows
    on_shards = [s for s in sent if "public.vout_" in s]
    assert on_shards, sent
    assert all("GROUP BY" in s for s in on_shards), [s for s in on_shards if "GROUP BY" not in s][:2]


def test_a_broken_distributed_output_has_its_violations_found(cluster_census):
    """An output built by hand, distributed by id: a class of one salary only (far from the whole
    table's distribution), a class of 2 rows, and correct classes around them."""
    conn = cluster_census
    conn.execute("DROP TABLE IF EXISTS public.vbroken, public.vbroken_local")
    conn.execute("CREATE TABLE public.vbroken (id bigint, ec_id bigint, salary int, marital text)")
    conn.execute("SELECT pg_catalog.create_distributed_table('public.vbroken', 'id')")
    conn.execute("INSERT INTO public.vbroken SELECT id, ec_id, salary, marital FROM public.vout")
    worst = conn.execute("SELECT min(salary) FROM public.vbroken").fetchone()[0]
    conn.execute("UPDATE public.vbroken SET salary = %s WHERE ec_id = (SELECT min(ec_id) FROM public.vbroken)", (worst,))
    conn.execute("UPDATE public.vbroken SET ec_id = -1 WHERE id IN (SELECT id FROM public.vbroken ORDER BY id LIMIT 2)")
    conn.execute("CREATE TABLE public.vbroken_local AS TABLE public.vbroken")
    for call in ("sabre.sabre_verify({rel}::regclass, 'salary', 0.3::float8, 5)",
                 "sabre.sabre_verify({rel}::regclass, ARRAY['salary', 'marital'], ARRAY[0.3, 0.5]::float8[], 5)"):
        distributed, sent = _remote_commands(conn, "SELECT * FROM " + call.format(rel="'public.vbroken'"))
        local = conn.execute("SELECT * FROM " + call.format(rel="'public.vbroken_local'")).fetchall()
        assert distributed == local
        classes, violations, max_emd, min_size = distributed[0]
        assert violations >= 2 and min_size == 2
        assert (max_emd[0] if isinstance(max_emd, list) else max_emd) > 0.3
        assert all("GROUP BY" in s for s in sent if "public.vbroken_" in s)


ESTIMATES = [("salary", "ak"), ("marital", "ak"), ("id", "ak"), ("workclass", "ak"), ("salary", "refine")]


@pytest.mark.parametrize("sa,method", ESTIMATES)
def test_estimate_on_a_distributed_table_from_the_workers_statistics(cluster_census, sa, method):
    """The coordinator holds no statistics of the distributed table (its shell is empty); ANALYZE
    on it runs on the shards; the estimate combines them and comes close to the single-node one
    (measured on 3000 rows in 4 shards: equal classes for salary, marital and id, docs/scale-out.md)."""
    conn = cluster_census
    conn.execute("ANALYZE public.vcensus")
    conn.execute("ANALYZE public.vcensus_local")
    assert conn.execute("SELECT reltuples FROM pg_catalog.pg_class WHERE oid = 'public.vcensus'::regclass"
                        ).fetchone()[0] <= 0
    qis = "ARRAY['age', 'sex', 'education']" if sa != "id" else "ARRAY['age', 'sex']"
    call = (f"SELECT t, classes, buckets, ec_size, feasible, classes_min, classes_max, source_of_stats "
            f"FROM sabre.sabre_estimate({{rel}}::regclass, {qis}, '{sa}', ARRAY[0.1, 0.2, 0.3, 0.5], 5, "
            f"method => '{method}')")
    distributed = conn.execute(call.format(rel="'public.vcensus'")).fetchall()
    local = conn.execute(call.format(rel="'public.vcensus_local'")).fetchall()
    assert [r[0] for r in distributed] == [r[0] for r in local]
    for d, s in zip(distributed, local):
        assert "reltuples %d" % ROWS in d[-1] and "the Citus shards' combined pg_stats of public.vcensus." in d[-1]
        assert d[4] == s[4]
        if method == "ak":
            print(f"estimate {sa} t={d[0]}: distributed {d[1]} classes, single node {s[1]}")
            assert d[1] == pytest.approx(s[1], rel=0.1), (sa, d, s)
        else:
            assert d[5:7] == s[5:7]


def test_estimate_needs_the_shards_statistics(cluster_census):
    """A distributed table never analyzed has no statistics on its shards: the usual error and
    HINT; options.analyze runs ANALYZE, which Citus runs on the shards."""
    conn = cluster_census
    conn.execute("DROP TABLE IF EXISTS public.vfresh")
    conn.execute("CREATE TABLE public.vfresh (id bigint, age int, salary int)")
    conn.execute("SELECT pg_catalog.create_distributed_table('public.vfresh', 'id', shard_count => 4)")
    conn.execute("INSERT INTO public.vfresh SELECT g, g % 70, g % 13 FROM pg_catalog.generate_series(1, 2000) g")
    try:
        call = ("SELECT classes FROM sabre.sabre_estimate('public.vfresh'::regclass, ARRAY['age'], 'salary', 0.3, 5, "
                "options => %s, method => 'ak')")
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as ei:
            conn.execute(call, ('{}',))
        assert "no statistics" in ei.value.diag.message_primary and "ANALYZE" in ei.value.diag.message_hint
        assert conn.execute(call, ('{"analyze": true}',)).fetchone()[0] > 1
    finally:
        conn.execute("DROP TABLE public.vfresh")


def test_an_analyst_estimates_and_verifies_with_her_column_privileges(cluster_census, citus_cluster, analyst_role):
    """A role with USAGE on sabre and SELECT on the table estimates from the shards' statistics
    and verifies the distributed output; without SELECT on the SA column she gets 42501 before
    any statistics are read (docs/security.md)."""
    dba = cluster_census
    with analyst_role(dba, "sec_est"):
        dba.execute("GRANT SELECT ON public.vcensus, public.vout TO sec_est")
        dba.execute("ANALYZE public.vcensus")
        call = ("SELECT classes FROM sabre.sabre_estimate('public.vcensus'::regclass, ARRAY['age', 'sex', 'education'], "
                "'salary', 0.2, 5, method => 'ak')")
        expected = dba.execute(call).fetchone()
        verify = "SELECT * FROM sabre.sabre_verify('public.vout'::regclass, 'salary', 0.3::float8, 5)"
        with psycopg.connect(citus_cluster.dsn, user="sec_est", autocommit=True) as analyst:
            assert analyst.execute(call).fetchone() == expected
            assert analyst.execute(verify).fetchone() == dba.execute(verify).fetchone()
        dba.execute("REVOKE SELECT ON public.vcensus FROM sec_est")
        dba.execute("GRANT SELECT (age, sex, education) ON public.vcensus TO sec_est")
        with psycopg.connect(citus_cluster.dsn, user="sec_est", autocommit=True) as analyst:
            with pytest.raises(psycopg.errors.InsufficientPrivilege) as ei:
                analyst.execute(call)
            assert '"salary"' in ei.value.diag.message_primary
