"""Issue 25, finding 7 (hierarchies, red-team round): the catalog of hierarchies is shared by
every role, looked up by name.

* a call's hierarchies are capped together: one large hierarchy named for many attributes is
  refused at once (54000), and a name several attributes use is loaded once;
* a run records the owner and content hash of each hierarchy it used; ``sabre_refresh``
  refuses (55000) when another role redefined one since, and leaves the old output intact;
* a role with write rights on the catalog can LOCK it: a run then fails fast with 55P03
  instead of waiting until statement_timeout.

Roles as in tests/db/test_security.py; ``sec_bob`` and ``sec_mallory`` get the hierarchy
editing rights docs/security.md describes.
"""
from __future__ import annotations

import json

import psycopg
import pytest

from sabre_pg.core import limits
from tests.db.test_security import roles  # noqa: F401  (the fixture)

EDIT = "GRANT INSERT, UPDATE, DELETE ON sabre.hierarchies, sabre.hierarchy_rows TO %s"


def _expect(conn, call, sqlstate, *words, params=None):
    with pytest.raises(psycopg.Error) as e:
        conn.execute(call, params)
    assert e.value.sqlstate == sqlstate, (e.value.sqlstate, str(e.value))
    text = str(e.value) + " " + (e.value.diag.message_hint or "")
    for w in words:
        assert w in text, (w, text)
    assert e.value.diag.message_hint
    return e.value


def _wide_arx(leaves: int) -> str:
    """Leaves w0..w<n-1> over 3 levels and a root: 5 labels a leaf."""
    return "\n".join(f"w{i};{i >> 4:x}a;{i >> 8:x}b;{i >> 12:x}c;*" for i in range(leaves))


# ------------------------------------------------------------------ the per-call cap
def test_one_large_hierarchy_named_for_many_qis_is_refused_at_once(roles):
    dba, bob, alice = roles["dba"], roles["sec_bob"], roles["sec_alice"]
    dba.execute(EDIT % "sec_bob")
    leaves = limits.HIERARCHY_CALL_CELLS // 5 // 4          # 4 uses fill the cap exactly, 5 exceed it
    bob.execute("SELECT * FROM sabre_define_hierarchy('wide5', %s)", (_wide_arx(leaves),))
    cols = [f"c{i}" for i in range(5)]
    alice.execute("CREATE TABLE alice.tiny (id int PRIMARY KEY, %s, pay int)" % ", ".join(f"{c} text" for c in cols))
    values = ", ".join(f"'w' || ((g * {i + 3}) % 40)" for i in range(5))
    alice.execute(f"INSERT INTO alice.tiny SELECT g, {values}, g % 7 FROM generate_series(1, 240) g")
    alice.execute("ANALYZE alice.tiny")
    hier = {"hierarchies": {c: "wide5" for c in cols}}
    for call, opts in (("SELECT * FROM sabre_anonymize('alice.tiny', %s, 'pay', 0.6, 3, output => 'alice.tiny_out', "
                        "options => %s)", dict(hier, key="id")),
                       ("SELECT * FROM sabre_estimate('alice.tiny', %s, 'pay', 0.6, 3, %s)", hier)):
        _expect(alice, call, "54000", "too large together", "1,250,000", "docs/security.md",
                params=(cols, json.dumps(opts)))
    assert alice.execute("SELECT to_regclass('alice.tiny_out')").fetchone()[0] is None


