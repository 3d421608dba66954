"""The other entry points on a Citus distributed table (docs/scale-out.md, "Citus: verify,
estimate and the other entry points"): the several-SA form of sabre_anonymize works (its outputs
distributed, verified from the coordinator); sabre_instant and streams refuse with 0A000, a
message naming the table and a HINT, before they write anything."""
from __future__ import annotations

import psycopg
import pytest

ROWS = 1500
QIS = "ARRAY['age', 'sex', 'education']"


@pytest.fixture(scope="module")
def dist(citus_cluster, distributed_census):
    distributed_census("ecensus", ROWS)
    with psycopg.connect(citus_cluster.dsn, autocommit=True) as conn:
        yield conn
        conn.execute("DROP TABLE IF EXISTS public.ecensus, public.ecensus_multi, public.ecensus_multi_classes, "
                     "public.ecensus_multi_keys, public.elocal CASCADE")


def _partmethod(conn, relation):
    row = conn.execute("SELECT partmethod::text FROM pg_catalog.pg_dist_partition WHERE logicalrelid = "
                       "pg_catalog.to_regclass(%s)", (relation,)).fetchone()
    return row and row[0]


def test_the_several_sa_form_runs_on_a_distributed_table(dist):
    conn = dist
    rows, classes, max_emd = conn.execute(
        f"SELECT rows, classes, max_emd FROM sabre.sabre_anonymize(source => 'public.ecensus'::regclass, "
        f"quasi_identifiers => {QIS}, sensitive => ARRAY['salary', 'marital'], t => ARRAY[0.3, 0.4], k => 5, "
        "output => 'public.ecensus_multi', options => '{\"keep\": [\"id\"], \"hierarchies\": "
        "{\"marital\": \"ecensus_marital\"}}')").fetchone()
    assert rows == ROWS and classes > 1 and max_emd[0] <= 0.3 and max_emd[1] <= 0.4
    # pushed down (test_citus_methods.py): the classes stay on the workers, distributed by their piece
    assert _partmethod(conn, "public.ecensus_multi") == "h" and _partmethod(conn, "public.ecensus_multi_classes") == "h"
    assert conn.execute("SELECT classes, violations FROM sabre.sabre_verify('public.ecensus_multi'::regclass, "
                        "ARRAY['salary', 'marital'], ARRAY[0.3, 0.4]::float8[], 5, ARRAY[NULL, 'ecensus_marital'])"
                        ).fetchone() == (classes, 0)
    assert conn.execute("SELECT count(*), count(DISTINCT id) FROM public.ecensus_multi").fetchone() == (ROWS, ROWS)
    # sabre_refresh runs the recorded call again: distributed outputs again
    assert conn.execute("SELECT rows FROM sabre.sabre_refresh('public.ecensus_multi')").fetchone()[0] == ROWS
    assert _partmethod(conn, "public.ecensus_multi") == "h"


def _refusal(conn, query):
    with pytest.raises(psycopg.errors.FeatureNotSupported) as ei:
        conn.execute(query)
    e = ei.value
    print(e.sqlstate, e.diag.message_primary, "HINT:", e.diag.message_hint)
    assert "public.ecensus: it is a Citus distributed table" in e.diag.message_primary
    return e.diag.message_primary, e.diag.message_hint


def test_sabre_instant_refuses_a_distributed_table(dist):
    conn = dist
    message, hint = _refusal(conn, "SELECT * FROM sabre.sabre_instant(source => 'public.ecensus'::regclass, "
                                   "quasi_identifiers => ARRAY['age', 'education'], k => 5)")
    assert message.startswith("sabre_instant does not run on") and "GROUPING SETS" in message
    assert "sabre_anonymize" in hint and "local copy" in hint
    assert conn.execute("SELECT pg_catalog.to_regclass('public.ecensus_instant')").fetchone()[0] is None


def test_streams_refuse_a_distributed_table(dist):
    conn = dist
    message, hint = _refusal(conn, "SELECT * FROM sabre.sabre_stream_create(name => 'ew', source => 'public.ecensus'::regclass, "
                                   f"arrival => 'id', quasi_identifiers => {QIS}, sensitive => 'salary', t => 0.3, "
                                   "k => 5, window_size => 800, step => 400)")
    assert message.startswith("a sabre stream does not run on") and "sabre_schedule_refresh" in hint
    assert conn.execute("SELECT count(*) FROM sabre.streams").fetchone()[0] == 0
    assert conn.execute("SELECT pg_catalog.to_regclass('public.ecensus_sabre_w')").fetchone()[0] is None


def test_a_stream_whose_source_became_distributed_refuses_to_advance(dist):
    conn = dist
    conn.execute("DROP TABLE IF EXISTS public.elocal CASCADE")
    conn.execute("CREATE TABLE public.elocal (id bigint PRIMARY KEY, age int, salary int)")
    conn.execute("INSERT INTO public.elocal SELECT g, 20 + g % 50, g % 17 FROM pg_catalog.generate_series(1, 600) g")
    conn.execute("SELECT * FROM sabre.sabre_stream_create(name => 'el', source => 'public.elocal'::regclass, "
                 "arrival => 'id', quasi_identifiers => ARRAY['age'], sensitive => 'salary', t => 0.4, k => 5, "
                 "window_size => 200, step => 100)").fetchone()
    try:
        conn.execute("SELECT pg_catalog.create_distributed_table('public.elocal', 'id', shard_count => 4)")
        with pytest.raises(psycopg.errors.FeatureNotSupported) as ei:
            conn.execute("SELECT * FROM sabre.sabre_stream_advance('el')")
        assert "public.elocal: it is a Citus distributed table" in ei.value.diag.message_primary
    finally:
        conn.execute("SELECT sabre.sabre_stream_drop('el', purge => true)")
