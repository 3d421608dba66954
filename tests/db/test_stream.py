"""SABRE_W in the database (docs/streams.md): the SQL contract, the three cases, every row
published exactly once across advances and calls, crash and cancel mid-advance, bad input,
owner-only state, and a real pg_cron job."""
from __future__ import annotations

import threading
import time

import psycopg
import pytest
from psycopg import sql

from tests.db.helpers import anonymize, expect_error, scalar

SOURCE = "admissions"


def make_source(conn, rows=0, table=SOURCE, seed=0.5, shift_at=None):
    conn.execute(sql.SQL(
        "CREATE TABLE {} (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, age int NOT NULL, "
        "sex text NOT NULL, zip int NOT NULL, diagnosis int NOT NULL)").format(sql.Identifier(table)))
    conn.execute("SELECT setseed(%s)", (seed,))
    if rows:
        add_rows(conn, rows, table, shift_at=shift_at)


def add_rows(conn, rows, table=SOURCE, shift_at=None):
    """``rows`` new rows; diagnosis 95% in {0, 1}, 5% in {8, 9}; with ``shift_at`` the other way
    round after that many rows of the table."""
    start = scalar(conn, sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table)))
    conn.execute(sql.SQL(
        "INSERT INTO {} (age, sex, zip, diagnosis) SELECT 17 + (random() * 70)::int, "
        "CASE WHEN random() < 0.5 THEN 'F' ELSE 'M' END, (random() * 99)::int, "
        "CASE WHEN %s::bigint IS NOT NULL AND %s::bigint + g > %s::bigint "
        "THEN (CASE WHEN random() < 0.95 THEN 8 + random()::int ELSE random()::int END) "
        "ELSE (CASE WHEN random() < 0.95 THEN random()::int ELSE 8 + random()::int END) END "
        "FROM generate_series(1, %s) g").format(sql.Identifier(table)),
        (shift_at, start, shift_at, rows))


def create(conn, name="adm_w", window_size=400, step=100, t=0.3, k=4, output=None, options="{}",
           source=SOURCE, arrival="id", qis=("age", "sex", "zip"), sensitive="diagnosis", method="refine"):
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
    logged = scalar(pg_conn, "SELECT count(*) FROM admissions_sabre_w_log")
    assert logged == 7


def test_internal_statements_send_the_client_no_notice(pg_conn, pg_connect):
    """Stream create, advances (in several calls, and from a session whose window table is another
    session's), refresh, drop, and an anonymize rerun send no NOTICE: the internal
    ``DROP ... IF EXISTS`` once said 'table "sabre_w_k" does not exist, skipping' per advance."""
    notices = []
    pg_conn.add_notice_handler(lambda d: notices.append((d.severity_nonlocalized, d.message_primary)))
    make_source(pg_conn, 330, seed=0.25)
    create(pg_conn, name="quiet_w", window_size=240, step=60, method="knn")
    advance(pg_conn, "quiet_w", max_advances=1)
    add_rows(pg_conn, 200)
    assert len(advance(pg_conn, "quiet_w")) >= 2
    other = pg_connect()
    other.add_notice_handler(lambda d: notices.append((d.severity_nonlocalized, d.message_primary)))
    add_rows(other, 120)
    assert advance(other, "quiet_w")                         # rebuilds its own window table
    add_rows(pg_conn, 60)
    assert advance(pg_conn, "quiet_w")                       # and back in the first session
    for _ in range(2):                                       # the second run replaces the first
        anonymize(pg_conn, SOURCE, ["age", "zip"], "diagnosis", 0.4, 3, "ak", "quiet_anon")
    assert scalar(pg_conn, "SELECT sabre_stream_drop('quiet_w', purge => true)")
    assert notices == [], notices


