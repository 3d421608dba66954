"""Automatic parts (issue 26, docs/scale-out.md "Automatic partitions"): the exactly-once
check of a one-backend partitioned run takes the output's and side table's row counts from
the chunked check of those very relations instead of counting them again.  The outputs are
the same as before that change (hashes taken on main before it, seed 7, threshold forced
small so the census table goes in parts), and every output still holds every source row
once, 0 violations by sabre_verify, the exact generalization.  ('refine''s hashes were taken
again when its parts began to be cut against the table's SA counts instead of a budget,
session of 2026-11-27 #5: a change of method, test_parts_against_the_table.py.)"""
from __future__ import annotations

from tests.db.helpers import anonymize, run_row
from tests.db.test_auto_partition import check_every_row_once
from tests.db.test_io_speed import hashes
from tests.db.test_partitioned import K, QIS, ROWS, T, census  # noqa: F401 (the census fixture)

LIMIT = 1000
BEFORE = {
    "refine": ("d0170560ff3a2a963f96bfdda24ac816", "688a98b3f68276f6af686bb387fbb523",
               "55e3e0ccfeb570e32c8c521c48e05dc1"),
    "ak": ("7da97a8a6215f9745e64d09188b88953", "4ded8648b731668303ecfcb99cb3a3bb", "98b808a384ac60b7e07d9cd9a2fc1cdc"),
}


def test_forced_parts_same_outputs_every_row_once(pg_conn, census):
    got = {}
    for method in BEFORE:
        name = "public.autopart_%s" % method
        res = anonymize(pg_conn, "public.census", QIS, "salary", T, K, method, name,
                        {"hierarchies": census, "auto_partition_rows": LIMIT, "seed": 7})
        assert run_row(pg_conn, res["run_id"])["partitions"]["automatic"] is True
        check_every_row_once(pg_conn, name, res, census)
        got[method] = hashes(pg_conn, name)
    assert got == BEFORE
