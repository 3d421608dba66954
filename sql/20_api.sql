-- sabre-pg SQL API: thin PL/Python wrappers around sabre_plpy (plpython/**/*.py), which call
-- the core engine (sabre_pg.core).  Idempotent.
--
-- Each entry point is written once, as the PL/Python function <name>_impl; the line
-- @wrap:<name>[:<type>]@ after it makes the function users call (sabre_pg.installer.wrapper):
-- PL/pgSQL, same parameters, result and volatility, which reports the implementation's errors
-- as PostgreSQL reports its own (installer.ERRORS: no "plpy.Error:" prefix, DETAIL and HINT
-- kept, a one-line CONTEXT; the Python traceback in the server log).

CREATE OR REPLACE FUNCTION @schema@.sabre_define_hierarchy_impl(
    name text, csv text, delimiter text DEFAULT ';')
RETURNS TABLE (hierarchy text, leaves integer, height integer)
LANGUAGE plpython3u VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
@bootstrap@
from sabre_plpy.catalog import hierarchies
return hierarchies.define(plpy, name, csv, delimiter)
$fn$;
COMMENT ON FUNCTION @schema@.sabre_define_hierarchy_impl(text, text, text) IS
    'Internal: the PL/Python implementation behind sabre_define_hierarchy (which reports its errors)';
@wrap:sabre_define_hierarchy@
COMMENT ON FUNCTION @schema@.sabre_define_hierarchy(text, text, text) IS
    'Store (or replace) an ARX-format hierarchy: one row per leaf, leaf;level1;...;root';

CREATE OR REPLACE FUNCTION @schema@.sabre_drop_hierarchy_impl(name text)
RETURNS boolean
LANGUAGE plpython3u VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
@bootstrap@
from sabre_plpy.catalog import hierarchies
return hierarchies.drop(plpy, name)
$fn$;
COMMENT ON FUNCTION @schema@.sabre_drop_hierarchy_impl(text) IS
    'Internal: the PL/Python implementation behind sabre_drop_hierarchy (which reports its errors)';
@wrap:sabre_drop_hierarchy@
COMMENT ON FUNCTION @schema@.sabre_drop_hierarchy(text) IS
    'Drop a hierarchy you own (true), or return false when none has that name';

-- The results of sabre_anonymize (one SA / several), sabre_refresh and sabre_publish_parts: the
-- PL/pgSQL wrappers that report their errors (installer.ERRORS, docs/anonymize.md "Errors") cannot
-- declare a result column named like a parameter (output), so they return these types.
DO $type$
BEGIN
    IF pg_catalog.to_regtype('@schema@.run_result') IS NULL THEN
        CREATE TYPE @schema@.run_result AS (run_id bigint, output regclass, rows bigint, classes bigint,
            min_class_size bigint, max_emd double precision, ail double precision,
            seconds double precision);
    END IF;
    IF pg_catalog.to_regtype('@schema@.run_result_multi') IS NULL THEN
        CREATE TYPE @schema@.run_result_multi AS (run_id bigint, output regclass, rows bigint, classes bigint,
            min_class_size bigint, max_emd double precision[], ail double precision,
            seconds double precision);
    END IF;
END
$type$;

-- Runs whose statements PL/pgSQL executes (plpython/shared/driven.py; docs/scale-out.md, "A
-- worker lost mid-run"): on a Citus distributed source the implementation hands its run to a
-- job and returns no rows; sabre_driven_loop executes the job's statements (EXECUTE opens no
-- subtransaction, so a worker lost between two statements fails the next one like any error)
-- and returns the job's result. These functions skip the bootstrap preamble (it executes a statement):
-- the job's module is already loaded in the backend when there is a job.
CREATE OR REPLACE FUNCTION @schema@.sabre_driven_step(reply text, role_name text, xact text)
RETURNS TABLE (kind text, statement text)
LANGUAGE plpython3u VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
import sys
driven = sys.modules.get("sabre_plpy.shared.driven")
if driven is None:
    return [(None, None)]
return driven.step(plpy, reply, role_name, xact)
$fn$;
COMMENT ON FUNCTION @schema@.sabre_driven_step(text, text, text) IS
    'Internal: the next statement of this backend''s pending run (plpython/shared/driven.py)';

