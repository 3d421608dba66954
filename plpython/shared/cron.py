"""pg_cron jobs (docs/streams.md, "Scheduling"): the schema of pg_cron's functions in this
database, and a job scheduled or removed.  Shared by the entry points that make or drop jobs
(``schedule.py``; ``stream.py``'s drop removes the stream's job), so neither imports the other.

pg_cron is found as an extension of the current database (its schema from ``pg_extension``);
without it every call fails with a HINT on what to install and configure.  A job runs its
command as the role that scheduled it, in this database.
"""
from __future__ import annotations

from . import common as C
from . import errors as E

INSTALL_HINT = ("Install pg_cron (Debian: apt-get install postgresql-15-cron), set shared_preload_libraries = "
                "'pg_cron' and cron.database_name = '%s' in postgresql.conf (cron.use_background_workers = on "
                "avoids a password for the jobs' connections), restart the server, then CREATE EXTENSION pg_cron "
                "in this database. The sabre-pg embedded cluster is configured so.")


def cron_schema(plpy) -> str:
    """The schema of pg_cron's functions in this database (quoted; the extension's own
    ``schedule`` function, found through pg_depend), or the install error."""
    r = plpy.execute("SELECT n.nspname FROM pg_catalog.pg_extension e JOIN pg_catalog.pg_depend d "
                     "ON d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass "
                     "AND d.refobjid OPERATOR(pg_catalog.=) e.oid "
                     "AND d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass "
                     "JOIN pg_catalog.pg_proc p ON p.oid OPERATOR(pg_catalog.=) d.objid "
                     "JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace "
                     "WHERE e.extname OPERATOR(pg_catalog.=) 'pg_cron' AND p.proname OPERATOR(pg_catalog.=) 'schedule' "
                     "LIMIT 1")
    if not len(r):
        db = plpy.execute("SELECT pg_catalog.current_database() AS db")[0]["db"]
        raise E.not_in_prerequisite_state("pg_cron is not installed in database %s" % C.ident(db), INSTALL_HINT % db)
    return C.ident(r[0]["nspname"])


def schedule_job(plpy, job_name, cron, command) -> int:
    """A pg_cron job running ``command`` on the ``cron`` schedule; its id."""
    if cron is None or not str(cron).strip():
        raise E.invalid_parameter("cron must be a schedule", "For example '*/5 * * * *' (every five minutes).")
    schema = cron_schema(plpy)
    try:
        with plpy.subtransaction():
            return plpy.execute(plpy.prepare("SELECT %s.schedule($1, $2, $3) AS job" % schema,
                                             ["text", "text", "text"]), [job_name, cron, command])[0]["job"]
    except plpy.SPIError as e:
        if getattr(e, "sqlstate", None) == E.INSUFFICIENT_PRIVILEGE:
            raise E.insufficient_privilege("pg_cron refused the job: %s" % e,
                                           "GRANT USAGE ON SCHEMA cron TO the role that schedules jobs.")
        raise E.invalid_parameter("pg_cron refused the schedule %s: %s" % (C.ident(cron), e),
                                  "Use a cron expression such as '*/5 * * * *' (pg_cron 1.4 schedules by the minute).")


def unschedule_job(plpy, job) -> bool:
    """Remove job ``job`` (False if pg_cron no longer has it)."""
    schema = cron_schema(plpy)
    try:
        with plpy.subtransaction():
            plpy.execute(plpy.prepare("SELECT %s.unschedule($1::bigint)" % schema, ["int8"]), [job])
        return True
    except plpy.SPIError as e:
        E.reraise_canceled(e)
        return False
