"""sabre_verify against a real server: exact for every SA type (bigint above 2^53, numeric
with many digits, microsecond timestamps), exact at the boundary EMD = t, categorical SAs
with and without a hierarchy, bad input (SQLSTATE + HINT), and agreement with
sabre_anonymize's own outputs.

Expected EMDs are fractions worked out by hand (Li et al., ICDE 2007, ordered and
hierarchical distances); tests/core/test_exact_emd.py checks the arithmetic against an LP.
"""
from __future__ import annotations

import json
import math
from fractions import Fraction

import numpy as np
import psycopg
import pytest
from psycopg import sql

from sabre_pg import datasets as ds


def verify(conn, relation, sensitive, t, k=1, hierarchy=None) -> tuple:
    """(classes, violations, max_emd, min_class_size)."""
    return conn.execute("SELECT * FROM sabre_verify(%s::regclass, %s, %s::float8, %s::int, %s)",
                        (relation, sensitive, t, k, hierarchy)).fetchone()


def expect_error(conn, args, sqlstate, part):
    with pytest.raises(psycopg.Error) as ei:
        verify(conn, *args)
    e = ei.value
    assert e.sqlstate == sqlstate, (e.sqlstate, e.diag.message_primary)
    assert part in e.diag.message_primary, e.diag.message_primary
    assert e.diag.message_hint and e.diag.message_hint.strip()
    return e


def one_value_classes(conn, table, sqltype, value_expr, classes=20, rows_per_class=3):
    """``classes`` classes, class i holding ``rows_per_class`` rows of the i-th value."""
    conn.execute(sql.SQL(
        "CREATE TABLE {} AS SELECT i::bigint AS ec_id, ({})::{} AS sa "
        "FROM generate_series(0, %s) AS i, generate_series(1, %s) AS r").format(
            sql.Identifier(table), sql.SQL(value_expr), sql.SQL(sqltype)),
        (classes - 1, rows_per_class))


def exceeding(emds, t) -> int:
    """How many of the exact EMDs exceed the float t."""
    return sum(e > Fraction(t) for e in emds)


# 20 one-value classes of 20 values: each class's ordered EMD, by Li et al.'s formula
ONE_VALUE_EMDS = [sum(abs(Fraction(int(i >= c)) - Fraction(i + 1, 20)) for i in range(19)) / 19
                  for c in range(20)]


# --------------------------------------------------------------------------- exact numbers
@pytest.mark.parametrize("sqltype,value_expr", [
    ("bigint", "0 + i"),
    ("bigint", "4611686018427387904 + i"),                           # 2^62 + i: one float8
    ("bigint", "-9223372036854775807 + i"),
    ("numeric(45,10)", "1e30 + i * 1e-10"),                          # 40 significant digits
    ("timestamp", "timestamp '2262-01-01' + i * interval '1 microsecond'"),
    ("interval", "interval '1000000 days' + i * interval '1 microsecond'"),
    ("double precision", "1e300 * (1 + i * 2.220446049250313e-16)"),  # consecutive floats
], ids=["bigint-0", "bigint-2^62", "bigint-min", "numeric-40-digits", "timestamp-us",
        "interval-us", "float8-ulps"])
def test_distinct_values_stay_distinct(pg_conn, sqltype, value_expr):
    """Twenty one-value classes are far from the table's distribution: with t small every
    class violates, whatever the magnitude of the values (a float8 cast merged them)."""
    one_value_classes(pg_conn, "ones", sqltype, value_expr)
    assert pg_conn.execute("SELECT count(DISTINCT sa) FROM ones").fetchone()[0] == 20
    classes, violations, max_emd, min_size = verify(pg_conn, "ones", "sa", 0.05, 1)
    assert (classes, violations, min_size) == (20, 20, 3)
    assert max_emd == float(max(ONE_VALUE_EMDS)) == 0.5
    closest = min(ONE_VALUE_EMDS)                                    # the middle classes
    for t in (float(closest), float(np.nextafter(float(closest), 1)), float(np.nextafter(float(closest), 0))):
        assert verify(pg_conn, "ones", "sa", t, 1)[1] == exceeding(ONE_VALUE_EMDS, t)
    assert verify(pg_conn, "ones", "sa", 0.5, 1)[1] == 0
    assert verify(pg_conn, "ones", "sa", 0.5, 4)[1] == 20


def test_order_is_the_types_own_not_texts(pg_conn):
    """9 < 10 < 100 as numbers ('10' < '100' < '9' as text): the class of 10 is the
    middle one, EMD 1/3; the classes of 9 and 100 have EMD 1/2."""
    pg_conn.execute("CREATE TABLE nums AS SELECT v::bigint AS ec_id, v::numeric AS sa "
                    "FROM unnest(ARRAY[9, 10, 100]) AS v")
    assert verify(pg_conn, "nums", "sa", 0.4, 1)[:3] == (3, 2, 0.5)
    assert verify(pg_conn, "nums", "sa", 0.5, 1)[1] == 0


