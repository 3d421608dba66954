"""``sabre-pg demo``: generate a census-like table, anonymize it with SABRE-AK, verify it.

On the embedded cluster (no DSN) or any server given with ``--dsn`` / ``$DATABASE_URL`` /
``PG*`` (see :mod:`sabre_pg.connect`):

1. ``datasets.generate_census`` builds ``public.census_demo`` (100 000 rows by default,
   replaced if it exists) and registers its hierarchies;
2. ``sabre_anonymize`` with SABRE-AK, t = 0.35, k = 6 and all seven quasi-identifiers
   (age, sex, education, marital, race, workclass, birthplace) writes
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

from sabre_pg import datasets
from sabre_pg.errors import SabreError

QUASI_IDENTIFIERS = ["age", "sex", "education", "marital", "race", "workclass", "birthplace"]
SENSITIVE = "salary"
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
    t_start = time.perf_counter()
    try:
        gen = datasets.generate_census(conn, table=opts.table, rows=opts.rows, seed=opts.seed,
                                       schema=opts.table_schema, hierarchies=True, replace=True,
                                       sabre_schema=sabre_schema)
    except (ValueError, RuntimeError) as e:
        raise SabreError(str(e)) from e
    source = _qualified(conn, sql.Identifier(opts.table_schema, opts.table).as_string(conn))
    out("generated %s: %d rows in %.2f s" % (source, gen["rows"], gen["seconds"]))

    options = {"hierarchies": gen["hierarchies"], "keep": []}
    qs = sql.Identifier(sabre_schema)
    t0 = time.perf_counter()
    row = conn.execute(
        sql.SQL("SELECT run_id, output::text, rows, classes, min_class_size, max_emd, ail, seconds "
                "FROM {}.sabre_anonymize(source => %s::regclass, quasi_identifiers => %s, "
                "sensitive => %s, t => %s, k => %s, method => %s, options => %s::jsonb)").format(qs),
        (source, QUASI_IDENTIFIERS, SENSITIVE, opts.t, opts.k, opts.method, json.dumps(options)),
    ).fetchone()
    wall = time.perf_counter() - t0
    run_id, output, rows, classes, min_size, max_emd, ail, seconds = row
    output = _qualified(conn, output)

    ver = conn.execute(
        sql.SQL("SELECT classes, violations, max_emd, min_class_size "
                "FROM {}.sabre_verify(%s::regclass, %s, %s, %s)").format(qs),
        (output, SENSITIVE, opts.t, opts.k),
    ).fetchone()
    v_classes, violations, v_emd, v_min = ver

    summary = {
        "run_id": run_id, "source": source, "output": output, "rows": rows, "classes": classes,
        "min_class_size": min_size, "ail": ail, "max_emd": max_emd, "seconds": seconds,
        "wall_seconds": wall, "verify_classes": v_classes, "violations": violations,
        "verify_max_emd": v_emd, "verify_min_class_size": v_min,
        "psql": psql_command(conn, "SELECT * FROM %s LIMIT 10" % output),
        "total_seconds": time.perf_counter() - t_start,
    }
    method = "SABRE-%s" % opts.method.upper()
    out("anonymized with %s, t = %g, k = %d, QIs: %s (run %d)"
        % (method, opts.t, opts.k, ", ".join(QUASI_IDENTIFIERS), run_id))
    out("  output      %s" % output)
    out("  rows        %d" % rows)
    out("  classes     %d (smallest %d)" % (classes, min_size))
    out("  AIL         %.4f" % ail)
    out("  max EMD     %.4f (t = %g)" % (max_emd, opts.t))
    out("  seconds     %.2f in sabre_anonymize (%.2f s wall)" % (seconds, wall))
    out("verify: %d classes, %d violations, max EMD %.4f, smallest class %d -> %s"
        % (v_classes, violations, v_emd, v_min, "OK" if violations == 0 else "FAILED"))
    out("look at it:")
    out("  " + summary["psql"])
    return summary


def main(args) -> int:
    from sabre_pg.connect import connect

    opts = parse_options(args)
    sabre_schema = getattr(args, "sabre_schema", None) or "sabre"
    with connect(args, autocommit=True) as conn:
        summary = run_demo(conn, opts, sabre_schema)
    return 0 if summary["violations"] == 0 else 1
