"""Parts of a one-call partitioned run read the source through a temporary view of their
predicate, not a copy of their rows, when each part's stages read its rows once
(docs/scale-out.md, "Parts read through views"; ``partition.staged``): the rows the copy gave
each part, read in the source's physical order; every output verified, every row once, nothing
left behind.  A part that would read its
rows more than once (a flat categorical QI, a keep column, a numeric QI's exact ranges, a flat
text SA) or a run of more than ``VIEW_PARTS`` parts still copies them.  A source that changes
between two parts' reads fails the run with 40001 and leaves nothing."""
from __future__ import annotations

import json

import psycopg
import pytest
from psycopg import sql

from sabre_pg import installer
from tests.db.helpers import check_exact_generalization, relations, run_row, scalar, state, verify
from tests.db.test_partitioned import census  # noqa: F401 (the census fixture)

QIS = ["age", "education", "sex"]
T, K = 0.3, 5


@pytest.fixture
def traced(pg_conn):
    """public.traced_views(statement, force, meanwhile): runs the statement with each call of
    ``partition.staged`` recorded (``force``: every run copies its rows, as before views) and
    ``meanwhile`` (SQL or '') executed after the first part; returns {"staged": [...], "copies":
    stage_rows calls that copied, "reads": the keys each part's read gave, in its order}."""
    pg_conn.execute(
        "CREATE FUNCTION public.traced_views(statement text, force bool, meanwhile text) RETURNS text "
        "LANGUAGE plpython3u AS $fn$\n"
        + installer.bootstrap("sabre") +
        "import json\n"
        "from sabre_plpy.batch import partition as P\n"
        "from sabre_plpy.stages import scan as S\n"
        "saved = (P.staged, P.stage_rows, P.anonymize_part, S.read)\n"
        "seen = {'staged': [], 'copies': 0, 'reads': []}\n"
        "def staged(*a):\n"
        "    seen['staged'].append(saved[0](*a))\n"
        "    return True if force else seen['staged'][-1]\n"
        "def stage_rows(plpy_, req, parts):\n"
        "    seen['copies'] += len(parts) > 1\n"
        "    return saved[1](plpy_, req, parts)\n"
        "def anonymize_part(plpy_, req, part, j, *a, **kw):\n"
        "    n = saved[2](plpy_, req, part, j, *a, **kw)\n"
        "    if j == 0 and meanwhile:\n"
        "        plpy_.execute(meanwhile)\n"
        "    return n\n"
        "def read(plpy_, req, *a):\n"
        "    got = saved[3](plpy_, req, *a)\n"
        "    seen['reads'].append(got.keys.tolist())\n"
        "    return got\n"
        "P.staged, P.stage_rows, P.anonymize_part, S.read = staged, stage_rows, anonymize_part, read\n"
        "try:\n"
        "    plpy.execute(statement)\n"
        "finally:\n"
        "    P.staged, P.stage_rows, P.anonymize_part, S.read = saved\n"
        "return json.dumps(seen)\n$fn$")
    return lambda statement, force=False, meanwhile="": json.loads(
        pg_conn.execute("SELECT public.traced_views(%s, %s, %s)", (statement, force, meanwhile)).fetchone()[0])


def call(conn, output, sa, method, opts, qis=QIS):
    return sql.SQL("SELECT * FROM sabre.sabre_anonymize('public.census'::regclass, {}, {}, {}, {}, {}, {}, "
                   "{}::jsonb)").format(*map(sql.Literal, (qis, sa, T, K, method, output, json.dumps(opts)))
                                        ).as_string(conn)


def checked_run(conn, output, sa, hierarchies, rows, source="public.census"):
    """The run's output: verified, every source row once, the exact generalization."""
    res = conn.execute("SELECT r.run_id, r.classes FROM sabre.runs r WHERE r.output_oid = %s::regclass "
                       "ORDER BY r.run_id DESC LIMIT 1", (output,)).fetchone()
    assert run_row(conn, res[0])["partitions"]["parts"] >= 2
    checked = verify(conn, output, sa, T, K, hierarchies.get(sa))
    assert checked["violations"] == 0 and checked["max_emd"] <= T and checked["min_class_size"] >= K
    assert checked["classes"] == res[1]
    assert scalar(conn, "SELECT count(DISTINCT k.key) FROM %s_keys k JOIN %s s ON s.id = k.key"
                  % (output, source)) == rows == scalar(conn, "SELECT count(*) FROM %s" % output)
    check_exact_generalization(conn, output, source, hierarchies=hierarchies)


def no_part_objects(conn):
    """No part table, rows table or temporary view of a part left in any schema."""
    return not [r for r in relations(conn) if r[1].startswith("sabre_part_")] and not scalar(
        conn, "SELECT count(*) FROM pg_class WHERE relname LIKE 'sabre\\_part\\_%'")


@pytest.mark.parametrize("method, opts", [
    ("refine", {"auto_partition_rows": 900}), ("mondrian", {"auto_partition_rows": 1200}),
    ("ak", {"partitions": 3}), ("refine", {"partitions": 8}),
    ("refine", {"auto_partition_rows": 1000, "nulls": "drop"})])
