-- sabre-pg streams (issue #8): SABRE_W (Cao et al. §5), (omega, t)-closeness on a growing
-- table, advanced by calls or by pg_cron jobs.  Thin PL/Python wrappers around
-- sabre_plpy.stream.stream and sabre_plpy.stream.schedule (docs/streams.md).  Idempotent.
--
-- State (issue #25, finding 3).  Each stream's state lives in three relations its owner owns,
-- created beside its output and revoked from everyone else: <output>_state (one row: position,
-- S_G, the rows published ahead, cron job), <output>_rows (the row numbering) and <output>_log
-- (the log of advances).  Their keys and constraints therefore never span roles, nobody else can
-- read, write, probe or lock them, and an advance serializes on the row lock of <output>_state
-- (SELECT ... FOR UPDATE), which only the owner (or a superuser) can take.
--
-- @schema@.streams is the registry: one row per stream with its immutable definition and the
-- OIDs of its relations; stream_id is the OID of <output>_state.  Each role inserts and reads
-- only its own rows (row-level security, WITH CHECK on the owner's oid); nobody but its owner
-- may update or delete them (no UPDATE or DELETE privilege, so no role can LOCK the table in a
-- mode that blocks others), and it has no unique key or foreign key, so no insert can collide
-- with, or reveal, another role's row.  A row counts only while its stream_id is a relation
-- owned by the row's owner carrying the stream's identity; stream_forget() removes the rows
-- whose relation is gone.

-- The 0.2 layout (central state tables with DML for PUBLIC): set aside, migrated below.
DO $mig$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_attribute a
               WHERE a.attrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('@schema@.streams')
                 AND a.attname OPERATOR(pg_catalog.=) 'ahead' AND NOT a.attisdropped) THEN
        ALTER TABLE @schema@.streams RENAME TO streams_0_2;
    END IF;
END
$mig$;

CREATE TABLE IF NOT EXISTS @schema@.streams (
    stream_id         bigint NOT NULL,        -- the OID of <output>_state
    name              text NOT NULL,
    owner             oid NOT NULL,           -- the owning role (pg_roles.oid)
    source            text NOT NULL,          -- qualified name at creation
    source_oid        oid NOT NULL,
    arrival           text NOT NULL,          -- the monotone column giving the arrival order
    key               text NOT NULL,          -- the key column (ties of arrival, joins)
    quasi_identifiers text[] NOT NULL,
    sensitive         text NOT NULL,
    t                 double precision NOT NULL,
    k                 integer NOT NULL,
    window_size       integer NOT NULL,       -- omega, rows
    step              integer NOT NULL,       -- I, rows
    method            text NOT NULL,
    options           jsonb NOT NULL,
    output_schema     name NOT NULL,
    output_name       name NOT NULL,
    relation_oids     oid[] NOT NULL,         -- <output>, <output>_classes, <output>_keys
    state_oids        oid[] NOT NULL,         -- <output>_state, <output>_rows, <output>_log
    identity          text NOT NULL,          -- token in the relations' COMMENT
    created_at        timestamptz NOT NULL DEFAULT pg_catalog.now()
);
-- the hierarchies the stream uses, {name: {owner, sha256}} at creation: each advance refuses one changed since
ALTER TABLE @schema@.streams ADD COLUMN IF NOT EXISTS hierarchies jsonb;
-- the window engine ('window': the whole window partitioned by the default method; 'refine': searched
-- cuts at every DIRECT; 'sabre': SABRE with the stream's method), recorded at
-- creation; NULL (streams created before it was recorded, or migrated from 0.2) runs 'sabre'
ALTER TABLE @schema@.streams ADD COLUMN IF NOT EXISTS engine text;
CREATE INDEX IF NOT EXISTS streams_by_name ON @schema@.streams (owner, name);     -- not unique
COMMENT ON TABLE @schema@.streams IS
    'SABRE_W streams (sabre_stream_create): definition and relations; each role sees its own, '
    'the state lives in relations the owner owns';
ALTER TABLE @schema@.streams ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS own ON @schema@.streams;
CREATE POLICY own ON @schema@.streams FOR ALL
    USING (owner OPERATOR(pg_catalog.=) (SELECT r.oid FROM pg_catalog.pg_roles r
                                         WHERE r.rolname OPERATOR(pg_catalog.=) CURRENT_USER))
    WITH CHECK (owner OPERATOR(pg_catalog.=) (SELECT r.oid FROM pg_catalog.pg_roles r
                                              WHERE r.rolname OPERATOR(pg_catalog.=) CURRENT_USER));
REVOKE ALL ON @schema@.streams FROM PUBLIC;
GRANT SELECT, INSERT ON @schema@.streams TO PUBLIC;

-- Removes the registry rows of stream_id whose state relation no longer exists (or is no longer
-- the row owner's): what sabre_stream_drop calls after dropping the state.  Anyone may call it;
-- it touches only dead rows, and skips rows another transaction holds instead of waiting.
CREATE OR REPLACE FUNCTION @schema@.stream_forget(stream_id bigint)
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
    WITH dead AS (
        SELECT s.ctid FROM @schema@.streams AS s
        WHERE s.stream_id OPERATOR(pg_catalog.=) stream_forget.stream_id
          AND NOT EXISTS (SELECT FROM pg_catalog.pg_class AS c
                          WHERE c.oid::pg_catalog.int8 OPERATOR(pg_catalog.=) s.stream_id
                            AND c.relowner OPERATOR(pg_catalog.=) s.owner)
        FOR UPDATE SKIP LOCKED),
    gone AS (DELETE FROM @schema@.streams AS s USING dead WHERE s.ctid OPERATOR(pg_catalog.=) dead.ctid RETURNING 1)
    SELECT pg_catalog.count(*) FROM gone
$fn$;
COMMENT ON FUNCTION @schema@.stream_forget(bigint) IS
    'Internal (sabre_stream_drop): remove the registry rows of a stream whose state relation is gone';
REVOKE ALL ON FUNCTION @schema@.stream_forget(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @schema@.stream_forget(bigint) TO PUBLIC;

-- Moves the streams of the 0.2 layout into relations their owners own (sabre_stream_create's
-- layout), copying only the rows each stream's owner wrote; then the old tables go.
CREATE OR REPLACE FUNCTION @schema@.stream_migrate()
RETURNS integer
LANGUAGE plpython3u VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
@bootstrap@
from sabre_plpy.stream import stream
return stream.migrate(plpy)
$fn$;
DO $mig$
BEGIN
    IF pg_catalog.to_regclass('@schema@.streams_0_2') IS NOT NULL THEN
        ALTER TABLE @schema@.stream_advances ADD COLUMN IF NOT EXISTS phases jsonb;   -- tables of earlier installs
        PERFORM @schema@.stream_migrate();
        DROP TABLE @schema@.stream_advances, @schema@.stream_rows, @schema@.streams_0_2;
        DROP SEQUENCE IF EXISTS @schema@.streams_stream_id_seq;
    END IF;
END
$mig$;
DROP FUNCTION @schema@.stream_migrate();    -- needed during an upgrade only

-- The result of sabre_stream_create: its PL/pgSQL wrapper (installer.ERRORS) cannot declare a result column named like a parameter (output).
DO $type$
BEGIN
    IF pg_catalog.to_regtype('@schema@.stream_create_result') IS NULL THEN
        CREATE TYPE @schema@.stream_create_result AS (stream text, output regclass, window_size integer, step integer,
            rows_arrived bigint, advances_ready bigint);
    END IF;
END
$type$;

CREATE OR REPLACE FUNCTION @schema@.sabre_stream_create_impl(
    name              text,
    source            regclass,
    arrival           text,
    quasi_identifiers text[],
    sensitive         text,
    t                 double precision,
    k                 integer,
    window_size       integer,
    step              integer,
    method            text DEFAULT 'refine',
    output            text DEFAULT NULL,
    options           jsonb DEFAULT '{}'::jsonb)
RETURNS TABLE (stream text, output regclass, window_size integer, step integer,
               rows_arrived bigint, advances_ready bigint)
LANGUAGE plpython3u VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
@bootstrap@
from sabre_plpy.stream import stream
return stream.create(plpy, name, source, arrival, quasi_identifiers, sensitive, t, k, window_size,
                     step, method, output, options)
$fn$;
COMMENT ON FUNCTION @schema@.sabre_stream_create_impl(text, regclass, text, text[], text, double precision, integer, integer, integer, text, text, jsonb) IS
    'Internal: the PL/Python implementation behind sabre_stream_create (which reports its errors)';
@wrap:sabre_stream_create:stream_create_result@
COMMENT ON FUNCTION @schema@.sabre_stream_create(text, regclass, text, text[], text, double precision, integer, integer, integer, text, text, jsonb) IS
    'SABRE_W: a stream over an append-only table, published with (window_size, t)-closeness as it grows';

CREATE OR REPLACE FUNCTION @schema@.sabre_stream_advance_impl(name text, max_advances integer DEFAULT NULL)
RETURNS TABLE (advance_no bigint, case_no integer, d double precision, rows bigint, classes bigint,
               max_emd double precision, seconds double precision)
LANGUAGE plpython3u VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
@bootstrap@
from sabre_plpy.stream import stream
return stream.advance(plpy, name, max_advances)
$fn$;
COMMENT ON FUNCTION @schema@.sabre_stream_advance_impl(text, integer) IS
    'Internal: the PL/Python implementation behind sabre_stream_advance (which reports its errors)';
@wrap:sabre_stream_advance@
COMMENT ON FUNCTION @schema@.sabre_stream_advance(text, integer) IS
    'Process every complete step that has arrived (at most max_advances): one row per window advance';

CREATE OR REPLACE FUNCTION @schema@.sabre_stream_status_impl(name text)
RETURNS TABLE (stream text, output regclass, advances bigint, window_first bigint, window_last bigint,
               numbered bigint, rows_arrived bigint, published bigint, pending bigint,
               sg_classes integer, sg_rows bigint, last_case integer, last_advance_at timestamptz,
               advances_ready bigint, lag interval, cron_job bigint)
LANGUAGE plpython3u STABLE SET search_path = pg_catalog, pg_temp AS $fn$
@bootstrap@
from sabre_plpy.stream import stream
return stream.status(plpy, name)
$fn$;
COMMENT ON FUNCTION @schema@.sabre_stream_status_impl(text) IS
    'Internal: the PL/Python implementation behind sabre_stream_status (which reports its errors)';
@wrap:sabre_stream_status@
COMMENT ON FUNCTION @schema@.sabre_stream_status(text) IS
    'Position, pending rows, S_G size, last case and lag of a stream';

CREATE OR REPLACE FUNCTION @schema@.sabre_stream_verify_impl(name text)
RETURNS TABLE (advances bigint, classes bigint, rows bigint, violations bigint, max_emd double precision,
               min_class_size bigint, published_twice bigint, expired_unpublished bigint,
               updated bigint, deleted bigint, late bigint)
LANGUAGE plpython3u STABLE SET search_path = pg_catalog, pg_temp AS $fn$
@bootstrap@
from sabre_plpy.stream import stream
return stream.verify(plpy, name)
$fn$;
COMMENT ON FUNCTION @schema@.sabre_stream_verify_impl(text) IS
    'Internal: the PL/Python implementation behind sabre_stream_verify (which reports its errors)';
@wrap:sabre_stream_verify@
COMMENT ON FUNCTION @schema@.sabre_stream_verify(text) IS
    'Recheck a stream from its output and the source: every class within t of its generating window and '
    '>= k rows, every expired row published once; published rows updated or deleted in the source, late rows';

CREATE OR REPLACE FUNCTION @schema@.sabre_stream_drop_impl(name text, purge boolean DEFAULT false)
RETURNS boolean
LANGUAGE plpython3u VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
@bootstrap@
from sabre_plpy.stream import stream
return stream.drop(plpy, name, purge)
$fn$;
COMMENT ON FUNCTION @schema@.sabre_stream_drop_impl(text, boolean) IS
    'Internal: the PL/Python implementation behind sabre_stream_drop (which reports its errors)';
@wrap:sabre_stream_drop@
COMMENT ON FUNCTION @schema@.sabre_stream_drop(text, boolean) IS
    'Drop a stream and its state (and its pg_cron job); purge => true also drops its output relations';

CREATE OR REPLACE FUNCTION @schema@.sabre_stream_schedule_impl(name text, cron text)
RETURNS bigint
LANGUAGE plpython3u VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
@bootstrap@
from sabre_plpy.stream import schedule
return schedule.stream(plpy, name, cron)
$fn$;
COMMENT ON FUNCTION @schema@.sabre_stream_schedule_impl(text, text) IS
    'Internal: the PL/Python implementation behind sabre_stream_schedule (which reports its errors)';
@wrap:sabre_stream_schedule@
COMMENT ON FUNCTION @schema@.sabre_stream_schedule(text, text) IS
    'A pg_cron job that calls sabre_stream_advance on the cron schedule; returns the job id';

CREATE OR REPLACE FUNCTION @schema@.sabre_stream_unschedule_impl(name text)
RETURNS boolean
LANGUAGE plpython3u VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
@bootstrap@
from sabre_plpy.stream import schedule
return schedule.unschedule_stream(plpy, name)
$fn$;
COMMENT ON FUNCTION @schema@.sabre_stream_unschedule_impl(text) IS
    'Internal: the PL/Python implementation behind sabre_stream_unschedule (which reports its errors)';
@wrap:sabre_stream_unschedule@
COMMENT ON FUNCTION @schema@.sabre_stream_unschedule(text) IS
    'Remove the pg_cron job of a stream (false when it had none)';

CREATE OR REPLACE FUNCTION @schema@.sabre_refresh_impl(output text)
RETURNS TABLE (run_id bigint, output regclass, rows bigint, classes bigint,
               min_class_size bigint, max_emd double precision, ail double precision,
               seconds double precision)
LANGUAGE plpython3u VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
@bootstrap@
from sabre_plpy.stream import schedule
return schedule.refresh(plpy, output)
$fn$;
COMMENT ON FUNCTION @schema@.sabre_refresh_impl(text) IS
    'Internal: the PL/Python implementation behind sabre_refresh (which reports its errors)';
-- Like sabre_anonymize's text overload, this wrapper alone runs with the caller's search_path, so
-- that the output's name resolves as the caller expects (the name sabre_anonymize returns is
-- unqualified when its schema is on the caller's path); every name in its body is qualified.
@drop_record_form:sabre_refresh(text)@
CREATE OR REPLACE FUNCTION @schema@.sabre_refresh(output text)
RETURNS SETOF @schema@.run_result
LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
    RETURN QUERY SELECT * FROM @schema@.sabre_refresh_impl(
        COALESCE(pg_catalog.to_regclass($1)::pg_catalog.oid::pg_catalog.text, $1));
    PERFORM @schema@.sabre_driven_loop();       -- a run on a Citus source (plpython/shared/driven.py)
    RETURN QUERY SELECT * FROM @schema@.sabre_driven_result();
@errors_driven@
END
$fn$;
COMMENT ON FUNCTION @schema@.sabre_refresh(text) IS
    'Rerun the recorded sabre_anonymize call of an output (its atomic replacement); the name resolved with the caller''s search_path';

CREATE OR REPLACE FUNCTION @schema@.sabre_schedule_refresh_impl(output regclass, cron text)
RETURNS bigint
LANGUAGE plpython3u VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
@bootstrap@
from sabre_plpy.stream import schedule
return schedule.refresh_job(plpy, output, cron)
$fn$;
COMMENT ON FUNCTION @schema@.sabre_schedule_refresh_impl(regclass, text) IS
    'Internal: the PL/Python implementation behind sabre_schedule_refresh (which reports its errors)';
@wrap:sabre_schedule_refresh@
COMMENT ON FUNCTION @schema@.sabre_schedule_refresh(regclass, text) IS
    'A pg_cron job that reruns the recorded sabre_anonymize call of an output; returns the job id';