# --------------------------------------------------------------------------- exact boundary
def test_emd_equal_to_t_is_not_a_violation(pg_conn):
    """Li et al.: salaries 3k..11k; {3k, 4k, 5k} has EMD 3/8, {6k, 8k, 11k} 1/6,
    {7k, 9k, 10k} 17/72."""
    pg_conn.execute("CREATE TABLE li AS SELECT CASE WHEN s <= 5 THEN 1 WHEN s IN (6, 8, 11) THEN 2 "
                    "ELSE 3 END AS ec_id, s * 1000 AS salary FROM generate_series(3, 11) AS s")
    assert verify(pg_conn, "li", "salary", 0.375, 3) == (3, 0, 0.375, 3)
    assert verify(pg_conn, "li", "salary", float(np.nextafter(0.375, 0)), 3)[1] == 1
    emds = [Fraction(3, 8), Fraction(1, 6), Fraction(17, 72)]
    for t in (17 / 72, float(np.nextafter(17 / 72, 0)), float(np.nextafter(17 / 72, 1)), 1 / 6):
        assert verify(pg_conn, "li", "salary", t, 1)[1] == exceeding(emds, t)
    assert verify(pg_conn, "li", "salary", float(np.nextafter(1 / 6, 0)), 1)[1] == 3


def test_non_dyadic_emd_is_compared_exactly(pg_conn):
    """Equal distance over {a, b, c} once each: class {b, c} has EMD exactly 1/3, which the
    float 1/3 (slightly below) does not bound; the next float above does. Class {a}: 2/3."""
    pg_conn.execute("CREATE TABLE thirds AS SELECT (v <> 'a')::int AS ec_id, v AS sa "
                    "FROM unnest(ARRAY['a', 'b', 'c']) AS v")
    assert Fraction(1 / 3) < Fraction(1, 3)
    assert verify(pg_conn, "thirds", "sa", 1 / 3, 1)[1] == 2
    assert verify(pg_conn, "thirds", "sa", float(np.nextafter(1 / 3, 1)), 1)[1] == 1
    assert verify(pg_conn, "thirds", "sa", 2 / 3, 1)[1] == exceeding([Fraction(1, 3), Fraction(2, 3)], 2 / 3)


def test_skewed_class_and_small_class(pg_conn):
    """Classes 0..3: salaries 1..10 once each (EMD 1/10); class 4: ten rows of salary 10 (2/5)."""
    pg_conn.execute("""
        CREATE TABLE fake AS
        SELECT c::bigint AS ec_id, v AS salary FROM generate_series(0, 3) c, generate_series(1, 10) v
        UNION ALL SELECT 4, 10 FROM generate_series(1, 10);""")
    assert verify(pg_conn, "fake", "salary", 0.2, 1) == (5, 1, 0.4, 10)
    assert verify(pg_conn, "fake", "salary", 0.4, 1)[1] == 0        # 2/5 < float 0.4
    assert verify(pg_conn, "fake", "salary", 0.1, 1)[1] == 1        # 1/10 < float 0.1 < 2/5
    assert verify(pg_conn, "fake", "salary", 0.05, 1)[1] == 5
    assert verify(pg_conn, "fake", "salary", 0.4, 11)[1] == 5       # size < k is a violation too
    pg_conn.execute("INSERT INTO fake VALUES (5, 1), (5, 10)")
    classes, violations, _, min_size = verify(pg_conn, "fake", "salary", 1.0, 5)
    assert (classes, violations, min_size) == (6, 1, 2)


# --------------------------------------------------------------------------- categorical
def test_categorical_with_and_without_hierarchy(pg_conn):
    pg_conn.execute("SELECT sabre_define_hierarchy('job_h', %s)",
                    ("nurse;health;*\ndoctor;health;*\npilot;transport;*\ndriver;transport;*",))
    pg_conn.execute("""
        CREATE TABLE fake_cat AS
        SELECT c::bigint AS ec_id, j AS job FROM generate_series(0, 2) c,
               unnest(ARRAY['nurse','doctor','pilot','driver']) j
        UNION ALL SELECT 3, j FROM unnest(ARRAY['nurse','doctor','nurse','doctor']) j;""")
    # whole table: nurse, doctor 5/16 each, pilot, driver 3/16.  Class 3 (health only) moves
    # 6/16 across the root (distance 1): EMD 3/8 under both; classes 0..2: 1/8 (hierarchy:
    # 2/16 across the root) and 1/8 (flat).
    assert verify(pg_conn, "fake_cat", "job", 0.2, 1) == (4, 1, 0.375, 4)
    assert verify(pg_conn, "fake_cat", "job", 0.2, 1, "job_h") == (4, 1, 0.375, 4)
    assert verify(pg_conn, "fake_cat", "job", 0.375, 1, "job_h")[1] == 0
    assert verify(pg_conn, "fake_cat", "job", 0.125, 1, "job_h")[1] == 1
    assert verify(pg_conn, "fake_cat", "job", float(np.nextafter(0.125, 0)), 1, "job_h")[1] == 4


