"""The Python API (sabre_pg.api) against the real test cluster: SQLAlchemy 2 (psycopg driver),
a plain psycopg connection and a DSN; DataFrames, reflection, errors, progress."""
from __future__ import annotations

import subprocess
import sys

import pandas as pd
import psycopg
import pytest
import sqlalchemy as sa
from psycopg.conninfo import conninfo_to_dict

import sabre_pg
from sabre_pg import errors
from sabre_pg.core.stopwatch import STEPS
from tests.db.helpers import make_census

ROWS = 3000
QIS = ["age", "sex", "education", "marital"]


@pytest.fixture
def census(pg_conn):
    return make_census(pg_conn, rows=ROWS)


@pytest.fixture
def engine(pg_dsn):
    """A SQLAlchemy engine on the test database, as users write it: postgresql+psycopg://..."""
    info = conninfo_to_dict(pg_dsn)
    url = sa.engine.URL.create("postgresql+psycopg", username=info["user"], password=info.get("password"),
                               database=info["dbname"], query={"host": info["host"], "port": info["port"]})
    engine = sa.create_engine(url)
    yield engine
    engine.dispose()


def test_import_needs_neither_pandas_nor_sqlalchemy():
    code = ("import sys, sabre_pg; sabre_pg.SabreError; "
            "assert 'pandas' not in sys.modules and 'sqlalchemy' not in sys.modules, 'imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_engine_round_trip(engine, census, pg_conn):
    run = sabre_pg.anonymize(engine, "public.census", quasi_identifiers=QIS, sensitive="salary",
                             t=0.35, k=6, hierarchies={"sex": census["sex"], "marital": census["marital"]})
    assert isinstance(run, sabre_pg.Run)
    assert isinstance(run.output, sa.Table)
    assert (run.output.schema, run.output.name) == ("public", "census_sabre")
    cols = {c.name: c.type for c in run.output.columns}
    assert list(cols) == ["ec_id", "age_lo", "age_hi", "sex", "education_lo", "education_hi", "marital",
                          "salary"]
    assert isinstance(cols["age_lo"], sa.Integer) and isinstance(cols["sex"], sa.String)
    # the run is what the catalog recorded (committed: another session sees it)
    recorded = pg_conn.execute("SELECT rows, classes, max_emd FROM sabre.runs WHERE run_id = %s",
                               (run.run_id,)).fetchone()
    assert recorded == (run.rows, run.n_classes, run.max_emd) and run.rows == ROWS

    frame = run.to_pandas()
    assert isinstance(frame, pd.DataFrame) and list(frame.columns) == list(cols)
    assert len(frame) == ROWS and frame["ec_id"].nunique() == run.n_classes
    assert frame.groupby("ec_id").size().min() >= 6
    with engine.connect() as c:   # the same rows SQLAlchemy reads
        assert c.execute(sa.select(sa.func.count()).select_from(run.output)).scalar() == ROWS
    chunks = list(run.to_pandas(chunksize=1000))
    assert [len(c) for c in chunks] == [1000, 1000, 1000]
    assert pd.concat(chunks).sort_values(list(cols)).reset_index(drop=True).equals(
        frame.sort_values(list(cols)).reset_index(drop=True))

    classes = run.classes()
    assert list(classes["ec_id"]) == list(range(run.n_classes))
    assert classes["size"].sum() == ROWS and classes["emd"].max() == pytest.approx(run.max_emd)
    assert frame.groupby("ec_id").size().sort_index().tolist() == classes["size"].tolist()

    checked = sabre_pg.verify(engine, run.output, "salary", 0.35, 6)
    assert checked.loc[0, "violations"] == 0 and checked.loc[0, "classes"] == run.n_classes
    assert run.verify().loc[0, "violations"] == 0
    assert run.verify(k=run.min_class_size + 1).loc[0, "violations"] > 0

    history = sabre_pg.runs(engine)
    assert history.loc[0, "run_id"] == run.run_id and history.loc[0, "status"] == "done"
    assert "sabre_pg.Run %d" % run.run_id in repr(run) and "census_sabre" in repr(run)
    assert "<table>" in run._repr_html_() and "SABRE-REFINE" in run._repr_html_()     # the default method


def test_run_reprs_keep_significant_digits():
    """Small floats keep their significant digits in the text and HTML reprs and the summary
    (AIL 3.59e-05 once showed as 0.0); None (a partitioned run's AIL) stays None."""
    run = sabre_pg.Run(run_id=7, output_name="public.x_sabre", output_schema="public", output_table="x_sabre",
                       rows=10, n_classes=2, min_class_size=5, max_emd=2.5e-07, ail=3.5912e-05, seconds=0.000432,
                       source="public.x", sensitive="s", t=0.35, k=5, method="refine")
    text, page = repr(run), run._repr_html_()
    assert "AIL 3.591e-05" in text and "max EMD 2.5e-07" in text and "0.000432 s" in text
    assert "<td style='text-align:left'>3.5912e-05</td>" in page and "2.5e-07" in page and "0.000432" in page
    assert run.summary()["AIL"] == 3.5912e-05 and run.summary()["seconds"] == 0.000432
    big = sabre_pg.Run(**{**run.__dict__, "max_emd": 0.34659, "ail": 0.1124339, "seconds": 2.3149, "bind": None})
    assert "max EMD 0.3466 <= t 0.35" in repr(big) and "AIL 0.1124, 2.31 s>" in repr(big)
    assert sabre_pg.Run(**{**run.__dict__, "ail": None}).summary()["AIL"] is None


def test_psycopg_connection_and_dsn(pg_conn, pg_dsn, census):
    run = sabre_pg.anonymize(pg_conn, "census", ["age", "sex"], "salary", t=0.3, k=4, output="census_api")
    assert run.output == "public.census_api" and run.output_name == "public.census_api"
    assert len(run.to_pandas()) == ROWS
    # a DSN: a connection per call
    assert sabre_pg.verify(pg_dsn, "public.census_api", "salary", 0.3, 4).loc[0, "violations"] == 0
    # a non-autocommit connection in an open transaction: the run takes part in it
    with psycopg.connect(pg_dsn) as conn:
        conn.execute("SELECT 1")
        inner = sabre_pg.anonymize(conn, "census", ["age"], "salary", t=0.3, k=4, output="census_rollback")
        assert len(inner.to_pandas()) == ROWS
        conn.rollback()
    assert pg_conn.execute("SELECT to_regclass('public.census_rollback')").fetchone()[0] is None


def test_sqlalchemy_connection_transaction(engine, census, pg_conn):
    with engine.connect() as c:
        with c.begin():
            run = sabre_pg.anonymize(c, "census", ["age"], "salary", t=0.3, k=4, output="census_sa_tx")
            assert run.output.name == "census_sa_tx"
            assert len(run.classes()) == run.n_classes
            c.rollback()
    assert pg_conn.execute("SELECT to_regclass('public.census_sa_tx')").fetchone()[0] is None


def test_estimate_matches_its_sql(pg_conn, census):
    pg_conn.execute("ANALYZE census")
    frame = sabre_pg.estimate(pg_conn, "census", QIS, "salary", [0.2, 0.35], k=6)
    assert list(frame["t"]) == [0.2, 0.35]
    sql_rows = pg_conn.execute("SELECT buckets, classes FROM sabre_estimate('census', %s, 'salary', "
                               "ARRAY[0.2, 0.35]::float8[], 6)", (QIS,)).fetchall()
    assert [tuple(r) for r in frame[["buckets", "classes"]].itertuples(index=False)] == \
        [tuple(r) for r in sql_rows]


def test_errors_carry_sqlstate_and_hint(engine, pg_conn, census):
    with pytest.raises(errors.InvalidParameter) as e:
        sabre_pg.anonymize(engine, "census", ["age"], "salary", t=1.5, k=2)
    assert e.value.sqlstate == "22023" and e.value.hint and isinstance(e.value, sabre_pg.SabreError)
    with pytest.raises(errors.UndefinedObject) as e:
        sabre_pg.anonymize(pg_conn, "no_such_table", ["age"], "salary", t=0.3)
    assert e.value.sqlstate == "42P01" and "search_path" in e.value.hint
    with pytest.raises(errors.UndefinedObject) as e:
        sabre_pg.anonymize(pg_conn, "census", ["agee"], "salary", t=0.3)
    assert e.value.sqlstate == "42703" and "HINT:" in str(e.value)
    with pytest.raises(sabre_pg.SabreError, match="cannot connect with a int"):
        sabre_pg.runs(42)


def test_progress_callback(pg_conn, census):
    events = []
    sabre_pg.anonymize(pg_conn, "census", ["age", "sex"], "salary", t=0.3, k=4, progress=events.append)
    starts = [e["phase"] for e in events if e["event"] == "start"]
    assert starts[:3] == ["validate", "summary", "bucketize"] and starts[-1] == "swap"
    assert {"read", "refine", "check"} <= set(starts)          # the default method's phases
    ends = [e for e in events if e["event"] == "end"]
    assert len(ends) == len(starts) and all(e["seconds"] >= 0 for e in ends)
    assert all(e["what"] == "anonymize" and e["steps"] == STEPS for e in events)
    # the setting is back as it was, and no notice reaches a caller that did not ask
    assert pg_conn.execute("SELECT current_setting('sabre.progress', true)").fetchone()[0] in (None, "")
    notices = []
    pg_conn.add_notice_handler(lambda d: notices.append(d.message_primary))
    sabre_pg.anonymize(pg_conn, "census", ["age", "sex"], "salary", t=0.3, k=4)
    assert not [n for n in notices if n.startswith("sabre.progress")]


def test_missing_pandas_names_the_extra(monkeypatch, pg_conn):
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(errors.MissingExtra, match=r"pip install 'sabre-pg\[api\]'"):
        sabre_pg.runs(pg_conn)
