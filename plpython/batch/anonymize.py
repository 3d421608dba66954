"""sabre_anonymize: SABRE inside PostgreSQL, in four stages (docs/architecture.md).

1. **request** (``request.py``): every argument checked once, into one immutable request;
2. **scan** (``scan.py``): hierarchies, the SA summary from one ``GROUP BY`` -- on which
   bucketization and ECSize (``sabre_pg.core``, §4.2-4.3) run before any row is read -- and
   one binary scan of the key and every attribute, checked against the summary;
3. **engine** (``sabre_pg.core.sabre``): Hilbert keys, takeOut, generalization, class EMDs;
4. **publish** (``publish.py``): side table, classes and output under temporary names, the
   pre-swap check of the rows written, the swap, and the run's catalog row.

All data moves in bulk, never row by row; any error rolls everything back.  The function runs
with ``search_path = pg_catalog, pg_temp``; the source arrives as an OID.
"""
from __future__ import annotations

import functools
import json
from contextlib import ExitStack

from sabre_pg.core import stopwatch
from sabre_pg.core.metrics import discernibility
from sabre_pg.core.multi_sa import anonymize_multi, most_constraining_of
from sabre_pg.core.parameters import check_k
from sabre_pg.core.sabre import anonymize, plan_from_counts
from sabre_pg.core.stopwatch import Stopwatch

from ..shared import citus, driven
from ..shared import common as C
from ..shared import errors as E
from ..stages import publish, request, scan
from . import citus_qi_local, citus_shards, partition

ENGINE_HINT = "Check the arguments of sabre_anonymize."


def plan_steps(method, options) -> None:
    """Declare the run's steps (docs/progress.md) from the raw arguments, before the first phase
    (``request.build`` checks them): they depend on the method and on options.partitions."""
    try:
        given = json.loads(options) if isinstance(options, str) else dict(options or {})
    except (TypeError, ValueError):
        given = {}
    partitioned = isinstance(given, dict) and given.get("partitions") is not None
    stopwatch.plan(stopwatch.anonymize_plan(method, partitioned))


@E.entry_point
def run(plpy, source, source_name, quasi_identifiers, sensitive, t, k, method, output, options):
    plan_steps(method, options)
    with citus.node_failures(plpy), C.settings(plpy, work_mem="256MB"), ExitStack() as reads:
        clock = Stopwatch()                                                 # (work_mem: hash joins of millions of rows)
        with clock.phase("validate"):
            req = request.build(plpy, source, source_name, quasi_identifiers, sensitive, t, k, method,
                                output, options)
            # a Citus distributed source: pushed down to the workers, QI-local (citus_qi_local.py,
            # options.partitions its number of parts) or shard-local (citus_shards.py), with the
            # run's Citus settings from its first distributed query on
            column = citus_shards.pushdown_column(plpy, req)
            if column:  # the rest is driven by the wrapper's PL/pgSQL (shared/driven.py)
                return driven.later(plpy, functools.partial(_citus_run, req, clock, column), "anonymize")
            reads.enter_context(_through_the_coordinator(plpy, req))
            partitioned = partition.partitions_option(req) is not None    # docs/scale-out.md
            if not partitioned:
                hierarchies = scan.hierarchies(plpy, req)
                encodings = scan.encodings(plpy, hierarchies)
        if partitioned:
            return partition.run(plpy, req, clock, run_part)
        with clock.phase("summary"):
            summary = scan.sa_summary(plpy, req, hierarchies.get(req.sa.name),
                                      spans=partition.automatic_spans(plpy, req))
            auto = partition.automatic(req, summary.rows)   # a large table: parts (docs/scale-out.md)
            plan = None if auto else _plan(req, summary)
        if auto:         # the run's steps become a partitioned run's (step numbers keep going up)
            stopwatch.plan(stopwatch.anonymize_plan(req.method, partitioned=True))
            return partition.run(plpy, req, clock, run_part, summary=summary)
        return _anonymize(plpy, req, hierarchies, encodings, clock, summary=summary, plan=plan)


def _through_the_coordinator(plpy, req):
    """A distributed source the run reads through the coordinator (not pushed down, so not
    driven): its reads open no transaction on the workers (``citus.reads_without_worker_transactions``)."""
    return citus.reads_without_worker_transactions(plpy, citus.distribution_column(plpy, req.source["oid"]) is not None)


def _citus_run(req, clock, column, plpy):
    """A run on a Citus distributed source, from its first distributed statement on: the
    whole table's SA summary of each SA, then the design's run on the workers
    (citus_qi_local.py, options.partitions its number of parts; or citus_shards.py), with the
    run's Citus settings. ``plpy`` is :class:`driven.Statements`: every statement is executed
    by the wrapper, so a worker lost between two of them fails the next one with 08006."""
    with citus.node_failures(plpy), C.settings(plpy, work_mem="256MB"), citus_shards.connections(plpy):
        with clock.phase("validate"):
            hierarchies = scan.hierarchies(plpy, req)
        with clock.phase("summary"):
            summaries = [scan.sa_summary(plpy, req, hierarchies.get(sa.name), sa) for sa in req.sensitive]
            _feasible_k(req, summaries[0].rows)
        design = citus_qi_local if citus_shards.design(req) == "qi_local" else citus_shards
        rows = design.run(plpy, req, clock, column, hierarchies, summaries)
        citus_shards.reach_workers(plpy, req)
        return rows


