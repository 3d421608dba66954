"""Adversarial tests of streams (issue #25, finding 3 and the stream part of finding 6).

Stream state must be private per role: no role reads, writes, probes or locks another role's
stream state, directly or through a constraint, a superuser's streams included, and
``sabre_stream_verify`` reports rows that were numbered but never published.  The roles are
those of ``tests/db/test_security.py``: the DBA (superuser), analysts ``sec_mallory`` (the
attacker, with CREATE on ``public``), ``sec_alice`` and ``sec_bob``, and ``sec_owner``, a
LOGIN role with no sabre rights.  Every plant here is tried against both layouts an attacker
may meet: the 0.2 one (central tables ``sabre.streams``, ``stream_rows``, ``stream_advances``
with DML for PUBLIC) and the current one (a registry plus relations the owner owns); a plant
the server refuses is simply skipped, what matters is what the victim sees afterwards.
"""
from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import psycopg
import pytest

from tests.db.helpers import scalar
from tests.db.test_security import roles  # noqa: F401  (the fixture)
from tests.db.test_stream import add_rows, advance, assert_clean, create, make_source, status, verify

OLD_COMMIT = "1b03906"      # 0.2.0: the shared stream tables


def attempt(conn, statement, params=None):
    """Run one statement; (sqlstate or 'ok', rowcount): a refused plant is skipped."""
    try:
        cur = conn.execute(statement, params)
        return "ok", cur.rowcount
    except psycopg.Error as e:
        return e.sqlstate, None


def attempt_locked(conn, statement):
    """``attempt`` inside a transaction (LOCK needs one), rolled back."""
    try:
        with conn.transaction():
            conn.execute(statement)
            raise _Rollback()
    except _Rollback:
        return "ok", None
    except psycopg.Error as e:
        return e.sqlstate, None


class _Rollback(Exception):
    pass


def stream_id(dba, name):
    """The stream id the catalog gives ``name`` (read as the DBA: what an attacker guesses)."""
    return scalar(dba, "SELECT stream_id FROM sabre.streams WHERE name = %s", (name,))


def alice_stream(alice, rows=600):
    """alice's stream 'visits_w' over alice.visits (output alice.visits_sabre_w), advanced."""
    alice.execute("SET search_path = alice, sabre")
    make_source(alice, rows, table="visits")
    create(alice, name="visits_w", source="visits")
    return advance(alice, "visits_w")


def plant_everywhere(mallory, ids, keys, name, row_base=0):
    """mallory's plants under guessed stream ids: numbered rows with keys of rows still to
    arrive, advances ahead of the victim's, squatted stream rows under the victim's name."""
    for i in ids:
        attempt(mallory, "INSERT INTO sabre.stream_rows (stream_id, row_no, key) SELECT %s, "
                "%s + g, k::text FROM unnest(%s::bigint[]) WITH ORDINALITY AS u(k, g)", (i, row_base, keys))
        attempt(mallory, "INSERT INTO sabre.stream_advances (stream_id, advance_no, case_no, rows, classes, "
                "window_first, window_last, seconds) SELECT %s, g, 1, 0, 0, 1, 1, 0 FROM generate_series(1, 30) g",
                (i,))
        attempt(mallory, "INSERT INTO sabre.streams (stream_id, name, source, source_oid, arrival, key, "
                "quasi_identifiers, sensitive, t, k, window_size, step, method, options, output_schema, "
                "output_name, relation_oids, identity) VALUES (%s, %s, 'x', 0, 'id', 'id', '{age}', 'd', 1, 1, "
                "2, 1, 'ak', '{}', 'mallory', 'x', '{}', 'x')", (i, name))
        for owner in ("(SELECT oid FROM pg_roles WHERE rolname = current_user)", "10",
                      "(SELECT oid FROM pg_roles WHERE rolname = 'sec_alice')"):
            attempt(mallory, "INSERT INTO sabre.streams (stream_id, name, owner, source, source_oid, arrival, key, "
                    "quasi_identifiers, sensitive, t, k, window_size, step, method, options, output_schema, "
                    "output_name, relation_oids, state_oids, identity) VALUES (%%s, %%s, %s, 'x', 0, 'id', 'id', "
                    "'{age}', 'd', 1, 1, 2, 1, 'ak', '{}', 'mallory', 'x', '{}', ARRAY[%%s, %%s, %%s]::oid[], 'x')"
                    % owner, (i, name, i, i + 1, i + 2))


