"""The fixed costs of automatic parts (issue 26, docs/evaluation.md "Automatic parts: the fixed
costs, 2"): the exactly-once check of a one-call partitioned run with an integer key sorts the
source's keys and the side table's in numpy instead of a hash semi-join.  Both ways must give the
same counts and refuse the same side tables: every source row's key once, no other key."""
from __future__ import annotations

import json

import pytest

from sabre_pg import installer
from tests.db.helpers import anonymize, run_row
from tests.db.test_io_speed import hashes
from tests.db.test_partitioned import census  # noqa: F401 (the census fixture)

ROWS = 500
SQLSTATE = "40001"           # source_changed: serialization_failure


@pytest.fixture
def rows_once(pg_conn):
    """public.rows_once(source, keys table, output rows, way): the partitioned run's exactly-once
    check on a side table the test wrote, in numpy ('memory': the side table read for it;
    'kept': the keys the parts wrote, kept in memory, as the chunked check passes them) or in SQL ('sql')."""
    pg_conn.execute(
        "CREATE FUNCTION public.rows_once(src regclass, keys text, n int8, in_memory text) RETURNS text "
        "LANGUAGE plpython3u AS $fn$\n" + installer.bootstrap("sabre") +
        "import numpy as np\n"
        "from sabre_plpy.batch import partition as P\n"
        "from sabre_plpy.stages import request\n"
        "from sabre_plpy.shared import errors as E\n"
        "req = request.build(plpy, src, None, ['age'], 'salary', 1.0, 1, 'refine', None, '{}')\n"
        "sorted_keys = np.array([r['key'] for r in plpy.execute('SELECT key FROM ' + keys)], dtype=np.int64) "
        "if in_memory == 'kept' else None\n"
        "written = P.Written([0], np.arange(1), np.array([n], dtype=np.int64), np.zeros(1), sorted_keys)\n"
        "calls = []\n"
        "saved = P._rows_once_in_sql\n"
        "P._rows_once_in_sql = lambda *a: calls.append('sql') or saved(*a)\n"
        "limit = P.KEYS_IN_MEMORY\n"
        "P.KEYS_IN_MEMORY = limit if in_memory != 'sql' else -1\n"
        "try:\n"
        "    with E.reported(plpy):\n"
        "        P.check_every_row_once(plpy, req, {'': 'unused', '_keys': keys}, written)\n"
        "finally:\n"
        "    P.KEYS_IN_MEMORY, P._rows_once_in_sql = limit, saved\n"
        "return 'sql' if calls else 'memory'\n$fn$")
    return lambda src, keys, n, in_memory: pg_conn.execute(
        "SELECT public.rows_once(%s::regclass, %s, %s, %s)", (src, keys, n, str(in_memory))).fetchone()[0]


@pytest.fixture
def source(pg_conn):
    """public.src (bigint key, ids 1..ROWS out of order) and public.src_text (a text key)."""
    pg_conn.execute("CREATE TABLE public.src (id int8 PRIMARY KEY, age int, salary int)")
    pg_conn.execute("INSERT INTO public.src SELECT g, g %% 50, g %% 7 FROM generate_series(%s, 1, -1) g", (ROWS,))
    pg_conn.execute("CREATE TABLE public.src_text (id text PRIMARY KEY, age int, salary int)")
    pg_conn.execute("INSERT INTO public.src_text SELECT 'k' || id, age, salary FROM public.src")
    return "public.src"


def side_table(conn, name, keys_sql):
    conn.execute("CREATE TABLE public.%s AS SELECT x.key, 0::int8 AS ec_id FROM (%s) AS x(key) ORDER BY random()"
                 % (name, keys_sql))
    return "public." + name


WAYS = ["memory", "kept", "sql"]


@pytest.mark.parametrize("in_memory", WAYS)
def test_every_key_once_passes(pg_conn, rows_once, source, in_memory):
    keys = side_table(pg_conn, "k_ok", "SELECT id FROM public.src")
    assert rows_once(source, keys, ROWS, in_memory) == ("sql" if in_memory == "sql" else "memory")


