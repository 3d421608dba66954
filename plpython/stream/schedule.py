"""Scheduled jobs through pg_cron (docs/streams.md, "Scheduling"): a stream's advances
(``sabre_stream_schedule``) and the refresh of a batch output (``sabre_schedule_refresh``,
which reruns the output's recorded ``sabre_anonymize`` call with its atomic replacement).

The jobs themselves are made and removed through ``cron.py`` (pg_cron found as an extension of
the current database, or a HINT on what to install).  A job runs its command as the role that
scheduled it, in this database.
"""
from __future__ import annotations

import json

from ..shared import common as C
from ..shared import driven
from ..shared import errors as E
from ..shared.cron import schedule_job, unschedule_job
from . import stream as S


@E.entry_point
def stream(plpy, name, cron):
    """sabre_stream_schedule: a job calling sabre_stream_advance(name); replaces a previous one."""
    s = S.load(plpy, name, lock=True)
    command = "SELECT * FROM %s(%s)" % (C.catalog("sabre_stream_advance"), plpy.quote_literal(name))
    if s["cron_job"] is not None:
        unschedule_job(plpy, s["cron_job"])
    job = schedule_job(plpy, "sabre_stream_%d" % s["stream_id"], cron, command)
    plpy.execute("UPDATE %s SET cron_job = %d" % (s["state"], job))
    return job


@E.entry_point
def unschedule_stream(plpy, name):
    """sabre_stream_unschedule: False when the stream had no job."""
    s = S.load(plpy, name, lock=True)
    if s["cron_job"] is None:
        return False
    unschedule_job(plpy, s["cron_job"])
    plpy.execute("UPDATE %s SET cron_job = NULL" % s["state"])
    return True


def recorded_run(plpy, output) -> dict:
    """The caller's own last recorded run whose output is ``output`` (an OID or a qualified
    name), checked before anything of the run is read or run (docs/security.md, "Refresh and
    schedule act only on your own runs"): the run and the output belong to the current role
    (42501 otherwise, even for a superuser, who sees every run), and that role can still read
    the source (42501), which still exists (42P01).  The source is the recorded OID and the
    output the recorded qualified name: nothing is resolved through a search_path."""
    rel = C.resolve_relation(plpy, output)
    r = plpy.execute(plpy.prepare(
        "SELECT r.*, r.run_by OPERATOR(pg_catalog.=) CURRENT_USER::pg_catalog.text "
        "AND c.relowner OPERATOR(pg_catalog.=) u.oid AS mine "
        "FROM %s AS o JOIN %s AS r ON r.run_id OPERATOR(pg_catalog.=) o.run_id "
        "JOIN pg_catalog.pg_class AS c ON c.oid OPERATOR(pg_catalog.=) o.output::pg_catalog.oid, "
        "pg_catalog.pg_roles AS u WHERE u.rolname OPERATOR(pg_catalog.=) CURRENT_USER "
        "AND o.output::pg_catalog.oid OPERATOR(pg_catalog.=) $1 ORDER BY r.run_id DESC LIMIT 1"
        % (C.catalog("outputs"), C.catalog("runs")), ["oid"]), [rel["oid"]])
    if not len(r):
        raise E.SabreError(E.UNDEFINED_OBJECT, "%s is not the output of one of your recorded runs" % rel["qname"],
                           "Only outputs of sabre_anonymize (sabre.outputs lists yours) can be refreshed.")
    run = dict(r[0], qname=rel["qname"])
    if not run["mine"]:
        role = plpy.execute(plpy.prepare("SELECT pg_catalog.pg_get_userbyid(c.relowner) AS owner FROM "
                                         "pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) $1", ["oid"]),
                            [rel["oid"]])[0]["owner"]
        raise E.insufficient_privilege(
            "%s is the output of a run by role %s: sabre refreshes and schedules only the current role's own runs"
            % (rel["qname"], C.ident(run["run_by"])),
            "A refresh reruns the recorded call, reading its source with the caller's rights; run it as the role "
            "that owns the run, e.g. SET ROLE %s; SELECT * FROM sabre.sabre_refresh(%s); RESET ROLE; (its pg_cron "
            "job then runs as that role too)." % (C.ident(run["run_by"]), plpy.quote_literal(rel["qname"])),
            "the run's role: %s; the output's owner: %s" % (run["run_by"], role))
    source = plpy.execute(plpy.prepare(
        "SELECT pg_catalog.has_any_column_privilege(c.oid, 'SELECT') AS readable FROM pg_catalog.pg_class c "
        "WHERE c.oid OPERATOR(pg_catalog.=) $1", ["oid"]), [run["source_oid"]])
    if not len(source):
        raise E.undefined_table("the source %s of run %d no longer exists" % (run["source"], run["run_id"]),
                                "Run sabre_anonymize on the new source instead of refreshing.")
    if not source[0]["readable"]:
        raise E.insufficient_privilege(
            "role %s can no longer read the source %s of run %d" % (C.ident(run["run_by"]), run["source"],
                                                                     run["run_id"]),
            "Ask the source's owner for SELECT on it again, or drop the schedule (cron.unschedule).")
    return run


