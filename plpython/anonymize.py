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

from sabre_pg.core.metrics import discernibility
from sabre_pg.core.parameters import check_k
from sabre_pg.core.sabre import QuasiIdentifier, anonymize, plan_from_counts
from sabre_pg.core.stopwatch import Stopwatch

from . import common as C
from . import errors as E
from . import publish, request, scan

ENGINE_HINT = "Check the arguments of sabre_anonymize."


@E.entry_point
def run(plpy, source, source_name, quasi_identifiers, sensitive, t, k, method, output, options):
    with C.settings(plpy, work_mem="256MB"):   # hash joins of millions of rows
        clock = Stopwatch()
        with clock.phase("validate"):
            req = request.build(plpy, source, source_name, quasi_identifiers, sensitive, t, k, method,
                                output, options)
            hierarchies = scan.hierarchies(plpy, req)
            encodings = {name: scan.encode(plpy, h.leaves) for name, h in hierarchies.items()}
        with clock.phase("summary"):
            summary = scan.sa_summary(plpy, req, hierarchies.get(req.sa.name))
            plan = _plan(req, summary)
        if req.sa.name not in encodings and summary.text_codes() is not None:
            encodings[req.sa.name] = scan.encode(plpy, summary.text_codes())
        clock.phases["summary"] -= sum(plan.phases.values())
        clock.merge(plan.phases)
        with clock.phase("read"):
            data = scan.read(plpy, req, encodings, summary)
        result = _engine(req, data, summary, plan, hierarchies)
        clock.merge(result.phases)
        return _publish(plpy, req, data, summary, result, hierarchies, clock)


def _plan(req, summary):
    """Bucketization and ECSize on the SA summary (fails fast when k cannot be met)."""
    try:
        check_k(req.k, summary.rows)
    except ValueError as e:
        raise E.invalid_parameter(str(e), "Every equivalence class needs at least k rows: choose k <= %d."
                                  % summary.rows)
    try:
        return plan_from_counts(summary.counts, summary.domain(), req.t, req.k, req.options.lookahead)
    except ValueError as e:
        raise E.invalid_parameter(str(e), ENGINE_HINT)


def _engine(req, data, summary, plan, hierarchies):
    qis = [QuasiIdentifier(a.name, data.data[i], hierarchies.get(a.name)) for i, a in enumerate(req.qis)]
    try:
        return anonymize(qis, data.sa_codes, summary.domain(), req.t, req.k, method=req.method,
                         seed=req.options.seed, takeout=req.options.takeout, weights=req.options.weights,
                         sa_plan=plan)
    except ValueError as e:
        raise E.invalid_parameter(str(e), ENGINE_HINT)


def _publish(plpy, req, data, summary, result, hierarchies, clock):
    run = publish.begin(plpy, req)
    prev = publish.previous(plpy, req)
    with clock.phase("write_keys"):
        keys_table = publish.write_keys(plpy, req, run, data.keys, result)
    with clock.phase("build_classes"):
        classes = publish.write_classes(plpy, req, run, result, data.data, keys_table, hierarchies)
    with clock.phase("build_output"):
        out = publish.write_output(plpy, req, run, classes, keys_table, summary, data.sa_codes, result)
    with clock.phase("check"):
        written = publish.check_written(plpy, req, out, result, summary.hierarchy)
    with clock.phase("swap"):
        publish.swap(plpy, req, run, prev, {"": out, "_classes": classes, "_keys": keys_table})
        publish.comment(plpy, req, run)
    metrics = result.metrics()
    facts = {"quasi_identifiers": [a.name for a in req.qis], "sensitive": req.sa.name, "t": req.t,
             "k": req.k, "method": req.method, "options": req.options.given, "rows": int(written.sizes.sum()),
             "classes": written.classes, "buckets": metrics["buckets"], "u": metrics["U"],
             "min_class_size": written.min_class_size, "max_class_size": int(written.sizes.max()),
             "max_emd": written.max_emd, "ail": metrics["ail"], "discernibility": discernibility(written.sizes)}
    facts["phases"], facts["seconds"] = clock.report(), clock.total()
    output_oid = publish.record(plpy, req, run, facts)
    return [(run.run_id, output_oid, facts["rows"], facts["classes"], facts["min_class_size"],
             facts["max_emd"], facts["ail"], facts["seconds"])]
