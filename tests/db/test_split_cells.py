"""The split's cells (docs/scale-out.md, "Automatic partitions"): a numerical QI whose buckets
each hold one value (an integer or date QI with a bucket per integer, or a QI of one value)
gets its cells' smallest and largest values from the bucket, not from min/max aggregates
(``partition._one_value_buckets``).  The cells are the same as the aggregates give, for int2,
int4, int8 beyond 2^53, dates, a one-value float column, and QIs whose buckets hold several
values (floats, one spanning exactly as many units as buckets, a wide integer range), so
the parts are the same."""
from __future__ import annotations

import json

import pytest

from sabre_pg import installer
from tests.db.helpers import scalar, verify
from tests.db.test_partitioned import census  # noqa: F401 (the census fixture)

T, K = 0.3, 5


@pytest.fixture
def cells_both_ways(pg_conn):
    """public.cells_both_ways(statement): runs the statement with each call of
    ``partition._cells`` made twice, with and without one-value buckets; returns per call
    [QIs aggregated without them, QIs taken from the buckets, equal arrays]."""
    pg_conn.execute(
        "CREATE FUNCTION public.cells_both_ways(statement text) RETURNS text LANGUAGE plpython3u AS $fn$\n"
        + installer.bootstrap("sabre") +
        "import json\n"
        "import numpy as np\n"
        "from sabre_plpy.batch import partition as P\n"
        "saved_cells, saved_one, seen = P._cells, P._one_value_buckets, []\n"
        "def cells(plpy_, req, summary, nums, bounds):\n"
        "    got = saved_cells(plpy_, req, summary, nums, bounds)\n"
        "    sizes = P.bucket_counts(nums, bounds, len(summary.counts))\n"
        "    ones = [a.name for a, (lo, hi), z in zip(nums, bounds, sizes) if saved_one(a, lo, hi, z)]\n"
        "    P._one_value_buckets = lambda *a: False\n"
        "    try:\n"
        "        ref = saved_cells(plpy_, req, summary, nums, bounds)\n"
        "    finally:\n"
        "        P._one_value_buckets = saved_one\n"
        "    seen.append([len(got.n), ones, all(np.array_equal(getattr(got, f), getattr(ref, f)) for f in ('bucket', 'lo', 'hi', 'code', 'n'))])\n"
        "    return got\n"
        "P._cells = cells\n"
        "try:\n"
        "    plpy.execute(statement)\n"
        "finally:\n"
        "    P._cells = saved_cells\n"
        "return json.dumps(seen)\n$fn$")
    return lambda statement: json.loads(pg_conn.execute("SELECT public.cells_both_ways(%s)",
                                                        (statement,)).fetchone()[0])


@pytest.mark.parametrize("qis, one_value", [
    (["age", "education", "sex"], {"age", "education"}),
    (["small", "born", "sex"], {"small", "born"}),
    (["huge", "flat", "sex"], {"huge", "flat"}),
    (["income", "wide", "sex"], set()),
    (["frac", "age", "sex"], {"age"}),       # a float spanning exactly 255: 256 buckets, not one value each
])
def test_one_value_buckets_give_the_aggregates_cells(pg_conn, census, cells_both_ways, qis, one_value):
    pg_conn.execute(
        "ALTER TABLE public.census ADD COLUMN small int2, ADD COLUMN born date, ADD COLUMN huge int8, "
        "ADD COLUMN flat float8, ADD COLUMN income float8, ADD COLUMN wide int4, ADD COLUMN frac float8")
    pg_conn.execute(
        "UPDATE public.census SET small = (id % 40) - 20, born = DATE '1990-01-01' + (id % 90)::int, "
        "huge = 9007199254740993 + (id % 50) * 3, flat = 2.5, income = (id % 13) * 1.37 + salary % 5, "
        "wide = (id * 7919) % 100003, frac = (id % 256) + CASE WHEN id % 256 IN (0, 255) THEN 0 ELSE 0.25 END")
    hierarchies = {"sex": census["sex"]}
    statement = ("SELECT * FROM sabre.sabre_anonymize('public.census'::regclass, %s, 'salary', %s, %s, 'refine', "
                 "'public.cells_out', '%s'::jsonb)" % (
                     "ARRAY[%s]" % ", ".join("'%s'" % q for q in qis), T, K,
                     json.dumps({"hierarchies": hierarchies, "auto_partition_rows": 1000})))
    seen = cells_both_ways(statement)
    assert len(seen) == 1
    n, ones, same = seen[0]
    assert n > 50 and same and set(ones) == one_value
    checked = verify(pg_conn, "public.cells_out", "salary", T, K)
    assert checked["violations"] == 0 and checked["min_class_size"] >= K
    assert scalar(pg_conn, "SELECT count(*) FROM public.cells_out") == 4000