def test_shifting_sa_goes_through_the_three_cases(pg_conn):
    """The diagnosis shifts from mostly low to mostly high values: unpublished rows of a window
    then differ from the window (Case 3, INDIRECT), and S_G's classes cover the next windows'
    expiring rows (Case 1); every class stays within t of its generating window."""
    make_source(pg_conn, 1600, shift_at=700)
    create(pg_conn, window_size=800, step=100, t=0.05, k=4)
    # the paper's cases, where D decides between DIRECT and INDIRECT: engines 'refine' and 'sabre'
    # (the default 'window' engine's case 3: tests/db/test_stream_window.py)
    pg_conn.execute("UPDATE sabre.streams SET engine = 'refine' WHERE name = 'adm_w'")
    rows = advance(pg_conn)
    cases = [r["case_no"] for r in rows]
    assert len(rows) == 8 and cases[0] == 2
    assert 3 in cases and 1 in cases, cases
    assert all(r["d"] >= 0.05 for r in rows if r["case_no"] == 3)
    assert all(r["d"] < 0.05 for r in rows if r["case_no"] == 2)
    assert all(r["rows"] == 0 and r["d"] is None for r in rows if r["case_no"] == 1)
    first_indirect = cases.index(3)
    assert 2 in cases[:first_indirect]                      # Lemma 4: a DIRECT came before
    assert all(not (a == 3 and b == 3) for a, b in zip(cases, cases[1:]))     # Lemma 3
    # an INDIRECT publishes classes generated from an earlier window (the last DIRECT's)
    indirect = rows[first_indirect]["advance_no"]
    windows = pg_conn.execute("SELECT DISTINCT window_first FROM admissions_sabre_w WHERE advance_no = %s",
                              (indirect,)).fetchall()
    assert windows and all(w[0] < (indirect - 1) * 100 + 1 for w in windows)
    assert_clean(verify(pg_conn), 800)


@pytest.mark.parametrize("stop, sqlstate", [("pg_cancel_backend", "57014"), ("pg_terminate_backend", "57P01")],
                         ids=["cancel", "killed backend"])
