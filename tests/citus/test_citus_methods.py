"""Every method and the several-SA form of sabre_anonymize pushed down on a Citus distributed
table (plpython/batch/citus_shards.py, citus_qi_local.py; docs/scale-out.md, "Citus (built)",
"Methods and several SAs"): 'ak' and 'knn' (SABRE's plan made on each shard's or part's own SA
counts with the budget t - EMD(piece, table)) and the array form ('refine' and 'mondrian' cut
against every SA's whole-table counts, 'ak' with each SA's budget), in both designs, on tests/citus/conftest.py's cluster: the output colocated with the source, every row
once, 0 violations of the WHOLE table's t and k by sabre_verify, the coordinator receiving
aggregates only, nothing left on the nodes."""
from __future__ import annotations

import json

import psycopg
import pytest

from tests.citus.helpers import analyst_on_every_node, coordinator_received, leftovers, placement

ROWS = 12000
QIS = "ARRAY['age', 'sex', 'education']"
RUN = ("SELECT run_id, rows, classes, min_class_size, max_emd, ail FROM sabre.sabre_anonymize("
       "source => %s::regclass, quasi_identifiers => " + QIS + ", sensitive => 'salary', t => 0.3, "
       "k => 5, output => %s, method => %s, options => %s::jsonb)")
RUN_MULTI = ("SELECT run_id, rows, classes, min_class_size, max_emd, ail FROM sabre.sabre_anonymize("
             "source => %s::regclass, quasi_identifiers => " + QIS + ", sensitive => ARRAY['salary', 'marital'], "
             "t => ARRAY[0.3, 0.4], k => 5, output => %s, method => %s, options => %s::jsonb)")
VERIFY_MULTI = ("SELECT classes, violations FROM sabre.sabre_verify(%s::regclass, ARRAY['salary', 'marital'], "
                "ARRAY[0.3, 0.4]::float8[], 5, ARRAY[NULL, 'mt_marital'])")


def _opts(design=None, **more):
    return json.dumps({"keep": ["id"], **({"citus_design": design} if design else {}), **more})


