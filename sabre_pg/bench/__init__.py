"""``sabre-pg bench``: the experiments of SABRE §6 on the census-like data, in the database.

    sabre-pg bench [--dsn DSN] [--out DIR] [--quick] [--rows N] [--queries Q] [--no-peer]
                   [--sizes 100000,250000,500000] [--seed S] [--keep]
    sabre-pg bench --instant [--quick] ...      S-INSTANT (:mod:`sabre_pg.bench.instant`)
    sabre-pg bench --multi-sa [--quick] ...     several SAs (:mod:`sabre_pg.bench.multi_sa`)
    sabre-pg bench --stream [--full] [--rows N] SABRE_W, Figs 15-16 (:mod:`sabre_pg.bench.stream`)
    sabre-pg bench --speed [--sizes N,...]      plain calls against a plain copy (:mod:`sabre_pg.bench.speed`)
    sabre-pg bench --citus [--rows N] [--designs shard_local,qi_local]
                                                Citus: distributed against one node (:mod:`sabre_pg.bench.citus`)

Every configuration runs ``sabre_anonymize`` (SABRE-AK and SABRE-KNN) on a generated census
table and measures the output with the SQL metric functions (``sabre_utility``,
``sabre_query_error_stats``, ``sabre_kl_divergence``) and ``sabre_verify``.  The Mondrian
t-closeness peer (``anonypyx``, see ``sabre_pg.peer``) runs on the same rows with the SA as a
categorical attribute under a flat hierarchy, and so does SABRE for that comparison.

Three parts:

* :mod:`sabre_pg.bench.runner`: runs one configuration and measures it (once each);
* :mod:`sabre_pg.bench.experiments`: the figures as data (``FIGURES``) and :func:`sweep`;
* :mod:`sabre_pg.bench.report`: ``results.json``, ``results.csv``, ``summary.md``
  (:meth:`Report.markdown`) and ``fig*.png``.

This module holds the command line: :func:`main` and :func:`run_bench`.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from psycopg import sql

from sabre_pg import peer
from sabre_pg.bench.experiments import DEFAULT, FIGURES, QUICK, planned_steps, sweep
from sabre_pg.bench.report import Report
from sabre_pg.bench.runner import Runner

PEER_OPTIONS = ("anonypyx %s: mondrian.Mondrian(df, <QIs>).partition([models.kAnonymity(k), "
                "models.tCloseness(t, df, salary, models.earth_movers_distance_categorical)]); "
                "salary as pandas category (all 50 values), categorical QIs as pre-order leaf positions")


def parse(extra) -> argparse.Namespace:
    """The bench options (``sabre_pg.cli.add_bench_options``, the ones ``sabre-pg bench --help``
    lists) from a list of arguments."""
    from sabre_pg.cli import add_bench_options

    p = argparse.ArgumentParser(prog="sabre-pg bench", add_help=True)
    add_bench_options(p)
    return p.parse_args(extra)


def stream_configuration(opts: argparse.Namespace) -> dict:
    """``sabre_pg.bench.stream``'s REDUCED or FULL (a copy), with ``--rows`` applied to the
    main stream."""
    from sabre_pg.bench import stream

    cfg = dict(stream.FULL if opts.full else stream.REDUCED)
    if opts.rows:
        cfg["rows"] = opts.rows
    return cfg


def run_stream_bench(conn, cfg: dict, out: Path, schema: str) -> dict:
    """The stream experiment with progress (a bar on a terminal); its report written to ``out``."""
    from sabre_pg.bench import stream
    from sabre_pg.progress import steps

    with steps(stream.planned_steps(cfg), "sabre-pg bench --stream", "batch") as step:
        results = stream.run(conn, cfg, schema, step)
    stream.write(results, out)
    return results


def configuration(opts: argparse.Namespace) -> dict:
    """DEFAULT or QUICK (a copy), with ``--rows``, ``--queries`` and ``--sizes`` applied."""
    cfg = {key: (list(value) if isinstance(value, list) else value)
           for key, value in (QUICK if opts.quick else DEFAULT).items()}
    if opts.rows:
        cfg["rows"] = opts.rows
    if opts.queries:
        cfg["queries"] = opts.queries
    if opts.sizes:
        cfg["sizes"] = [int(size) for size in opts.sizes.split(",") if size.strip()]
    return cfg


def peer_note(use_peer: bool, skipped_by_option: bool) -> str:
    if use_peer:
        from importlib.metadata import version

        return "Peer options: " + PEER_OPTIONS % version("anonypyx")
    if skipped_by_option:
        return "Peer skipped (--no-peer)."
    return "Peer skipped: anonypyx is not installed (pip install -e '.[bench]')."


def run_bench(conn, cfg: dict, out: Path, seed: int, keep: bool, use_peer: bool, schema: str,
              note: str) -> Report:
    """Sweep every figure of ``FIGURES`` on ``conn`` (autocommit, search_path holding sabre),
    drop the outputs unless ``keep``, write the report to ``out`` and return it."""
    from sabre_pg.progress import steps

    started = time.perf_counter()
    with steps(planned_steps(cfg, use_peer), "sabre-pg bench") as progress:
        runner = Runner(conn, cfg, seed, schema, progress)
        figures = {figure.id: sweep(runner, figure, cfg, use_peer) for figure in FIGURES}
    total = time.perf_counter() - started
    if not keep:
        runner.drop_outputs()
    server = conn.execute("SELECT pg_catalog.version()").fetchone()[0]
    report = Report(cfg, seed, runner.runs, figures, note, total, server)
    report.write(out)
    return report


def main(args) -> int:
    from sabre_pg.connect import connect

    # the command line parsed them (sabre_pg.cli); a caller passing args.extra instead still works
    opts = args if hasattr(args, "stream") else parse(getattr(args, "extra", []) or [])
    cfg = configuration(opts)
    use_peer = not opts.no_peer and peer.available()
    schema = getattr(args, "sabre_schema", "sabre") or "sabre"
    out = Path(getattr(args, "out", None) or "bench-out")
    if opts.instant:
        return instant_main(args, opts, schema, out)
    if opts.multi_sa:
        return multi_sa_main(args, opts, schema, out)
    if getattr(opts, "speed", False):
        return speed_main(args, opts, schema, out)
    if getattr(opts, "citus", False):
        return citus_main(args, opts, schema, out)
    with connect(args, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path = public, {}").format(sql.Identifier(schema)))
        if opts.stream:
            results = run_stream_bench(conn, stream_configuration(opts), out, schema)
            print(f"stream bench: main {results['main']['total_seconds']:.1f} s, "
                  f"{results['main']['advance_mean']} s per advance; results in {out}/ "
                  "(stream.json, stream.md, fig15.png, fig16.png)")
            return 0
        report = run_bench(conn, cfg, out, opts.seed, opts.keep, use_peer, schema,
                           peer_note(use_peer, opts.no_peer))
    print(f"bench finished in {report.total_seconds:.1f} s; results in {out}/ "
          "(results.json, results.csv, summary.md, fig*.png)")
    return 0


def instant_main(args, opts, schema: str, out: Path) -> int:
    """``sabre-pg bench --instant`` (:mod:`sabre_pg.bench.instant`)."""
    from sabre_pg.bench import instant

    cfg = dict(instant.QUICK if opts.quick else instant.DEFAULT)
    if opts.rows:
        cfg["rows"] = opts.rows
    if opts.sizes:
        cfg["sizes"] = [int(size) for size in opts.sizes.split(",") if size.strip()]
    return run_experiment(args, schema, "--instant", out, "instant.json, instant.md, fig_instant_*.png",
                          lambda conn: instant.run_instant_bench(conn, cfg, out, schema, opts.seed, opts.keep))


def multi_sa_main(args, opts, schema: str, out: Path) -> int:
    """``sabre-pg bench --multi-sa`` (:mod:`sabre_pg.bench.multi_sa`)."""
    from sabre_pg.bench import multi_sa

    cfg = dict(multi_sa.QUICK if opts.quick else multi_sa.DEFAULT)
    if opts.rows:
        cfg["rows"] = opts.rows
    return run_experiment(args, schema, "--multi-sa", out, "multi_sa.json, multi_sa.md, fig_multi_sa.png",
                          lambda conn: multi_sa.run_multi_sa_bench(conn, cfg, out, schema, opts.seed, opts.keep))


def speed_main(args, opts, schema: str, out: Path) -> int:
    """``sabre-pg bench --speed`` (:mod:`sabre_pg.bench.speed`): each method's plain call against a
    plain copy of the same table at each size of --sizes (default 100000,1000000; --quick 100000)."""
    import json

    from sabre_pg.bench import speed
    from sabre_pg.connect import resolve_dsn

    sizes = [int(x) for x in (opts.sizes or ("100000" if opts.quick else "100000,1000000")).split(",") if x.strip()]
    if opts.rows and not opts.sizes:
        sizes = [opts.rows]
    results = speed.run_speed(resolve_dsn(args), sizes, speed.METHODS, 1, schema,
                              echo=lambda text: print(text, flush=True))
    out.mkdir(parents=True, exist_ok=True)
    (out / "speed.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    (out / "speed.md").write_text(speed.curve_table(results) + "\n")
    print(f"bench --speed finished; results in {out}/ (speed.json, speed.md)")
    return 0


def citus_main(args, opts, schema: str, out: Path) -> int:
    """``sabre-pg bench --citus`` (:mod:`sabre_pg.bench.citus`): on a Citus coordinator, the default
    call on a distributed table with each class design of --designs (default: both) against the
    same table on one node (--sizes or --rows; default 1000000, --quick 5000)."""
    from sabre_pg.bench import citus
    from sabre_pg.connect import resolve_dsn

    sizes = citus.QUICK_ROWS if opts.quick else citus.DEFAULT_ROWS
    if opts.sizes:
        sizes = [int(x) for x in opts.sizes.split(",") if x.strip()]
    elif opts.rows:
        sizes = [opts.rows]
    designs = [d.strip() for d in (getattr(opts, "designs", None) or ",".join(citus.DESIGNS)).split(",") if d.strip()]
    try:
        results = citus.run_citus(resolve_dsn(args), sizes, schema, echo=lambda text: print(text, flush=True),
                                  shards=citus.QUICK_SHARDS if opts.quick else None, designs=designs, out=out)
    except citus.NotCitus as e:
        print(f"sabre-pg bench --citus: {e}", file=sys.stderr)
        return 2
    citus.write(results, out)
    print(f"bench --citus finished; results in {out}/ (citus.json, citus.md)")
    return 0


def run_experiment(args, schema: str, flag: str, out: Path, files: str, run) -> int:
    """A separate experiment (``sabre-pg bench <flag>``): ``run(conn)`` on a connection
    (autocommit, ``search_path`` holding sabre) returns a dict with its ``seconds``."""
    from sabre_pg.connect import connect

    with connect(args, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path = public, {}").format(sql.Identifier(schema)))
        result = run(conn)
    print(f"bench {flag} finished in {result['seconds']:.1f} s; results in {out}/ ({files})")
    return 0
