"""``sabre-pg`` command line.

Infrastructure commands (install, upgrade, uninstall, check, server) live here.
The others dispatch lazily to their modules, so adding one means adding a module:

* ``demo``  -> ``sabre_pg.demo.main(args)``
* ``bench`` -> ``sabre_pg.bench.main(args)``
* ``gen``   -> ``sabre_pg.datasets.cli_gen(args, conn)``
* ``load``  -> ``sabre_pg.datasets.cli_load(args, conn)``
* ``anonymize`` -> :func:`anonymize` here, over ``sabre_pg.api`` (progress: ``sabre_pg.progress``)

``demo`` also gets unrecognised options in ``args.extra``; ``demo`` and ``bench`` connect
with ``sabre_pg.connect.connect(args)``. Errors are printed without a traceback
(with SQLSTATE and HINT for database errors) and exit non-zero.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys

import sabre_pg
from sabre_pg.errors import SabreError, from_database, missing_extra

PASS_THROUGH = {"demo"}
# Third-party modules a command imports that come with an extra: {command: {module: extra}}.
# A command missing one says which extra to install instead of ending in ModuleNotFoundError.
COMMAND_EXTRAS = {"bench": {"tqdm": "bench", "matplotlib": "bench", "anonypyx": "bench", "pandas": "bench"}}


def _add_db_args(p: argparse.ArgumentParser, schema_flag: str = "--schema") -> None:
    p.add_argument("--dsn", help="libpq conninfo or postgresql:// URL (default: $DATABASE_URL, "
                                 "then PG* variables, then the embedded cluster)")
    p.add_argument(schema_flag, dest="sabre_schema", default="sabre", metavar="SCHEMA",
                   help="schema sabre-pg is installed in (default: sabre)")


def add_bench_options(p: argparse.ArgumentParser) -> None:
    """The options of ``sabre-pg bench`` (``sabre_pg.bench`` reads them): one short help line each."""
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--instant", action="store_true",
                      help="S-INSTANT against the exhaustive optimum instead")
    mode.add_argument("--multi-sa", action="store_true",
                      help="two SAs against each alone and Mondrian instead")
    mode.add_argument("--stream", action="store_true",
                      help="the stream experiment instead (SABRE_W, Figs 15-16)")
    mode.add_argument("--speed", action="store_true",
                      help="each method against a plain copy: time, VmHWM")
    mode.add_argument("--citus", action="store_true",
                      help="Citus: a distributed table against one node")
    p.add_argument("--quick", action="store_true", help="small n and few points (under a minute)")
    p.add_argument("--full", action="store_true", help="with --stream: the full sizes (500k rows)")
    p.add_argument("--rows", type=int, metavar="N", help="n of the main configuration")
    p.add_argument("--queries", type=int, metavar="Q", help="queries per workload (10000; --quick 1000)")
    p.add_argument("--sizes", metavar="N,N,...", help="n values of the scalability sweep")
    p.add_argument("--designs", metavar="D,D", help="with --citus: shard_local,qi_local (default: both)")
    p.add_argument("--no-peer", action="store_true", help="skip the Mondrian peer (anonypyx)")
    p.add_argument("--seed", type=int, default=1, help="data and workload seed (default: 1)")
    p.add_argument("--keep", action="store_true", help="keep the output tables")


def _add_run_commands(sub) -> None:
    """``anonymize`` and ``advance``: the commands that run sabre with progress on stderr."""
    p = sub.add_parser("anonymize", help="run sabre_anonymize with progress, then sabre_verify")
    _add_db_args(p)
    p.add_argument("source", help="table or view to anonymize (resolved with the session's search_path)")
    p.add_argument("--qi", nargs="+", required=True, metavar="COLUMN", help="quasi-identifiers")
    p.add_argument("--sensitive", required=True, metavar="COLUMN", help="the sensitive attribute")
    p.add_argument("-t", type=float, required=True, help="t-closeness threshold (0 < t <= 1)")
    p.add_argument("-k", type=int, default=1, help="k-anonymity (default: 1)")
    p.add_argument("--method", choices=["refine", "ak", "knn", "mondrian"], default="refine",
                   help="default: refine (t-Mondrian with searched cuts); ak, knn: the paper's SABRE-AK, SABRE-KNN")
    p.add_argument("--output", help="output relation (default: <source>_sabre beside the source)")
    p.add_argument("--hierarchy", action="append", default=[], metavar="COLUMN=NAME",
                   help="a column's hierarchy (options.hierarchies); repeatable")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="an option of sabre_anonymize, VALUE as JSON or else text, e.g. seed=3, "
                        "labels=true, keep='[\"id\"]'; repeatable")
    p.add_argument("--progress", choices=["auto", "bar", "lines", "none"], default="auto",
                   help="progress on stderr: a bar on a terminal, plain lines otherwise (default: auto)")
    p.add_argument("--parts", type=int, metavar="N",
                   help="a partitioned run in N parts, each read and anonymized alone (options.partitions; "
                        "docs/scale-out.md): bounded memory per backend")
    p.add_argument("--parallel", type=int, default=1, metavar="W",
                   help="with --parts: W parts at a time, each on its own connection (default 1: one backend, "
                        "one part after another)")

    p = sub.add_parser("advance", help="advance a stream (sabre_stream_advance) with progress")
    _add_db_args(p)
    p.add_argument("stream", help="the stream's name (sabre_stream_create's name)")
    p.add_argument("--max", type=int, metavar="N", help="at most N advances (default: every step that has arrived)")
    p.add_argument("--progress", choices=["auto", "bar", "lines", "none"], default="auto",
                   help="progress on stderr: a bar on a terminal, plain lines otherwise (default: auto)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sabre-pg", description="SABRE t-closeness anonymization in PostgreSQL")
    parser.add_argument("--version", action="version", version=f"sabre-pg {sabre_pg.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("install", help="install sabre-pg into a database (needs a superuser)")
    _add_db_args(p)
    p = sub.add_parser("upgrade", help="upgrade an installation (same as install)")
    _add_db_args(p)
    p = sub.add_parser("uninstall", help="drop the sabre schema; anonymized outputs are kept")
    _add_db_args(p)
    p.add_argument("--purge", action="store_true",
                   help="also drop the relations recorded runs created (those still carrying the run's identity)")
    p.add_argument("--cascade", action="store_true",
                   help="also drop other objects that depend on what is dropped (e.g. views on sabre.runs); "
                        "without it, uninstall refuses and lists them")
    p = sub.add_parser("check", help="check the server and the installation: its catalog against a reference install, "
                                        "then sabre_selftest() (skipped on any difference); warnings for "
                                        "capturable search_path settings")
    _add_db_args(p)
    p.add_argument("--json", action="store_true", help="print the report as JSON")

    p = sub.add_parser("server", help="the embedded PostgreSQL cluster")
    p.add_argument("action", choices=["start", "stop", "status"])
    p.add_argument("--data-dir", help="cluster directory (default: ~/.local/share/sabre-pg/cluster, "
                                      "or /var/lib/sabre-pg/cluster as root)")
    p.add_argument("--port", type=int, help="port (default: remembered, else 54329 or the first free one)")

    p = sub.add_parser("demo", help="load a data set, anonymize it and verify the result")
    _add_db_args(p)
    p = sub.add_parser("bench", help="run the benchmarks (docs/evaluation.md)",
                       description="Reruns the paper's experiments on generated census data (docs/evaluation.md): "
                                   "by default the §6 suite; --instant, --multi-sa, --stream, --speed or --citus "
                                   "runs that experiment instead.")
    _add_db_args(p)
    p.add_argument("--out", default="bench-out", help="output directory (default: bench-out)")
    add_bench_options(p)

    _add_run_commands(sub)

    p = sub.add_parser("gen", help="generate a synthetic CENSUS-like table")
    _add_db_args(p, "--sabre-schema")
    p.add_argument("--table", default="census")
    p.add_argument("--schema", default="public", help="schema of the table (default: public)")
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--no-hierarchies", action="store_true", help="do not register hierarchies")
    p.add_argument("--replace", action="store_true", help="replace an existing table")

    p = sub.add_parser("load", help="load an ARX-format CSV data set with its hierarchies")
    _add_db_args(p, "--sabre-schema")
    p.add_argument("csv", help="the data CSV (header row, ';'-separated by default)")
    p.add_argument("--hierarchies", help="directory of <prefix>_hierarchy_<column>.csv (default: beside the CSV)")
    p.add_argument("--table", help="table name (default: from the file name)")
    p.add_argument("--schema", default="public", help="schema of the table (default: public)")
    p.add_argument("--delimiter", default=";")
    p.add_argument("--replace", action="store_true", help="replace an existing table")
    return parser


def _print_report(report: dict) -> None:
    """One ``key  value`` line per item; a list prints one element per line (``-`` when empty)."""
    width = max(len(k) for k in report)
    for key, value in report.items():
        if isinstance(value, dict):
            value = json.dumps(value, sort_keys=True)
        elif isinstance(value, list):
            value = ("\n" + " " * (width + 2)).join(map(str, value)) if value else "-"
        print(f"{key.ljust(width)}  {value}")


def key_values(items: list[str], flag: str, as_json: bool) -> dict:
    """``KEY=VALUE`` arguments as a dict; with ``as_json`` a VALUE that parses as JSON is that."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SabreError(f"{flag} {item!r}: expected KEY=VALUE")
        if as_json:
            try:
                value = json.loads(value)
            except ValueError:
                pass
        out[key] = value
    return out


