"""A non-superuser analyst can call sabre_anonymize / sabre_verify after the README's grants,
but cannot reach tables it has no privilege on."""
from __future__ import annotations

import psycopg
import pytest

from sabre_pg import datasets

ROLE = "sabre_priv_analyst"


@pytest.fixture
def analyst(pg_conn, pg_connect):
    pg_conn.execute(f"DROP ROLE IF EXISTS {ROLE}")
    pg_conn.execute(f"CREATE ROLE {ROLE} LOGIN")
    pg_conn.execute(f"CREATE SCHEMA work AUTHORIZATION {ROLE}")
    pg_conn.execute(f"GRANT USAGE ON SCHEMA sabre TO {ROLE}")
    pg_conn.execute(f"ALTER ROLE {ROLE} SET search_path = work, public, sabre")
    yield pg_connect(user=ROLE)
    pg_conn.execute("DROP SCHEMA work CASCADE")
    pg_conn.execute(f"DROP OWNED BY {ROLE}")
    pg_conn.execute(f"DROP ROLE {ROLE}")


def test_analyst_anonymizes_a_table_it_can_read(pg_conn, analyst):
    info = datasets.generate_census(pg_conn, "census", rows=5000, seed=3)
    pg_conn.execute(f"GRANT SELECT ON public.census TO {ROLE}")
    opts = psycopg.types.json.Jsonb({"hierarchies": {"marital": info["hierarchies"]["marital"]}})
    row = analyst.execute(
        "SELECT run_id, output::text, rows, min_class_size, max_emd FROM sabre_anonymize("
        "'public.census'::regclass, ARRAY['age','sex','marital'], 'salary', 0.3, 5, "
        "output => 'work.census_anon', options => %s)", (opts,)).fetchone()
    assert row[2] == 5000 and row[3] >= 5 and row[4] <= 0.3 + 1e-9
    # the outputs belong to the analyst, in its own schema; the run is recorded
    owners = analyst.execute(
        "SELECT c.relname, pg_get_userbyid(c.relowner) FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'work' AND c.relkind = 'r' "
        "ORDER BY 1").fetchall()
    assert owners == [("census_anon", ROLE), ("census_anon_classes", ROLE), ("census_anon_keys", ROLE)]
    assert analyst.execute("SELECT run_by FROM sabre.runs WHERE run_id = %s", (row[0],)).fetchone()[0] == ROLE
    v = analyst.execute("SELECT violations FROM sabre_verify('work.census_anon', 'salary', 0.3, 5)").fetchone()
    assert v[0] == 0


def test_analyst_cannot_read_a_table_without_privilege(pg_conn, analyst):
    pg_conn.execute("CREATE TABLE public.secret (id int PRIMARY KEY, age int, salary int)")
    pg_conn.execute("INSERT INTO public.secret SELECT g, g % 50, g % 7 FROM generate_series(1, 100) g")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        analyst.execute("SELECT * FROM sabre_anonymize('public.secret'::regclass, ARRAY['age'], 'salary', 0.5, 2, "
                        "output => 'work.s')")
    assert pg_conn.execute("SELECT to_regclass('work.s')").fetchone()[0] is None


def test_upgrade_from_an_older_run_catalog_keeps_runs_working(pg_conn):
    """An install whose sabre.runs predates a column gets it on upgrade (CREATE TABLE IF NOT
    EXISTS alone would keep the old shape and break every later run)."""
    from sabre_pg import installer
    pg_conn.execute("ALTER TABLE sabre.runs DROP COLUMN relations")
    installer.upgrade(pg_conn, "sabre")
    pg_conn.execute("CREATE TABLE public.tiny (id int PRIMARY KEY, age int, salary int)")
    pg_conn.execute("INSERT INTO public.tiny SELECT g, g % 30, g % 5 FROM generate_series(1, 200) g")
    row = pg_conn.execute("SELECT rows FROM sabre_anonymize('public.tiny'::regclass, ARRAY['age'], "
                          "'salary', 0.5, 3)").fetchone()
    assert row[0] == 200
    rel = pg_conn.execute("SELECT relations FROM sabre.runs").fetchone()[0]
    assert rel == ["public.tiny_sabre", "public.tiny_sabre_classes", "public.tiny_sabre_keys"]


def test_side_table_ignores_default_privileges(pg_conn, analyst):
    """Default privileges that open a schema's new tables to readers reach the output and its
    classes, but not the side table (it maps source keys to SA buckets)."""
    reader = ROLE + "_reader"
    pg_conn.execute(f"DROP ROLE IF EXISTS {reader}")
    pg_conn.execute(f"CREATE ROLE {reader}")
    try:
        datasets.generate_census(pg_conn, "census", rows=3000, seed=4)
        pg_conn.execute(f"GRANT SELECT ON public.census TO {ROLE}")
        analyst.execute(f"ALTER DEFAULT PRIVILEGES IN SCHEMA work GRANT SELECT ON TABLES TO {reader}, PUBLIC")
        analyst.execute("SELECT * FROM sabre_anonymize('public.census'::regclass, ARRAY['age','sex'], "
                        "'salary', 0.3, 5, output => 'work.c_anon')")
        grants = dict(pg_conn.execute(
            "SELECT c.relname, array_agg(DISTINCT coalesce(r.rolname, 'PUBLIC')::text ORDER BY coalesce(r.rolname, 'PUBLIC')::text) "
            "FILTER (WHERE a.grantee <> c.relowner) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace LEFT JOIN aclexplode(c.relacl) a ON true "
            "LEFT JOIN pg_roles r ON r.oid = a.grantee WHERE n.nspname = 'work' AND c.relkind = 'r' "
            "GROUP BY 1").fetchall())
        assert grants["c_anon"] == ["PUBLIC", reader]
        assert grants["c_anon_classes"] == ["PUBLIC", reader]
        assert grants["c_anon_keys"] is None
    finally:
        analyst.execute(f"ALTER DEFAULT PRIVILEGES IN SCHEMA work REVOKE SELECT ON TABLES FROM {reader}, PUBLIC")
        pg_conn.execute(f"DROP OWNED BY {reader}")
        pg_conn.execute(f"DROP ROLE {reader}")


def test_analyst_rerun_replaces_its_output(pg_conn, analyst):
    """A rerun drops the previous output; an analyst may not lower deadlock_timeout (superuser
    only), which the run then simply leaves as it is."""
    datasets.generate_census(pg_conn, "census", rows=2000, seed=5)
    pg_conn.execute(f"GRANT SELECT ON public.census TO {ROLE}")
    call = ("SELECT run_id FROM sabre_anonymize('public.census'::regclass, ARRAY['age','sex'], "
            "'salary', 0.3, 4, output => 'work.rerun_anon')")
    first = analyst.execute(call).fetchone()[0]
    second = analyst.execute(call).fetchone()[0]
    assert second > first
    assert analyst.execute("SELECT count(*) FROM work.rerun_anon").fetchone()[0] == 2000
    assert analyst.execute("SELECT output_oid = 'work.rerun_anon'::regclass::oid FROM sabre.runs "
                           "WHERE run_id = %s", (second,)).fetchone()[0]
