"""SQL utility metrics: sabre_utility, sabre_query_error(_stats), sabre_kl_divergence/_cuboids.

Hand-computed cases use the 9-tuple reconstruction of tests/core/test_workload.py (the
paper's Table 2 generalization of Table 1 is not available): AIL = (15/22 + 75/40) / 6.
"""
from __future__ import annotations

import json

import psycopg
import pytest

from sabre_pg import datasets

TABLE = [(1, 23, 60, "gastric ulcer", 0), (2, 27, 65, "pneumonia", 0), (3, 29, 70, "bronchitis", 0),
         (4, 35, 55, "stomach cancer", 1), (5, 38, 80, "SARS", 1), (6, 40, 75, "pneumonia", 1),
         (7, 41, 50, "gastritis", 2), (8, 43, 85, "bronchitis", 2), (9, 45, 90, "stomach cancer", 2)]
RANGES = {0: ((23, 29), (60, 70)), 1: ((35, 40), (55, 80)), 2: ((41, 45), (50, 90))}
DISEASE_H = ("SARS;respiratory;*\npneumonia;respiratory;*\nbronchitis;respiratory;*\n"
             "gastric ulcer;digestive;*\ngastritis;digestive;*\nstomach cancer;digestive;*\n")
AIL_BY_HAND = (15 / 22 + 75 / 40) / 6
QIS = ["age", "weight"]


@pytest.fixture
def patients(pg_conn):
    c = pg_conn
    c.execute("CREATE TABLE patients (id int PRIMARY KEY, age int, weight int, disease text)")
    c.execute("CREATE TABLE patients_anon (ec_id bigint, age_lo int, age_hi int, weight_lo int, "
              "weight_hi int, disease text)")
    c.execute("CREATE TABLE patients_same (ec_id bigint, age_lo int, age_hi int, weight_lo int, "
              "weight_hi int, disease text)")
    with c.cursor() as cur:
        cur.executemany("INSERT INTO patients VALUES (%s, %s, %s, %s)", [r[:4] for r in TABLE])
        cur.executemany("INSERT INTO patients_anon VALUES (%s, %s, %s, %s, %s, %s)",
                        [(r[4], *RANGES[r[4]][0], *RANGES[r[4]][1], r[3]) for r in TABLE])
        cur.executemany("INSERT INTO patients_same VALUES (%s, %s, %s, %s, %s, %s)",
                        [(r[0], r[1], r[1], r[2], r[2], r[3]) for r in TABLE])
    c.execute("SELECT sabre_define_hierarchy('disease_h', %s)", (DISEASE_H,))
    return c


def test_utility_of_the_hand_computed_example(patients):
    r = patients.execute("SELECT * FROM sabre_utility('patients_anon', 'patients', %s, 'disease', "
                         "'{\"k\": 3}')", (QIS,)).fetchone()
    rows, classes, ail, disc, aecs, aecs_n, mn, mx = r
    assert (rows, classes, disc, mn, mx) == (9, 3, 27, 3, 3)
    assert ail == pytest.approx(AIL_BY_HAND)
    assert aecs == pytest.approx(3.0) and aecs_n == pytest.approx(1.0)


def test_utility_weights(patients):
    ail = patients.execute("SELECT ail FROM sabre_utility('patients_anon', 'patients', %s, 'disease', "
                           "'{\"weights\": {\"age\": 1, \"weight\": 0}}')", (QIS,)).fetchone()[0]
    assert ail == pytest.approx(15 / 22 / 3)


def test_query_error_zero_and_kl_zero_when_output_equals_source(patients):
    for opts in ({}, {"hierarchies": {"disease": "disease_h"}}):
        st = patients.execute("SELECT * FROM sabre_query_error_stats('patients_same', 'patients', %s, "
                              "'disease', 300, 2, 0.3, 5, %s)", (QIS, json.dumps(opts))).fetchone()
        assert st[0] == pytest.approx(0.0, abs=1e-9) and st[2] > 0 and st[2] + st[3] == 300
        assert patients.execute("SELECT sabre_query_error('patients_same', 'patients', %s, 'disease', "
                                "queries => 300, dimensionality => 1, selectivity => 0.5)",
                                (QIS,)).fetchone()[0] == pytest.approx(0.0, abs=1e-9)
        for level in (1, 2):
            kl = patients.execute("SELECT sabre_kl_divergence('patients_same', 'patients', %s, 'disease', "
                                  "%s, %s)", (QIS, level, json.dumps(opts))).fetchone()[0]
            assert kl == pytest.approx(0.0, abs=1e-8)


