"""A one-call partitioned run checks its output against what its parts wrote, kept in memory
(``publish.PartsWritten``: each class's rows and, for an integer key, every key), instead of
reading its side table back and analyzing it (docs/scale-out.md, step 4; 10M rows: 2-3.5 s
less).  The check must still refuse an output whose classes are not the parts' classes and
keys that are not every source row once, and leave nothing behind; a key that is no integer
still takes the exactly-once check in SQL, with the side table analyzed for it."""
from __future__ import annotations

import json

import psycopg
import pytest

from sabre_pg import installer
from tests.db.helpers import scalar, state
from tests.db.test_parts_through_views import QIS, call, checked_run, no_part_objects
from tests.db.test_partitioned import census  # noqa: F401 (the census fixture)

ROWS = 4000


@pytest.fixture
def tampered(pg_conn):
    """public.tampered_parts(statement, how): runs the statement with every statement sabre executes
    recorded and, for ``how`` other than 'none', what the parts report as written changed after the
    first part ('more': its first class one row more; 'fewer': one row fewer; 'foreign': its first
    key replaced by one the source does not have; 'twice': its first key replaced by its second);
    returns the statements' texts."""
    pg_conn.execute(
        "CREATE FUNCTION public.tampered_parts(statement text, how text) RETURNS text LANGUAGE plpython3u AS $fn$\n"
        + installer.bootstrap("sabre") +
        "import json\n"
        "import plpy as module\n"
        "from sabre_plpy.stages import publish as P\n"
        "saved_add, saved_execute, saved_prepare, seen, plans = P.PartsWritten.add, module.execute, module.prepare, [], {}\n"
        "def add(self, sizes, keys):\n"
        "    first = not self.sizes\n"
        "    saved_add(self, sizes, keys)\n"
        "    if first and how in ('more', 'fewer'):\n"
        "        self.sizes[-1] = self.sizes[-1].copy()\n"
        "        self.sizes[-1][0] += 1 if how == 'more' else -1\n"
        "    elif first and how in ('foreign', 'twice') and self.keys is not None:\n"
        "        self.keys[0] = self.keys[:self.filled].max() + 1000 if how == 'foreign' else self.keys[1]\n"
        "def prepare(query, *a):\n"
        "    plan = saved_prepare(query, *a)\n"
        "    plans[id(plan)] = (plan, query)\n"
        "    return plan\n"
        "def execute(query, *a):\n"
        "    seen.append(query if isinstance(query, str) else plans.get(id(query), (None, None))[1])\n"
        "    return saved_execute(query, *a)\n"
        "P.PartsWritten.add, module.execute, module.prepare = add, execute, prepare\n"
        "try:\n"
        "    saved_execute(statement)\n"
        "finally:\n"
        "    P.PartsWritten.add, module.execute, module.prepare = saved_add, saved_execute, saved_prepare\n"
        "return json.dumps(seen)\n$fn$")
    return lambda statement, how="none": json.loads(
        pg_conn.execute("SELECT public.tampered_parts(%s, %s)", (statement, how)).fetchone()[0])


def side_table_reads(statements) -> list:
    """The statements that read or analyze the run's side table (its temporary name ends in _k)."""
    return [s for s in statements if s and '_k"' in s and (s.lstrip().upper().startswith(("SELECT", "ANALYZE"))
                                                           or " FROM " in s.split('_k"')[0][-40:])]


@pytest.mark.parametrize("method, opts", [("refine", {"auto_partition_rows": 1000}), ("ak", {"partitions": 3}),
                                          ("mondrian", {"auto_partition_rows": 1500})])
def test_the_check_reads_no_side_table_for_an_integer_key(pg_conn, census, tampered, method, opts):
    hierarchies = {"sex": census["sex"]}
    statements = tampered(call(pg_conn, "public.mem_ok", "salary", method, {"hierarchies": hierarchies, **opts}))
    assert not [s for s in statements if s and s.lstrip().upper().startswith("ANALYZE")]
    assert not side_table_reads(statements)
    assert [s for s in statements if s and s.startswith("INSERT INTO") and '_k"' in s]     # (the parts wrote it)
    checked_run(pg_conn, "public.mem_ok", "salary", hierarchies, ROWS)
    # every class's output rows are its side-table keys
    assert scalar(pg_conn, "SELECT count(*) FROM (SELECT ec_id, count(*) FROM public.mem_ok GROUP BY 1 EXCEPT "
                           "SELECT ec_id, count(*) FROM public.mem_ok_keys GROUP BY 1) x") == 0


def test_a_text_key_is_checked_in_sql_with_the_side_table_analyzed(pg_conn, census, tampered):
    pg_conn.execute("CREATE TABLE public.census_text AS SELECT 'r' || c.id AS id, c.age, c.education, c.sex, "
                    "c.marital, c.salary FROM public.census c")
    pg_conn.execute("ALTER TABLE public.census_text ADD PRIMARY KEY (id)")
    hierarchies = {"sex": census["sex"]}
    statement = call(pg_conn, "public.mem_text", "salary", "refine",
                     {"hierarchies": hierarchies, "auto_partition_rows": 1000}).replace(
                         "'public.census'::regclass", "'public.census_text'::regclass")
    statements = tampered(statement)
    assert [s for s in statements if s and s.lstrip().upper().startswith("ANALYZE") and '_k"' in s]
    assert scalar(pg_conn, "SELECT count(DISTINCT k.key) FROM public.mem_text_keys k JOIN public.census_text s "
                           "ON s.id = k.key") == ROWS == scalar(pg_conn, "SELECT count(*) FROM public.mem_text")


@pytest.mark.parametrize("how, message", [
    ("more", "the output the parts wrote differs from the classes they computed"),
    ("fewer", "the output the parts wrote differs from the classes they computed"),
    ("foreign", "do not hold every row of the source exactly once"),
    ("twice", "do not hold every row of the source exactly once")])
def test_an_output_that_is_not_what_the_parts_wrote_is_refused(pg_conn, census, tampered, how, message):
    before = state(pg_conn)
    statement = call(pg_conn, "public.mem_bad", "salary", "refine",
                     {"hierarchies": {"sex": census["sex"]}, "auto_partition_rows": 1000})
    with pytest.raises(psycopg.Error) as ei:
        tampered(statement, how)
    assert ei.value.sqlstate == "40001", ei.value
    assert message in ei.value.diag.message_primary and ei.value.diag.message_hint
    assert state(pg_conn) == before
    assert no_part_objects(pg_conn)

