"""Issue 28, independent audit: cases the earlier tests did not cover.

Several SAs never call a solvable table infeasible: a table whose most constraining SA has a
SABRE plan of one class (t = 0.001) but whose rows split into classes at EMD 0 on every SA
(every SA's counts divisible by 3, and the QI separates three identical thirds).  The single
form publishes those classes ('refine', 'mondrian') or one class ('ak', 'knn'); the array form
used to raise 22023 'no feasible solution' there with every method."""
from __future__ import annotations

import pytest

from tests.db.test_multi_sa import verify

SAS, TS = ["s", "s2"], [0.001, 0.5]


@pytest.fixture
def thirds(pg_conn):
    """27 rows: q in 0..2, each third with s = (10 x4, 20 x1, 30 x4) and s2 = (0, 1, 2 x3 each)."""
    pg_conn.execute("CREATE TABLE public.thirds AS SELECT i AS id, i % 3 AS q, "
                    "CASE WHEN i / 3 < 4 THEN 10 WHEN i / 3 < 5 THEN 20 ELSE 30 END AS s, "
                    "(i / 3) % 3 AS s2 FROM pg_catalog.generate_series(0, 26) AS i")
    pg_conn.execute("ALTER TABLE public.thirds ADD PRIMARY KEY (id)")


def run(conn, sensitive, t, method):
    array = isinstance(sensitive, list)
    return conn.execute(
        "SELECT r.classes, r.min_class_size, r.max_emd FROM sabre.sabre_anonymize("
        "source => 'public.thirds'::regclass, quasi_identifiers => ARRAY['q'], sensitive => %s"
        + ("::text[]" if array else "::text") + ", t => %s" + ("::float8[]" if array else "::float8") + ", k => 2, method => %s, output => 'public.thirds_out') AS r",
        (sensitive, t, method)).fetchone()


@pytest.mark.parametrize("method", ["refine", "mondrian", "ak", "knn"])
def test_a_one_class_plan_is_not_infeasible(pg_conn, thirds, method):
    single = run(pg_conn, "s", 0.001, method)
    res = run(pg_conn, SAS, TS, method)
    assert res[0] >= single[0] >= 1 and res[1] >= 2
    if method in ("refine", "mondrian"):      # the QI's three thirds: EMD 0 on both SAs
        assert res[0] == 3 and list(res[2]) == [0.0, 0.0]
    v = verify(pg_conn, "public.thirds_out", SAS, TS, 2)
    assert v[:2] == (res[0], 0)