def test_a_hierarchy_shared_by_several_qis_gives_the_output_of_separate_copies(roles):
    """A name used by three QIs is loaded once: same output as three identical hierarchies."""
    dba, alice = roles["dba"], roles["sec_alice"]
    arx = "\n".join(f"v{i};g{i // 3};h{i // 9};*" for i in range(27))
    for name in ("shared3", "copy_a", "copy_b", "copy_c"):
        dba.execute("SELECT * FROM sabre_define_hierarchy(%s, %s)", (name, arx))
    alice.execute("CREATE TABLE alice.s3 (id int PRIMARY KEY, x text, y text, z text, pay int)")
    alice.execute("INSERT INTO alice.s3 SELECT g, 'v' || (g * 5) % 27, 'v' || (g * 7) % 27, 'v' || (g * 11) % 27, "
                  "(g * 104729) % 9 FROM generate_series(1, 900) g")
    outputs = {}
    for out, names in (("alice.one", ["shared3"] * 3), ("alice.three", ["copy_a", "copy_b", "copy_c"])):
        opts = json.dumps({"hierarchies": dict(zip("xyz", names)), "key": "id", "seed": 7})
        alice.execute("SELECT * FROM sabre_anonymize('alice.s3', ARRAY['x','y','z'], 'pay', 0.5, 4, "
                      "output => %s, options => %s)", (out, opts)).fetchall()
        outputs[out] = alice.execute(f"SELECT x, y, z, pay FROM {out} ORDER BY 1, 2, 3, 4").fetchall()
    assert outputs["alice.one"] == outputs["alice.three"] and len(outputs["alice.one"]) == 900
    recorded = alice.execute("SELECT hierarchies FROM sabre.runs WHERE output_name = 'alice.one'").fetchone()[0]
    assert list(recorded) == ["shared3"] and recorded["shared3"]["owner"] == dba.info.user


# ------------------------------------------------------------------ redefined under a refresh
def _refresh_setup(roles):
    dba, bob, alice = roles["dba"], roles["sec_bob"], roles["sec_alice"]
    dba.execute(EDIT % "sec_bob")
    dba.execute(EDIT % "sec_mallory")
    arx = "\n".join(f"t{i};band{i // 4};half{i // 8};*" for i in range(16))
    bob.execute("SELECT * FROM sabre_define_hierarchy('tiers', %s)", (arx,))
    alice.execute("CREATE TABLE alice.emp (id int PRIMARY KEY, age int, tier text, bonus int)")
    alice.execute("INSERT INTO alice.emp SELECT g, 20 + (g * 17) % 40, 't' || (g * 5) % 16, (g * 7919) % 13 "
                  "FROM generate_series(1, 800) g")
    alice.execute("SELECT * FROM sabre_anonymize('alice.emp', ARRAY['age','tier'], 'bonus', 0.5, 5, "
                  "output => 'alice.emp_out', options => '{\"key\": \"id\", \"hierarchies\": {\"tier\": \"tiers\"}}')"
                  ).fetchall()
    return dba, bob, alice, arx


def _snapshot(alice):
    return (alice.execute("SELECT run_id FROM sabre.outputs WHERE output = 'alice.emp_out'::regclass").fetchone(),
            alice.execute("SELECT * FROM alice.emp_out ORDER BY 1, 2, 3, 4").fetchall())


def test_an_unchanged_hierarchy_refreshes(roles):
    _, _, alice, _ = _refresh_setup(roles)
    before = _snapshot(alice)
    alice.execute("SELECT * FROM sabre_refresh('alice.emp_out')").fetchall()
    assert _snapshot(alice)[0] != before[0]          # a new run replaced the output


def test_a_hierarchy_redefined_by_its_owner_makes_the_refresh_fail_and_keeps_the_output(roles):
    _, bob, alice, _ = _refresh_setup(roles)
    before = _snapshot(alice)
    # the owner collapses every distance: same leaves, a flat hierarchy
    bob.execute("SELECT * FROM sabre_define_hierarchy('tiers', %s)",
                ("\n".join(f"t{i};*" for i in range(16)),))
    _expect(alice, "SELECT * FROM sabre_refresh('alice.emp_out')", "55000", '"tiers" (redefined)',
            "sabre_anonymize explicitly")
    assert _snapshot(alice) == before
    # rerunning explicitly accepts the new definition; refreshes repeat that run from then on
    alice.execute("SELECT * FROM sabre_anonymize('alice.emp', ARRAY['age','tier'], 'bonus', 0.5, 5, "
                  "output => 'alice.emp_out', options => '{\"key\": \"id\", \"hierarchies\": {\"tier\": \"tiers\"}}')"
                  ).fetchall()
    alice.execute("SELECT * FROM sabre_refresh('alice.emp_out')").fetchall()