def _display(progress: str):
    """The progress callback ``--progress`` asks for (None for ``none``)."""
    from sabre_pg.progress import ProgressDisplay

    return None if progress == "none" else ProgressDisplay(bar={"auto": None, "bar": True, "lines": False}[progress])


def anonymize(args: argparse.Namespace) -> int:
    """``sabre-pg anonymize``: one run with progress, its summary, then sabre_verify's."""
    from sabre_pg import api
    from sabre_pg.connect import connect

    options = key_values(args.option, "--option", as_json=True)
    hierarchies = key_values(args.hierarchy, "--hierarchy", as_json=False)
    if args.parts is not None and args.parallel > 1:
        return _anonymize_partitioned(args, options, hierarchies)
    display = _display(args.progress)
    if args.parts is not None:
        options["partitions"] = args.parts
    with connect(args, autocommit=True) as conn:
        try:
            run = api.anonymize(conn, args.source, args.qi, args.sensitive, args.t, args.k, method=args.method,
                                output=args.output, hierarchies=hierarchies or None, options=options,
                                schema=args.sabre_schema, progress=display)
        finally:
            if display is not None:
                display.close()
        return _report_and_verify(args, conn, run, options, hierarchies)


def advance(args: argparse.Namespace) -> int:
    """``sabre-pg advance``: a stream's advances with progress (as ``anonymize``), one line each."""
    from sabre_pg import api
    from sabre_pg.connect import connect

    display = _display(args.progress)
    with connect(args, autocommit=True) as conn:
        try:
            done = api.stream_advance(conn, args.stream, args.max, schema=args.sabre_schema, progress=display)
        finally:
            if display is not None:
                display.close()
    for a in done:
        emd = "n/a" if a["max_emd"] is None else "%.4f" % a["max_emd"]
        print("advance %d (case %d): %d rows in %d classes, max EMD %s, %.2f s" % (
            a["advance_no"], a["case_no"], a["rows"], a["classes"], emd, a["seconds"]))
    if not done:
        print("no complete step has arrived: nothing to advance")
    return 0