# ------------------------------------------------------------------ planted state, squatted ids
def test_plants_under_guessed_ids_do_not_break_another_analysts_stream(roles):
    """mallory plants numbered rows (the keys of alice's rows still to arrive) and advances
    ahead of alice's under a spread of guessed stream ids, and registry rows claiming alice's
    stream; alice's later advances still succeed, every row is numbered and published once,
    and bob can still create streams."""
    dba, alice, mallory, bob = roles["dba"], roles["sec_alice"], roles["sec_mallory"], roles["sec_bob"]
    assert [r["advance_no"] for r in alice_stream(alice)] == [1, 2]
    victim = stream_id(dba, "visits_w")
    guessed = sorted({victim, *range(1, 40), *range(victim, victim + 40)})
    plant_everywhere(mallory, guessed, list(range(601, 1001)), "visits_w", row_base=600)
    plant_everywhere(mallory, guessed, list(range(601, 1001)), "bobs_w", row_base=10_000)
    add_rows(alice, 400, table="visits")
    assert [r["advance_no"] for r in advance(alice, "visits_w")] == [3, 4, 5, 6]
    st = status(alice, "visits_w")
    assert st["numbered"] == 1000 and st["advances"] == 6
    assert_clean(verify(alice, "visits_w"), 600)
    assert scalar(alice, "SELECT count(*) FROM alice.visits_sabre_w_keys") == \
        scalar(alice, "SELECT count(DISTINCT key) FROM alice.visits_sabre_w_keys")
    # squatted ids do not stop another role's stream
    bob.execute("SET search_path = bob, sabre")
    make_source(bob, 300, table="visits")
    assert create(bob, name="bobs_w", source="visits")["stream"] == "bobs_w"
    assert len(advance(bob, "bobs_w")) == 0 and status(bob, "bobs_w")["numbered"] == 300
    assert [r[0] for r in alice.execute("SELECT name FROM sabre.streams").fetchall()] == ["visits_w"]
    # mallory's own registry rows are all she sees, and they name no stream of hers
    assert scalar(mallory, "SELECT count(*) FROM sabre.streams WHERE owner <> "
                           "(SELECT oid FROM pg_roles WHERE rolname = current_user)") == 0
    assert attempt(mallory, "SELECT * FROM sabre_stream_status('visits_w')")[0] == "42704"


def test_superuser_stream_cannot_be_tampered_with(roles):
    """The DBA's stream (row-level security does not apply to a superuser): mallory numbers
    the keys of the DBA's future rows far ahead under every plausible stream id and claims the
    stream in the registry.  Every row the DBA's source receives is still numbered and
    published exactly once, and verify is clean."""
    dba, mallory = roles["dba"], roles["sec_mallory"]
    dba.execute("CREATE SCHEMA dba_w")
    dba.execute("SET search_path = dba_w, sabre")
    make_source(dba, 500, table="intake")
    create(dba, name="intake_w", source="intake", window_size=200, step=100)
    assert len(advance(dba, "intake_w")) == 3
    victim = stream_id(dba, "intake_w")
    guessed = sorted({victim, *range(1, 60), *range(victim, victim + 10)})
    plant_everywhere(mallory, guessed, list(range(501, 801)), "intake_w", row_base=1_000_000)
    add_rows(dba, 300, table="intake")
    assert [r["advance_no"] for r in advance(dba, "intake_w")] == [4, 5, 6]
    assert status(dba, "intake_w")["numbered"] == 800
    # every expired row (1..600) is published, by key
    assert scalar(dba, "SELECT count(*) FROM dba_w.intake WHERE id <= 600 AND id NOT IN "
                       "(SELECT key FROM dba_w.intake_sabre_w_keys)") == 0
    assert_clean(verify(dba, "intake_w"), 600)
    dba.execute("SET search_path = public, sabre")