def test_hierarchy_distance_differs_from_flat(pg_conn):
    """A class {nurse, doctor} vs a table of nurse, doctor, pilot, driver once each: the flat
    distance moves 1/2 at distance 1 (EMD 1/2); in the hierarchy (height 2) too, since
    the moved mass must cross the root.  A class {nurse, pilot} moves 1/2 within the
    sub-trees: 1/2 * 1/2 = 1/4 with the hierarchy, 1/2 flat."""
    pg_conn.execute("SELECT sabre_define_hierarchy('job_h', %s)",
                    ("nurse;health;*\ndoctor;health;*\npilot;transport;*\ndriver;transport;*",))
    pg_conn.execute("CREATE TABLE jobs (ec_id int, job text)")
    pg_conn.execute("INSERT INTO jobs VALUES (1, 'nurse'), (1, 'pilot'), (2, 'doctor'), (2, 'driver')")
    assert verify(pg_conn, "jobs", "job", 0.3, 1, "job_h")[1:3] == (0, 0.25)
    assert verify(pg_conn, "jobs", "job", 0.3, 1)[1:3] == (2, 0.5)


@pytest.mark.parametrize("sqltype,values", [
    ("boolean", "ARRAY[true, false, false, true]"),
    ("mood", "ARRAY['low', 'high', 'high', 'low']::mood[]"),
    ("varchar(5)", "ARRAY['x', 'y', 'y', 'x']"),
])
def test_categorical_types_without_hierarchy(pg_conn, sqltype, values):
    """Classes {v1, v2} and {v2, v1}: both match the table exactly (EMD 0)."""
    pg_conn.execute("CREATE TYPE mood AS ENUM ('low', 'mid', 'high')")
    pg_conn.execute(sql.SQL("CREATE TABLE cats AS SELECT (o + 1) / 2 AS ec_id, v::{} AS sa "
                            "FROM unnest({}) WITH ORDINALITY AS u(v, o)").format(sql.SQL(sqltype), sql.SQL(values)))
    assert verify(pg_conn, "cats", "sa", 1e-9, 2) == (2, 0, 0.0, 2)


def test_values_missing_from_hierarchy(pg_conn):
    pg_conn.execute("SELECT sabre_define_hierarchy('job_h', %s)", ("nurse;health;*\npilot;transport;*",))
    pg_conn.execute("CREATE TABLE jobs AS SELECT 1 AS ec_id, j AS job "
                    "FROM unnest(ARRAY['nurse', 'Nurse', 'chef', 'chef', 'pilot']) AS j")
    e = expect_error(pg_conn, ("jobs", "job", 0.3, 1, "job_h"), "22023", '3 rows of public.jobs')
    assert 'hierarchy "job_h"' in e.diag.message_primary
    assert "'Nurse'" in e.diag.message_detail and "'chef'" in e.diag.message_detail


# --------------------------------------------------------------------------- bad input
def test_nulls_in_sa_or_ec_id(pg_conn):
    pg_conn.execute("CREATE TABLE holes (ec_id bigint, salary int)")
    pg_conn.execute("INSERT INTO holes VALUES (1, 5), (1, NULL), (2, 7)")
    expect_error(pg_conn, ("holes", "salary", 0.3), "22004", '1 rows with NULL in column "salary"')
    pg_conn.execute("UPDATE holes SET salary = 6 WHERE salary IS NULL")
    pg_conn.execute("INSERT INTO holes VALUES (NULL, 5), (NULL, 6)")
    expect_error(pg_conn, ("holes", "salary", 0.3), "22004", '2 rows with NULL in column "ec_id"')
    pg_conn.execute("SELECT sabre_define_hierarchy('sal_h', %s)", ("5;*\n6;*\n7;*",))
    expect_error(pg_conn, ("holes", "salary", 0.3, 1, "sal_h"), "22004", '"ec_id"')


@pytest.mark.parametrize("sqltype", ["point", "jsonb", "int4range"])
def test_unsupported_sa_type(pg_conn, sqltype):
    pg_conn.execute(sql.SQL("CREATE TABLE odd (ec_id bigint, sa {})").format(sql.SQL(sqltype)))
    expect_error(pg_conn, ("odd", "sa", 0.3), "42804", "unsupported type %s" % sqltype)