def test_a_hierarchy_taken_over_by_another_role_makes_the_refresh_fail(roles):
    """Same content, another owner: bob drops it and mallory defines it again."""
    _, bob, alice, arx = _refresh_setup(roles)
    before = _snapshot(alice)
    bob.execute("DELETE FROM sabre.hierarchies WHERE name = 'tiers'")
    roles["sec_mallory"].execute("SELECT * FROM sabre_define_hierarchy('tiers', %s)", (arx,))
    _expect(alice, "SELECT * FROM sabre_refresh('alice.emp_out')", "55000", '"tiers" (owner sec_mallory, was sec_bob)')
    assert _snapshot(alice) == before


# ------------------------------------------------------------------ a lock on the catalog
@pytest.mark.parametrize("call", [
    "SELECT * FROM sabre_anonymize('alice.lk', ARRAY['age','kind'], 'pay', 0.6, 4, output => 'alice.lk_out', "
    "options => '{\"key\": \"id\", \"hierarchies\": {\"kind\": \"kinds\"}}')",
    "SELECT * FROM sabre_estimate('alice.lk', ARRAY['age','kind'], 'pay', 0.6, 4, "
    "'{\"hierarchies\": {\"kind\": \"kinds\"}}')",
])
def test_a_lock_held_on_the_hierarchy_catalog_fails_the_run_fast(roles, call):
    dba, mallory, alice = roles["dba"], roles["sec_mallory"], roles["sec_alice"]
    dba.execute(EDIT % "sec_mallory")
    dba.execute("SELECT * FROM sabre_define_hierarchy('kinds', %s)", ("\n".join(f"k{i};k{i // 2}x;*" for i in range(6)),))
    alice.execute("CREATE TABLE alice.lk (id int PRIMARY KEY, age int, kind text, pay int)")
    alice.execute("INSERT INTO alice.lk SELECT g, g % 50, 'k' || g % 6, g % 5 FROM generate_series(1, 600) g")
    alice.execute("ANALYZE alice.lk")
    alice.execute("SET statement_timeout = '60s'")    # the old code waited until this (57014)
    with mallory.transaction():
        mallory.execute("LOCK TABLE sabre.hierarchies IN ACCESS EXCLUSIVE MODE")
        _expect(alice, call, "55P03", "sabre.hierarchies", "pg_locks")
    alice.execute(call).fetchall()                    # released: the call runs


def test_a_hierarchy_redefined_under_a_stream_stops_its_advances(roles):
    dba, bob, alice = roles["dba"], roles["sec_bob"], roles["sec_alice"]
    dba.execute(EDIT % "sec_bob")
    bob.execute("SELECT * FROM sabre_define_hierarchy('ranks', %s)",
                ("\n".join(f"r{i};r{i // 3}g;*" for i in range(12)),))
    alice.execute("CREATE TABLE alice.arr (id int PRIMARY KEY, at int NOT NULL, age int, rk text, pay int)")
    alice.execute("INSERT INTO alice.arr SELECT g, g, 20 + (g * 13) % 40, 'r' || (g * 5) % 12, (g * 7919) % 11 "
                  "FROM generate_series(1, 400) g")
    alice.execute("SELECT * FROM sabre_stream_create('arr_w', 'alice.arr'::regclass, 'at', ARRAY['age','rk'], "
                  "'pay', 0.6, 4, 200, 100, output => 'alice.arr_w', "
                  "options => '{\"key\": \"id\", \"hierarchies\": {\"rk\": \"ranks\"}}')").fetchall()
    assert len(alice.execute("SELECT * FROM sabre_stream_advance('arr_w', 1)").fetchall()) == 1
    published = alice.execute("SELECT count(*) FROM alice.arr_w").fetchone()[0]
    recorded = alice.execute("SELECT hierarchies FROM sabre.streams WHERE name = 'arr_w'").fetchone()[0]
    assert list(recorded) == ["ranks"] and recorded["ranks"]["owner"] == "sec_bob", recorded
    bob.execute("SELECT * FROM sabre_define_hierarchy('ranks', %s)", ("\n".join(f"r{i};*" for i in range(12)),))
    _expect(alice, "SELECT * FROM sabre_stream_advance('arr_w')", "55000", '"ranks" (redefined)', "arr_w")
    assert alice.execute("SELECT count(*) FROM alice.arr_w").fetchone()[0] == published