# ------------------------------------------------------------------ oracles
PROBES = [
    # (statement, params from (stream id, key, name))
    ("INSERT INTO sabre.stream_rows (stream_id, row_no, key) VALUES (%s, 9999999, %s) ON CONFLICT DO NOTHING",
     lambda i, k, n: (i, k)),
    ("INSERT INTO sabre.stream_advances (stream_id, advance_no, case_no, rows, classes, window_first, window_last, "
     "seconds) VALUES (%s, 777, 1, 0, 0, 1, 1, 0)", lambda i, k, n: (i,)),
    ("INSERT INTO sabre.streams (stream_id, name, source, source_oid, arrival, key, quasi_identifiers, sensitive, t, "
     "k, window_size, step, method, options, output_schema, output_name, relation_oids, identity) VALUES (%s, %s, "
     "'x', 0, 'id', 'id', '{a}', 'd', 1, 1, 2, 1, 'ak', '{}', 'm', 'x', '{}', 'x') "
     "ON CONFLICT (stream_id) DO UPDATE SET t = 1", lambda i, k, n: (i, n)),
    ("INSERT INTO sabre.streams (stream_id, name, owner, source, source_oid, arrival, key, quasi_identifiers, "
     "sensitive, t, k, window_size, step, method, options, output_schema, output_name, relation_oids, state_oids, "
     "identity) VALUES (%s, %s, (SELECT oid FROM pg_roles WHERE rolname = current_user), 'x', 0, 'id', 'id', '{a}', "
     "'d', 1, 1, 2, 1, 'ak', '{}', 'm', 'x', '{}', ARRAY[%s::oid], 'x')", lambda i, k, n: (i, n, i)),
    ("SELECT count(*) FROM sabre.streams WHERE stream_id = %s OR name = %s", lambda i, k, n: (i, n)),
    ("SELECT sabre.stream_forget(%s)", lambda i, k, n: (i,)),
    ("SELECT * FROM sabre_stream_status(%s)", lambda i, k, n: (n,)),
    ("SELECT * FROM sabre_stream_verify(%s)", lambda i, k, n: (n,)),
    ("SELECT sabre_stream_drop(%s)", lambda i, k, n: (n,)),
    ("SELECT sabre_stream_unschedule(%s)", lambda i, k, n: (n,)),
]


def test_no_probe_tells_another_roles_stream_from_nothing(roles):
    """mallory probes with ON CONFLICT, foreign keys and sabre's own functions, once with
    alice's stream id, a key alice has numbered and her stream's name, once with values no
    stream has: every probe ends the same way (SQLSTATE and row count) both times."""
    dba, alice, mallory = roles["dba"], roles["sec_alice"], roles["sec_mallory"]
    alice_stream(alice)
    present = (stream_id(dba, "visits_w"), "17", "visits_w")
    absent = (987654321, "100017", "no_such_w")
    for statement, params in PROBES:
        seen = [attempt(mallory, statement, params(*values)) for values in (absent, present)]
        assert seen[0] == seen[1], (statement, seen)
    # and alice's stream still advances and verifies clean
    add_rows(alice, 100, table="visits")
    assert [r["advance_no"] for r in advance(alice, "visits_w")] == [3]
    assert_clean(verify(alice, "visits_w"), 300)


# ------------------------------------------------------------------ locks (finding 6)
def test_locks_any_role_can_take_do_not_block_advances(roles, pg_connect):
    """A LOGIN role with no sabre rights holds advisory locks over a wide spread of keys
    (both key forms), and mallory, an analyst, holds them too and locks every sabre table
    she may name; alice's advances still run (lock_timeout = 2s), and two sessions of alice
    still serialize on her stream."""
    dba, alice, mallory, nobody = roles["dba"], roles["sec_alice"], roles["sec_mallory"], roles["sec_owner"]
    alice_stream(alice, rows=500)
    victim = stream_id(dba, "visits_w")
    holders = []
    for conn, spread in ((nobody, range(0, 400)), (mallory, range(victim - 20, victim + 100))):
        holder = pg_connect(user=conn.info.user, autocommit=False)
        holder.execute("SELECT pg_try_advisory_lock(x, y) FROM unnest(ARRAY[x'5AB2F'::int, x'5AB2E'::int]) x, "
                       "unnest(%s::int[]) y", (list(spread),))
        holder.execute("SELECT pg_try_advisory_lock(y::bigint) FROM unnest(%s::int[]) y", (list(spread)[:100],))
        holders.append(holder)
    locker = pg_connect(user="sec_mallory", autocommit=False)
    for table in ("streams", "stream_rows", "stream_advances", "streams_0_2"):
        locker.execute("SAVEPOINT s")
        try:
            locker.execute(f"LOCK TABLE sabre.{table} IN ACCESS EXCLUSIVE MODE NOWAIT")
        except psycopg.Error:
            locker.execute("ROLLBACK TO SAVEPOINT s")
    for statement in ("SELECT * FROM sabre.streams FOR UPDATE", "LOCK TABLE alice.visits_sabre_w_state NOWAIT"):
        locker.execute("SAVEPOINT s")
        try:
            locker.execute(statement)
        except psycopg.Error:
            locker.execute("ROLLBACK TO SAVEPOINT s")
    first = pg_connect(user="sec_alice", autocommit=False)
    try:
        add_rows(alice, 300, table="visits")
        alice.execute("SET lock_timeout = '2s'")
        first.execute("SET search_path = alice, sabre")
        first.execute("SET lock_timeout = '2s'")
        assert [r["advance_no"] for r in advance(first, "visits_w", 1)] == [2]
        # the stream's own lock: a second session of alice waits for the first
        with pytest.raises(psycopg.errors.LockNotAvailable):
            advance(alice, "visits_w")
        first.commit()
        assert [r["advance_no"] for r in advance(alice, "visits_w")] == [3, 4]
        assert_clean(verify(alice, "visits_w"), 300)
    finally:
        first.rollback()
        for conn in holders + [locker]:
            conn.rollback()
            conn.execute("SELECT pg_advisory_unlock_all()")
            conn.commit()