def _anonymize_partitioned(args: argparse.Namespace, options: dict, hierarchies: dict) -> int:
    """``sabre-pg anonymize --parts N --parallel W``: the parts on W connections (sabre_pg.partitioned)."""
    from sabre_pg import api
    from sabre_pg.connect import connect, resolve_dsn

    dsn = resolve_dsn(args)

    def on_part(p: dict) -> None:
        if args.progress != "none":
            print("part %d/%d: %d rows, %d classes, max EMD to its part %.4f, %.1f s" % (
                p["part"] + 1, p["parts"], p["rows"], p["classes"], p["max_emd"], p["seconds"]), file=sys.stderr)

    run = api.anonymize_partitioned(dsn, args.source, args.qi, args.sensitive, args.t, args.k, method=args.method,
                                    output=args.output, hierarchies=hierarchies or None, options=options,
                                    partitions=args.parts, parallel=args.parallel, schema=args.sabre_schema,
                                    on_part=on_part)
    with connect(args, autocommit=True) as conn:
        return _report_and_verify(args, conn, run, options, hierarchies)


def _report_and_verify(args, conn, run, options: dict, hierarchies: dict) -> int:
    """A run's summary, then sabre_verify's; the exit status."""
    from sabre_pg import api

    _print_report(run.summary())
    checked = api.verify_summary(conn, run, args.sensitive, args.t, args.k,
                                 hierarchy={**options.get("hierarchies", {}), **hierarchies}.get(args.sensitive),
                                 schema=args.sabre_schema)
    print("verify: %d classes, %d violations, max EMD %.4f, smallest class %d -> %s" % (
        checked["classes"], checked["violations"], checked["max_emd"], checked["min_class_size"],
        "OK" if checked["violations"] == 0 else "FAILED"))
    return 0 if checked["violations"] == 0 else 1