@pytest.mark.parametrize("in_memory", WAYS)
@pytest.mark.parametrize("keys_sql, n, counts", [
    # a key twice and another missing: as many keys as rows, but one source row not among them
    ("SELECT CASE WHEN id = 3 THEN 4 ELSE id END FROM public.src", ROWS,
     "(%d source rows, %d output rows, %d keys, %d source rows found among them)" % (ROWS, ROWS, ROWS, ROWS - 1)),
    # a key the source does not have instead of one it has
    ("SELECT CASE WHEN id = 3 THEN %d ELSE id END FROM public.src" % (ROWS + 10), ROWS,
     "(%d source rows, %d output rows, %d keys, %d source rows found among them)" % (ROWS, ROWS, ROWS, ROWS - 1)),
    # a row lost
    ("SELECT id FROM public.src WHERE id <> 7", ROWS - 1,
     "(%d source rows, %d output rows, %d keys, %d source rows found among them)" % (ROWS, ROWS - 1, ROWS - 1,
                                                                                    ROWS - 1)),
    # every key, but the output claims one row more
    ("SELECT id FROM public.src", ROWS + 1,
     "(%d source rows, %d output rows, %d keys, %d source rows found among them)" % (ROWS, ROWS + 1, ROWS + 1, ROWS)),
])
def test_a_wrong_side_table_is_refused_both_ways(pg_conn, rows_once, source, in_memory, keys_sql, n, counts):
    keys = side_table(pg_conn, "k_bad", keys_sql)
    with pytest.raises(Exception) as ei:
        rows_once(source, keys, n, in_memory)
    assert ei.value.sqlstate == SQLSTATE
    message = ei.value.diag.message_primary
    assert "do not hold every row of the source exactly once" in message
    if in_memory != "sql":        # the side table counted, not taken from the written classes
        counts = counts.replace("%d keys" % (ROWS + 1), "%d keys" % ROWS)
    assert counts in message, message


def test_a_text_key_is_checked_in_sql(pg_conn, rows_once, source):
    keys = side_table(pg_conn, "k_text", "SELECT id FROM public.src_text")
    assert rows_once("public.src_text", keys, ROWS, "memory") == "sql"


@pytest.fixture
def summary_spans(pg_conn):
    """public.summary_spans(source, sa): the SA summary's rows and its spans of age and score
    read in the same scan (what the split of a partitioned run takes instead of a scan of its own)."""
    pg_conn.execute(
        "CREATE FUNCTION public.summary_spans(src regclass, sa text) RETURNS text LANGUAGE plpython3u AS $fn$\n"
        + installer.bootstrap("sabre") +
        "import json\n"
        "from sabre_plpy.batch import partition as P\n"
        "from sabre_plpy.stages import request, scan\n"
        "req = request.build(plpy, src, None, ['age', 'score', 'city'], sa, 1.0, 1, 'refine', None, "
        "'{}')\n"
        "s = scan.sa_summary(plpy, req, None, spans=P.span_exprs(plpy, req))\n"
        "plain = scan.sa_summary(plpy, req, None)\n"
        "assert plain.spans is None and list(plain.counts) == list(s.counts)\n"
        "return json.dumps([s.rows, s.spans[0], [list(x) for x in s.spans[1]]])\n$fn$")
    return lambda src, sa: json.loads(pg_conn.execute("SELECT public.summary_spans(%s::regclass, %s)",
                                                      (src, sa)).fetchone()[0])


@pytest.mark.parametrize("sa", ["salary", "income", "grade", "job"])
def test_the_summary_reads_the_spans_a_scan_would(pg_conn, summary_spans, sa):
    """Each SA kind (integer, float, numeric, text): the spans from the SA summary's scan are
    the count, min and max of a separate scan."""
    pg_conn.execute("CREATE TABLE public.spans_src (id int8 PRIMARY KEY, age int, score float8, city text, "
                    "salary int, income float8, grade numeric, job text)")
    pg_conn.execute("INSERT INTO public.spans_src SELECT g, 17 + g % 70, "
                    "(g * 7919 % 1000) / 8.0 - 40, 'c' || g % 5, g % 9, (g % 13) * 1.5, (g % 11) / 4.0, "
                    "'j' || g % 6 FROM generate_series(1, 3000) g")
    rows, all_rows, spans = summary_spans("public.spans_src", sa)
    want = pg_conn.execute("SELECT count(*), count(age), min(age), max(age), count(score), min(score), max(score) "
                           "FROM public.spans_src").fetchone()
    assert rows == all_rows == want[0] == 3000
    assert spans == [[want[1], want[2], want[3]], [want[4], want[5], want[6]]]


@pytest.fixture
def scanned_part_summaries(pg_conn):
    """public.scanned(sql): runs the statement with each part's SA summary scanned from its rows
    (as before the split's counts were handed to the parts); returns how many parts asked."""
    pg_conn.execute(
        "CREATE FUNCTION public.scanned(statement text) RETURNS int LANGUAGE plpython3u AS $fn$\n"
        + installer.bootstrap("sabre") +
        "from sabre_plpy.batch import partition as P\n"
        "saved, asked = P.part_summary, []\n"
        "P.part_summary = lambda *a: asked.append(saved(*a)) or None\n"
        "try:\n"
        "    plpy.execute(statement)\n"
        "finally:\n"
        "    P.part_summary = saved\n"
        "return sum(1 for s in asked if s is not None)\n$fn$")
    return lambda statement: pg_conn.execute("SELECT public.scanned(%s)", (statement,)).fetchone()[0]


