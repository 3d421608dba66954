"""The run's read of the source starts at the table's first block (synchronize_seqscans off
for it) and runs in this backend alone (max_parallel_workers_per_gather 0: a parallel scan
under a Gather, which the planner took for a part's filtered view of a 10M-row table,
interleaves its workers' rows, so the same call gave 382,637, 382,692 and 382,745 classes): a synchronized scan of a table over shared_buffers / 4 starts where another session's
scan of it is or stopped, so the rows came in a rotated order, ties were broken otherwise and
the classes changed from run to run of the same call (1M census-like rows: 69,151 classes from
the first block, 69,206 and 69,218 after other scans had stopped at other places; measured by
hand, docs/anonymize.md).  Checked here where it is decided: the settings in force while the
read's rows are decoded, for one SA, several, and the parts of a partitioned run."""
from __future__ import annotations

import json

import pytest

from sabre_pg import installer
from tests.db.helpers import make_census


@pytest.fixture
def settings_at_read(pg_conn):
    """public.settings_at_read(sql): runs the statement; returns synchronize_seqscans and
    max_parallel_workers_per_gather as they were while each read's rows were decoded (JSON list)."""
    pg_conn.execute(
        "CREATE FUNCTION public.settings_at_read(statement text) RETURNS text LANGUAGE plpython3u AS $fn$\n"
        + installer.bootstrap("sabre") +
        "import json\n"
        "from sabre_plpy.stages import scan as S\n"
        "saved, seen = S.ReadPlan.decode, []\n"
        "def decode(self, row):\n"
        "    seen.append(plpy.execute(\"SELECT pg_catalog.current_setting('synchronize_seqscans') || ' ' || \"\n"
        "                             \"pg_catalog.current_setting('max_parallel_workers_per_gather') AS s\")[0]['s'])\n"
        "    return saved(self, row)\n"
        "S.ReadPlan.decode = decode\n"
        "try:\n"
        "    plpy.execute(statement)\n"
        "finally:\n"
        "    S.ReadPlan.decode = saved\n"
        "return json.dumps(seen)\n$fn$")
    return lambda statement: json.loads(pg_conn.execute("SELECT public.settings_at_read(%s)", (statement,)).fetchone()[0])


@pytest.mark.parametrize("sensitive, options", [("'salary'", {}), ("ARRAY['salary', 'age']", {}),
                                                ("'salary'", {"auto_partition_rows": 200})])
def test_the_read_starts_at_the_first_block(pg_conn, settings_at_read, sensitive, options):
    hierarchies = make_census(pg_conn, rows=600)
    qis = "ARRAY['education', 'sex']" if sensitive.startswith("ARRAY") else "ARRAY['age', 'education', 'sex']"
    t = "ARRAY[0.4, 0.4]" if sensitive.startswith("ARRAY") else "0.4"
    if options:
        options["hierarchies"] = {"sex": hierarchies["sex"]}      # (the parts read through views)
    before = pg_conn.execute("SELECT current_setting('max_parallel_workers_per_gather')").fetchone()[0]
    seen = settings_at_read("SELECT * FROM sabre.sabre_anonymize('public.census'::regclass, %s, %s, %s, 5, "
                            "'refine', 'public.census_read', '%s'::jsonb)" % (qis, sensitive, t, json.dumps(options)))
    assert seen == ["off 0"] * (len(seen) if options else 1) and len(seen) >= (2 if options else 1)
    assert pg_conn.execute("SELECT current_setting('synchronize_seqscans'), "
                           "current_setting('max_parallel_workers_per_gather')").fetchone() == ("on", before)