CREATE OR REPLACE FUNCTION @schema@.sabre_driven_failed(state text, message text, detail text, hint text,
                                                         context text)
RETURNS TABLE (state text, message text, detail text, hint text)
LANGUAGE plpython3u VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
import sys
driven = sys.modules.get("sabre_plpy.shared.driven")
if driven is None:
    return [(None, None, None, None)]
return driven.failed(plpy, state, message, detail, hint, context)
$fn$;
COMMENT ON FUNCTION @schema@.sabre_driven_failed(text, text, text, text, text) IS
    'Internal: a statement of the pending run failed; the error to report instead, if any';

CREATE OR REPLACE FUNCTION @schema@.sabre_driven_result()
RETURNS TABLE (run_id bigint, output regclass, rows bigint, classes bigint,
               min_class_size bigint, max_emd double precision, ail double precision,
               seconds double precision)
LANGUAGE plpython3u VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
import sys
driven = sys.modules.get("sabre_plpy.shared.driven")
return [] if driven is None else driven.result(plpy)
$fn$;
COMMENT ON FUNCTION @schema@.sabre_driven_result() IS
    'Internal: the result rows of the one-SA run sabre_driven_loop drove';

CREATE OR REPLACE FUNCTION @schema@.sabre_driven_result_multi()
RETURNS TABLE (run_id bigint, output regclass, rows bigint, classes bigint,
               min_class_size bigint, max_emd double precision[], ail double precision,
               seconds double precision)
LANGUAGE plpython3u VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
import sys
driven = sys.modules.get("sabre_plpy.shared.driven")
return [] if driven is None else driven.result(plpy)
$fn$;
COMMENT ON FUNCTION @schema@.sabre_driven_result_multi() IS
    'Internal: the result rows of the several-SA run sabre_driven_loop drove';

CREATE OR REPLACE FUNCTION @schema@.sabre_driven_loop()
RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    d_kind pg_catalog.text;
    d_sql pg_catalog.text;
    d_reply pg_catalog.text := NULL;
    d_rows pg_catalog.int8;
    d_role pg_catalog.text := CURRENT_USER::pg_catalog.text;
    d_xact pg_catalog.text := pg_catalog.statement_timestamp()::pg_catalog.text;
    d_note pg_catalog.jsonb;
    d_msg pg_catalog.text;
    d_hint pg_catalog.text;
BEGIN
    LOOP
        SELECT s.kind, s.statement INTO d_kind, d_sql FROM @schema@.sabre_driven_step(d_reply, d_role, d_xact) AS s;
        EXIT WHEN d_kind IS NULL;
        IF d_kind OPERATOR(pg_catalog.=) 'rows' THEN
            EXECUTE 'SELECT pg_catalog.json_agg(q)::pg_catalog.text FROM (' OPERATOR(pg_catalog.||) d_sql
                OPERATOR(pg_catalog.||) E'\n) AS q' INTO d_reply;
        ELSIF d_kind OPERATOR(pg_catalog.=) 'returning' THEN
            EXECUTE 'WITH q AS (' OPERATOR(pg_catalog.||) d_sql
                OPERATOR(pg_catalog.||) E'\n) SELECT pg_catalog.json_agg(q)::pg_catalog.text FROM q' INTO d_reply;
        ELSIF d_kind OPERATOR(pg_catalog.=) 'command' THEN
            EXECUTE d_sql;
            GET DIAGNOSTICS d_rows = ROW_COUNT;
            d_reply := d_rows::pg_catalog.text;
        ELSE    -- a message: {"message", "hint"} (hint NULL when not given)
            d_note := d_sql::pg_catalog.jsonb;
            d_msg := d_note OPERATOR(pg_catalog.->>) 'message';
            d_hint := d_note OPERATOR(pg_catalog.->>) 'hint';
            IF d_kind OPERATOR(pg_catalog.=) 'notice' AND d_hint IS NULL THEN
                RAISE NOTICE USING MESSAGE = d_msg;
            ELSIF d_kind OPERATOR(pg_catalog.=) 'notice' THEN
                RAISE NOTICE USING MESSAGE = d_msg, HINT = d_hint;
            ELSIF d_hint IS NULL THEN
                RAISE WARNING USING MESSAGE = d_msg;
            ELSE
                RAISE WARNING USING MESSAGE = d_msg, HINT = d_hint;
            END IF;
            d_reply := NULL;
        END IF;
    END LOOP;
