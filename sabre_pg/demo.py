"""``sabre-pg demo``: generate a census-like table, anonymize it with SABRE-AK, verify it.

On the embedded cluster (no DSN) or any server given with ``--dsn`` / ``$DATABASE_URL`` /
``PG*`` (see :mod:`sabre_pg.connect`):

1. ``datasets.generate_census`` builds ``public.census_demo`` (100 000 rows by default,
   replaced if it exists) and registers its hierarchies;
2. ``sabre_anonymize`` with SABRE-AK, t = 0.35, k = 6 and all seven census quasi-identifiers
   (``census.CENSUS_QIS``: age, sex, education, marital, race, workclass, birthplace) writes
   ``public.census_demo_sabre``;
3. ``sabre_verify`` recomputes t-closeness and k-anonymity from that table alone.

It prints a short summary and the psql command that shows the result, and exits 1 when
the verification finds a violation.  Options (after ``demo``): ``--rows N``,
``--table NAME``, ``--schema NAME``, ``--seed N``, ``-t``, ``-k``, ``--method ak|knn``.
"""
from __future__ import annotations

import argparse
import json
import shlex
import time

from psycopg import sql
from psycopg.conninfo import make_conninfo

from sabre_pg.census import CENSUS_QIS, CENSUS_SENSITIVE
from sabre_pg.census_sql import generate_census
from sabre_pg.errors import SabreError

DEFAULTS = {"rows": 100_000, "table": "census_demo", "schema": "public", "seed": 1,
            "t": 0.35, "k": 6, "method": "ak"}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sabre-pg demo", description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=DEFAULTS["rows"], help="rows to generate (default: 100000)")
    p.add_argument("--table", default=DEFAULTS["table"], help="source table (default: census_demo)")
    p.add_argument("--schema", dest="table_schema", default=DEFAULTS["schema"],
                   help="schema of the source and output tables (default: public)")
    p.add_argument("--seed", type=int, default=DEFAULTS["seed"], help="generator seed (default: 1)")
    p.add_argument("-t", type=float, default=DEFAULTS["t"], help="t-closeness threshold (default: 0.35)")
    p.add_argument("-k", type=int, default=DEFAULTS["k"], help="k-anonymity (default: 6)")
    p.add_argument("--method", choices=["ak", "knn"], default=DEFAULTS["method"], help="default: ak")
    return p


def parse_options(args) -> argparse.Namespace:
    """Demo options from ``args.extra`` (what the main parser did not recognise)."""
    opts = build_parser().parse_args(list(getattr(args, "extra", None) or []))
    if opts.rows < 1:
        raise SabreError("--rows must be at least 1")
    return opts


def psql_conninfo(conn) -> str:
    """A conninfo for the connection actually in use (host or socket dir, port, user, dbname);
    the password, if any, is left out."""
    info = conn.info
    return make_conninfo(host=info.host, port=str(info.port), user=info.user, dbname=info.dbname)


def psql_command(conn, query: str) -> str:
    return "psql %s -c %s" % (shlex.quote(psql_conninfo(conn)), shlex.quote(query))


def _qualified(conn, relation: str) -> str:
    """schema.name of a relation, quoted only where needed (``public.census_demo_sabre``)."""
    return conn.execute(
        "SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname) FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = %s::regclass",
        (relation,)).fetchone()[0]


def run_demo(conn, opts, sabre_schema: str = "sabre", out=print) -> dict:
    """Generate, anonymize, verify on ``conn`` (autocommit). Returns the summary dict."""
    started = time.perf_counter()
    try:
        generated = generate_census(conn, table=opts.table, rows=opts.rows, seed=opts.seed,
                                    schema=opts.table_schema, hierarchies=True, replace=True,
                                    sabre_schema=sabre_schema)
    except (ValueError, RuntimeError) as e:
        raise SabreError(str(e)) from e
    source = _qualified(conn, sql.Identifier(opts.table_schema, opts.table).as_string(conn))
    out("generated %s: %d rows in %.2f s" % (source, generated["rows"], generated["seconds"]))

    options = {"hierarchies": generated["hierarchies"], "keep": []}
    schema = sql.Identifier(sabre_schema)
    anonymize_started = time.perf_counter()
    run = conn.execute(
        sql.SQL("SELECT run_id, output::text, rows, classes, min_class_size, max_emd, ail, seconds "
                "FROM {}.sabre_anonymize(source => %s::regclass, quasi_identifiers => %s, "
                "sensitive => %s, t => %s, k => %s, method => %s, options => %s::jsonb)").format(schema),
        (source, CENSUS_QIS, CENSUS_SENSITIVE, opts.t, opts.k, opts.method, json.dumps(options)),
    ).fetchone()
    wall = time.perf_counter() - anonymize_started
    output = _qualified(conn, run[1])
    verified = conn.execute(
        sql.SQL("SELECT classes, violations, max_emd, min_class_size "
                "FROM {}.sabre_verify(%s::regclass, %s, %s, %s)").format(schema),
        (output, CENSUS_SENSITIVE, opts.t, opts.k),
    ).fetchone()

    summary = {
        **dict(zip(("run_id", "output", "rows", "classes", "min_class_size", "max_emd", "ail",
                    "seconds"), run)),
        "source": source, "output": output, "wall_seconds": wall,
        **dict(zip(("verify_classes", "violations", "verify_max_emd", "verify_min_class_size"),
                   verified)),
        "psql": psql_command(conn, "SELECT * FROM %s LIMIT 10" % output),
        "total_seconds": time.perf_counter() - started,
    }
    _print_summary(summary, opts, out)
    return summary


def _print_summary(summary: dict, opts, out) -> None:
    out("anonymized with SABRE-%s, t = %g, k = %d, QIs: %s (run %d)"
        % (opts.method.upper(), opts.t, opts.k, ", ".join(CENSUS_QIS), summary["run_id"]))
    out("  output      %s" % summary["output"])
    out("  rows        %d" % summary["rows"])
    out("  classes     %d (smallest %d)" % (summary["classes"], summary["min_class_size"]))
    out("  AIL         %.4f" % summary["ail"])
    out("  max EMD     %.4f (t = %g)" % (summary["max_emd"], opts.t))
    out("  seconds     %.2f in sabre_anonymize (%.2f s wall)" % (summary["seconds"], summary["wall_seconds"]))
    violations = summary["violations"]
    out("verify: %d classes, %d violations, max EMD %.4f, smallest class %d -> %s"
        % (summary["verify_classes"], violations, summary["verify_max_emd"],
           summary["verify_min_class_size"], "OK" if violations == 0 else "FAILED"))
    out("look at it:")
    out("  " + summary["psql"])


def main(args) -> int:
    from sabre_pg.connect import connect

    opts = parse_options(args)
    sabre_schema = getattr(args, "sabre_schema", None) or "sabre"
    with connect(args, autocommit=True) as conn:
        summary = run_demo(conn, opts, sabre_schema)
    return 0 if summary["violations"] == 0 else 1