# ------------------------------------------------------------------ relation names taken in advance
def test_state_relation_names_taken_by_another_role_are_refused(roles):
    """mallory, who may create in public, takes the names beside the DBA's future output
    (a view running her function, tables with a trigger, all granted to PUBLIC): the DBA's
    stream refuses them (42P07) and runs nothing of hers; under another name, the stream's
    state relations are the DBA's alone."""
    dba, mallory = roles["dba"], roles["sec_mallory"]
    mallory.execute("CREATE TABLE mallory.log (who name, what text)")
    mallory.execute("GRANT INSERT ON mallory.log TO PUBLIC")
    mallory.execute("CREATE FUNCTION mallory.note() RETURNS trigger LANGUAGE plpgsql AS "
                    "$$ BEGIN INSERT INTO mallory.log VALUES (current_user, TG_TABLE_NAME); RETURN NEW; END $$")
    mallory.execute("CREATE FUNCTION mallory.seen() RETURNS bigint LANGUAGE sql AS "
                    "$$ INSERT INTO mallory.log VALUES (current_user, 'view') RETURNING 0::bigint $$")
    mallory.execute("CREATE VIEW public.adm_w_state AS SELECT mallory.seen() AS advances, 0::bigint AS numbered")
    for suffix in ("rows", "log"):
        mallory.execute(f"CREATE TABLE public.adm_w_{suffix} (row_no bigint, key text, advance_no bigint)")
        mallory.execute(f"CREATE TRIGGER t BEFORE INSERT ON public.adm_w_{suffix} FOR EACH ROW "
                        "EXECUTE FUNCTION mallory.note()")
    for rel in ("adm_w_state", "adm_w_rows", "adm_w_log"):
        mallory.execute(f"GRANT ALL ON public.{rel} TO PUBLIC")
    mallory.execute("GRANT USAGE ON SCHEMA mallory TO PUBLIC")
    mallory.execute("GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA mallory TO PUBLIC")
    make_source(dba, 700)
    with pytest.raises(psycopg.Error) as ei:
        create(dba, output="public.adm_w")
    assert ei.value.sqlstate == "42P07" and "adm_w_" in ei.value.diag.message_primary
    assert scalar(dba, "SELECT count(*) FROM sabre.streams") == 0
    create(dba, output="public.adm_w2")
    assert len(advance(dba)) == 3
    assert_clean(verify(dba), 300)
    assert scalar(dba, "SELECT count(*) FROM mallory.log") == 0
    for suffix in ("_state", "_rows", "_log"):
        for statement in (f"SELECT * FROM public.adm_w2{suffix}", f"DELETE FROM public.adm_w2{suffix}",
                          f"LOCK TABLE public.adm_w2{suffix} NOWAIT"):
            assert attempt_locked(mallory, statement)[0] == "42501", statement
    assert scalar(dba, "SELECT sabre_stream_drop('adm_w', purge => true)")
    assert scalar(dba, "SELECT count(*) FROM pg_class WHERE relname LIKE 'adm_w2%'") == 0
    assert scalar(dba, "SELECT count(*) FROM pg_class WHERE relname IN ('adm_w_state', 'adm_w_rows', 'adm_w_log')") == 3


