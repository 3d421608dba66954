"""The side table's Hilbert keys travel as one bytea read back through a varbit (issue 26,
"Moving rows"; plpython/shared/transfer.py): every int8 comes back exactly, in order, and past
``BYTEA_VALUES`` values the keys travel as a list as before."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import psycopg
import pytest

from tests.client.fake_plpy import sabre_plpy

T = sabre_plpy("shared.transfer")
P = sabre_plpy("stages.publish")

EXTREMES = [0, 1, -1, 2 ** 63 - 1, -2 ** 63, 2 ** 62 + 12345, 9223371622669435526, -77]


def test_bytea_round_trip_in_sql(pg_conn):
    """int8_at over bytea_bits_sql gives back every value, in order (extremes and random)."""
    values = EXTREMES + np.random.default_rng(5).integers(-2 ** 63, 2 ** 63 - 1, 500, dtype=np.int64).tolist()
    query = ("SELECT %s AS v FROM (SELECT b.bits, pg_catalog.generate_series(0, %d) AS i FROM (SELECT %s AS bits) AS b) AS u"
             % (T.int8_at("u.bits", "u.i"), len(values) - 1, T.bytea_bits_sql("%s::bytea")))
    got = [r[0] for r in pg_conn.execute(query, (T.int8_bytea(values),))]
    assert got == values
    assert pg_conn.execute(query.replace("(0, %d)" % (len(values) - 1), "(0, -1)"), (b"",)).fetchall() == []


def _result(n):
    rng = np.random.default_rng(2)
    keys = rng.integers(0, 2 ** 63 - 1, n, dtype=np.int64)
    order = np.argsort(keys, kind="stable")
    return SimpleNamespace(keys=keys, ec=np.arange(n) // 3, bucket_of_tuple=np.zeros(n, dtype=np.int64),
                           by_bucket_and_key=lambda: order), order


def test_keys_sql_bytea_then_list(monkeypatch):
    key = SimpleNamespace(col={"type": "bigint"})
    result, order = _result(30)
    sql, types, params = P.keys_sql('"public"."k"', key, np.arange(30, dtype=np.int64), result)
    assert types[0] == "bytea" and np.array_equal(np.frombuffer(params[0], ">i8"), result.keys[order])
    assert "generate_series(0, 29)" in sql and "unnest($1" not in sql
    monkeypatch.setattr(T, "BYTEA_VALUES", 29)
    sql, types, params = P.keys_sql('"public"."k"', key, np.arange(30, dtype=np.int64), result)
    assert types[0] == "int8[]" and params[0] == result.keys[order].tolist() and "pg_catalog.unnest($1::int8[])" in sql


@pytest.mark.parametrize("limit", [None, 0])
def test_keys_table_exact_either_way(pg_conn, monkeypatch, limit):
    """The side table written from either form holds the engine's keys exactly."""
    if limit is not None:
        monkeypatch.setattr(T, "BYTEA_VALUES", limit)
    key = SimpleNamespace(col={"type": "bigint"})
    result, order = _result(300)
    result.keys[:len(EXTREMES)] = EXTREMES          # (the rows are written in ``order``, whatever it is)
    sql, types, params = P.keys_sql("public.kt", key, np.arange(300, dtype=np.int64), result)
    pg_conn.execute("DROP TABLE IF EXISTS public.kt")
    pg_conn.execute("DEALLOCATE ALL")
    pg_conn.execute("PREPARE kq(%s) AS %s" % (", ".join(types), sql.split(" AS ", 1)[1]))
    with psycopg.ClientCursor(pg_conn) as cur:      # (EXECUTE takes no server-side parameters)
        cur.execute("CREATE TABLE public.kt AS EXECUTE kq(%s)" % ", ".join(["%s"] * len(params)), params)
    got = pg_conn.execute("SELECT key, hilbert_key, ec_id FROM public.kt").fetchall()
    want = sorted(zip(range(300), result.keys.tolist(), result.ec.tolist()))
    assert sorted(got) == want