END
$fn$;
COMMENT ON FUNCTION @schema@.sabre_driven_loop() IS
    'Internal: execute the statements of this backend''s pending run (its result: sabre_driven_result)';

-- One implementation of sabre_anonymize; the two overloads below are thin wrappers.
-- source is the relation's OID (NULL when source_name, the caller's text, names none).
CREATE OR REPLACE FUNCTION @schema@.sabre_anonymize_impl(
    source            oid,
    source_name       text,
    quasi_identifiers text[],
    sensitive         text,
    t                 double precision,
    k                 integer,
    method            text,
    output            text,
    options           jsonb)
RETURNS TABLE (run_id bigint, output regclass, rows bigint, classes bigint,
               min_class_size bigint, max_emd double precision, ail double precision,
               seconds double precision)
LANGUAGE plpython3u VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
@bootstrap@
from sabre_plpy.batch import anonymize
return anonymize.run(plpy, source, source_name, quasi_identifiers, sensitive, t, k, method, output, options)
$fn$;
COMMENT ON FUNCTION @schema@.sabre_anonymize_impl(oid, text, text[], text, double precision, integer, text, text, jsonb) IS
    'Internal: the implementation behind both sabre_anonymize overloads';

@drop_record_form:sabre_anonymize(regclass, text[], text, double precision, integer, text, text, jsonb)@
CREATE OR REPLACE FUNCTION @schema@.sabre_anonymize(
    source            regclass,
    quasi_identifiers text[],
    sensitive         text,
    t                 double precision,
    k                 integer DEFAULT 1,
    method            text DEFAULT 'refine',
    output            text DEFAULT NULL,
    options           jsonb DEFAULT '{}'::jsonb)
RETURNS SETOF @schema@.run_result
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    RETURN QUERY SELECT * FROM @schema@.sabre_anonymize_impl($1::pg_catalog.oid, NULL, $2, $3, $4, $5, $6, $7, $8);
    PERFORM @schema@.sabre_driven_loop();
    RETURN QUERY SELECT * FROM @schema@.sabre_driven_result();
@errors_driven@
END
$fn$;
COMMENT ON FUNCTION @schema@.sabre_anonymize(regclass, text[], text, double precision, integer, text, text, jsonb) IS
    'SABRE t-closeness (Cao et al., VLDB J. 2011): materialize a generalized, t-close, k-anonymous copy of source';

-- The same, with the source given as text: a missing table then gets sabre's error and hint
-- instead of the regclass cast's.  This wrapper alone runs with the caller's search_path
-- (the name resolves as the caller expects), so every name in its body is qualified.
@drop_record_form:sabre_anonymize(text, text[], text, double precision, integer, text, text, jsonb)@
CREATE OR REPLACE FUNCTION @schema@.sabre_anonymize(
    source            text,
    quasi_identifiers text[],
    sensitive         text,
    t                 double precision,
    k                 integer DEFAULT 1,
    method            text DEFAULT 'refine',
    output            text DEFAULT NULL,
    options           jsonb DEFAULT '{}'::jsonb)
RETURNS SETOF @schema@.run_result
LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
    RETURN QUERY SELECT * FROM @schema@.sabre_anonymize_impl(pg_catalog.to_regclass($1)::pg_catalog.oid, $1, $2, $3, $4, $5, $6, $7, $8);
    PERFORM @schema@.sabre_driven_loop();
    RETURN QUERY SELECT * FROM @schema@.sabre_driven_result();
@errors_driven@
END
$fn$;
COMMENT ON FUNCTION @schema@.sabre_anonymize(text, text[], text, double precision, integer, text, text, jsonb) IS
    'sabre_anonymize with the source named as text, resolved with the caller''s search_path';

-- l (distinct l-diversity) was added after 0.2.0: the five-argument form is replaced (an
-- overload beside it would make calls with defaults ambiguous); calls with 2-5 arguments
-- are unchanged, and t => NULL checks k (and l) alone.
DROP FUNCTION IF EXISTS @schema@.sabre_verify(regclass, text, double precision, integer, text);
CREATE OR REPLACE FUNCTION @schema@.sabre_verify_impl(
    output    regclass,
    sensitive text,
    t         double precision,
    k         integer DEFAULT 1,
    hierarchy text DEFAULT NULL,
    l         integer DEFAULT NULL)
