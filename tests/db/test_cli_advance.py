"""``sabre-pg advance`` and ``sabre_pg.stream_advance`` (docs/progress.md, docs/streams.md): a
stream's advances from the client, with the same progress display as ``sabre-pg anonymize``:
plain lines when stderr is not a terminal, the step never going back."""
from __future__ import annotations

import re

import sabre_pg
from sabre_pg import cli
from tests.db.test_stream import add_rows, create, make_source


def test_cli_advance_prints_each_advance_with_monotone_progress(pg_conn, pg_dsn, capsys):
    make_source(pg_conn, 450)
    create(pg_conn)
    add_rows(pg_conn, 250)                    # 700 rows: advances 1..3 (window 400, step 100)
    assert cli.main(["advance", "adm_w", "--dsn", pg_dsn, "--progress", "lines"]) == 0
    out, err = capsys.readouterr()
    assert re.findall(r"^advance (\d+) ", out, re.M) == ["1", "2", "3"], out
    steps = [(int(a), int(b)) for a, b in re.findall(r"^\[\s*(\d+)/(\d+)\]", err, re.M)]
    assert steps and "\r" not in err
    assert [a for a, _ in steps] == sorted(a for a, _ in steps), err
    assert steps[-1][0] == steps[-1][1] == 5, err        # validate, number, 3 advances
    assert cli.main(["advance", "adm_w", "--dsn", pg_dsn, "--progress", "none"]) == 0
    assert "nothing to advance" in capsys.readouterr().out


def test_api_stream_advance_returns_the_advances(pg_conn, pg_dsn):
    make_source(pg_conn, 450)
    create(pg_conn)
    add_rows(pg_conn, 250)
    events = []
    done = sabre_pg.stream_advance(pg_dsn, "adm_w", 1, progress=events.append)
    assert [a["advance_no"] for a in done] == [1] and done[0]["rows"] > 0
    assert events and events[-1]["step"] == events[-1]["steps"]
    try:
        sabre_pg.stream_advance(pg_dsn, "no_such_stream")
    except sabre_pg.SabreError as e:
        assert e.sqlstate and e.hint and "Traceback" not in str(e)
    else:
        raise AssertionError("an unknown stream must raise")
