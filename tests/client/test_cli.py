"""CLI and DSN resolution, without a database."""
from __future__ import annotations

import pytest
from psycopg.conninfo import conninfo_to_dict

from sabre_pg import cli, connect
from sabre_pg.errors import SabreError

NO_ENV: dict[str, str] = {}


def ns(**kw):
    return cli.build_parser().parse_args(["check", *sum(([f"--{k}", v] for k, v in kw.items()), [])])


def test_explicit_dsn_wins():
    env = {"DATABASE_URL": "postgresql://u@h/db", "PGHOST": "x"}
    assert connect.dsn_source(ns(dsn="host=a dbname=b"), env) == ("arg", "host=a dbname=b")
    assert connect.resolve_dsn(ns(dsn="host=a dbname=b"), env) == "host=a dbname=b"


def test_database_url_before_libpq_vars():
    env = {"DATABASE_URL": "postgresql://u@h/db", "PGHOST": "x"}
    assert connect.dsn_source(ns(), env) == ("env", "postgresql://u@h/db")


@pytest.mark.parametrize("var", ["PGHOST", "PGPORT", "PGDATABASE", "PGUSER", "PGSERVICE"])
def test_libpq_variables_mean_libpq_defaults(var):
    assert connect.dsn_source(ns(), {var: "something"}) == ("libpq", "")
    assert connect.resolve_dsn(ns(), {var: "something"}) == ""


def test_unrelated_or_empty_variables_fall_through_to_embedded():
    env = {"PGPASSWORD": "secret", "PGHOST": "", "DATABASE_URL": ""}
    assert connect.dsn_source(ns(), env) == ("embedded", None)


def test_embedded_cluster_started_on_demand(monkeypatch):
    started = []

    class FakeCluster:
        def __init__(self, schema="sabre"):
            self.schema = schema

        def start(self):
            started.append(self.schema)
            return self

        def dsn(self):
            return "host=/fake port=1 dbname=sabre"

    import sabre_pg.cluster

    monkeypatch.setattr(sabre_pg.cluster, "LocalCluster", FakeCluster)
    assert connect.resolve_dsn(ns(), NO_ENV) == "host=/fake port=1 dbname=sabre"
    assert started == ["sabre"]


def test_resolve_dsn_reads_process_environment(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgresql://from-env/db")
    assert connect.resolve_dsn(ns()) == "postgresql://from-env/db"


def test_parser_subcommands():
    p = cli.build_parser()
    a = p.parse_args(["gen", "--rows", "10", "--seed", "3", "--table", "t"])
    assert (a.rows, a.seed, a.table, a.schema, a.sabre_schema) == (10, 3, "t", "public", "sabre")
    a = p.parse_args(["load", "x.csv", "--hierarchies", "d"])
    assert (a.csv, a.hierarchies, a.delimiter) == ("x.csv", "d", ";")
    a = p.parse_args(["uninstall", "--purge", "--schema", "s"])
    assert a.purge and a.sabre_schema == "s" and not a.cascade
    assert p.parse_args(["uninstall", "--cascade"]).cascade
    a = p.parse_args(["server", "status", "--port", "5999"])
    assert (a.action, a.port) == ("status", 5999)


def test_unknown_options_rejected_except_pass_through(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["install", "--bogus"])
    assert exc.value.code == 2
    assert "--bogus" in capsys.readouterr().err


BENCH_OPTIONS = ("--out", "--instant", "--multi-sa", "--stream", "--speed", "--citus", "--quick", "--full", "--rows",
                 "--queries", "--sizes", "--no-peer", "--seed", "--keep")


def test_bench_help_lists_every_bench_option_on_one_line(monkeypatch, capsys):
    """``sabre-pg bench --help`` shows the experiments and their options, one line each at 80 columns."""
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "--help"])
    assert exc.value.code == 0
    lines = capsys.readouterr().out.split("options:", 1)[1].splitlines()
    for option in BENCH_OPTIONS:
        line = [x for x in lines if x.strip().startswith(option + " ")]
        assert len(line) == 1, option
        index = lines.index(line[0])
        follows = lines[index + 1] if index + 1 < len(lines) else ""
        assert not follows.startswith(" " * 10), "%s: its help takes more than one line" % option