@E.entry_point
def refresh_job(plpy, output, cron):
    """sabre_schedule_refresh: a job calling sabre_refresh on the output's qualified name."""
    run = recorded_run(plpy, output)
    command = "SELECT * FROM %s(%s)" % (C.catalog("sabre_refresh"), plpy.quote_literal(run["qname"]))
    return schedule_job(plpy, "sabre_refresh_%s" % run["qname"], cron, command)


def check_hierarchies(plpy, run, recorded: dict, current: dict):
    """55000 when a hierarchy the run used is gone, or has another owner or content than when
    the run was made (docs/security.md, "Hierarchies redefined under a refresh"): hierarchies
    are global by name, and a refresh must not silently publish with another role's new one."""
    changed = C.changed_hierarchies(recorded, current)
    if changed:
        raise E.not_in_prerequisite_state(
            "the hierarchies of run %d changed since it was made: %s; %s was not refreshed"
            % (run["run_id"], ", ".join(changed), run["qname"]),
            "A refresh reruns a run with the hierarchies it used. Check the new definition (sabre.hierarchies, "
            "sabre.hierarchy_rows), then rerun sabre_anonymize explicitly to accept it (that run becomes the one "
            "refreshes repeat).")


@E.entry_point
def refresh(plpy, output):
    """sabre_refresh: rerun the recorded call (source, attributes, t, k, method, options)."""
    if output is None:
        raise E.null_not_allowed("output must not be NULL", "Pass the output's qualified name.")
    run = recorded_run(plpy, output)
    recorded = json.loads(run["hierarchies"]) if run.get("hierarchies") else None
    if recorded:                            # (runs recorded before 0.2.x have none)
        check_hierarchies(plpy, run, recorded, C.hierarchy_fingerprints(plpy, list(recorded)))
    several = len(run["sensitive_attributes"] or ()) > 1
    # a run of several SAs reruns the array form with every SA and its own t; the result row
    # gives the first SA's max EMD, as sabre.runs.max_emd does
    sensitive, t = ((run["sensitive_attributes"], run["t_values"]) if several else (run["sensitive"], run["t"]))
    rows = plpy.execute(plpy.prepare(
        "SELECT * FROM %s($1, NULL, $2, $3, $4, $5, $6, $7, $8::jsonb)" % C.catalog("sabre_anonymize_impl"),
        ["oid", "text[]", "text[]" if several else "text", "float8[]" if several else "float8", "int4", "text",
         "text", "text"]),
        [run["source_oid"], run["quasi_identifiers"], sensitive, t, run["k"], run["method"],
         run["output_name"], run["options"]])
    if not len(rows) and driven.then(lambda p, done: _refreshed(p, run, recorded, several, [
            dict(zip(RESULT, r)) for r in done])):
        return []       # a run on a Citus source: the wrapper drives it, then _refreshed (shared/driven.py)
    return _refreshed(plpy, run, recorded, several, rows)


RESULT = ("run_id", "output", "rows", "classes", "min_class_size", "max_emd", "ail", "seconds")


def _refreshed(plpy, run, recorded, several, rows) -> list:
    """The rerun's result rows, once its own record is checked."""
    if recorded and len(rows):
        # the rerun's own record: a redefinition committed between the check above and the
        # rerun's read is refused too (the error rolls the whole refresh back)
        now = plpy.execute(plpy.prepare("SELECT hierarchies FROM %s WHERE run_id OPERATOR(pg_catalog.=) $1"
                                        % C.catalog("runs"), ["int8"]), [rows[0]["run_id"]])
        check_hierarchies(plpy, run, recorded, json.loads(now[0]["hierarchies"] or "{}") if len(now) else {})
    return [tuple((r[c][0] if several and c == "max_emd" else r[c]) for c in RESULT) for r in rows]