# ------------------------------------------------------------------ verify
def test_verify_reports_rows_numbered_but_never_published(pg_conn):
    """As the stream's owner (a superuser here), alter what was published: a published row's
    key in <output>_keys replaced (its row number kept), another one deleted; then number a
    key of a row still to arrive far ahead, as the planted rows of the issue did.  verify
    reports each row numbered but never published under expired_unpublished."""
    make_source(pg_conn, 700)
    create(pg_conn)
    assert len(advance(pg_conn)) == 3
    assert_clean(verify(pg_conn), 300)
    published = [r[0] for r in pg_conn.execute(
        "SELECT row_no FROM admissions_sabre_w_keys ORDER BY row_no LIMIT 2").fetchall()]
    pg_conn.execute("UPDATE admissions_sabre_w_keys SET key = 5000000 WHERE row_no = %s", (published[0],))
    assert verify(pg_conn)["expired_unpublished"] == 1
    pg_conn.execute("DELETE FROM admissions_sabre_w_keys WHERE row_no = %s", (published[1],))
    assert verify(pg_conn)["expired_unpublished"] == 2
    # a key numbered far ahead is never numbered in order, so never published
    pg_conn.execute("INSERT INTO admissions_sabre_w_rows (row_no, key) VALUES (10000000, '750')")
    add_rows(pg_conn, 100)
    advance(pg_conn)
    v = verify(pg_conn)
    assert v["expired_unpublished"] == 3, v


# ------------------------------------------------------------------ upgrade from 0.2
def _old_tree(tmp_path) -> Path:
    """The 0.2.0 tree (git archive of OLD_COMMIT), or skip when the checkout has no history."""
    repo = Path(__file__).resolve().parents[2]
    try:
        data = subprocess.run(["git", "-C", str(repo), "archive", OLD_COMMIT], check=True,
                              capture_output=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("no git history with %s to install the 0.2 layout from" % OLD_COMMIT)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(tmp_path / "old")
    return tmp_path / "old"


def test_upgrade_moves_old_streams_to_their_owners_leaving_plants_behind(roles, pg_dsn, tmp_path):
    """A 0.2 install with alice's stream, advanced, and mallory's plants under alice's stream
    id in the shared tables; `sabre-pg upgrade` moves the stream into relations alice owns,
    copying only her rows: the next advances succeed, every row is published once, verify is
    clean, and nobody else can read the state."""
    from sabre_pg import installer
    dba, alice, mallory = roles["dba"], roles["sec_alice"], roles["sec_mallory"]
    old = _old_tree(tmp_path)
    dba.execute("DROP SCHEMA sabre CASCADE")
    subprocess.run([sys.executable, "-c", "import sys, psycopg; from sabre_pg import installer; "
                    "assert installer.__file__.startswith(sys.argv[2]), installer.__file__; "
                    "c = psycopg.connect(sys.argv[1]); installer.install(c, 'sabre'); c.commit()", pg_dsn, str(old)],
                   check=True, cwd=old, env=dict(os.environ, PYTHONPATH=str(old)))
    dba.execute("GRANT USAGE ON SCHEMA sabre TO sec_alice, sec_mallory, sec_bob")
    alice.execute("SET search_path = alice, sabre")
    make_source(alice, 600, table="visits")
    create(alice, name="visits_w", source="visits")
    assert len(advance(alice, "visits_w")) == 2
    victim = stream_id(dba, "visits_w")
    plant_everywhere(mallory, [victim], list(range(601, 801)), "visits_w", row_base=600)
    installer.upgrade(dba, "sabre")
    dba.execute("SET search_path = public, sabre")
    assert status(alice, "visits_w")["advances"] == 2
    owners = {r[0] for r in dba.execute(
        "SELECT relowner::regrole::text FROM pg_class WHERE relname LIKE 'visits_sabre_w%' AND relkind = 'r'")}
    assert owners == {"sec_alice"}
    add_rows(alice, 200, table="visits")
    assert [r["advance_no"] for r in advance(alice, "visits_w")] == [3, 4]
    assert status(alice, "visits_w")["numbered"] == 800
    assert_clean(verify(alice, "visits_w"), 400)
    assert scalar(dba, "SELECT to_regclass('sabre.stream_rows')") is None
    assert attempt(mallory, "SELECT * FROM alice.visits_sabre_w_rows")[0] == "42501"
