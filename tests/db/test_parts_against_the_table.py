"""Parts of a one-backend partitioned run cut against the table (docs/scale-out.md, "Parts cut
against the table"): a 'refine' or 'mondrian' part over a numerical SA (integer, float,
numeric) or a named hierarchy gets the table's t and the table's SA counts, its SA in the
table's domain, instead of its budget t - EMD(part, table); 'ak' and a flat text SA keep the
budget.  Every output: 0 violations by sabre_verify, every source row once, the exact
generalization; the classes differ from the budget's exactly where the table's counts are
taken (the same where the budget stays)."""
from __future__ import annotations

import json

import pytest
from psycopg import sql

from sabre_pg import installer
from tests.db.helpers import anonymize, check_exact_generalization, run_row, scalar, verify
from tests.db.test_io_speed import hashes
from tests.db.test_partitioned import census  # noqa: F401 (the census fixture)

QIS = ["age", "education", "sex"]
T, K = 0.3, 5


@pytest.fixture
def traced(pg_conn):
    """public.traced(sql, force): runs the statement, each part's choice recorded (force
    'budget': every part takes its budget, as before parts were cut against the table);
    returns the choices as a JSON list."""
    pg_conn.execute(
        "CREATE FUNCTION public.traced(statement text, force text) RETURNS text LANGUAGE plpython3u AS $fn$\n"
        + installer.bootstrap("sabre") +
        "import json\n"
        "from sabre_plpy.batch import partition as P\n"
        "saved, seen = P.against_the_table, []\n"
        "P.against_the_table = lambda *a: seen.append(saved(*a) and force != 'budget') or seen[-1]\n"
        "try:\n"
        "    plpy.execute(statement)\n"
        "finally:\n"
        "    P.against_the_table = saved\n"
        "return json.dumps(seen)\n$fn$")
    return lambda statement, force="": json.loads(
        pg_conn.execute("SELECT public.traced(%s, %s)", (statement, force)).fetchone()[0])


@pytest.mark.parametrize("method, sa, against", [
    ("refine", "salary", True), ("refine", "grade", True), ("refine", "marital", True), ("mondrian", "income", True),
    ("refine", "job", False), ("ak", "salary", False)])
def test_parts_are_cut_against_the_table(pg_conn, census, traced, method, sa, against):
    pg_conn.execute("ALTER TABLE public.census ADD COLUMN income float8, ADD COLUMN grade numeric, "
                    "ADD COLUMN job text")
    pg_conn.execute("UPDATE public.census SET income = (id % 13) * 1.5 + (salary % 7), grade = (id % 11) / 4.0 "
                    "+ salary % 3, job = 'j' || (salary * 7 % 6)")
    hierarchies = {k: v for k, v in census.items() if k == "sex" or k == sa}
    opts = {"hierarchies": hierarchies, "auto_partition_rows": 1000, "seed": 7}
    outputs = {}
    for force in ("", "budget"):
        output = "public.parts_%s" % (force or "table")
        call = sql.SQL("SELECT * FROM sabre.sabre_anonymize('public.census'::regclass, {}, {}, {}, {}, {}, {}, "
                       "{}::jsonb)").format(*map(sql.Literal, (QIS, sa, T, K, method, output, json.dumps(opts))))
        seen = traced(call.as_string(pg_conn), force)
        assert len(seen) >= 4 and set(seen) == {against and not force}
        res = pg_conn.execute("SELECT r.run_id, r.classes FROM sabre.runs r WHERE r.output_oid = %s::regclass "
                              "ORDER BY r.run_id DESC LIMIT 1", (output,)).fetchone()
        assert run_row(pg_conn, res[0])["partitions"]["automatic"] is True
        checked = verify(pg_conn, output, sa, T, K, hierarchies.get(sa))
        assert checked["violations"] == 0 and checked["max_emd"] <= T and checked["min_class_size"] >= K
        assert checked["classes"] == res[1]
        assert scalar(pg_conn, "SELECT count(DISTINCT key) FROM %s_keys" % output) == \
            scalar(pg_conn, "SELECT count(*) FROM public.census")
        check_exact_generalization(pg_conn, output, "public.census", hierarchies=hierarchies)
        outputs[force] = hashes(pg_conn, output)
    # against the table, the exact EMD to it decides the cuts the budget decided before
    assert (outputs[""] != outputs["budget"]) is against
