"""Several sensitive attributes, each with its own t, against a real server: the array
overloads of sabre_anonymize and sabre_verify (docs/multiple-sa.md), the classes' emd_<sa>
columns, the catalog's arrays, an independent EMD check in numpy, and the errors."""
from __future__ import annotations

import json

import numpy as np
import psycopg
import pytest
from psycopg import sql

from sabre_pg import census
from sabre_pg.core.emd import SADomain, hierarchical_emd, ordered_emd
from sabre_pg.core.hierarchy import Hierarchy
from tests.db.helpers import checksum, columns, expect_error, make_census, run_row

QIS = ["age", "sex", "education", "marital"]
ROWS = 4000


@pytest.fixture
def patients(pg_conn):
    """census + hours (a second numerical SA) + the marital hierarchy; returns hierarchies."""
    hierarchies = make_census(pg_conn, rows=ROWS)
    pg_conn.execute("CREATE TABLE patients AS SELECT c.*, %s AS hours FROM census c" % census.hours_sql("c.salary", "c.age", "c.id"))
    pg_conn.execute("ALTER TABLE patients ADD PRIMARY KEY (id)")
    return hierarchies


def anonymize(conn, sensitive, t, k=5, options=None, source="public.patients", qis=QIS):
    with conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        return cur.execute(
            "SELECT * FROM sabre_anonymize(source => %s::regclass, quasi_identifiers => %s::text[], "
            "sensitive => %s::text[], t => %s::float8[], k => %s, options => %s::jsonb)",
            (source, qis, sensitive, t, k, json.dumps(options or {}))).fetchone()


def verify(conn, output, sensitive, t, k=1, hierarchies=None):
    return conn.execute("SELECT * FROM sabre_verify(%s::regclass, %s::text[], %s::float8[], %s, hierarchies => %s::text[])",
                        (output, sensitive, t, k, hierarchies)).fetchone()


def independent_violations(conn, output, sa, t, hierarchy=None):
    """Classes of ``output`` over t on ``sa``, by emd.py's formulas from the rows (numpy)."""
    rows = conn.execute(sql.SQL("SELECT ec_id, {}::text FROM {}").format(
        sql.Identifier(sa), sql.Identifier(output))).fetchall()
    ec = np.array([r[0] for r in rows])
    if hierarchy is None:
        values = np.array([float(r[1]) for r in rows])
        distinct, codes = np.unique(values, return_inverse=True)
        domain = SADomain("numerical", m=len(distinct))
    else:
        codes = np.array([hierarchy.leaf_pos[r[1]] for r in rows])
        domain = SADomain("categorical", hierarchy=hierarchy)
    q = np.bincount(codes, minlength=domain.m) / len(codes)
    bad = 0
    for c in np.unique(ec):
        p = np.bincount(codes[ec == c], minlength=domain.m) / np.count_nonzero(ec == c)
        emd = ordered_emd(p, q) if domain.numerical else hierarchical_emd(p, q, domain.hierarchy)
        bad += emd > t + 1e-12
    return bad


def test_two_sas_each_with_its_own_t(pg_conn, patients):
    before = checksum(pg_conn, "public.patients")
    res = anonymize(pg_conn, ["salary", "hours", "marital"], [0.2, 0.15, 0.3],
                    options={"hierarchies": {"marital": patients["marital"]}}, qis=["age", "sex", "education"])
    assert res["rows"] == ROWS and res["classes"] > 1 and res["min_class_size"] >= 5
    assert len(res["max_emd"]) == 3
    assert all(0 <= e <= t for e, t in zip(res["max_emd"], [0.2, 0.15, 0.3]))
    assert checksum(pg_conn, "public.patients") == before
    out = [c for c, _ in columns(pg_conn, sql.Identifier("public", "patients_sabre"))]
    assert out == ["ec_id", "age_lo", "age_hi", "sex", "education_lo", "education_hi", "salary", "hours", "marital"]
    classes = [c for c, _ in columns(pg_conn, sql.Identifier("public", "patients_sabre_classes"))]
    assert classes[:5] == ["ec_id", "size", "emd_salary", "emd_hours", "emd_marital"]
    # the classes' EMDs are the verifier's; sabre_verify and numpy find no violation
    worst = pg_conn.execute("SELECT max(emd_salary), max(emd_hours), max(emd_marital), min(size), count(*) "
                            "FROM patients_sabre_classes").fetchone()
    assert list(worst[:3]) == pytest.approx(res["max_emd"]) and worst[3] >= 5 and worst[4] == res["classes"]
    v = verify(pg_conn, "public.patients_sabre", ["salary", "hours", "marital"], [0.2, 0.15, 0.3], 5,
               [None, None, patients["marital"]])
    assert v == (res["classes"], 0, pytest.approx(res["max_emd"]), res["min_class_size"])
    h = Hierarchy([r[0] for r in pg_conn.execute(
        "SELECT path FROM sabre.hierarchy_rows WHERE hierarchy = %s", (patients["marital"],))])
    assert independent_violations(pg_conn, "patients_sabre", "salary", 0.2) == 0
    assert independent_violations(pg_conn, "patients_sabre", "hours", 0.15) == 0
    assert independent_violations(pg_conn, "patients_sabre", "marital", 0.3, h) == 0
    # a tighter t on one SA is a violation for the verifier
    assert verify(pg_conn, "public.patients_sabre", ["salary", "hours"], [0.2, res["max_emd"][1] / 2])[1] > 0
    run = run_row(pg_conn, res["run_id"])
    assert run["sensitive_attributes"] == ["salary", "hours", "marital"]
    assert run["t_values"] == [0.2, 0.15, 0.3] and run["max_emds"] == pytest.approx(res["max_emd"])
    assert (run["sensitive"], run["t"]) == ("salary", 0.2)


