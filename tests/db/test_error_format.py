"""Errors read like PostgreSQL's (issue 29, docs/anonymize.md "Errors"): psql shows the message
without a Python prefix, DETAIL and HINT, and a one-line CONTEXT, at the default and at the
verbose verbosity; the traceback is in the server log only; a cancel keeps 57014; the Python
API's exceptions carry message, sqlstate, detail and hint and no traceback."""
from __future__ import annotations

import os
import shutil
import subprocess
import traceback

import psycopg
import pytest

import sabre_pg
from sabre_pg.cluster import find_bindir
from tests.db.helpers import make_census

ROWS = 500
BAD_COLUMN = "SELECT * FROM sabre_anonymize('public.census', ARRAY['age','sexx'], 'salary', 0.35, 6)"


def psql(conn, sql: str, verbosity: str = "default") -> str:
    """psql's stderr for ``sql`` on ``conn``'s database (psql 15 knows fewer libpq options than
    psycopg's DSN may carry: the connection is given by its parts)."""
    exe = shutil.which("psql") or str(find_bindir() / "psql")
    info = conn.info
    env = dict(os.environ, PGHOST=info.host, PGPORT=str(info.port), PGUSER=info.user,
               PGDATABASE=info.dbname, PGPASSWORD=info.password or "")
    res = subprocess.run([exe, "-X", "-v", "VERBOSITY=" + verbosity, "-c", sql],
                         capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode != 0, res.stdout
    return res.stderr


@pytest.mark.parametrize("verbosity", ["default", "verbose"])
def test_psql_shows_message_hint_and_one_context_line(pg_conn, verbosity):
    make_census(pg_conn, rows=ROWS)
    lines = psql(pg_conn, BAD_COLUMN, verbosity).splitlines()
    state = "42703: " if verbosity == "verbose" else ""
    assert lines[0] == 'ERROR:  %scolumn "sexx" does not exist in the source' % state, lines
    assert lines[1].startswith("HINT:  Available columns, nearest first: sex, ")
    context = [line for line in lines if line.startswith("CONTEXT:")]
    assert len(context) == 1 and context[0].startswith("CONTEXT:  PL/pgSQL function sabre_anonymize("), lines
    body = lines[:lines.index(context[0]) + 1]
    assert not [line for line in body if "Traceback" in line or "plpy" in line or "PL/Python" in line], lines
    assert (verbosity == "verbose") == any(line.startswith("LOCATION:") for line in lines)


@pytest.mark.parametrize("sql, sqlstate, hint", [
    (BAD_COLUMN, "42703", True),
    ("SELECT * FROM sabre_verify('public.census', 'salary', 0.3)", "42703", True),           # no ec_id
    ("SELECT * FROM sabre_stream_status('nope')", "42704", True),
    ("SELECT * FROM sabre_estimate('public.census', ARRAY['age'], 'salary', 7.0)", "22023", True),
    ("SELECT sabre_drop_hierarchy(NULL)", None, None),
    ("SELECT sabre_kl_divergence('public.census', 'public.census')", "22023", True),
    ("SELECT * FROM sabre_anonymize('public.census'::regclass, ARRAY['age'], ARRAY['salary'], "
     "ARRAY[0.3, 0.2]::float8[], 4)", "22023", True),
])
def test_every_entry_point_reports_like_postgresql(pg_conn, sql, sqlstate, hint):
    make_census(pg_conn, rows=ROWS)
    try:
        pg_conn.execute(sql).fetchall()
    except psycopg.Error as e:
        d = e.diag
        assert not d.message_primary.startswith(("plpy.", "spiexceptions.")), d.message_primary
        assert d.context and "\n" not in d.context.strip() and "PL/pgSQL function" in d.context, d.context
        assert "Traceback" not in (d.context or "")
        if sqlstate:
            assert e.sqlstate == sqlstate, (e.sqlstate, d.message_primary)
        if hint:
            assert d.message_hint
    else:
        assert sqlstate is None


def test_detail_and_hint_are_kept(pg_conn):
    pg_conn.execute("CREATE TABLE v (ec_id int, s text)")
    pg_conn.execute("INSERT INTO v VALUES (1, 'a'), (1, 'zz')")
    pg_conn.execute("SELECT * FROM sabre_define_hierarchy('v_h', E'a;*\\nb;*')").fetchall()
    call = "SELECT * FROM sabre_verify('public.v', 's', 0.5, 1, 'v_h')"
    with pytest.raises(psycopg.errors.InvalidParameterValue) as ei:
        pg_conn.execute(call).fetchall()
    d = ei.value.diag
    assert d.message_primary.startswith("1 rows of public.v have a value")
    assert d.message_detail == "Values not in the hierarchy include: 'zz'." and d.message_hint
    lines = psql(pg_conn, call).splitlines()
    assert [line.split(":")[0] for line in lines] == ["ERROR", "DETAIL", "HINT", "CONTEXT"], lines


def test_traceback_goes_to_the_server_log_only(pg_conn):
    make_census(pg_conn, rows=ROWS)
    pg_conn.execute("SET client_min_messages = log")      # what the server log gets, shown to us
    seen = []
    pg_conn.add_notice_handler(lambda d: seen.append((d.severity_nonlocalized, d.message_primary, d.message_detail)))
    with pytest.raises(psycopg.errors.UndefinedColumn):
        pg_conn.execute(BAD_COLUMN).fetchall()
    logged = [s for s in seen if s[0] == "LOG"]
    assert logged and logged[0][1].startswith("plpy.Error: column \"sexx\"") and "Traceback" in logged[0][2]
    pg_conn.execute("RESET client_min_messages")
    seen.clear()
    with pytest.raises(psycopg.errors.UndefinedColumn):
        pg_conn.execute(BAD_COLUMN).fetchall()
    assert seen == []


def test_cancel_keeps_its_sqlstate(pg_conn):
    make_census(pg_conn, rows=ROWS)
    pg_conn.execute("SET statement_timeout = '1ms'")
    with pytest.raises(psycopg.errors.QueryCanceled) as ei:
        pg_conn.execute("SELECT * FROM sabre_anonymize('public.census', ARRAY['age','sex'], 'salary', 0.35, 6)").fetchall()
    pg_conn.execute("RESET statement_timeout")
    assert not ei.value.diag.message_primary.startswith(("plpy.", "spiexceptions."))


def test_python_api_errors_carry_fields_without_traceback(pg_conn, pg_dsn):
    make_census(pg_conn, rows=ROWS)
    with pytest.raises(sabre_pg.UndefinedObject) as ei:
        sabre_pg.anonymize(pg_dsn, "census", ["age", "sexx"], "salary", t=0.35, k=6)
    e = ei.value
    assert e.sqlstate == "42703" and e.message == 'column "sexx" does not exist in the source'
    assert e.hint.startswith("Available columns, nearest first: sex")
    shown = "".join(traceback.format_exception(e))
    assert "Traceback (most recent call last):\n  PL/Python" not in shown and "PL/Python function" not in shown
    assert "CONTEXT" not in str(e) and "plpy" not in str(e)