def run_part(plpy, req, into: publish.Into, summary=None) -> int:
    """One part of a partitioned run in this backend (``partition.run``): the stages of
    sabre_anonymize over the part's rows, written straight into the run's relations ``into``
    (no check, swap or catalog row of its own: the run checks every part against the whole
    table).  ``summary``: the part's SA summary when the split counted it (else scanned).
    Returns the part's number of classes."""
    with C.settings(plpy, work_mem="256MB"):
        hierarchies = scan.hierarchies(plpy, req)
        encodings = scan.encodings(plpy, hierarchies)
        return _anonymize(plpy, req, hierarchies, encodings, Stopwatch(), into, summary=summary)


def _anonymize(plpy, req, hierarchies, encodings, clock, into=None, summary=None, plan=None):
    """Stages 2-4 for one SA (``summary`` and ``plan``: the SA summary and SABRE's plan on it
    when the caller made them, timed in its "summary" phase)."""
    if plan is None:
        with clock.phase("summary"):
            if summary is None:
                summary = scan.sa_summary(plpy, req, hierarchies.get(req.sa.name))
            plan = _plan(req, summary)
    if req.sa.name not in encodings and summary.text_codes() is not None:
        encodings[req.sa.name] = scan.encode(plpy, summary.text_codes())
    clock.phases["summary"] -= sum(plan.phases.values())
    clock.merge(plan.phases)
    with clock.phase("read"):
        data = scan.read(plpy, req, encodings, summary)
    result = _engine(req, data, summary, plan, hierarchies, into)
    clock.merge(result.phases)
    if into is not None:
        return _write_into(plpy, req, data, summary, result, hierarchies, into)
    return _publish(plpy, req, data, summary, result, hierarchies, clock)


@E.entry_point
def run_multi(plpy, source, source_name, quasi_identifiers, sensitive, t, k, method, output, options):
    """The array overload: several SAs, each with its own t (docs/multiple-sa.md).  The same
    stages, with one SA summary per SA; SABRE plans on each.  'refine' (the default) and
    'mondrian' cut the QI space checking every SA (``core.multi_refine``); 'ak' and 'knn'
    start from the most constraining SA and merge classes until every SA holds
    (``core.multi_sa``)."""
    if sensitive is None or t is None:
        raise E.null_not_allowed("sensitive and t must not be NULL", request.SENSITIVE_HINT)
    plan_steps(method, options)
    with citus.node_failures(plpy), C.settings(plpy, work_mem="256MB"), ExitStack() as reads:
        clock = Stopwatch()
        with clock.phase("validate"):
            req = request.build(plpy, source, source_name, quasi_identifiers, list(sensitive), list(t), k, method,
                                output, options)
            # a Citus distributed source: pushed down as the one-SA form is (docs/scale-out.md)
            column = citus_shards.pushdown_column(plpy, req)
            if column:  # the rest is driven by the wrapper's PL/pgSQL (shared/driven.py)
                return driven.later(plpy, functools.partial(_citus_run, req, clock, column), "anonymize")
            reads.enter_context(_through_the_coordinator(plpy, req))
            if partition.partitions_option(req) is not None:
                partition.run(plpy, req, clock, run_part)          # (refuses several SAs)
            hierarchies = scan.hierarchies(plpy, req)
            encodings = scan.encodings(plpy, hierarchies)
        with clock.phase("summary"):
            summaries = [scan.sa_summary(plpy, req, hierarchies.get(sa.name), sa) for sa in req.sensitive]
            base = _base(req, summaries)
        for sa, summary in zip(req.sensitive, summaries):
            if sa.name not in encodings and summary.text_codes() is not None:
                encodings[sa.name] = scan.encode(plpy, summary.text_codes())
        clock.phases["summary"] -= sum(base[1].phases.values())
        clock.merge(base[1].phases)
        with clock.phase("read"):
            data = scan.read(plpy, req, encodings, summaries)
        qis = scan.quasi_identifiers(req, data.data, hierarchies)
        try:
            result = anonymize_multi(qis, data.codes_by_sa, [s.domain() for s in summaries], req.thresholds, req.k,
                                     method=req.method, seed=req.options.seed, takeout=req.options.takeout,
                                     weights=req.options.weights, strategy="auto", base=base,
                                     search=req.options.search, threads=req.options.threads)
        except ValueError as e:
            raise E.invalid_parameter(str(e), ENGINE_HINT)
        # one class is published as it is (it holds every SA: EMD 0), as with one SA: the
        # method found no cut (e.g. constant QIs, a tiny t); no table of >= k rows is infeasible
        clock.merge(result.phases)
        return _publish(plpy, req, data, summaries, result, hierarchies, clock)


