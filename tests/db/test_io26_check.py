"""The pre-swap check reads each row's class and SA value as one int8 (issue 26, branch io26).

``closeness.measure(..., small_classes=True)`` (what ``publish.check_written`` passes: the class
ids it just wrote are below 2^31) packs ``ec_id`` and a 32-bit SA (int2, int4, or a hierarchy
leaf's position) into one int8 per row, one aggregate instead of four.  It must measure exactly
what the unpacked read measures -- negative and extreme int4 values, int2, leaf positions --
and a relation with NULLs must still end in the grouped query's error.  Run against a real
server through a small psycopg-backed ``plpy``.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
from psycopg.rows import dict_row

from sabre_pg.core.hierarchy import Hierarchy
from tests.client.fake_plpy import PlpyError, sabre_plpy
from tests.db.helpers import anonymize, verify

CL = sabre_plpy("shared.closeness")
CM = sabre_plpy("shared.common")


class DbPlpy:
    """Just enough of ``plpy`` over a psycopg connection: prepare/execute with ``$n`` parameters."""
    SPIError = PlpyError
    Error = PlpyError

    def __init__(self, conn):
        self.conn, self.executed = conn, []

    def prepare(self, sql, types=None):
        return (sql, types)

    def execute(self, query, params=None):
        sql = query[0] if isinstance(query, tuple) else query
        self.executed.append(sql)
        order = [int(m) for m in re.findall(r"\$(\d+)", sql)]
        text = re.sub(r"\$(\d+)", "%s", sql.replace("%", "%%"))
        with self.conn.cursor(row_factory=dict_row) as cur:
            cur.execute(text, [params[i - 1] for i in order] if order else None)
            return cur.fetchall() if cur.description else []

    def quote_literal(self, value):
        return "'%s'" % str(value).replace("'", "''")

    def error(self, message, sqlstate=None, hint=None, detail=None):
        raise PlpyError(message, sqlstate, hint, detail)


def _col(conn, relation):
    """The SA column's entry of ``common.columns`` (as the check gets it)."""
    oid = conn.execute("SELECT %s::regclass::oid", (relation,)).fetchone()[0]
    return CM.columns(DbPlpy(conn), oid)["sa"]


def _both(conn, relation, hierarchy=None):
    """(packed measurement, unpacked measurement, the packed run's SQL)."""
    plpy = DbPlpy(conn)
    packed = CL.measure(plpy, relation, "sa", _col(conn, relation), hierarchy, small_classes=True)
    sql = list(plpy.executed)
    plain = CL.measure(DbPlpy(conn), relation, "sa", _col(conn, relation), hierarchy)
    return packed, plain, sql


def _same(a, b):
    assert a.classes == b.classes
    np.testing.assert_array_equal(a.class_ids, b.class_ids)
    np.testing.assert_array_equal(a.sizes, b.sizes)
    assert a.max_emd == b.max_emd and a.min_class_size == b.min_class_size
    np.testing.assert_array_equal(a.emd, b.emd)
    np.testing.assert_array_equal(a.numerators, b.numerators)


@pytest.mark.parametrize("sa_type", ["int4", "int2"])
def test_packed_check_measures_what_the_plain_read_measures(pg_conn, sa_type):
    lo, hi = (-(2 ** 31), 2 ** 31 - 1) if sa_type == "int4" else (-(2 ** 15), 2 ** 15 - 1)
    pg_conn.execute("CREATE TABLE public.m (ec_id bigint, sa %s)" % sa_type)
    rng = np.random.default_rng(4)
    ec = rng.integers(0, 300, 3000)
    sa = rng.choice([lo, hi, -1, 0, 1, -7, 12, 40], 3000)
    with pg_conn.cursor() as cur:
        cur.executemany("INSERT INTO public.m VALUES (%s, %s)", list(zip(ec.tolist(), sa.tolist())))
    packed, plain, sql = _both(pg_conn, "public.m")
    _same(packed, plain)
    assert packed.classes == len(np.unique(ec))
    # one aggregate over the packed pairs, no per-column counts
    assert any("OPERATOR(pg_catalog.<<) 32" in s and "n_ec" not in s for s in sql)


def test_packed_check_with_a_hierarchy(pg_conn):
    h = Hierarchy.from_arx("a;ab;*\nb;ab;*\nc;cd;*\nd;cd;*", name="h")
    pg_conn.execute("CREATE TABLE public.h (ec_id bigint, sa text)")
    pg_conn.execute("INSERT INTO public.h SELECT i % 50, (ARRAY['a','b','c','d'])[1 + (i * 7) % 4] "
                    "FROM generate_series(1, 2000) AS i")
    packed, plain, sql = _both(pg_conn, "public.h", h)
    _same(packed, plain)
    assert any("OPERATOR(pg_catalog.<<) 32" in s for s in sql)


def test_packed_check_with_nulls_reports_them(pg_conn):
    """A NULL class or SA makes the pair NULL: the packed read falls back to the grouped query,
    which names the NULLs (22004), as the plain read does."""
    for column in ("ec_id", "sa"):
        pg_conn.execute("DROP TABLE IF EXISTS public.n")
        pg_conn.execute("CREATE TABLE public.n AS SELECT (i % 10)::bigint AS ec_id, (i % 3)::int4 AS sa "
                        "FROM generate_series(1, 200) AS i")
        pg_conn.execute("UPDATE public.n SET %s = NULL WHERE ctid = (SELECT min(ctid) FROM public.n)" % column)
        errors = []
        for small in (True, False):
            with pytest.raises(PlpyError) as e:
                CL.measure(DbPlpy(pg_conn), "public.n", "sa", _col(pg_conn, "public.n"), None, small_classes=small)
            errors.append((e.value.sqlstate, str(e.value)))
        assert errors[0] == errors[1] and errors[0][0] == "22004"


@pytest.mark.parametrize("method", ["refine", "ak"])
def test_runs_pass_the_packed_check_and_verify(pg_conn, method):
    """Whole runs: an int4 SA and a categorical SA with a hierarchy go through the packed check
    and publish outputs the independent verifier accepts."""
    pg_conn.execute("CREATE TABLE public.r (id int PRIMARY KEY, age int, zip int, sa int, job text)")
    pg_conn.execute("INSERT INTO public.r SELECT i, 18 + (i * 7) % 60, (i * 13) % 97, -5 + (i * 11) % 23, "
                    "(ARRAY['a','b','c','d'])[1 + (i * 5) % 4] FROM generate_series(1, 1500) AS i")
    pg_conn.execute("SELECT sabre_define_hierarchy('r_job', 'a;ab;*\nb;ab;*\nc;cd;*\nd;cd;*')")
    anonymize(pg_conn, "public.r", ["age", "zip"], "sa", 0.3, 5, method, "r_int", {"seed": 3})
    assert verify(pg_conn, "public.r_int", "sa", 0.3, 5)["violations"] == 0
    anonymize(pg_conn, "public.r", ["age", "zip"], "job", 0.3, 5, method, "r_job",
              {"seed": 3, "hierarchies": {"job": "r_job"}})
    assert verify(pg_conn, "public.r_job", "job", 0.3, 5, "r_job")["violations"] == 0