def test_refresh_of_a_several_sa_run_reruns_every_sa_with_its_own_t(pg_conn, patients):
    """sabre_refresh of an array-form run reruns the array form: every SA, each with its t."""
    sas, ts = ["salary", "hours", "marital"], [0.25, 0.2, 0.35]
    opts = {"hierarchies": {"marital": patients["marital"]}}
    first = anonymize(pg_conn, sas, ts, options=opts, qis=["age", "sex", "education"])
    again = pg_conn.execute("SELECT run_id, rows, classes, min_class_size, max_emd FROM sabre_refresh("
                            "'public.patients_sabre')").fetchone()
    assert again[0] > first["run_id"] and again[1] == ROWS and again[3] >= 5
    run = run_row(pg_conn, again[0])
    assert run["sensitive_attributes"] == sas and run["t_values"] == ts
    assert run["quasi_identifiers"] == ["age", "sex", "education"] and run["method"] == first_method(pg_conn, first)
    assert again[4] == pytest.approx(run["max_emds"][0])
    v = verify(pg_conn, "public.patients_sabre", sas, ts, 5, [None, None, patients["marital"]])
    assert v[1] == 0 and v[0] == again[2]
    classes = [c for c, _ in columns(pg_conn, sql.Identifier("public", "patients_sabre_classes"))]
    assert classes[:5] == ["ec_id", "size", "emd_salary", "emd_hours", "emd_marital"]


def first_method(conn, res) -> str:
    return run_row(conn, res["run_id"])["method"]


def test_one_sa_in_the_array_form_keeps_emd(pg_conn, patients):
    res = anonymize(pg_conn, ["salary"], [0.2])
    assert len(res["max_emd"]) == 1
    classes = [c for c, _ in columns(pg_conn, sql.Identifier("public", "patients_sabre_classes"))]
    assert classes[:3] == ["ec_id", "size", "emd"]
    # (both forms default to 'refine')
    single = pg_conn.execute("SELECT classes, max_emd FROM sabre_anonymize('public.patients'::regclass, %s, "
                             "'salary', 0.2, 5, 'refine', output => 'single')", (QIS,)).fetchone()
    assert single == (res["classes"], pytest.approx(res["max_emd"][0]))


@pytest.mark.parametrize("sensitive, t, qis, sqlstate, words", [
    (["salary", "hours"], [0.2], QIS, "22023", "arrays of different lengths"),
    (["salary", "salary"], [0.2, 0.3], QIS, "42701", "listed twice"),
    (["salary", "age"], [0.2, 0.3], QIS, "22023", "also listed among the quasi-identifiers"),
    (["salary", "hours"], [0.2, 1.5], QIS, "22023", "t must"),
    (["salary", None], [0.2, 0.3], QIS, "22004", "without NULLs"),
])
def test_errors(pg_conn, patients, sensitive, t, qis, sqlstate, words):
    expect_error(pg_conn, lambda c: anonymize(c, sensitive, t, qis=qis), sqlstate, words, source="patients")


def test_verify_errors(pg_conn, patients):
    anonymize(pg_conn, ["salary", "hours"], [0.3, 0.3])
    for args, sqlstate, words in (((["salary", "hours"], [0.2]), "22023", "different lengths"),
                                  ((["salary", "salary"], [0.2, 0.2]), "42701", "listed twice"),
                                  ((["salary", "nope"], [0.2, 0.2]), "42703", "nope")):
        with pytest.raises(psycopg.Error) as e:
            verify(pg_conn, "public.patients_sabre", *args)
        assert e.value.sqlstate == sqlstate and words in e.value.diag.message_primary
        assert e.value.diag.message_hint