def test_ec_id_must_be_an_integer(pg_conn):
    pg_conn.execute("CREATE TABLE texty (ec_id text, sa int)")
    expect_error(pg_conn, ("texty", "sa", 0.3), "42804", '"ec_id"')


@pytest.mark.parametrize("t,k,sqlstate,part", [
    # (t NULL is no error since issue #10: it checks k, and l, alone -- tests/db/test_instant.py)
    (math.nan, 1, "22023", "t must"),
    (0.0, 1, "22023", "t must"),
    (-0.5, 1, "22023", "t must"),
    (1.0000001, 1, "22023", "t must"),
    (math.inf, 1, "22023", "t must"),
    (0.3, None, "22004", "k must not be NULL"),
    (0.3, 0, "22023", "k must"),
    (0.3, -2, "22023", "k must"),
])
def test_bad_t_and_k(pg_conn, t, k, sqlstate, part):
    pg_conn.execute("CREATE TABLE small AS SELECT 1::bigint AS ec_id, 5 AS sa")
    expect_error(pg_conn, ("small", "sa", t, k), sqlstate, part)


def test_null_sensitive_name(pg_conn):
    pg_conn.execute("CREATE TABLE small AS SELECT 1::bigint AS ec_id, 5 AS sa")
    expect_error(pg_conn, ("small", None, 0.3), "22004", "sensitive must not be NULL")


def test_empty_relation(pg_conn):
    pg_conn.execute("CREATE TABLE nothing (ec_id bigint, sa numeric, job text)")
    pg_conn.execute("SELECT sabre_define_hierarchy('job_h', %s)", ("nurse;*\npilot;*",))
    assert verify(pg_conn, "nothing", "sa", 0.3, 5) == (0, 0, 0.0, 0)
    assert verify(pg_conn, "nothing", "job", 0.3, 5) == (0, 0, 0.0, 0)
    assert verify(pg_conn, "nothing", "job", 0.3, 5, "job_h") == (0, 0, 0.0, 0)


def test_search_path_cannot_redirect_builtins(pg_conn):
    """Functions and operators planted in public, ahead of pg_catalog and matching better
    than the built-ins, are never called."""
    pg_conn.execute("""
        CREATE TABLE four AS SELECT s AS ec_id, s AS sa, 'v' || s AS job FROM generate_series(1, 4) AS s;
        CREATE FUNCTION public.unnest(text[]) RETURNS TABLE (leaf text, pos bigint) LANGUAGE sql
            AS $$ SELECT 'v4', 1::bigint $$;
        CREATE FUNCTION public.sum(bigint) RETURNS numeric LANGUAGE sql AS 'SELECT 0::numeric';
        CREATE FUNCTION public.always(text, text) RETURNS boolean LANGUAGE sql AS 'SELECT true';
        CREATE OPERATOR public.= (LEFTARG = text, RIGHTARG = text, FUNCTION = public.always);""")
    pg_conn.execute("SELECT sabre_define_hierarchy('job_h', %s)", ("v1;*\nv2;*\nv3;*",))
    pg_conn.execute("SET search_path = public, sabre, pg_catalog")
    # one value per class among 4 (ordered): EMDs 1/2, 1/3, 1/3, 1/2
    assert verify(pg_conn, "four", "sa", 0.4, 1) == (4, 2, 0.5, 1)
    expect_error(pg_conn, ("four", "job", 0.3, 1, "job_h"), "22023", "1 rows of public.four")


# --------------------------------------------------------------------------- agreement with the engine
@pytest.mark.parametrize("sensitive,hierarchy,t", [
    ("salary", None, 0.3), ("marital", "census_marital", 0.25), ("race", None, 0.3),
])
def test_agrees_with_sabre_anonymize(pg_conn, sensitive, hierarchy, t):
    ds.generate_census(pg_conn, table="census", rows=3000, seed=5)
    opts = {"hierarchies": {sensitive: hierarchy}} if hierarchy else {}
    res = pg_conn.execute(
        "SELECT classes, min_class_size, max_emd FROM sabre_anonymize(source => 'census', "
        "quasi_identifiers => ARRAY['age', 'sex', 'education'], sensitive => %s, t => %s, k => 6, "
        "output => 'census_anon', options => %s::jsonb)",
        (sensitive, t, json.dumps(opts))).fetchone()
    classes, violations, max_emd, min_size = verify(pg_conn, "census_anon", sensitive, t, 6, hierarchy)
    assert (classes, violations, min_size) == (res[0], 0, res[1])
    assert max_emd == pytest.approx(res[2], abs=1e-9) and max_emd <= t