def _plugin(module: str):
    try:
        return importlib.import_module(f"sabre_pg.{module}")
    except ModuleNotFoundError as e:
        if e.name == f"sabre_pg.{module}":
            raise SabreError(f"this command is not available yet (module sabre_pg.{module} is missing)") from None
        raise


def run(args: argparse.Namespace) -> int:
    from sabre_pg import citus, installer
    from sabre_pg.connect import connect

    cmd = args.command
    if cmd == "server":
        from sabre_pg.cluster import LocalCluster

        cluster = LocalCluster(args.data_dir, args.port)
        if args.action == "start":
            cluster.start()
            print(f"running; connect with: psql \"{cluster.dsn()}\"")
        elif args.action == "stop":
            print("stopped" if cluster.stop() else "not running")
        else:
            _print_report(cluster.status())
        return 0
    if cmd in ("install", "upgrade"):
        with connect(args) as conn:
            res = installer.install(conn, args.sabre_schema)
            print(f"sabre-pg {res['version']} installed in schema {res['schema']} (build {res['build_id']})")
            for node in citus.install_workers(conn, args.sabre_schema):  # none unless a Citus coordinator
                print(f"  and on Citus worker {node['node']} (build {node['build_id']})")
        return 0
    if cmd == "uninstall":
        with connect(args) as conn:
            res = installer.uninstall(conn, args.sabre_schema, purge=args.purge, cascade=args.cascade)
            print(f"schema {res['schema']} dropped"
                  + (f"; dropped outputs: {', '.join(res['dropped_outputs'])}" if res["dropped_outputs"] else "")
                  + (f"; dropped dependents: {'; '.join(res['dropped_dependents'])}" if res["dropped_dependents"] else ""))
            for node in citus.uninstall_workers(conn, args.sabre_schema, args.cascade):  # none unless a Citus coordinator
                print(f"  and on Citus worker {node['node']}"
                      + (f" (dropped dependents: {'; '.join(node['dropped_dependents'])})"
                         if node["dropped_dependents"] else ""))
        return 0
    if cmd == "check":
        with connect(args) as conn:
            report = installer.check(conn, args.sabre_schema)
            nodes = citus.check_workers(conn, args.sabre_schema)  # none unless a Citus coordinator
        if nodes:
            report["citus_workers"] = nodes
            report["ok"] = report["ok"] and all(n["ok"] for n in nodes)
        if args.json:
            print(json.dumps(report, indent=2, sort_keys=True))
        else:
            _print_report({k: v for k, v in report.items() if k != "citus_workers"})
            for node in nodes:
                print(f"\nCitus worker {node['node']}:")
                _print_report({k: v for k, v in node.items() if k not in ("node", "role")})
        return 0 if report["ok"] else 1
    if cmd == "anonymize":
        return anonymize(args)
    if cmd == "advance":
        return advance(args)
    if cmd in ("gen", "load"):
        datasets = _plugin("datasets")
        with connect(args) as conn:
            getattr(datasets, f"cli_{cmd}")(args, conn)
        return 0
    rc = _plugin(cmd).main(args)  # demo, bench
    return int(rc or 0)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command not in PASS_THROUGH:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra = extra
    try:
        return run(args)
    except SabreError as e:
        print(f"error: {e}", file=sys.stderr)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except ModuleNotFoundError as e:
        extra = missing_extra(e, COMMAND_EXTRAS.get(args.command, {}), f"sabre-pg {args.command}")
        if extra is None:
            raise
        print(f"error: {extra}", file=sys.stderr)
    except Exception as e:  # psycopg is imported lazily; its errors are recognised by from_database
        error = from_database(e)
        if error is None:
            raise
        print(f"error: {error}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