def _feasible_k(req, rows):
    """k against the rows of the SA summary (fails fast when k cannot be met)."""
    try:
        check_k(req.k, rows)
    except ValueError as e:
        raise E.invalid_parameter(str(e), "Every equivalence class needs at least k rows: choose k <= %d." % rows)


def _plan(req, summary):
    """Bucketization and ECSize on the SA summary (fails fast when k cannot be met)."""
    _feasible_k(req, summary.rows)
    try:
        return plan_from_counts(summary.counts, summary.domain(), req.t, req.k, req.options.lookahead)
    except ValueError as e:
        raise E.invalid_parameter(str(e), ENGINE_HINT)


def _base(req, summaries):
    """(index, plan) of the most constraining SA: SABRE's plan on each SA's summary.  A plan of
    one class is no reason to refuse the table: the whole table as one class holds every SA,
    a partitioning method may still find cuts the plan's bound does not see (every SA's counts
    divisible: classes at EMD 0), and the single form publishes in that case too."""
    _feasible_k(req, summaries[0].rows)
    try:
        return most_constraining_of([s.counts for s in summaries], [s.domain() for s in summaries],
                                    req.thresholds, req.k, req.options.lookahead)
    except ValueError as e:
        raise E.invalid_parameter(str(e), ENGINE_HINT)


def _engine(req, data, summary, plan, hierarchies, into=None):
    """The core on the rows read; ``into`` (a part of a partitioned run): the default's guard
    runs no second thread beside the search (its memory would add to the search's, which the
    parts bound: docs/scale-out.md), and with ``into.reference`` the classes are cut against
    the table's SA counts."""
    qis = scan.quasi_identifiers(req, data.data, hierarchies)
    try:
        return anonymize(qis, data.sa_codes, summary.domain(), req.t, req.k, method=req.method,
                         seed=req.options.seed, takeout=req.options.takeout, weights=req.options.weights,
                         sa_plan=plan, search=req.options.search,
                         threads=req.options.threads, parallel_guard=into is None,
                         reference=None if into is None else into.reference)
    except ValueError as e:
        raise E.invalid_parameter(str(e), ENGINE_HINT)


def _write_into(plpy, req, data, summary, result, hierarchies, into) -> int:
    keys_table = publish.write_keys(plpy, req, None, data.keys, result, into)
    classes = publish.write_classes(plpy, req, None, result, data.data, keys_table, hierarchies, into)
    publish.write_output(plpy, req, None, classes, keys_table, summary, data.sa_codes, result, into)
    if into.written is not None:
        into.written.add(result.sizes, data.keys if req.key.integer else None)
    return result.n_classes


def _publish(plpy, req, data, summary, result, hierarchies, clock):
    """Stage 4; ``summary`` is a list, one per SA, for the several-SA overload."""
    several = isinstance(summary, list)
    run = publish.begin(plpy, req)
    prev = publish.previous(plpy, req)
    with clock.phase("write_keys"):
        keys_table = publish.write_keys(plpy, req, run, data.keys, result)
    with clock.phase("build_classes"):
        classes = publish.write_classes(plpy, req, run, result, data.data, keys_table, hierarchies)
    with clock.phase("build_output"):
        out = publish.write_output(plpy, req, run, classes, keys_table, summary,
                                   data.codes_by_sa if several else data.sa_codes, result)
    with clock.phase("check"):
        written = publish.check_written(plpy, req, out, result,
                                        [s.hierarchy for s in summary] if several else summary.hierarchy)
    every = written if several else [written]
    written = every[0]
    with clock.phase("swap"):
        publish.swap(plpy, req, run, prev, {"": out, "_classes": classes, "_keys": keys_table})
        publish.comment(plpy, req, run)
    metrics = result.metrics()
    facts = {"quasi_identifiers": [a.name for a in req.qis], "sensitive": req.sa.name, "t": req.t,
             "k": req.k, "method": req.method, "options": req.options.given, "rows": int(written.sizes.sum()),
             "classes": written.classes, "buckets": metrics["buckets"], "u": metrics["U"],
             "min_class_size": written.min_class_size, "max_class_size": int(written.sizes.max()),
             "max_emd": written.max_emd, "ail": metrics["ail"], "discernibility": discernibility(written.sizes)}
    if several:
        facts["u"] = max(u for u in metrics["U"] if u is not None)     # the bucketization's SA
    facts["sensitive_attributes"] = [a.name for a in req.sensitive]
    facts["t_values"], facts["max_emds"] = list(req.thresholds), [w.max_emd for w in every]
    facts["phases"], facts["seconds"] = clock.report(), clock.total()
    output_oid = publish.record(plpy, req, run, facts, hierarchies)
    return [(run.run_id, output_oid, facts["rows"], facts["classes"], facts["min_class_size"],
             facts["max_emds"] if several else facts["max_emd"], facts["ail"], facts["seconds"])]