@pytest.fixture(scope="module")
def mt(citus_cluster, distributed_census):
    """public.mt (sabre-pg gen, seeded) distributed by id in 4 shards; public.mt_local, a plain
    table of the same rows on the coordinator (the one-node run to compare with)."""
    distributed_census("mt", ROWS, local_copy="mt_local")
    with psycopg.connect(citus_cluster.dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE public.mt_local ADD PRIMARY KEY (id)")
        yield conn
        conn.execute("DROP TABLE IF EXISTS public.mt, public.mt_local CASCADE")


def _pushed_down(conn, run, args, notices):
    """(run row, its partitions fact, bytes the coordinator received) of a call; no NOTICE that
    the run went through the coordinator."""
    handler = lambda d: notices.append(d.message_primary or "")  # noqa: E731
    conn.add_notice_handler(handler)
    got = {}
    try:
        received = coordinator_received(conn, lambda: got.setdefault("run", conn.execute(run, args).fetchone()))
    finally:
        conn.remove_notice_handler(handler)
    assert not [m for m in notices if "through the coordinator" in m], notices
    parts = conn.execute("SELECT partitions FROM sabre.runs WHERE run_id = %s", (got["run"][0],)).fetchone()[0]
    return got["run"], parts, received


_ONE_NODE = {}


def _one_node(conn, run, method, opts) -> float:
    """AIL of the same call on public.mt_local (one node), once per call and method."""
    if (run, method) not in _ONE_NODE:
        _ONE_NODE[run, method] = conn.execute(run, ("public.mt_local", "public.mt_local_%s_%d" % (
            method, len(_ONE_NODE)), method, opts)).fetchone()[5]
    return _ONE_NODE[run, method]


def _every_row_once_colocated(conn, output, sas=("salary",)):
    source = placement(conn, "public.mt")
    assert placement(conn, output) == source
    assert placement(conn, output + "_keys") == ("h", "key", source[2])
    assert placement(conn, output + "_classes")[:2] == ("h", "shard_key")
    assert conn.execute(f"SELECT count(*), count(DISTINCT id) FROM {output}").fetchone() == (ROWS, ROWS)
    differs = " OR ".join(f"c.{a} IS DISTINCT FROM o.{a}" for a in sas)
    assert conn.execute(f"SELECT count(*) FROM public.mt c FULL JOIN {output} o USING (id) WHERE c.id IS NULL "
                        f"OR o.id IS NULL OR {differs}").fetchone()[0] == 0


@pytest.mark.parametrize("design", ["qi_local", "shard_local"])
@pytest.mark.parametrize("method", ["ak", "knn"])
def test_ak_and_knn_run_on_the_workers(mt, citus_cluster, method, design):
    conn = mt
    table = conn.execute("SELECT pg_catalog.citus_table_size('public.mt')").fetchone()[0]
    output = f"public.mt_{method}_{design}"
    (run_id, rows, classes, min_size, max_emd, ail), parts, received = _pushed_down(
        conn, RUN, ("public.mt", output, method, _opts(design)), [])
    print(method, design, "coordinator received:", received, "table:", table, "AIL:", ail, "classes:", classes)
    assert parts["citus_design"] == design and parts["workers"] == 2
    assert rows == ROWS and classes > parts["parts"] and min_size >= 5 and max_emd <= 0.3 and 0 < ail < 1
    # only aggregates reached the coordinator: the split's, the summary, the pieces' replies
    assert 0 < received < table / 10
    _every_row_once_colocated(conn, output)
    assert conn.execute("SELECT count(*), count(DISTINCT ec_id) FROM " + output + "_classes").fetchone() \
        == (classes, classes)
    # the exact verifier from the coordinator: every class within t of the WHOLE table, >= k
    assert conn.execute("SELECT * FROM sabre.sabre_verify(%s::regclass, 'salary', 0.3::float8, 5)",
                        (output,)).fetchone() == (classes, 0, pytest.approx(max_emd), min_size)
    # the classes relation's EMDs are the whole table's (recomputed there, not the piece's own)
    assert conn.execute(f"SELECT max(emd) FROM {output}_classes").fetchone()[0] == pytest.approx(max_emd)
    assert leftovers(citus_cluster) == 0
    # against the same call on one node (a plain copy): the AIL the push-down costs
    one = _one_node(conn, RUN, method, _opts())
    print(method, design, "AIL pushed down:", ail, "one node:", one)
    assert ail < 2 * one


@pytest.mark.parametrize("method,design", [("refine", None), ("ak", "shard_local"), ("mondrian", "qi_local")])
def test_the_several_sa_form_runs_on_the_workers(mt, citus_cluster, method, design):
    conn = mt
    table = conn.execute("SELECT pg_catalog.citus_table_size('public.mt')").fetchone()[0]
    output = f"public.mt_multi_{method}"
    opts = _opts(design, hierarchies={"marital": "mt_marital"})
    (run_id, rows, classes, min_size, max_emds, ail), parts, received = _pushed_down(
        conn, RUN_MULTI, ("public.mt", output, method, opts), [])
    print("several SAs", method, design, "coordinator received:", received, "table:", table, "AIL:", ail)
    assert parts["citus_design"] == (design or "qi_local") and parts["workers"] == 2
    assert rows == ROWS and classes > 1 and min_size >= 5 and max_emds[0] <= 0.3 and max_emds[1] <= 0.4
    assert 0 < received < table / 10
    run = conn.execute("SELECT sensitive_attributes, t_values, max_emds FROM sabre.runs WHERE run_id = %s",
                       (run_id,)).fetchone()
    assert run[0] == ["salary", "marital"] and run[1] == [0.3, 0.4] and run[2] == pytest.approx(max_emds)
    _every_row_once_colocated(conn, output, ("salary", "marital"))
    assert conn.execute(VERIFY_MULTI, (output,)).fetchone() == (classes, 0)
    assert leftovers(citus_cluster) == 0
    one = _one_node(conn, RUN_MULTI, method, _opts(hierarchies={"marital": "mt_marital"}))
    print("several SAs", method, design, "AIL pushed down:", ail, "one node:", one)
    assert ail < 2 * one


def test_a_piece_too_far_from_the_table_publishes_nothing(mt, citus_cluster):
    """A budget t - EMD(shard, table) <= 0: the shard's rows alone cannot make a class within t
    of the table; the run fails with 22023 and a HINT, the old output intact, nothing left."""
    conn = mt
    output = "public.mt_far"
    run_id, _, classes = conn.execute(RUN, ("public.mt", output, "ak", _opts("shard_local"))).fetchone()[:3]
    with pytest.raises(psycopg.Error) as ei:
        conn.execute(RUN.replace("t => 0.3", "t => 0.001"), ("public.mt", output, "ak", _opts("shard_local")))
    e = ei.value
    print(e.diag.message_primary, "HINT:", e.diag.message_hint)
    assert e.sqlstate == "22023" and "from the whole table's, not below t = 0.001" in e.diag.message_primary
    assert "fewer shards" in e.diag.message_hint
    assert conn.execute("SELECT classes, violations FROM sabre.sabre_verify(%s::regclass, 'salary', 0.3::float8, 5)",
                        (output,)).fetchone() == (classes, 0)
    assert f"sabre-pg run {run_id}," in conn.execute(
        "SELECT pg_catalog.obj_description(%s::regclass, 'pg_class')", (output,)).fetchone()[0]
    assert leftovers(citus_cluster) == 0


def test_a_single_qi_local_part_does_not_go_through_the_coordinator(mt, citus_cluster):
    """One part (options.partitions 1, or no cut keeps its sides close enough to the table): the
    staging table gets an empty second shard, so Citus still repartitions worker to worker (with
    a staging table of one shard it pulled every row through the coordinator: 1.5x the table)."""
    conn = mt
    table = conn.execute("SELECT pg_catalog.citus_table_size('public.mt')").fetchone()[0]
    output = "public.mt_one_part"
    (run_id, rows, classes, min_size, max_emd, ail), parts, received = _pushed_down(
        conn, RUN, ("public.mt", output, "ak", _opts("qi_local", partitions=1)), [])
    print("one part: coordinator received:", received, "table:", table)
    assert (parts["citus_design"], parts["parts"], parts["part_rows"]) == ("qi_local", 1, [ROWS])
    assert 0 < received < table / 10
    _every_row_once_colocated(conn, output)
    assert conn.execute("SELECT * FROM sabre.sabre_verify(%s::regclass, 'salary', 0.3::float8, 5)",
                        (output,)).fetchone() == (classes, 0, pytest.approx(max_emd), min_size)
    assert leftovers(citus_cluster) == 0


def test_an_analyst_runs_ak_with_several_sas_on_the_workers(mt, citus_cluster, analyst_role):
    """The security suite's analyst (USAGE on sabre on every node, SELECT on the source, her own
    schema): the several-SA 'ak' run is hers on every node, its side table (and the index the
    Hilbert methods build on it) hers alone."""
    dba = mt
    with analyst_on_every_node(dba, analyst_role, "sec_mt", "mtsec", "public.mt"):
        with psycopg.connect(citus_cluster.dsn, user="sec_mt", autocommit=True) as analyst:
            run_id, rows, classes = analyst.execute(RUN_MULTI, (
                "public.mt", "mtsec.o", "ak", _opts(hierarchies={"marital": "mt_marital"}))).fetchone()[:3]
            assert analyst.execute("SELECT partitions->>'citus_design', run_by FROM sabre.runs WHERE run_id = %s",
                                   (run_id,)).fetchone() == ("qi_local", "sec_mt")
            assert rows == ROWS and analyst.execute(VERIFY_MULTI, ("mtsec.o",)).fetchone() == (classes, 0)
        assert placement(dba, "mtsec.o") == placement(dba, "public.mt")
        assert dba.execute("SELECT pg_catalog.pg_get_userbyid(relowner) FROM pg_catalog.pg_class "
                           "WHERE oid = 'mtsec.o_keys'::regclass").fetchone()[0] == "sec_mt"
        assert dba.execute("SELECT count(*) FROM pg_catalog.pg_indexes WHERE schemaname = 'mtsec' "
                           "AND tablename = 'o_keys'").fetchone()[0] == 1
        assert not dba.execute("SELECT pg_catalog.has_table_privilege('public', 'mtsec.o_keys', 'SELECT')"
                               ).fetchone()[0]
    assert leftovers(citus_cluster) == 0