@pytest.mark.parametrize("sa, counted", [("salary", True), ("income", True), ("grade", True), ("marital", True),
                                         ("job", False)])
def test_parts_given_the_splits_counts_make_the_same_output(pg_conn, census, scanned_part_summaries, sa, counted):
    """Each SA kind -- integer, float, numeric, a named hierarchy, a flat text SA (still
    scanned: its leaves are the part's own values) -- gives the same output, classes and side
    table whether each part's SA summary is the split's counts or a scan of its rows.  (With
    SABRE-AK: a 'refine' or 'mondrian' part given the split's counts takes them in the table's
    domain and is cut against the table's counts, test_parts_against_the_table.py, which a
    scan of its rows cannot give.)"""
    pg_conn.execute("ALTER TABLE public.census ADD COLUMN income float8, ADD COLUMN grade numeric, "
                    "ADD COLUMN job text")
    pg_conn.execute("UPDATE public.census SET income = (id % 13) * 1.5, grade = (id % 11) / 4.0, "
                    "job = 'j' || (id * 7 % 6)")
    opts = {"hierarchies": {k: v for k, v in census.items() if k == "sex" or k == sa},
            "auto_partition_rows": 1000, "seed": 7}
    call = ("SELECT * FROM sabre.sabre_anonymize('public.census'::regclass, ARRAY['age', 'education', 'sex'], "
            "'%s', 0.3, 5, 'ak', '%%s', '%s'::jsonb)" % (sa, json.dumps(opts)))
    res = anonymize(pg_conn, "public.census", ["age", "education", "sex"], sa, 0.3, 5, "ak",
                    "public.given", opts)
    assert run_row(pg_conn, res["run_id"])["partitions"]["parts"] >= 4
    assert scanned_part_summaries(call % "public.scanned") == (run_row(pg_conn, res["run_id"])["partitions"]["parts"]
                                                               if counted else 0)
    assert hashes(pg_conn, "public.given") == hashes(pg_conn, "public.scanned")


@pytest.mark.parametrize("qi_type", ["int", "timestamptz"])
def test_the_routed_copy_puts_every_row_in_its_part(pg_conn, qi_type):
    """The parts' rows tables (routed by one scan of the source without a synchronized scan)
    hold exactly the rows of their predicates, with the source's columns and nothing more (the
    routing column dropped), for an integer and a timestamptz QI."""
    when = "timestamptz '2020-01-01' + g * interval '7 hours'" if qi_type == "timestamptz" else "g % 300"
    pg_conn.execute("CREATE TABLE public.routed (id int8 PRIMARY KEY, t %s, age int, salary int)" % qi_type)
    pg_conn.execute("INSERT INTO public.routed SELECT g, %s, 17 + g * 7 %% 60, g * 13 %% 20 FROM "
                    "generate_series(1, 3000) g" % when)
    parts = pg_conn.execute(
        "SELECT rows, predicate, part_rows FROM sabre_partitions('public.routed', ARRAY['t', 'age'], 'salary', 0.4, 5, "
        "'refine', 'public.routed_out', '{\"partitions\": 4}'::jsonb, stage_rows => true)").fetchall()
    assert len(parts) >= 3 and sum(p[0] for p in parts) == 3000
    source_columns = pg_conn.execute("SELECT array_agg(attname ORDER BY attnum) FROM pg_attribute WHERE attrelid = "
                                     "'public.routed'::regclass AND attnum > 0 AND NOT attisdropped").fetchone()[0]
    for rows, predicate, table in parts:
        assert pg_conn.execute("SELECT array_agg(attname ORDER BY attnum) FROM pg_attribute WHERE attrelid = "
                               "%s::regclass AND attnum > 0 AND NOT attisdropped", (table,)).fetchone()[0] == source_columns
        assert pg_conn.execute("SELECT count(*) FROM %s" % table).fetchone()[0] == rows
        assert pg_conn.execute("SELECT count(*) FROM (SELECT * FROM %s EXCEPT ALL SELECT * FROM public.routed "
                               "WHERE %s) x" % (table, predicate)).fetchone()[0] == 0
        pg_conn.execute("DROP TABLE " + table)
    assert not pg_conn.execute("SELECT relname FROM pg_class WHERE relname LIKE 'sabre_part_%'").fetchall()
