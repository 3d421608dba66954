"""Runs driven by the wrapper's PL/pgSQL (plpython/shared/driven.py), without a server: the
statements' parameters bound as typed literals, how each statement is executed, and the
step/failed/result protocol with the wrapper's loop played by the test."""
from __future__ import annotations

import json
import math
import threading

import pytest

from tests.client.fake_plpy import FakePlpy, PlpyError, sabre_plpy

driven = sabre_plpy("shared.driven")
E = sabre_plpy("shared.errors")
OWNER = ("alice", "2026-11-27 09:00:00+00")


def test_parameters_become_typed_literals_in_one_pass():
    sql = driven.bind("SELECT $1::pg_catalog.regclass, $2, $10, '$1' AS x", ["text", "text[]"] + ["int4"] * 8,
                      ["o'k $2", ["a", 'b"c', None, "d\\e"], 1, 2, 3, 4, 5, 6, 7, 8])
    assert sql.startswith("SELECT ('o''k $2')::text::pg_catalog.regclass, ")
    assert "(E'{\"a\",\"b\\\\\"c\",NULL,\"d\\\\\\\\e\"}')::text[]" in sql
    assert "('8')::int4" in sql and "('1')::int4" not in sql.split("int4")[0]


@pytest.mark.parametrize("value, text", [
    (None, "NULL"), (True, "'true'"), (False, "'false'"), (7, "'7'"), (2.5, "'2.5'"),
    (math.nan, "'NaN'"), (math.inf, "'Infinity'"), (-math.inf, "'-Infinity'"), (b"\x00\xff", "'\\x00ff'"),
    ({"a": [1, 2]}, "'{\"a\": [1, 2]}'"), ([1, None, 2.5], "'{\"1\",NULL,\"2.5\"}'"), ([[1, 2], [3, 4]],
                                                                                     "'{{\"1\",\"2\"},{\"3\",\"4\"}}'"),
    ("it's", "'it''s'"), ("a\\b", "E'a\\\\b'")])
def test_literals_are_the_text_a_bound_parameter_would_carry(value, text):
    assert driven.literal(value) == text


def test_a_missing_parameter_is_an_error():
    with pytest.raises(ValueError):
        driven.bind("SELECT $2", ["text"], ["x"])


@pytest.mark.parametrize("sql, kind", [
    ("SELECT 1", "rows"), ("  (SELECT 1)", "rows"), ("VALUES (1)", "rows"), ("TABLE t", "rows"),
    ("WITH a AS (SELECT 1) SELECT * FROM a", "rows"),
    ("WITH a AS (SELECT 1) INSERT INTO t SELECT * FROM a", "command"),
    ("WITH a AS (DELETE FROM t RETURNING *) INSERT INTO u SELECT * FROM a RETURNING 1", "returning"),
    ("INSERT INTO t VALUES (1) ON CONFLICT DO NOTHING RETURNING 1", "returning"),
    ("INSERT INTO t SELECT 1", "command"), ("CREATE TABLE t (a int)", "command"), ("DROP TABLE t", "command"),
    ("ALTER TABLE t ADD PRIMARY KEY (a)", "command"), ("GRANT SELECT ON t TO u", "command")])
def test_each_statement_is_run_as_its_result_needs(sql, kind):
    assert driven.kind(sql) == kind


class Loop:
    """The wrapper: sabre_driven_loop's loop over step, with answers by statement."""

    def __init__(self, plpy, answers):
        self.plpy, self.answers, self.seen = plpy, answers, []

    def run(self, owner=OWNER):
        reply = None
        while True:
            (kind, sql), = driven.step(self.plpy, reply, *owner)
            if kind is None:
                return driven.result(self.plpy)
            self.seen.append((kind, sql))
            answer = next((a for needle, a in self.answers.items() if needle in sql), None)
            if isinstance(answer, Exception):
                raise answer
            reply = answer if kind == "command" or answer is None else json.dumps(answer)


def _owner_plpy():
    return FakePlpy({"statement_timestamp": [{"r": OWNER[0], "s": OWNER[1]}]})


def test_a_job_runs_its_statements_through_the_loop_and_returns_its_rows():
    main = threading.get_ident()
    threads = []

    def job(p):
        threads.append(threading.get_ident())
        n = p.execute(p.prepare("SELECT pg_catalog.count(*) AS n FROM t WHERE a = $1", ["int4"]), [3])[0]["n"]
        made = p.execute("CREATE TABLE u AS SELECT 1").nrows()
        assert p.execute("SELECT 7 AS seven", 1)[0]["seven"] == 7
        reply = json.loads(p.execute("SELECT r FROM f()")[0]["r"])
        p.notice("half way", hint="go on")
        return [(n, made, reply["ok"])]

    plpy = _owner_plpy()
    assert driven.later(plpy, job, "anonymize") == []
    loop = Loop(plpy, {"count(*)": [{"n": 42}], "CREATE TABLE": "5", "f()": [{"r": {"ok": True}}],
                       "seven": [{"seven": 7}]})
    assert loop.run() == [(42, 5, True)]
    assert ("rows", "SELECT * FROM (SELECT 7 AS seven) AS q LIMIT 1") in loop.seen
    assert threads and threads[0] != main
    assert [k for k, _ in loop.seen] == ["rows", "command", "rows", "rows", "notice"]
    assert json.loads(loop.seen[-1][1]) == {"message": "half way", "hint": "go on"}
    assert ("rows", "SELECT pg_catalog.count(*) AS n FROM t WHERE a = ('3')::int4") in loop.seen
    assert driven.step(plpy, None, *OWNER) == [(None, None)]          # nothing pending any more


