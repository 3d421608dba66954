"""Issue 25, finding 5 and "Bounded and cancellable": a cancel or statement_timeout ends any
sabre call within about a second, and the lattice sabre_instant walks is capped before it is
made (docs/security.md, "Bounded and cancellable"; docs/instant.md, "Bounds").

PostgreSQL acts on a cancel only at a database call; on 0.2.0 the engine's pure-Python/numpy
work ran to its end first (the lattice walk of sabre_instant for minutes).  Each call below
runs many seconds without a cancel; with one it must end with SQLSTATE 57014 within
``BOUND`` seconds of wall time (the issue's 2 s, with a margin for a loaded machine).
The big inputs are made inside the server with generate_series.
"""
from __future__ import annotations

import json
import threading
import time

import psycopg
import pytest

from tests.db.helpers import expect_error

BOUND = 2.5                     # seconds from the call to its 57014, statement_timeout = 1 s
LEAVES = 12                     # leaves of the lattice hierarchies


def chain_hierarchy(conn, name: str, height: int):
    """A hierarchy of ``LEAVES`` leaves and ``height`` levels above them, each level but the
    root splitting the leaves in two: every node of the lattice over it passes k-anonymity,
    so S-INSTANT's walk evaluates them all."""
    rows = "".join("v%d;%s*\n" % (i, "".join("L%dg%d;" % (j, i % 2) for j in range(1, height)))
                   for i in range(LEAVES))
    conn.execute("SELECT * FROM sabre_define_hierarchy(%s, %s)", (name, rows))


@pytest.fixture
def lattice_table(pg_conn):
    """public.lat: four text QIs over the leaves v0..v11, 12,000 rows, analyzed."""
    pg_conn.execute("CREATE TABLE lat AS SELECT i AS id, 'v' || (i %% %d) AS a, 'v' || ((i / %d) %% %d) AS b, "
                    "'v' || ((i / %d) %% %d) AS c, 'v' || ((i * 7) %% %d) AS d FROM generate_series(0, 11999) AS i"
                    % (LEAVES, LEAVES, LEAVES, LEAVES * LEAVES, LEAVES, LEAVES))
    pg_conn.execute("ANALYZE lat")
    return "lat"


def instant_call(conn, hierarchy: str, output: str = "lat_instant"):
    return conn.execute(
        "SELECT * FROM sabre_instant(source => 'lat', quasi_identifiers => ARRAY['a', 'b', 'c', 'd'], k => 5, "
        "output => %s, options => %s::jsonb)", (output, json.dumps({"hierarchies": {q: hierarchy for q in "abcd"}})))


def cancelled_within(conn, call, bound: float = BOUND, timeout: str = "1s") -> float:
    """``call(conn)`` under statement_timeout ``timeout``: it fails with 57014 within ``bound``
    seconds; the session is usable after it."""
    conn.execute("SET statement_timeout = '%s'" % timeout)
    started = time.monotonic()
    with pytest.raises(psycopg.Error) as ei:
        call(conn)
    elapsed = time.monotonic() - started
    conn.execute("RESET statement_timeout")
    assert ei.value.sqlstate == "57014", (ei.value.sqlstate, str(ei.value))
    assert elapsed < bound, "the call ran %.1f s after statement_timeout = %s" % (elapsed, timeout)
    assert conn.execute("SELECT 1").fetchone() == (1,)
    print("57014 after %.2f s" % elapsed)  # shown with -s: the figure the issue asks for
    return elapsed


# ------------------------------------------------------------------ the lattice (sabre_instant)

def test_largest_lattice_under_the_cap_ends_at_statement_timeout(pg_conn, lattice_table):
    # 4 QIs of 17 levels (the hierarchy cap allows 33): 83,521 nodes, under the cap, most
    # of them passing (the walk evaluates them: many seconds)
    chain_hierarchy(pg_conn, "lat_h16", 16)
    cancelled_within(pg_conn, lambda c: instant_call(c, "lat_h16"))
    assert pg_conn.execute("SELECT to_regclass('public.lat_instant')").fetchone() == (None,)


def test_lattice_over_the_cap_is_refused_before_it_is_made(pg_conn, lattice_table):
    # 18 levels on 4 QIs: 104,976 nodes; refused at once (on 0.2.0 it was walked: the
    # statement_timeout, far above the time a refusal takes, ends it instead)
    chain_hierarchy(pg_conn, "lat_h17", 17)
    pg_conn.execute("SET statement_timeout = '20s'")
    started = time.monotonic()
    e = expect_error(pg_conn, lambda c: instant_call(c, "lat_h17"), "54000", "lattice", "104,976",
                     "100,000", source="lat")
    assert time.monotonic() - started < 10
    assert "coarser hierarchies" in e.diag.message_hint and "fewer quasi-identifiers" in e.diag.message_hint
    pg_conn.execute("RESET statement_timeout")


