"""``sabre-pg demo`` end to end on the test database (``pg_dsn``, sabre installed)."""
from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict

from sabre_pg import demo
from sabre_pg.census import CENSUS_QIS

REPO_DIR = Path(__file__).resolve().parents[2]
ROWS = 20_000


def _psql_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("psql ")]
    assert len(lines) == 1, text
    return lines[0]


def _check_summary(text: str, pg_dsn: str) -> str:
    assert f"{ROWS} rows" in text
    assert re.search(rf"^\s*rows\s+{ROWS}$", text, re.M), text
    assert re.search(r"^\s*classes\s+\d+ \(smallest (\d+)\)", text, re.M), text
    assert int(re.search(r"smallest (\d+)\)", text).group(1)) >= 6
    assert re.search(r"^\s*AIL\s+0\.\d+", text, re.M), text
    emd = float(re.search(r"^\s*max EMD\s+([0-9.]+)", text, re.M).group(1))
    assert 0 <= emd <= 0.35
    assert "SABRE-AK, t = 0.35, k = 6" in text
    assert "age, sex, education, marital, race, workclass, birthplace" in text
    assert re.search(r"^verify: \d+ classes, 0 violations, .* -> OK$", text, re.M), text

    line = _psql_line(text)
    argv = shlex.split(line)
    assert argv[0] == "psql" and argv[2] == "-c"
    assert argv[3] == "SELECT * FROM public.census_demo_sabre LIMIT 10"
    used, want = conninfo_to_dict(argv[1]), conninfo_to_dict(pg_dsn)
    for key in ("host", "port", "user", "dbname"):
        assert used[key] == want[key], (key, used, want)
    return line


def test_demo_main(pg_dsn, pg_conn, capsys):
    args = argparse.Namespace(command="demo", dsn=pg_dsn, sabre_schema="sabre",
                              extra=["--rows", str(ROWS)])
    assert demo.main(args) == 0
    out = capsys.readouterr().out
    line = _check_summary(out, pg_dsn)

    n, classes, min_size = pg_conn.execute(
        "SELECT count(*), count(DISTINCT ec_id), min(c) FROM public.census_demo_sabre "
        "JOIN (SELECT ec_id, count(*) AS c FROM public.census_demo_sabre GROUP BY ec_id) g USING (ec_id)"
    ).fetchone()
    assert n == ROWS and min_size >= 6
    assert re.search(rf"^\s*classes\s+{classes} ", out, re.M)
    run = pg_conn.execute("SELECT method, t, k, quasi_identifiers, options->'keep' FROM sabre.runs "
                          "ORDER BY run_id DESC LIMIT 1").fetchone()
    assert run == ("ak", 0.35, 6, CENSUS_QIS, [])

    if shutil.which("psql"):   # the printed command really works
        res = subprocess.run(shlex.split(line), capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        assert "(10 rows)" in res.stdout


def test_demo_cli_reruns(pg_dsn):
    """Through the command line, twice: the table and the output are replaced."""
    cmd = [sys.executable, "-m", "sabre_pg.cli", "demo", "--dsn", pg_dsn, "--rows", str(ROWS)]
    for _ in range(2):
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_DIR, timeout=300)
        assert res.returncode == 0, res.stdout + res.stderr
        _check_summary(res.stdout, pg_dsn)


def test_demo_exits_nonzero_on_violations(pg_dsn, monkeypatch, capsys):
    real = demo.run_demo

    def with_violation(*a, **kw):
        summary = real(*a, **kw)
        summary["violations"] = 3
        return summary

    monkeypatch.setattr(demo, "run_demo", with_violation)
    args = argparse.Namespace(command="demo", dsn=pg_dsn, sabre_schema="sabre", extra=["--rows", "500"])
    assert demo.main(args) == 1


def test_demo_rejects_bad_rows():
    from sabre_pg.errors import SabreError

    with pytest.raises(SabreError):
        demo.parse_options(argparse.Namespace(extra=["--rows", "0"]))
