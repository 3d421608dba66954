"""The label view <output>_labels (options.labels, docs/bi-views.md): read as a BI tool would
(SQLAlchemy reflection), its labels against the output's ranges, and its life with the run
(replaced, dropped, grants kept, recorded and purged)."""
from __future__ import annotations

import datetime as dt
from decimal import Decimal

import psycopg
import pytest
import sqlalchemy as sa
from psycopg.conninfo import conninfo_to_dict

import sabre_pg
from sabre_pg import installer
from tests.db.helpers import anonymize

ROWS = 400
BI_ROLE = "sabre_labels_bi"
QIS = ["age", "score", "day", "sex"]


@pytest.fixture
def visits(pg_conn):
    """Few distinct values per QI, so classes with one value (lo = hi) and ranges both occur."""
    pg_conn.execute(
        "CREATE TABLE visits AS SELECT i AS id, 20 + i %% 4 AS age, ((i %% 7) * 1.5)::numeric(5,1) AS score, "
        "date '2020-01-01' + i %% 50 AS day, CASE WHEN i %% 3 = 0 THEN 'F' ELSE 'M' END AS sex, "
        "(i * 7919) %% 10 AS salary FROM generate_series(1, %s) i", (ROWS,))
    pg_conn.execute("ALTER TABLE visits ADD PRIMARY KEY (id)")
    return "visits"


@pytest.fixture
def engine(pg_dsn):
    info = conninfo_to_dict(pg_dsn)
    engine = sa.create_engine(sa.engine.URL.create(
        "postgresql+psycopg", username=info["user"], password=info.get("password"), database=info["dbname"],
        query={"host": info["host"], "port": info["port"]}))
    yield engine
    engine.dispose()


def _label(lo, hi) -> str:
    return str(lo) if lo == hi else f"[{lo}, {hi}]"


def test_labels_read_by_reflection(engine, pg_conn, visits):
    run = sabre_pg.anonymize(engine, visits, QIS, "salary", t=1.0, k=5, options={"labels": True, "keep": ["id"]})
    view = sa.Table("visits_sabre_labels", sa.MetaData(), schema="public", autoload_with=engine)
    types = {c.name: c.type for c in view.columns}
    assert list(types) == ["ec_id", "age", "score", "day", "sex", "salary", "id"]
    assert all(isinstance(types[c], sa.Text) for c in QIS)
    assert isinstance(types["ec_id"], sa.BigInteger) and isinstance(types["salary"], sa.Integer)

    with engine.connect() as c:
        labelled = {r.id: r for r in c.execute(sa.select(view))}
        output = {r.id: r for r in c.execute(sa.select(run.output))}
    assert set(labelled) == set(output) and len(labelled) == ROWS
    singles = ranges = 0
    for key, o in output.items():
        row = labelled[key]
        assert (row.ec_id, row.sex, row.salary) == (o.ec_id, o.sex, o.salary)
        for qi in ("age", "score", "day"):
            lo, hi = getattr(o, qi + "_lo"), getattr(o, qi + "_hi")
            assert getattr(row, qi) == _label(lo, hi), (qi, lo, hi)
            singles, ranges = singles + (lo == hi), ranges + (lo != hi)
    assert singles and ranges
    assert isinstance(output[1].score_lo, Decimal) and isinstance(output[1].day_lo, dt.date)

    frame = run.labels()
    assert list(frame.columns) == list(types) and len(frame) == ROWS
    kinds = dict(pg_conn.execute("SELECT relkind, count(*) FROM sabre.recorded_relations() r "
                                 "WHERE r.run_id = %s GROUP BY relkind", (run.run_id,)).fetchall())
    assert kinds == {"r": 3, "v": 1}
    comment = pg_conn.execute("SELECT obj_description('public.visits_sabre_labels'::regclass)").fetchone()[0]
    assert f"sabre-pg labels of run {run.run_id}" in comment


def test_rerun_replaces_keeps_grants_then_drops(pg_conn, visits):
    pg_conn.execute(f"DO $$ BEGIN CREATE ROLE {BI_ROLE}; EXCEPTION WHEN duplicate_object THEN NULL; END $$")
    anonymize(pg_conn, visits, QIS, "salary", 1.0, 5, options={"labels": True})
    pg_conn.execute(f"GRANT SELECT ON visits_sabre_labels TO {BI_ROLE}")
    first = pg_conn.execute("SELECT 'visits_sabre_labels'::regclass::oid").fetchone()[0]

    anonymize(pg_conn, visits, QIS, "salary", 1.0, 6, options={"labels": True})
    oid, granted = pg_conn.execute("SELECT 'visits_sabre_labels'::regclass::oid, "
                                   "has_table_privilege(%s, 'visits_sabre_labels', 'SELECT')", (BI_ROLE,)).fetchone()
    assert oid != first and granted
    assert pg_conn.execute("SELECT min(c) FROM (SELECT count(*) c FROM visits_sabre_labels GROUP BY ec_id) g"
                           ).fetchone()[0] >= 6

    mvcc = {"labels": True, "refresh": "mvcc"}
    anonymize(pg_conn, visits, QIS, "salary", 1.0, 7, options=mvcc)   # in place: the view stays
    assert pg_conn.execute("SELECT 'visits_sabre_labels'::regclass::oid").fetchone()[0] == oid
    assert pg_conn.execute("SELECT min(c) FROM (SELECT count(*) c FROM visits_sabre_labels GROUP BY ec_id) g"
                           ).fetchone()[0] >= 7

    anonymize(pg_conn, visits, QIS, "salary", 1.0, 5)                  # no labels asked: ours is dropped
    assert pg_conn.execute("SELECT to_regclass('visits_sabre_labels')").fetchone()[0] is None


def test_foreign_relation_of_that_name(pg_conn, visits):
    pg_conn.execute("CREATE TABLE visits_sabre_labels (x int)")
    anonymize(pg_conn, visits, QIS, "salary", 1.0, 5)                  # not asked for: left alone
    with pytest.raises(psycopg.errors.DuplicateTable):
        anonymize(pg_conn, visits, QIS, "salary", 1.0, 5, options={"labels": True})
    assert pg_conn.execute("SELECT count(*) FROM visits_sabre_labels").fetchone()[0] == 0
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="options.labels must be true or false"):
        anonymize(pg_conn, visits, QIS, "salary", 1.0, 5, options={"labels": "yes"})


def test_purge_drops_the_view(pg_conn, visits):
    anonymize(pg_conn, visits, QIS, "salary", 1.0, 5, options={"labels": True})
    res = installer.uninstall(pg_conn, "sabre", purge=True)
    assert "public.visits_sabre_labels" in res["dropped_outputs"]
    assert pg_conn.execute("SELECT to_regclass('visits_sabre_labels')").fetchone()[0] is None
    installer.install(pg_conn, "sabre")
