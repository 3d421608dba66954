"""Several SAs with the partitioning methods through the DB contract (issue 28): the array form
of sabre_anonymize defaults to 'refine', every class holds every SA by sabre_verify and by an
independent numpy check, 'mondrian' checks every SA, and a table whose QIs cannot be cut (one
class is the answer) is published, never refused as infeasible."""
from __future__ import annotations

import json

import psycopg
import pytest

from tests.db.helpers import checksum, run_row
from tests.db.test_multi_sa import QIS, ROWS, independent_violations, patients, verify  # noqa: F401 (fixture)
from sabre_pg.core.hierarchy import Hierarchy

SAS, TS = ["salary", "hours", "marital"], [0.2, 0.15, 0.3]


def anonymize(conn, sensitive, t, k=5, method=None, options=None, source="public.patients", qis=QIS, output=None):
    """The array form; ``method`` None: its default."""
    named = "" if method is None else ", method => %(method)s"
    with conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        return cur.execute(
            "SELECT * FROM sabre_anonymize(source => %(source)s::regclass, quasi_identifiers => %(qis)s::text[], "
            "sensitive => %(sas)s::text[], t => %(ts)s::float8[], k => %(k)s" + named
            + ", output => %(output)s, options => %(options)s::jsonb)",
            dict(source=source, qis=qis, sas=sensitive, ts=t, k=k, method=method, output=output,
                 options=json.dumps(options or {}))).fetchone()


def marital(conn, hierarchies) -> Hierarchy:
    return Hierarchy([r[0] for r in conn.execute(
        "SELECT path FROM sabre.hierarchy_rows WHERE hierarchy = %s", (hierarchies["marital"],))])


@pytest.mark.parametrize("method", [None, "mondrian"])
def test_every_sa_holds_with_the_partitioning_methods(pg_conn, patients, method):
    """The default ('refine') and 'mondrian': every class within the t of every SA (3 SAs: two
    ordered, one hierarchical), by sabre_verify and by numpy from the rows; source unchanged."""
    before = checksum(pg_conn, "public.patients")
    opts = {"hierarchies": {"marital": patients["marital"]}}
    res = anonymize(pg_conn, SAS, TS, method=method, options=opts, qis=["age", "sex", "education"])
    assert res["rows"] == ROWS and res["classes"] > 1 and res["min_class_size"] >= 5
    assert all(0 <= e <= t for e, t in zip(res["max_emd"], TS))
    assert run_row(pg_conn, res["run_id"])["method"] == (method or "refine")
    v = verify(pg_conn, "public.patients_sabre", SAS, TS, 5, [None, None, patients["marital"]])
    assert v == (res["classes"], 0, pytest.approx(res["max_emd"]), res["min_class_size"])
    for sa, t in zip(SAS[:2], TS[:2]):
        assert independent_violations(pg_conn, "patients_sabre", sa, t) == 0
    assert independent_violations(pg_conn, "patients_sabre", "marital", TS[2], marital(pg_conn, patients)) == 0
    assert checksum(pg_conn, "public.patients") == before


def test_the_default_beats_ak_and_mondrian_with_two_sas(pg_conn, patients):
    """The array form's default ('refine') has a lower AIL than 'ak' (the former default) and
    than 'mondrian' on the census-like table with salary and hours."""
    ail = {m: anonymize(pg_conn, ["salary", "hours"], [0.2, 0.15], method=m, output="o_%s" % (m or "default"))["ail"]
           for m in (None, "ak", "mondrian")}
    assert ail[None] < ail["ak"] and ail[None] <= ail["mondrian"], ail


def test_one_sa_in_the_array_form_is_the_single_form(pg_conn, patients):
    """One SA in the array form gives the single-SA form's classes with the same default."""
    res = anonymize(pg_conn, ["salary"], [0.2], output="arr")
    single = pg_conn.execute("SELECT classes, max_emd, ail FROM sabre_anonymize('public.patients'::regclass, %s, "
                             "'salary', 0.2, 5, output => 'single')", (QIS,)).fetchone()
    assert single == (res["classes"], pytest.approx(res["max_emd"][0]), pytest.approx(res["ail"]))


@pytest.fixture
def constant_qis(pg_conn):
    """40 rows whose QIs are constant (no cut is possible) and two independent SAs."""
    pg_conn.execute("CREATE TABLE flat AS SELECT i AS id, 7 AS zone, 'x'::text AS kind, "
                    "(i * 37) % 11 AS cost, (i * 13) % 5 AS stay FROM generate_series(1, 40) i")
    pg_conn.execute("ALTER TABLE flat ADD PRIMARY KEY (id)")


@pytest.mark.parametrize("method", ["refine", "mondrian", "ak", "knn"])
def test_constant_qis_publish_one_valid_class(pg_conn, constant_qis, method):
    """Constant QIs: every method publishes (often one class, the valid answer), where the
    array form used to raise 22023 'no feasible solution' with 'refine' and 'mondrian'."""
    res = anonymize(pg_conn, ["cost", "stay"], [0.3, 0.3], k=5, method=method, source="public.flat",
                    qis=["zone", "kind"], output="flat_out")
    assert res["rows"] == 40 and res["classes"] >= 1 and res["min_class_size"] >= 5
    v = verify(pg_conn, "public.flat_out", ["cost", "stay"], [0.3, 0.3], 5)
    assert v[0] == res["classes"] and v[1] == 0
    assert independent_violations(pg_conn, "flat_out", "cost", 0.3) == 0
    assert independent_violations(pg_conn, "flat_out", "stay", 0.3) == 0


@pytest.mark.parametrize("method", ["refine", "ak"])
def test_a_tiny_t_publishes_valid_classes(pg_conn, patients, method):
    """t = 0.001 on both SAs (the plans allow classes): the classes found, down to the whole
    table as one, are published and hold every SA (this used to be 22023 'no feasible
    solution' whenever one class came out)."""
    res = anonymize(pg_conn, ["salary", "hours"], [0.001, 0.001], method=method)
    assert res["rows"] == ROWS and res["classes"] >= 1
    v = verify(pg_conn, "public.patients_sabre", ["salary", "hours"], [0.001, 0.001], 5)
    assert v[:2] == (res["classes"], 0)


def test_refresh_of_a_refine_run_keeps_every_sa(pg_conn, patients):
    opts = {"hierarchies": {"marital": patients["marital"]}}
    first = anonymize(pg_conn, SAS, TS, options=opts, qis=["age", "sex", "education"])
    again = pg_conn.execute("SELECT run_id, classes FROM sabre_refresh('public.patients_sabre')").fetchone()
    run = run_row(pg_conn, again[0])
    assert run["method"] == "refine" and run["t_values"] == TS and again[1] == first["classes"]
    v = verify(pg_conn, "public.patients_sabre", SAS, TS, 5, [None, None, patients["marital"]])
    assert v[1] == 0