def test_views_read_each_parts_rows_in_the_sources_order(pg_conn, census, traced, method, opts):
    """Each part reads the rows the copy gave it, in the source's physical order (the copy's
    own order can differ: a fresh table's free-space map puts a short row back on an earlier
    page), and the output verifies either way."""
    hierarchies, source = {"sex": census["sex"]}, "public.census"
    if opts.get("nulls"):
        pg_conn.execute("ALTER TABLE public.census ALTER COLUMN education DROP NOT NULL")
        pg_conn.execute("UPDATE public.census SET education = NULL WHERE id % 17 = 3")
        pg_conn.execute("CREATE VIEW public.census_kept AS SELECT * FROM public.census WHERE education IS NOT NULL")
        source = "public.census_kept"
    rows = scalar(pg_conn, "SELECT count(*) FROM %s" % source)
    physical = [r[0] for r in pg_conn.execute("SELECT id FROM public.census%s ORDER BY ctid" % (
        " WHERE education IS NOT NULL" if opts.get("nulls") else "")).fetchall()]
    reads = {}
    for force in (False, True):
        output = "public.views_%s" % ("copied" if force else "viewed")
        seen = traced(call(pg_conn, output, "salary", method, {"hierarchies": hierarchies, "seed": 7, **opts}),
                      force)
        assert seen["staged"] == [False]                     # the views' way was chosen ...
        assert seen["copies"] == (1 if force else 0)         # ... and no row copied unless forced
        reads[force] = seen["reads"]
        checked_run(pg_conn, output, "salary", hierarchies, rows, source)
        assert no_part_objects(pg_conn)
    assert len(reads[False]) == len(reads[True]) >= 2
    assert [sorted(r) for r in reads[False]] == [sorted(r) for r in reads[True]]
    assert sorted(k for r in reads[False] for k in r) == sorted(physical)
    position = {k: i for i, k in enumerate(physical)}
    assert all(r == sorted(r, key=position.get) for r in reads[False])


@pytest.mark.parametrize("case", ["flat_qi", "keep", "numeric_qi", "flat_sa", "many_parts"])
def test_parts_that_would_read_twice_copy_their_rows(pg_conn, census, traced, case):
    hierarchies, sa, qis, opts = {"sex": census["sex"]}, "salary", QIS, {"auto_partition_rows": 1000}
    if case == "flat_qi":
        hierarchies = {}
    elif case == "keep":
        opts["keep"] = ["race"]
    elif case == "numeric_qi":
        pg_conn.execute("ALTER TABLE public.census ADD COLUMN score numeric")
        pg_conn.execute("UPDATE public.census SET score = (id % 23) / 4.0")
        qis = QIS + ["score"]
    elif case == "flat_sa":
        sa = "workclass"
    else:
        opts = {"partitions": 12}
    seen = traced(call(pg_conn, "public.views_fallback", sa, "refine", {"hierarchies": hierarchies, **opts}, qis))
    assert (seen["staged"], seen["copies"]) == ([True], 1)
    checked_run(pg_conn, "public.views_fallback", sa, hierarchies, 4000)
    assert no_part_objects(pg_conn)


@pytest.mark.parametrize("moved", ["id % 10 = 0", "true"])
def test_a_source_changed_between_parts_fails_and_leaves_nothing(pg_conn, census, traced, moved):
    """Rows moved, after the first part's read, from one end of age's range to the other: a later
    part reads other SA counts than the split's, or no rows at all (every row moved), and the run
    fails with 40001 and leaves nothing."""
    hierarchies = {"sex": census["sex"]}
    before = state(pg_conn)
    statement = call(pg_conn, "public.views_changed", "salary", "refine",
                     {"hierarchies": hierarchies, "auto_partition_rows": 1000})
    with pytest.raises(psycopg.Error) as ei:
        traced(statement, False, "UPDATE public.census SET age = 190 - age WHERE %s" % moved)
    assert ei.value.sqlstate == "40001" and "changed while sabre read it" in ei.value.diag.message_primary
    assert "public.census (part " in ei.value.diag.message_primary and "sabre_part" not in ei.value.diag.message_primary
    assert ei.value.diag.message_hint
    assert state(pg_conn) == before
    assert no_part_objects(pg_conn)


@pytest.mark.parametrize("sa, ddl", [
    ("salary", None),
    ("grade", "ALTER TABLE public.census ADD COLUMN grade int2; UPDATE public.census SET grade = (salary % 9) - 4"),
    ("debt", "ALTER TABLE public.census ADD COLUMN debt int4; "
             "UPDATE public.census SET debt = (salary % 7) * -300000000 + 5")])
def test_the_chunked_check_reads_class_and_sa_packed_as_unpacked(pg_conn, census, sa, ddl):
    """The pre-swap check of the parts' output reads an SA of at most 32 bits with its class id
    in one int8 per row: the same (class, SA, rows) groups as the two separate aggregates, for
    int4, int2 and negative values near the 32-bit range."""
    if ddl:
        pg_conn.execute(ddl)
    pg_conn.execute(
        "CREATE FUNCTION public.packed_as_unpacked(statement text) RETURNS text LANGUAGE plpython3u AS $fn$\n"
        + installer.bootstrap("sabre") +
        "import json\n"
        "import numpy as np\n"
        "from sabre_plpy.batch import partition as P\n"
        "saved, seen = P._part_groups, []\n"
        "def groups(plpy_, req, summary, output, small_classes=False):\n"
        "    got = saved(plpy_, req, summary, output, small_classes)\n"
        "    if small_classes:\n"
        "        other = saved(plpy_, req, summary, output, False)\n"
        "        seen.append([len(got[0]), all(np.array_equal(a, b) for a, b in zip(got, other))])\n"
        "    return got\n"
        "P._part_groups = groups\n"
        "try:\n"
        "    plpy.execute(statement)\n"
        "finally:\n"
        "    P._part_groups = saved\n"
        "return json.dumps(seen)\n$fn$")
    statement = call(pg_conn, "public.views_packed", sa, "refine",
                     {"hierarchies": {"sex": census["sex"]}, "auto_partition_rows": 1000})
    seen = json.loads(pg_conn.execute("SELECT public.packed_as_unpacked(%s)", (statement,)).fetchone()[0])
    assert seen and all(same for _, same in seen) and sum(n for n, _ in seen) > 100