def test_bench_options_parsed_by_the_command_line(capsys):
    """The command line parses the bench options itself (they are listed in --help); an unknown one
    is refused, and the experiments exclude each other."""
    from sabre_pg import bench
    from sabre_pg.bench import stream

    a = cli.build_parser().parse_args(["bench", "--stream", "--full", "--rows", "7", "--out", "o"])
    assert bench.stream_configuration(a) == dict(stream.FULL, rows=7) and a.out == "o" and not a.quick
    assert bench.parse(["--multi-sa", "--quick"]).multi_sa    # the module's own parser has the same options
    for argv in (["bench", "--bogus"], ["bench", "--stream", "--instant"]):
        with pytest.raises(SystemExit) as exc:
            cli.main(argv)
        assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--bogus" in err and "not allowed with argument" in err


def test_missing_plugin_module_is_a_clear_error():
    with pytest.raises(SabreError, match="sabre_pg.no_such_plugin"):
        cli._plugin("no_such_plugin")


def test_connection_error_printed_without_traceback(capsys, tmp_path):
    rc = cli.main(["check", "--dsn", f"host={tmp_path} port=1 connect_timeout=2"])
    err = capsys.readouterr().err
    assert rc == 1
    assert err.startswith("error:") and "Traceback" not in err


def test_report_lists_print_one_item_per_line(capsys):
    cli._print_report({"ok": False, "tampered": ["module a: source differs", "function f() is missing"],
                       "none": []})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["ok", "False"]
    assert lines[1] == "tampered  module a: source differs"
    assert lines[2] == "          function f() is missing"
    assert lines[3].split() == ["none", "-"]


def test_embedded_dsn_names_the_password_file(tmp_path):
    from sabre_pg.cluster import LocalCluster

    cluster = LocalCluster(tmp_path / "c", port=5999)
    dsn = conninfo_to_dict(cluster.dsn())
    assert dsn["passfile"] == str(tmp_path / "c" / "pgpass") and dsn["host"] == str(tmp_path / "c" / "run")
    assert conninfo_to_dict(cluster.dsn("x", tcp=True))["host"] == "127.0.0.1"


@pytest.mark.parametrize("hba, trusting", [
    ("local all all trust\n", True),
    ("host all all 127.0.0.1/32   trust  # old default\n", True),
    ("hostssl all all ::1/128 trust\n", True),
    ("# local all all trust\nlocal all all peer map=sabre\n", False),
    ("local all trusted_role scram-sha-256\n", False),
])
def test_hba_trust_detection(hba, trusting):
    from sabre_pg.cluster import HBA_TEMPLATE, hba_allows_trust

    assert hba_allows_trust(hba) is trusting
    assert not hba_allows_trust(HBA_TEMPLATE.format(superuser="postgres", map="sabre"))


def test_missing_extra_names_the_extra(monkeypatch, capsys):
    """A command whose optional dependency is missing says which extra to install."""
    class Bench:
        @staticmethod
        def main(args):
            __import__("tqdm")   # blocked below

    monkeypatch.setitem(__import__("sys").modules, "tqdm", None)
    monkeypatch.setattr(cli, "_plugin", lambda name: Bench)
    assert cli.main(["bench", "--dsn", "host=/nonexistent"]) == 1
    err = capsys.readouterr().err
    assert "tqdm" in err and "pip install 'sabre-pg[bench]'" in err and "Traceback" not in err


def test_missing_module_that_is_no_extra_is_a_bug(monkeypatch):
    class Bench:
        @staticmethod
        def main(args):
            raise ModuleNotFoundError("No module named 'sabre_pg.nothing'", name="sabre_pg.nothing")

    monkeypatch.setattr(cli, "_plugin", lambda name: Bench)
    with pytest.raises(ModuleNotFoundError):
        cli.main(["bench", "--dsn", "host=/nonexistent"])
