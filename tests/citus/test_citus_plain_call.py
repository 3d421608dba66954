"""A plain call on a distributed table: no options at all (the distribution column not
published). It is pushed down with the QI-local design all the same (no source row through
the coordinator); the output, which has no distribution column, is distributed by ec_id with a
NOTICE saying how to colocate it, and the side table stays colocated with the source."""
from __future__ import annotations

import psycopg
import pytest

from tests.citus.helpers import coordinator_received, distributed_table, leftovers, placement

ROWS = 3000
PLAIN = ("SELECT run_id, rows, classes, min_class_size, max_emd FROM sabre.sabre_anonymize("
         "'public.pc'::regclass, ARRAY['age', 'sex', 'education', 'race'], 'salary', 0.3, 6, output => %s)")


@pytest.fixture(scope="module")
def pc(citus_cluster):
    yield from distributed_table(citus_cluster.dsn, "pc", ROWS, 4)


def test_a_plain_call_is_pushed_down_and_says_how_to_colocate_the_output(pc, citus_cluster):
    conn = pc
    notices = []
    conn.add_notice_handler(lambda d: notices.append((d.message_primary, d.message_hint)))
    table = conn.execute("SELECT pg_catalog.citus_table_size('public.pc')").fetchone()[0]
    got = {}
    received = coordinator_received(conn, lambda: got.setdefault("run", conn.execute(
        PLAIN, ("public.pc_anon",)).fetchone()))
    run_id, rows, classes, min_size, max_emd = got["run"]
    print("coordinator received:", received, "table:", table)
    assert 0 < received < table / 2
    assert rows == ROWS and min_size >= 6 and max_emd <= 0.3 and classes > 2
    parts = conn.execute("SELECT partitions FROM sabre.runs WHERE run_id = %s", (run_id,)).fetchone()[0]
    assert parts["citus_design"] == "qi_local"
    # the output has no id: distributed by its class; the side table colocated with the source
    assert conn.execute("SELECT count(*) FROM information_schema.columns WHERE table_name = 'pc_anon' "
                        "AND column_name = 'id'").fetchone()[0] == 0
    assert placement(conn, "public.pc_anon")[:2] == ("h", "ec_id")
    assert placement(conn, "public.pc_anon_keys") == ("h", "key", placement(conn, "public.pc")[2])
    said = [(m, h) for m, h in notices if "not colocated" in m]
    assert said and '"keep": ["id"]' in said[0][1]
    # every source row once (through the side table, colocated), the classes t-close and >= k
    assert conn.execute("SELECT count(*), count(DISTINCT key) FROM public.pc_anon_keys").fetchone() == (ROWS, ROWS)
    assert conn.execute("SELECT count(*) FROM public.pc s LEFT JOIN public.pc_anon_keys k ON k.key = s.id "
                        "WHERE k.key IS NULL").fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM public.pc_anon").fetchone()[0] == ROWS
    assert conn.execute("SELECT classes, violations FROM sabre.sabre_verify('public.pc_anon'::regclass, 'salary', "
                        "0.3::float8, 6)").fetchone() == (classes, 0)
    assert leftovers(citus_cluster) == 0


def test_a_plain_call_with_only_categorical_qis_still_needs_the_column_and_says_so(pc):
    """Shard-local (the default without a numerical QI) writes each shard's rows where they are,
    colocated by the distribution column: without it the run reads through the coordinator,
    with a NOTICE and a HINT."""
    conn = pc
    notices = []
    conn.add_notice_handler(lambda d: notices.append((d.message_primary, d.message_hint)))
    run = conn.execute("SELECT rows FROM sabre.sabre_anonymize('public.pc'::regclass, ARRAY['sex', 'marital'], "
                       "'salary', 0.3, 5, output => 'public.pc_cat')").fetchone()
    assert run == (ROWS,)
    said = [(m, h) for m, h in notices if "through the coordinator" in m]
    assert said and "shard-local" in said[0][0] and '"keep": ["id"]' in said[0][1]


@pytest.fixture(scope="module")
def odd(pc):
    """A distributed table of unusual types: bigint ids past 2^53, a date, a timestamptz (its
    epoch is a stable function: Citus refused it in the QI-local split's VALUES), a numeric and
    text with quotes, a backslash, a comma, '' and non-ASCII."""
    conn = pc
    conn.execute("DROP TABLE IF EXISTS public.odd CASCADE")
    conn.execute("CREATE TABLE public.odd (id bigint PRIMARY KEY, born date, city text, score numeric(12,3), "
                 "ts timestamptz, pay numeric(10,2))")
    conn.execute("INSERT INTO public.odd SELECT 9007199254740993 + g * 1000, date '1950-01-01' + (g * 37 % 20000), "
                 "(ARRAY['O''Brien', 'back\\slash', 'x\"y', '', 'ünï', 'a,b'])[1 + g % 6], (g % 997) * 1.125, "
                 "timestamptz '2020-01-01' + (g % 5000) * interval '1 hour', ((g * 7919) % 100000) / 7.0 "
                 "FROM generate_series(1, 1500) g")
    conn.execute("SELECT pg_catalog.create_distributed_table('public.odd', 'id', shard_count => 4)")
    yield conn
    conn.execute("DROP TABLE public.odd CASCADE")


@pytest.mark.parametrize("design", ["qi_local", "shard_local"])
def test_unusual_types_are_pushed_down(odd, design):
    conn = odd
    run_id, rows, classes = conn.execute(
        "SELECT run_id, rows, classes FROM sabre.sabre_anonymize('public.odd'::regclass, "
        "ARRAY['born', 'city', 'score', 'ts'], 'pay', 0.35, 5, output => 'public.odd_anon', options => %s::jsonb)",
        ('{"keep": ["id"], "citus_design": "%s"}' % design,)).fetchone()
    assert rows == 1500
    parts = conn.execute("SELECT partitions FROM sabre.runs WHERE run_id = %s", (run_id,)).fetchone()[0]
    assert parts["citus_design"] == design
    assert conn.execute("SELECT classes, violations FROM sabre.sabre_verify('public.odd_anon'::regclass, 'pay', "
                        "0.35::float8, 5)").fetchone() == (classes, 0)
    # every id once, exactly (past 2^53: no float on the way), with its own SA value
    assert conn.execute("SELECT count(*) FROM public.odd s FULL JOIN public.odd_anon o USING (id) "
                        "WHERE s.id IS NULL OR o.id IS NULL OR s.pay IS DISTINCT FROM o.pay").fetchone()[0] == 0
    # a class of one city publishes it as written
    cities = {c for (c,) in conn.execute("SELECT DISTINCT city FROM public.odd_anon")}
    assert cities <= {"O'Brien", "back\\slash", 'x"y', "", "ünï", "a,b", "*"}
