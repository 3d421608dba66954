"""SABRE_W in the database (docs/streams.md): the SQL contract, the three cases, every row
published exactly once across advances and calls, crash and cancel mid-advance, bad input,
owner-only state, and a real pg_cron job."""
from __future__ import annotations

import threading
import time

import psycopg
import pytest
from psycopg import sql

from tests.db.helpers import expect_error, scalar

SOURCE = "admissions"


def make_source(conn, rows=0, table=SOURCE, seed=0.5, shift_at=None):
    conn.execute(sql.SQL(
        "CREATE TABLE {} (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, age int NOT NULL, "
        "sex text NOT NULL, zip int NOT NULL, diagnosis int NOT NULL)").format(sql.Identifier(table)))
    conn.execute("SELECT setseed(%s)", (seed,))
    if rows:
        add_rows(conn, rows, table, shift_at=shift_at)


def add_rows(conn, rows, table=SOURCE, shift_at=None):
    """``rows`` new rows; with ``shift_at`` the diagnosis shifts from mostly low to mostly high
    values after that many rows of the table."""
    start = scalar(conn, sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table)))
    conn.execute(sql.SQL(
        "INSERT INTO {} (age, sex, zip, diagnosis) SELECT 17 + (random() * 70)::int, "
        "CASE WHEN random() < 0.5 THEN 'F' ELSE 'M' END, (random() * 99)::int, "
        "CASE WHEN %s::bigint IS NOT NULL AND %s::bigint + g > %s::bigint "
        "THEN (CASE WHEN random() < 0.9 THEN 5 + (random() * 4)::int ELSE (random() * 4)::int END) "
        "ELSE (CASE WHEN random() < 0.9 THEN (random() * 4)::int ELSE 5 + (random() * 4)::int END) END "
        "FROM generate_series(1, %s) g").format(sql.Identifier(table)),
        (shift_at, start, shift_at, rows))


def create(conn, name="adm_w", window_size=400, step=100, t=0.3, k=4, output=None, options="{}",
           source=SOURCE, arrival="id", qis=("age", "sex", "zip"), sensitive="diagnosis", method="ak"):
    with conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        return cur.execute(
            "SELECT * FROM sabre_stream_create(name => %s, source => %s::regclass, arrival => %s, "
            "quasi_identifiers => %s::text[], sensitive => %s, t => %s, k => %s, window_size => %s, "
            "step => %s, method => %s, output => %s, options => %s::jsonb)",
            (name, source, arrival, list(qis), sensitive, t, k, window_size, step, method, output,
             options)).fetchone()


def advance(conn, name="adm_w", max_advances=None):
    with conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        return cur.execute("SELECT * FROM sabre_stream_advance(%s, %s)", (name, max_advances)).fetchall()


def status(conn, name="adm_w"):
    with conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        return cur.execute("SELECT * FROM sabre_stream_status(%s)", (name,)).fetchone()


def verify(conn, name="adm_w"):
    with conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        return cur.execute("SELECT * FROM sabre_stream_verify(%s)", (name,)).fetchone()


def assert_clean(v, expired):
    assert v["violations"] == 0 and v["published_twice"] == 0 and v["expired_unpublished"] == 0, v
    assert v["updated"] == 0 and v["deleted"] == 0 and v["late"] == 0, v
    assert v["rows"] >= expired


def columns(conn, table):
    return [r[0] for r in conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped "
        "ORDER BY attnum", (table,)).fetchall()]


def test_contract_columns_and_exactly_once_across_calls(pg_conn):
    make_source(pg_conn, 450)
    made = create(pg_conn)
    assert made["stream"] == "adm_w" and made["output"] == "admissions_sabre_w"
    assert made["rows_arrived"] == 450 and made["advances_ready"] == 0
    assert advance(pg_conn) == []                          # W1 = rows 1..400 needs rows to 500
    assert columns(pg_conn, "admissions_sabre_w") == [
        "ec_id", "age_lo", "age_hi", "sex", "zip_lo", "zip_hi", "diagnosis",
        "advance_no", "window_first", "window_last", "published_at"]
    assert columns(pg_conn, "admissions_sabre_w_classes") == [
        "ec_id", "size", "emd", "age_lo", "age_hi", "sex", "zip_lo", "zip_hi",
        "advance_no", "window_first", "window_last", "published_at"]
    assert columns(pg_conn, "admissions_sabre_w_keys") == ["key", "row_no", "ec_id", "advance_no", "row_hash"]
    add_rows(pg_conn, 250)                                 # 700 rows: advances 1..3
    first = advance(pg_conn)
    assert [r["advance_no"] for r in first] == [1, 2, 3]
    assert first[0]["case_no"] == 2 and first[0]["d"] == 0 and first[0]["rows"] >= 100
    assert all(r["max_emd"] is None or r["max_emd"] <= 0.3 for r in first)
    add_rows(pg_conn, 420)                                 # 1120 rows: advances 4..7
    second = advance(pg_conn, max_advances=2)
    assert [r["advance_no"] for r in second] == [4, 5]
    assert [r["advance_no"] for r in advance(pg_conn)] == [6, 7]
    st = status(pg_conn)
    assert st["advances"] == 7 and st["window_first"] == 701 and st["numbered"] == 1120
    assert st["published"] + st["pending"] == 1120 and st["advances_ready"] == 0
    v = verify(pg_conn)
    assert_clean(v, 700)
    assert v["min_class_size"] >= 4 and v["max_emd"] <= 0.3
    # every key at most once in the keys table, and rows 1..700 all there
    assert scalar(pg_conn, "SELECT count(DISTINCT row_no) FROM admissions_sabre_w_keys WHERE row_no <= 700") == 700
    assert scalar(pg_conn, "SELECT count(*) FROM admissions_sabre_w") == \
        scalar(pg_conn, "SELECT count(*) FROM admissions_sabre_w_keys")
    logged = scalar(pg_conn, "SELECT count(*) FROM sabre.stream_advances")
    assert logged == 7