def test_a_failed_statement_reaches_the_jobs_handler_and_its_error_is_reported():
    after = []

    def job(p):
        try:
            p.execute("SELECT sabre.shard_call()")
        except p.SPIError as e:
            after.append(p.execute("SELECT 1 AS one"))     # a failed run reads nothing more
            if e.sqlstate.startswith("08"):
                raise E.connection_failure("could not reach a node: %s" % e, "nothing was published") from e
            raise
        return [("never",)]

    plpy = _owner_plpy()
    driven.later(plpy, job, "anonymize")
    loop = Loop(plpy, {"shard_call": RuntimeError("the wrapper's EXECUTE failed")})
    with pytest.raises(RuntimeError):
        loop.run()
    state = driven.failed(plpy, "08006", "connection to the remote node failed", "", "", "while executing")
    assert state == [("08006", "could not reach a node: connection to the remote node failed", None,
                      "nothing was published")]
    assert after == [[]]
    assert [sql for _, sql in loop.seen] == ["SELECT sabre.shard_call()"]


def test_an_untranslated_statement_error_reports_the_statements_own():
    def job(p):
        p.execute("SELECT 1/0")
        return []

    plpy = _owner_plpy()
    driven.later(plpy, job, "anonymize")
    with pytest.raises(RuntimeError):
        Loop(plpy, {"1/0": RuntimeError("division by zero")}).run()
    assert driven.failed(plpy, "22012", "division by zero", "", "", "") == [(None, None, None, None)]


def test_a_sabre_error_of_the_job_is_raised_by_the_step():
    def job(p):
        p.execute("SELECT 1")
        raise E.invalid_parameter("k is larger than the table", "Lower k.")

    plpy = _owner_plpy()
    driven.later(plpy, job, "anonymize")
    with pytest.raises(PlpyError) as ei:
        Loop(plpy, {}).run()
    assert ei.value.sqlstate == "22023" and ei.value.hint == "Lower k."
    assert driven.failed(plpy, "22023", "k", "", "", "") == [(None, None, None, None)]


def test_another_role_or_statement_cannot_drive_a_pending_job():
    ran = []

    def job(p):
        ran.append(p.execute("SELECT secret FROM t"))
        return [(1,)]

    plpy = _owner_plpy()
    driven.later(plpy, job, "anonymize")
    loop = Loop(plpy, {"secret": [{"secret": "x"}]})
    assert loop.run(owner=("mallory", OWNER[1])) == []
    assert loop.seen == [] and ran == []
    assert driven.step(plpy, None, *OWNER) == [(None, None)]          # abandoned, not kept for its owner


def test_a_new_run_abandons_one_left_pending():
    def job(p):
        p.execute("SELECT 1")
        return [("first",)]

    plpy = _owner_plpy()
    driven.later(plpy, job, "anonymize")
    (kind, _), = driven.step(plpy, None, *OWNER)                     # the first job waits for its reply
    assert kind == "rows"
    driven.later(plpy, lambda p: [("second",)], "anonymize")
    assert Loop(plpy, {}).run() == [("second",)]


def test_a_caller_of_an_implementation_goes_on_after_the_job():
    """sabre_refresh calls sabre_anonymize's implementation, which hands a Citus run to a job:
    the refresh's own last steps run after the job, in its thread, on its rows."""
    def job(p):
        p.execute("SELECT 1")
        return [(7, "o")]

    plpy = _owner_plpy()
    assert driven.then(lambda p, rows: rows) is False                 # no job: the caller goes on itself
    driven.later(plpy, job, "anonymize")
    assert driven.then(lambda p, rows: [r + (p.execute("SELECT 2 AS two")[0]["two"],) for r in rows]) is True
    loop = Loop(plpy, {"SELECT 2": [{"two": 2}]})
    assert loop.run() == [(7, "o", 2)]
    assert [sql for _, sql in loop.seen] == ["SELECT 1", "SELECT 2 AS two"]


def test_a_finished_job_is_not_stepped_again_before_its_rows_are_taken():
    plpy = _owner_plpy()
    driven.later(plpy, lambda p: [("rows",)], "anonymize")
    assert driven.step(plpy, None, *OWNER) == [(None, None)]           # the job ran and finished
    assert driven.step(plpy, None, *OWNER) == [(None, None)]           # (did not wait for a dead thread)
    assert driven.result(plpy) == [("rows",)] and driven.result(plpy) == []