def test_pg_cancel_backend_ends_a_running_lattice_walk(pg_conn, pg_connect, lattice_table):
    chain_hierarchy(pg_conn, "lat_h15", 15)
    victim = pg_connect()
    pid = victim.info.backend_pid
    got = {}

    def cancel_when_walking():
        watcher = pg_connect()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "done" not in got:
            # the call is past reading statistics: its backend is in the walk (no phase of
            # its own) -- wait a little longer than the summary takes, then cancel
            row = watcher.execute("SELECT state, query FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
            if row and row[0] == "active" and "sabre_instant" in (row[1] or ""):
                time.sleep(1.5)
                got["cancelled_at"] = time.monotonic()
                watcher.execute("SELECT pg_cancel_backend(%s)", (pid,))
                return
            time.sleep(0.05)

    thread = threading.Thread(target=cancel_when_walking)
    thread.start()
    try:
        with pytest.raises(psycopg.Error) as ei:
            instant_call(victim, "lat_h15")
        ended = time.monotonic()
    finally:
        got["done"] = True
        thread.join()
    assert ei.value.sqlstate == "57014", (ei.value.sqlstate, str(ei.value))
    assert "cancelled_at" in got and ended - got["cancelled_at"] < 1.5
    assert victim.execute("SELECT 1").fetchone() == (1,)


# ------------------------------------------------------------------ the largest hierarchy

def test_anonymize_over_a_large_hierarchy_ends_at_statement_timeout(pg_conn):
    # a hierarchy of 10,000 leaves (4 levels), used by a QI of a 200,000-row table: the
    # statistics and the read take well under 1 s, the engine many seconds (on 0.2.0 the
    # call ended only after it)
    pg_conn.execute(
        "SELECT * FROM sabre_define_hierarchy('big_h', (SELECT string_agg(format('p%s;g%s;m%s;*', i, i / 8, i / 512), "
        "E'\\n') FROM generate_series(0, 9999) AS i))")
    pg_conn.execute("CREATE TABLE bigh AS SELECT i AS id, 'p' || ((i::int8 * 7919) % 10000) AS place, (i * 31) % 97 AS age, "
                    "(i * 17) % 1000 AS pay FROM generate_series(1, 200000) AS i")
    pg_conn.execute("ALTER TABLE bigh ADD PRIMARY KEY (id)")
    cancelled_within(pg_conn, lambda c: c.execute(
        "SELECT * FROM sabre_anonymize(source => 'bigh'::regclass, quasi_identifiers => ARRAY['place', 'age'], "
        "sensitive => 'pay', t => 0.2, k => 4, method => 'refine', options => %s::jsonb)",
        (json.dumps({"hierarchies": {"place": "big_h"}}),)))
    assert pg_conn.execute("SELECT to_regclass('public.bigh_sabre')").fetchone() == (None,)


# ------------------------------------------------------------------ the largest refine call

@pytest.mark.parametrize("options", [{}, {"threads": 2}], ids=["one_thread", "two_threads"])
def test_refine_on_a_large_table_ends_at_statement_timeout(pg_conn, options):
    # 200,000 rows of 3 numerical QIs on a lattice of residues: the read takes a few tenths
    # of a second, the cut search minutes (measured 561 s at 600,000 rows); with threads the
    # backend's thread waits for its workers, ticking, and stops them
    pg_conn.execute("CREATE TABLE bigr AS SELECT i AS id, (i * 7) % 83 AS age, (i * 13) % 211 AS zip, "
                    "(i * 29) % 97 AS hours, (i * 17) % 1000 AS pay FROM generate_series(1, 200000) AS i")
    pg_conn.execute("ALTER TABLE bigr ADD PRIMARY KEY (id)")
    cancelled_within(pg_conn, lambda c: c.execute(
        "SELECT * FROM sabre_anonymize(source => 'bigr'::regclass, quasi_identifiers => ARRAY['age', 'zip', 'hours'], "
        "sensitive => 'pay', t => 0.1, k => 4, method => 'refine', options => %s::jsonb)", (json.dumps(options),)))
    assert pg_conn.execute("SELECT to_regclass('public.bigr_sabre')").fetchone() == (None,)


# ------------------------------------------------------------------ the largest hierarchy

def largest_hierarchy() -> str:
    """A hierarchy at the caps of sabre_pg.core.limits: 100,000 leaves on 5 columns (500,000
    labels, about 3.5 MB), each level grouping its children ten by ten."""
    from sabre_pg.core import limits
    n, height = limits.HIERARCHY_LEAVES, limits.HIERARCHY_CELLS // limits.HIERARCHY_LEAVES - 1
    rows = ["leaf%06d;%s*" % (i, "".join("g%d_%d;" % (j, i // 10 ** j) for j in range(1, height)))
            for i in range(n)]
    text = "\n".join(rows) + "\n"
    assert len(text.encode()) <= limits.HIERARCHY_TEXT_BYTES
    return text


def test_defining_and_using_the_largest_hierarchy_ends_at_statement_timeout(pg_conn):
    text = largest_hierarchy()
    # defining it: within the bound, finished or cancelled (on 0.2.0 its rows were cut from
    # one array by slices, quadratic: minutes)
    pg_conn.execute("SET statement_timeout = '1s'")
    started = time.monotonic()
    try:
        pg_conn.execute("SELECT * FROM sabre_define_hierarchy('big_h', %s)", (text,))
    except psycopg.Error as e:
        assert e.sqlstate == "57014", (e.sqlstate, str(e))
    assert time.monotonic() - started < BOUND
    pg_conn.execute("RESET statement_timeout")
    pg_conn.execute("SELECT * FROM sabre_define_hierarchy('big_h', %s)", (text,))
    assert pg_conn.execute("SELECT leaves, height FROM sabre.hierarchies WHERE name = 'big_h'").fetchone() == (
        100_000, 4)
    # a run over it: loading and building the hierarchy alone takes seconds
    pg_conn.execute("CREATE TABLE big (id int PRIMARY KEY, code text, age int, v int)")
    pg_conn.execute("INSERT INTO big SELECT i, 'leaf' || lpad((i * 7919 % 100000)::text, 6, '0'), 20 + i % 50, "
                    "i % 13 FROM generate_series(1, 200000) AS i")
    cancelled_within(pg_conn, lambda c: c.execute(
        "SELECT * FROM sabre_anonymize('public.big'::regclass, ARRAY['code', 'age'], 'v', 0.2, 5, "
        "options => '{\"hierarchies\": {\"code\": \"big_h\"}}')"))
    assert pg_conn.execute("SELECT to_regclass('public.big_sabre')").fetchone() == (None,)