def test_generalized_output_has_positive_error_and_kl(patients):
    qe = patients.execute("SELECT sabre_query_error('patients_anon', 'patients', %s, 'disease', 500, 1, 0.5)",
                          (QIS,)).fetchone()[0]
    assert qe > 0
    cub = patients.execute("SELECT * FROM sabre_kl_cuboids('patients_anon', 'patients', %s, 'disease', 1)",
                           (QIS,)).fetchall()
    assert sorted(c[0] for c in cub) == [["age"], ["weight"]]
    assert all(c[1] > 0 for c in cub)


@pytest.mark.parametrize("call, sqlstate", [
    ("sabre_query_error('patients_anon', 'patients', ARRAY['age','weight'], 'disease', 10, 3)", "22023"),
    ("sabre_query_error('patients_anon', 'patients', ARRAY['age','weight'], 'disease', 10, 1, 0)", "22023"),
    ("sabre_kl_divergence('patients_anon', 'patients', ARRAY['age','weight'], 'disease', 0)", "22023"),
    ("sabre_utility('patients_anon', 'patients', ARRAY['age','nope'], 'disease')", "42703"),
    ("sabre_utility('patients', 'patients_anon', ARRAY['age'], 'disease')", "42703"),
    ("sabre_utility('patients_anon', 'patients', NULL, NULL)", "22023"),
    ("sabre_utility('patients_anon', 'patients', ARRAY['age'], 'disease', '{\"bogus\": 1}')", "22023"),
    ("sabre_utility('patients_anon', 'patients', ARRAY['age'], 'disease', "
     "'{\"hierarchies\": {\"disease\": \"missing_h\"}}')", "42704"),
])
def test_bad_input(patients, call, sqlstate):
    with pytest.raises(psycopg.Error) as e:
        patients.execute("SELECT * FROM " + call)
    assert e.value.sqlstate == sqlstate
    assert e.value.diag.message_primary


def test_sabre_output_uses_its_run_record(pg_conn):
    c = pg_conn
    r = datasets.generate_census(c, "census_u", rows=3000, seed=2)
    h = r["hierarchies"]
    qis = ["age", "sex", "education", "marital", "workclass"]
    c.execute("SELECT * FROM sabre_anonymize('census_u', %s, 'salary', 0.3, 4, 'ak', 'census_u_out', %s)",
              (qis, json.dumps({"hierarchies": {q: h[q] for q in qis if q in h}})))
    run = c.execute("SELECT ail, classes, discernibility FROM sabre.runs ORDER BY run_id DESC LIMIT 1").fetchone()
    u = c.execute("SELECT ail, classes, discernibility, aecs_normalized FROM "
                  "sabre_utility('census_u_out', 'census_u')").fetchone()
    assert u[0] == pytest.approx(run[0]) and u[1] == run[1] and u[2] == run[2]
    assert u[3] == pytest.approx(3000 / run[1] / 4)
    qe = c.execute("SELECT * FROM sabre_query_error_stats('census_u_out', 'census_u', queries => 2000)").fetchone()
    assert 0 < qe[0] < 10 and qe[2] > 1000
    kl = [c.execute("SELECT sabre_kl_divergence('census_u_out', 'census_u', level => %s)", (lv,)).fetchone()[0]
          for lv in (1, 2, 3)]
    assert 0 < kl[0] < kl[1] < kl[2]
    # the cuboids of level 2: one per pair of QIs
    assert c.execute("SELECT count(*) FROM sabre_kl_cuboids('census_u_out', 'census_u')").fetchone()[0] == 10