def test_cancel_mid_advance_leaves_the_previous_state(pg_conn, pg_connect, stop, sqlstate):
    """An advance blocked on the output (another session locks it) is cancelled, or its
    backend is killed mid-transaction (a crash of that process): nothing of it remains; the
    next call resumes and publishes every expired row exactly once."""
    make_source(pg_conn, 700)
    create(pg_conn)
    assert len(advance(pg_conn, max_advances=1)) == 1
    before = (status(pg_conn), scalar(pg_conn, "SELECT count(*) FROM admissions_sabre_w"),
              scalar(pg_conn, "SELECT ahead::text || sg_rows::text FROM admissions_sabre_w_state"))
    blocker = pg_connect(autocommit=False)
    blocker.execute("LOCK TABLE admissions_sabre_w IN ACCESS EXCLUSIVE MODE")
    worker = pg_connect()
    pid = worker.info.backend_pid
    errors = []

    def run():
        try:
            advance(worker)
        except psycopg.Error as e:
            errors.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    for _ in range(200):                                     # wait until it waits for the lock
        if scalar(pg_conn, "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (pid,)):
            break
        time.sleep(0.05)
    assert scalar(pg_conn, "SELECT pg_catalog.%s(%%s)" % stop, (pid,))
    thread.join(30)
    blocker.rollback()
    assert len(errors) == 1 and errors[0].sqlstate == sqlstate, errors
    after = (status(pg_conn), scalar(pg_conn, "SELECT count(*) FROM admissions_sabre_w"),
             scalar(pg_conn, "SELECT ahead::text || sg_rows::text FROM admissions_sabre_w_state"))
    assert after[1:] == before[1:] and after[0]["advances"] == before[0]["advances"] == 1
    assert after[0]["numbered"] == before[0]["numbered"]
    assert [r["advance_no"] for r in advance(pg_conn)] == [2, 3]
    assert_clean(verify(pg_conn), 300)


def test_concurrent_advances_serialize(pg_conn, pg_connect):
    """A second advance waits for the first's transaction and then sees its state: each
    advance happens once."""
    make_source(pg_conn, 800)
    create(pg_conn)
    first = pg_connect(autocommit=False)
    got_first = advance(first, max_advances=2)
    results = []
    second = pg_connect()
    thread = threading.Thread(target=lambda: results.append(advance(second)))
    thread.start()
    time.sleep(0.5)
    assert thread.is_alive()                                 # waiting for the stream's lock
    first.commit()
    thread.join(60)
    assert [r["advance_no"] for r in got_first] == [1, 2]
    assert [r["advance_no"] for r in results[0]] == [3, 4]
    assert_clean(verify(pg_conn), 400)


def test_window_table_after_rollback_and_other_sessions(pg_conn, pg_connect):
    """A session's window table is trusted only as its last committed advance left it: after
    a rolled-back advance, and after another session's advances, the next advance reads the
    window's rows afresh and publishes every expired row exactly once."""
    make_source(pg_conn, 1100)
    create(pg_conn)
    mine, other = pg_connect(autocommit=False), pg_connect()
    assert [r["advance_no"] for r in advance(mine, max_advances=2)] == [1, 2]
    mine.commit()
    assert [r["advance_no"] for r in advance(mine, max_advances=2)] == [3, 4]
    mine.rollback()                                          # its window table rolls back too
    assert [r["advance_no"] for r in advance(other, max_advances=2)] == [3, 4]
    assert [r["advance_no"] for r in advance(mine)] == [5, 6, 7]
    mine.commit()
    assert_clean(verify(pg_conn), 700)


def test_verify_reports_updates_deletes_and_late_rows(pg_conn):
    pg_conn.execute("CREATE TABLE claims (id int PRIMARY KEY, arrived_at timestamptz NOT NULL, age int NOT NULL, "
                    "zip int NOT NULL, amount int NOT NULL)")
    pg_conn.execute("INSERT INTO claims SELECT g, timestamptz '2026-01-01' + g * interval '1 minute', "
                    "20 + g % 50, g % 17, (g * 7919) % 13 FROM generate_series(1, 600) g")
    create(pg_conn, name="claims_w", source="claims", arrival="arrived_at", qis=("age", "zip"),
           sensitive="amount", window_size=200, step=100, t=0.3, k=3)
    assert len(advance(pg_conn, "claims_w")) == 4             # windows 1..200 .. 301..500
    assert_clean(verify(pg_conn, "claims_w"), 400)
    # a row arriving late but within the current window (501..700) joins the next step; one
    # older than the window's first row is never published and reported as late
    pg_conn.execute("INSERT INTO claims VALUES (1001, timestamptz '2026-01-01' + interval '450 minutes', 30, 1, 5), "
                    "(1002, timestamptz '2026-01-01' + interval '10 minutes', 30, 1, 5)")
    assert advance(pg_conn, "claims_w") == [] and status(pg_conn, "claims_w")["numbered"] == 601
    assert scalar(pg_conn, "SELECT row_no FROM claims_sabre_w_rows WHERE key = '1001'") == 601
    v = verify(pg_conn, "claims_w")
    assert v["late"] == 1 and v["violations"] == 0
    published = pg_conn.execute("SELECT key FROM claims_sabre_w_keys ORDER BY row_no LIMIT 2").fetchall()
    pg_conn.execute("UPDATE claims SET amount = amount + 1 WHERE id = %s", (published[0][0],))
    pg_conn.execute("DELETE FROM claims WHERE id = %s", (published[1][0],))
    v = verify(pg_conn, "claims_w")
    assert v["updated"] == 1 and v["deleted"] == 1


def test_numbering_new_late_and_moved_rows(pg_conn):
    """Set-based numbering: new rows in (arrival, key) order, a late row from the window's first
    arrival on joins them, an older one is left out; a published row whose arrival is moved
    past the horizon (outside the recorded-arrival range the anti-join reads) is refused by the
    unique numbering and never numbered twice."""
    pg_conn.execute("CREATE TABLE events (id int PRIMARY KEY, seq bigint NOT NULL, age int NOT NULL, "
                    "zip int NOT NULL, amount int NOT NULL)")
    pg_conn.execute("INSERT INTO events SELECT g, g * 10, 20 + g % 50, g % 17, (g * 7919) % 13 "
                    "FROM generate_series(1, 300) g")
    create(pg_conn, name="ev_w", source="events", arrival="seq", qis=("age", "zip"), sensitive="amount",
           window_size=200, step=100, t=0.3, k=3)
    assert len(advance(pg_conn, "ev_w")) == 1                # W1 = 1..200; next W2 = 101..300 (seq 1010..)
    pg_conn.execute("INSERT INTO events VALUES (1001, 1505, 30, 1, 5), (1002, 5, 30, 1, 5)")
    pg_conn.execute("INSERT INTO events SELECT g, g * 10, 20 + g % 50, g % 17, (g * 7919) % 13 "
                    "FROM generate_series(301, 398) g")
    pg_conn.execute("UPDATE events SET seq = 9999 WHERE id = 50")  # published in W1, moved past the horizon
    assert advance(pg_conn, "ev_w") == []
    rows = dict(pg_conn.execute("SELECT r.key, r.row_no FROM events_sabre_w_rows r").fetchall())
    assert len(rows) == 399 and rows["50"] == 50 and rows["1001"] == 301 and "1002" not in rows
    assert [rows[str(i)] for i in (301, 302, 398)] == [302, 303, 399]
    pg_conn.execute("INSERT INTO events VALUES (399, 3990, 40, 2, 7)")
    assert [r["advance_no"] for r in advance(pg_conn, "ev_w")] == [2]
    v = verify(pg_conn, "ev_w")
    assert v["late"] == 1 and v["published_twice"] == 0 and v["violations"] == 0 and v["expired_unpublished"] == 0


def test_row_deleted_after_entering_the_window_is_not_published(pg_conn):
    """The session keeps the window's rows between advances; a row deleted from the source
    after it entered the window fails the advance that would publish it (55000), and nothing
    of that advance remains."""
    make_source(pg_conn, 700)
    create(pg_conn, window_size=400, step=100, k=4, t=0.15, method="ak")   # leaves rows of 301..400 pending
    assert len(advance(pg_conn)) == 3                      # W3 = 201..600 held by this session
    victim = pg_conn.execute("SELECT r.key FROM admissions_sabre_w_rows r WHERE r.row_no BETWEEN 301 AND 400 AND NOT "
                             "EXISTS (SELECT FROM admissions_sabre_w_keys k WHERE k.row_no = r.row_no)").fetchone()
    assert victim is not None                              # rows 301..400 expire at advance 4
    victim = victim[0]
    pg_conn.execute("DELETE FROM admissions WHERE id = %s", (int(victim),))
    add_rows(pg_conn, 100)
    before = scalar(pg_conn, "SELECT count(*) FROM admissions_sabre_w_keys")
    expect_error(pg_conn, lambda c: advance(c), "55000", "deleted from the source", source=SOURCE)
    assert scalar(pg_conn, "SELECT count(*) FROM admissions_sabre_w_keys") == before
    assert status(pg_conn)["advances"] == 3


BAD = [
    (dict(window_size=450, step=100), "22023", "not a multiple"),
    (dict(step=2, k=4, window_size=400), "22023", "smaller than k"),
    (dict(t=1.5), "22023", "t must"),
    (dict(k=0), "22023", "k must"),
    (dict(arrival="nope"), "42703", "arrival column"),
    (dict(arrival="sex"), "42804", "arrival order"),
    (dict(arrival="seen"), "22004", "nullable"),
    (dict(options='{"replace": true}'), "22023", "does not apply to streams"),
    (dict(qis=("age", "nope")), "42703", "nope"),
    (dict(method="tmondrian"), "22023", "unknown method"),
]


@pytest.mark.parametrize("args, sqlstate, message", BAD, ids=[b[2] for b in BAD])
def test_bad_input(pg_conn, args, sqlstate, message):
    make_source(pg_conn, 50)
    pg_conn.execute("ALTER TABLE admissions ADD COLUMN seen bigint")
    streams = scalar(pg_conn, "SELECT count(*) FROM sabre.streams")
    expect_error(pg_conn, lambda c: create(c, **args), sqlstate, message, source=SOURCE)
    assert scalar(pg_conn, "SELECT count(*) FROM sabre.streams") == streams


def test_name_in_use_unknown_stream_and_schedule_without_pg_cron(pg_conn):
    make_source(pg_conn, 50)
    create(pg_conn)
    expect_error(pg_conn, lambda c: create(c, output="other"), "42710", "already exists", source=SOURCE)
    expect_error(pg_conn, lambda c: advance(c, "nope"), "42704", "does not exist", source=SOURCE)
    e = expect_error(pg_conn, lambda c: c.execute("SELECT sabre_stream_schedule('adm_w', '* * * * *')"),
                     "55000", "pg_cron is not installed", source=SOURCE)
    assert "postgresql-15-cron" in e.diag.message_hint and "shared_preload_libraries" in e.diag.message_hint
    assert not scalar(pg_conn, "SELECT sabre_stream_unschedule('adm_w')")


def test_state_and_keys_are_owner_only(pg_conn, pg_connect):
    pg_conn.execute("CREATE ROLE stream_analyst LOGIN")
    pg_conn.execute("GRANT USAGE ON SCHEMA sabre TO stream_analyst")
    pg_conn.execute("GRANT CREATE ON SCHEMA public TO stream_analyst")
    pg_conn.execute("ALTER DEFAULT PRIVILEGES FOR ROLE stream_analyst GRANT SELECT ON TABLES TO PUBLIC")
    analyst = pg_connect(user="stream_analyst")
    analyst.execute("SET search_path = public, sabre")
    make_source(analyst, 600, table="visits")
    create(analyst, name="mine", source="visits")
    assert len(advance(analyst, "mine")) == 2
    make_source(pg_conn, 50)
    create(pg_conn)                                          # the superuser's stream
    assert [r[0] for r in analyst.execute("SELECT name FROM sabre.streams").fetchall()] == ["mine"]
    for suffix in ("_state", "_rows", "_log", "_keys"):                  # the superuser's state
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            analyst.execute("SELECT 1 FROM public.admissions_sabre_w%s" % suffix)
    with pytest.raises(psycopg.Error) as ei:
        advance(analyst, "adm_w")
    assert ei.value.sqlstate == "42704"
    # the output is readable as default privileges say; the keys table is for its owner only
    acl = dict(pg_conn.execute("SELECT relname, relacl::text FROM pg_class WHERE relname LIKE 'visits_sabre_w%%' "
                               "AND relkind = 'r'").fetchall())
    assert "=r/" in acl["visits_sabre_w"] and (acl["visits_sabre_w_keys"] or "").count("=") <= 1
    # another role cannot forge the analyst's state through the tables either
    pg_conn.execute("CREATE ROLE stream_other LOGIN")
    pg_conn.execute("GRANT USAGE ON SCHEMA sabre TO stream_other")
    other = pg_connect(user="stream_other")
    for statement in ("UPDATE public.visits_sabre_w_rows SET key = 'x'", "UPDATE public.visits_sabre_w_state "
                      "SET ahead = '{}'", "DELETE FROM sabre.streams", "UPDATE sabre.streams SET t = 1"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            other.execute(statement)
    assert scalar(other, "SELECT count(*) FROM sabre.streams") == 0


def test_drop_keeps_or_purges_the_output(pg_conn):
    make_source(pg_conn, 600)
    create(pg_conn)
    advance(pg_conn)
    assert scalar(pg_conn, "SELECT sabre_stream_drop('adm_w')")
    assert scalar(pg_conn, "SELECT count(*) FROM admissions_sabre_w") > 0
    assert scalar(pg_conn, "SELECT count(*) FROM sabre.streams") == 0
    assert scalar(pg_conn, "SELECT to_regclass('admissions_sabre_w_rows')") is None
    create(pg_conn, name="again", output="again_w")
    pg_conn.execute("CREATE VIEW again_v AS SELECT * FROM again_w")
    expect_error(pg_conn, lambda c: c.execute("SELECT sabre_stream_drop('again', purge => true)"), "2BP01",
                 "depend", source=SOURCE)
    pg_conn.execute("DROP VIEW again_v")
    assert scalar(pg_conn, "SELECT sabre_stream_drop('again', purge => true)")
    assert scalar(pg_conn, "SELECT to_regclass('again_w_keys')") is None


def test_refresh_reruns_the_recorded_call(pg_conn):
    make_source(pg_conn, 300)
    pg_conn.execute("SELECT * FROM sabre_anonymize('admissions'::regclass, ARRAY['age','zip'], 'diagnosis', 0.3, 3)")
    add_rows(pg_conn, 100)
    row = pg_conn.execute("SELECT rows FROM sabre_refresh('public.admissions_sabre')").fetchone()
    assert row[0] == 400 and scalar(pg_conn, "SELECT count(*) FROM admissions_sabre") == 400
    expect_error(pg_conn, lambda c: c.execute("SELECT sabre_schedule_refresh('admissions_sabre', '0 * * * *')"),
                 "55000", "pg_cron", source=SOURCE)
    expect_error(pg_conn, lambda c: c.execute("SELECT sabre_schedule_refresh('admissions', '0 * * * *')"),
                 "42704", "not the output", source=SOURCE)


def test_pg_cron_job_advances_the_stream(sabre_cluster):
    """A real pg_cron job (pg_cron 1.4 schedules by the minute) in the cluster's cron database."""
    from sabre_pg import installer
    with psycopg.connect(sabre_cluster.dsn(sabre_cluster.dbname), autocommit=True) as conn:
        if not scalar(conn, "SELECT current_setting('cron.database_name', true) = current_database()"):
            pytest.skip("pg_cron is not installed (Debian: postgresql-15-cron)")
        installer.install(conn, "sabre")
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_cron")
        conn.execute("SET search_path = public, sabre")
        conn.execute("DROP TABLE IF EXISTS admissions, admissions_sabre_w, admissions_sabre_w_classes, "
                     "admissions_sabre_w_keys, admissions_sabre_w_state, admissions_sabre_w_rows, admissions_sabre_w_log")
        conn.execute("DELETE FROM sabre.streams")
        make_source(conn, 600)
        create(conn)
        job = scalar(conn, "SELECT sabre_stream_schedule('adm_w', '* * * * *')")
        assert scalar(conn, "SELECT command FROM cron.job WHERE jobid = %s", (job,)).startswith(
            'SELECT * FROM "sabre"."sabre_stream_advance"(')
        try:
            deadline = time.monotonic() + 75
            while time.monotonic() < deadline and status(conn)["advances"] == 0:
                time.sleep(2)
            st = status(conn)
            assert st["advances"] == 2 and st["cron_job"] == job, st
        finally:
            assert scalar(conn, "SELECT sabre_stream_unschedule('adm_w')")
        assert scalar(conn, "SELECT count(*) FROM cron.job WHERE jobid = %s", (job,)) == 0
        assert_clean(verify(conn), 200)
        conn.execute("SELECT sabre_stream_drop('adm_w', purge => true)")
        conn.execute("DROP TABLE admissions")


def test_knn_categorical_sa_with_hierarchy_and_kept_column(pg_conn):
    """SABRE-KNN, a text SA under a named hierarchy (hierarchical EMD), options.keep (the
    output joined from the source): the same guarantees."""
    pg_conn.execute("SELECT * FROM sabre_define_hierarchy('dx_h', $$a1;a;*\na2;a;*\nb1;b;*\nb2;b;*$$)")
    pg_conn.execute("CREATE TABLE visits (id int PRIMARY KEY, age int NOT NULL, zip int NOT NULL, dx text NOT NULL, "
                    "note text)")
    pg_conn.execute("INSERT INTO visits SELECT g, 20 + g % 53, g % 31, (ARRAY['a1','a2','b1','b2'])[1 + (g * 7) % 4], "
                    "'n' || g FROM generate_series(1, 600) g")
    create(pg_conn, name="v_w", source="visits", qis=("age", "zip"), sensitive="dx", method="knn", window_size=200,
           step=100, t=0.2, k=3, options='{"hierarchies": {"dx": "dx_h"}, "keep": ["note"]}')
    assert len(advance(pg_conn, "v_w")) == 4
    assert columns(pg_conn, "visits_sabre_w")[-6:] == ["dx", "note", "advance_no", "window_first", "window_last",
                                                        "published_at"]
    assert scalar(pg_conn, "SELECT count(*) FROM visits_sabre_w o JOIN visits_sabre_w_keys k USING (ec_id) "
                           "JOIN visits v ON v.id = k.key WHERE v.note = o.note") > 0
    assert_clean(verify(pg_conn, "v_w"), 400)