RETURNS TABLE (classes bigint, violations bigint, max_emd double precision, min_class_size bigint)
LANGUAGE plpython3u STABLE SET search_path = pg_catalog, pg_temp AS $fn$
@bootstrap@
from sabre_plpy.batch import verify
return verify.run(plpy, output, sensitive, t, k, hierarchy, l)
$fn$;
COMMENT ON FUNCTION @schema@.sabre_verify_impl(regclass, text, double precision, integer, text, integer) IS
    'Internal: the PL/Python implementation behind sabre_verify (which reports its errors)';
@wrap:sabre_verify@
COMMENT ON FUNCTION @schema@.sabre_verify(regclass, text, double precision, integer, text, integer) IS
    'Recompute t-closeness (t NULL: not checked), k-anonymity and distinct l-diversity (l) of an output '
    'from the relation alone (classes = ec_id groups)';

-- Several sensitive attributes, each with its own t (docs/multiple-sa.md): the array overloads.
CREATE OR REPLACE FUNCTION @schema@.sabre_anonymize_impl(
    source            oid,
    source_name       text,
    quasi_identifiers text[],
    sensitive         text[],
    t                 double precision[],
    k                 integer,
    method            text,
    output            text,
    options           jsonb)
RETURNS TABLE (run_id bigint, output regclass, rows bigint, classes bigint,
               min_class_size bigint, max_emd double precision[], ail double precision,
               seconds double precision)
LANGUAGE plpython3u VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
@bootstrap@
from sabre_plpy.batch import anonymize
return anonymize.run_multi(plpy, source, source_name, quasi_identifiers, sensitive, t, k, method, output, options)
$fn$;
COMMENT ON FUNCTION @schema@.sabre_anonymize_impl(oid, text, text[], text[], double precision[], integer, text, text, jsonb) IS
    'Internal: the implementation behind the several-SA sabre_anonymize';

@drop_record_form:sabre_anonymize(regclass, text[], text[], double precision[], integer, text, text, jsonb)@
CREATE OR REPLACE FUNCTION @schema@.sabre_anonymize(
    source            regclass,
    quasi_identifiers text[],
    sensitive         text[],
    t                 double precision[],
    k                 integer DEFAULT 1,
    method            text DEFAULT 'refine',
    output            text DEFAULT NULL,
    options           jsonb DEFAULT '{}'::jsonb)
RETURNS SETOF @schema@.run_result_multi
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    RETURN QUERY SELECT * FROM @schema@.sabre_anonymize_impl($1::pg_catalog.oid, NULL, $2, $3, $4, $5, $6, $7, $8);
    PERFORM @schema@.sabre_driven_loop();
    RETURN QUERY SELECT * FROM @schema@.sabre_driven_result_multi();
@errors_driven@
END
$fn$;
COMMENT ON FUNCTION @schema@.sabre_anonymize(regclass, text[], text[], double precision[], integer, text, text, jsonb) IS
    'SABRE t-closeness for several sensitive attributes, each with its own t (one per SA, same order)';

-- The thresholds parameter is not named t: a call naming t (`t => NULL` checks k alone) is
-- then the one-SA form's, never ambiguous between the two (positional calls are unchanged).
CREATE OR REPLACE FUNCTION @schema@.sabre_verify_impl(
    output      regclass,
    sensitive   text[],
    thresholds  double precision[],
    k           integer DEFAULT 1,
    hierarchies text[] DEFAULT NULL)
RETURNS TABLE (classes bigint, violations bigint, max_emd double precision[], min_class_size bigint)
LANGUAGE plpython3u STABLE SET search_path = pg_catalog, pg_temp AS $fn$
@bootstrap@
from sabre_plpy.batch import verify
return verify.run_multi(plpy, output, sensitive, thresholds, k, hierarchies)
$fn$;
COMMENT ON FUNCTION @schema@.sabre_verify_impl(regclass, text[], double precision[], integer, text[]) IS
    'Internal: the PL/Python implementation behind sabre_verify (which reports its errors)';
@wrap:sabre_verify@
COMMENT ON FUNCTION @schema@.sabre_verify(regclass, text[], double precision[], integer, text[]) IS
    'Recompute t-closeness on several sensitive columns (each with its own t) and k-anonymity of an output';
