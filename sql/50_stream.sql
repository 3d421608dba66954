-- sabre-pg streams (issue #8): SABRE_W (Cao et al. §5), (omega, t)-closeness on a growing
-- table, advanced by calls or by pg_cron jobs.  Thin PL/Python wrappers around
-- sabre_plpy.stream and sabre_plpy.schedule (docs/streams.md).  Idempotent.
--
-- State (row numbering, the rows published ahead of their window, S_G, the log of advances)
-- lives in three tables of this schema.  Each row carries its owner; row-level security lets a role see and change
-- only its own streams, as for sabre.runs.  The tables are logged: a crash keeps the state of
-- the last committed advance.

CREATE SEQUENCE IF NOT EXISTS @schema@.streams_stream_id_seq;

CREATE TABLE IF NOT EXISTS @schema@.streams (
    stream_id         bigint PRIMARY KEY
                      DEFAULT pg_catalog.nextval('@schema@.streams_stream_id_seq'::pg_catalog.regclass),
    name              text NOT NULL,
    owner             name NOT NULL DEFAULT CURRENT_USER,
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
    identity          text NOT NULL,          -- token in the outputs' COMMENT
    advances          bigint NOT NULL DEFAULT 0,
    numbered          bigint NOT NULL DEFAULT 0,   -- rows numbered so far (1..numbered)
    next_ec           bigint NOT NULL DEFAULT 0,   -- first ec_id of the next published class
    sg_first          bigint,                 -- S_G's generating window (the last DIRECT's)
    sg_last           bigint,
    sg_emds           double precision[] NOT NULL DEFAULT '{}',   -- EMD of each S_G class
    sg_rows           bigint[] NOT NULL DEFAULT '{}',             -- rows of S_G, by row number
    sg_classes        integer[] NOT NULL DEFAULT '{}',            -- their S_G class
    ahead             bigint[] NOT NULL DEFAULT '{}',  -- rows published before their window came:
                                                       -- row numbers >= the next window's first
    last_case         integer,
    last_advance_at   timestamptz,
    cron_job          bigint,                 -- pg_cron job of sabre_stream_schedule
    created_at        timestamptz NOT NULL DEFAULT pg_catalog.now(),
    UNIQUE (owner, name)
);
-- the state's arrays are rewritten by every advance: stored uncompressed (compressing
-- some 100 kB of row numbers cost more than the rest of the state's update)
ALTER TABLE @schema@.streams ALTER COLUMN ahead SET STORAGE EXTERNAL, ALTER COLUMN sg_rows SET STORAGE EXTERNAL,
    ALTER COLUMN sg_classes SET STORAGE EXTERNAL, ALTER COLUMN sg_emds SET STORAGE EXTERNAL;
COMMENT ON TABLE @schema@.streams IS
    'SABRE_W streams (sabre_stream_create): parameters, position and S_G; each role sees its own';

-- No foreign key to streams: its check per numbered row cost as much as the numbering itself;
-- sabre_stream_drop deletes a stream's rows (stream ids are never reused).
CREATE TABLE IF NOT EXISTS @schema@.stream_rows (
    stream_id bigint NOT NULL,
    row_no    bigint NOT NULL,                -- arrival order, ties broken by the key
    key       text NOT NULL,                  -- the source key as text
    owner     name NOT NULL DEFAULT CURRENT_USER,
    PRIMARY KEY (stream_id, row_no)
);
-- the numbering's anti-join takes the window's rows by the primary key (a row-number range):
-- a third index, on the arrival recorded with each row, cost a third of the numbering's inserts
DROP INDEX IF EXISTS @schema@.stream_rows_arrival;
ALTER TABLE @schema@.stream_rows DROP COLUMN IF EXISTS arrival;      -- tables of earlier installs
ALTER TABLE @schema@.stream_rows DROP CONSTRAINT IF EXISTS stream_rows_stream_id_fkey;
-- a key is numbered at most once: exactly-once publication rests on this index.  The key
-- leads, so that lookups by stream and row number take the primary key even while a new
-- stream's statistics are stale.
DROP INDEX IF EXISTS @schema@.stream_rows_key;
CREATE UNIQUE INDEX IF NOT EXISTS stream_rows_once ON @schema@.stream_rows (key, stream_id);
COMMENT ON TABLE @schema@.stream_rows IS
    'Row numbering of each stream (insert-only): rows below the next window''s first are published, '
    'the others are published if listed in streams.ahead';

CREATE TABLE IF NOT EXISTS @schema@.stream_advances (
    stream_id    bigint NOT NULL REFERENCES @schema@.streams (stream_id) ON DELETE CASCADE,
    advance_no   bigint NOT NULL,
    case_no      integer NOT NULL CHECK (case_no IN (1, 2, 3)),
    d            double precision,
    rows         bigint NOT NULL,
    classes      bigint NOT NULL,
    max_emd      double precision,
    window_first bigint NOT NULL,
    window_last  bigint NOT NULL,
    seconds      double precision NOT NULL,
    phases       jsonb,                       -- seconds per phase (validate, number, state, read, engine, publish, save)
    advanced_at  timestamptz NOT NULL DEFAULT pg_catalog.now(),
    owner        name NOT NULL DEFAULT CURRENT_USER,
    PRIMARY KEY (stream_id, advance_no)
);
ALTER TABLE @schema@.stream_advances ADD COLUMN IF NOT EXISTS phases jsonb;   -- tables of earlier installs
COMMENT ON TABLE @schema@.stream_advances IS 'The log of every advance of every stream';

ALTER TABLE @schema@.streams ENABLE ROW LEVEL SECURITY;
ALTER TABLE @schema@.stream_rows ENABLE ROW LEVEL SECURITY;
ALTER TABLE @schema@.stream_advances ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS own ON @schema@.streams;
DROP POLICY IF EXISTS own ON @schema@.stream_rows;
DROP POLICY IF EXISTS own ON @schema@.stream_advances;
CREATE POLICY own ON @schema@.streams FOR ALL
    USING (owner OPERATOR(pg_catalog.=) CURRENT_USER) WITH CHECK (owner OPERATOR(pg_catalog.=) CURRENT_USER);
CREATE POLICY own ON @schema@.stream_rows FOR ALL
    USING (owner OPERATOR(pg_catalog.=) CURRENT_USER) WITH CHECK (owner OPERATOR(pg_catalog.=) CURRENT_USER);
CREATE POLICY own ON @schema@.stream_advances FOR ALL
    USING (owner OPERATOR(pg_catalog.=) CURRENT_USER) WITH CHECK (owner OPERATOR(pg_catalog.=) CURRENT_USER);
REVOKE ALL ON @schema@.streams, @schema@.stream_rows, @schema@.stream_advances FROM PUBLIC;
GRANT SELECT, INSERT, UPDATE, DELETE ON @schema@.streams, @schema@.stream_rows, @schema@.stream_advances TO PUBLIC;
REVOKE ALL ON SEQUENCE @schema@.streams_stream_id_seq FROM PUBLIC;
GRANT USAGE ON SEQUENCE @schema@.streams_stream_id_seq TO PUBLIC;

CREATE OR REPLACE FUNCTION @schema@.sabre_stream_create(
    name              text,
    source            regclass,
    arrival           text,
    quasi_identifiers text[],
    sensitive         text,
    t                 double precision,
    k                 integer,
    window_size       integer,
    step              integer,
    method            text DEFAULT 'ak',
    output            text DEFAULT NULL,
    options           jsonb DEFAULT '{}'::jsonb)
RETURNS TABLE (stream text, output regclass, window_size integer, step integer,
               rows_arrived bigint, advances_ready bigint)
LANGUAGE plpython3u VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
@bootstrap@
from sabre_plpy import stream
return stream.create(plpy, name, source, arrival, quasi_identifiers, sensitive, t, k, window_size,
                     step, method, output, options)
$fn$;
COMMENT ON FUNCTION @schema@.sabre_stream_create(text, regclass, text, text[], text, double precision, integer, integer, integer, text, text, jsonb) IS
    'SABRE_W: a stream over an append-only table, published with (window_size, t)-closeness as it grows';

CREATE OR REPLACE FUNCTION @schema@.sabre_stream_advance(name text, max_advances integer DEFAULT NULL)
RETURNS TABLE (advance_no bigint, case_no integer, d double precision, rows bigint, classes bigint,
               max_emd double precision, seconds double precision)
LANGUAGE plpython3u VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
@bootstrap@
from sabre_plpy import stream
return stream.advance(plpy, name, max_advances)
$fn$;
COMMENT ON FUNCTION @schema@.sabre_stream_advance(text, integer) IS
    'Process every complete step that has arrived (at most max_advances): one row per window advance';

CREATE OR REPLACE FUNCTION @schema@.sabre_stream_status(name text)
RETURNS TABLE (stream text, output regclass, advances bigint, window_first bigint, window_last bigint,
               numbered bigint, rows_arrived bigint, published bigint, pending bigint,
               sg_classes integer, sg_rows bigint, last_case integer, last_advance_at timestamptz,
               advances_ready bigint, lag interval, cron_job bigint)
LANGUAGE plpython3u STABLE SET search_path = pg_catalog, pg_temp AS $fn$
@bootstrap@
from sabre_plpy import stream
return stream.status(plpy, name)
$fn$;
COMMENT ON FUNCTION @schema@.sabre_stream_status(text) IS
    'Position, pending rows, S_G size, last case and lag of a stream';

CREATE OR REPLACE FUNCTION @schema@.sabre_stream_verify(name text)
RETURNS TABLE (advances bigint, classes bigint, rows bigint, violations bigint, max_emd double precision,
               min_class_size bigint, published_twice bigint, expired_unpublished bigint,
               updated bigint, deleted bigint, late bigint)
LANGUAGE plpython3u STABLE SET search_path = pg_catalog, pg_temp AS $fn$
@bootstrap@
from sabre_plpy import stream
return stream.verify(plpy, name)
$fn$;
COMMENT ON FUNCTION @schema@.sabre_stream_verify(text) IS
    'Recheck a stream from its output and the source: every class within t of its generating window and '
    '>= k rows, every expired row published once; published rows updated or deleted in the source, late rows';

CREATE OR REPLACE FUNCTION @schema@.sabre_stream_drop(name text, purge boolean DEFAULT false)
RETURNS boolean
LANGUAGE plpython3u VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
@bootstrap@
from sabre_plpy import stream
return stream.drop(plpy, name, purge)
$fn$;
COMMENT ON FUNCTION @schema@.sabre_stream_drop(text, boolean) IS
    'Drop a stream and its state (and its pg_cron job); purge => true also drops its output relations';

CREATE OR REPLACE FUNCTION @schema@.sabre_stream_schedule(name text, cron text)
RETURNS bigint
LANGUAGE plpython3u VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
@bootstrap@
from sabre_plpy import schedule
return schedule.stream(plpy, name, cron)
$fn$;
COMMENT ON FUNCTION @schema@.sabre_stream_schedule(text, text) IS
    'A pg_cron job that calls sabre_stream_advance on the cron schedule; returns the job id';

CREATE OR REPLACE FUNCTION @schema@.sabre_stream_unschedule(name text)
RETURNS boolean
LANGUAGE plpython3u VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
@bootstrap@
from sabre_plpy import schedule
return schedule.unschedule_stream(plpy, name)
$fn$;
COMMENT ON FUNCTION @schema@.sabre_stream_unschedule(text) IS
    'Remove the pg_cron job of a stream (false when it had none)';

CREATE OR REPLACE FUNCTION @schema@.sabre_refresh(output text)
RETURNS TABLE (run_id bigint, output regclass, rows bigint, classes bigint,
               min_class_size bigint, max_emd double precision, ail double precision,
               seconds double precision)
LANGUAGE plpython3u VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
@bootstrap@
from sabre_plpy import schedule
return schedule.refresh(plpy, output)
$fn$;
COMMENT ON FUNCTION @schema@.sabre_refresh(text) IS
    'Rerun the recorded sabre_anonymize call of an output (its atomic replacement)';

CREATE OR REPLACE FUNCTION @schema@.sabre_schedule_refresh(output regclass, cron text)
RETURNS bigint
LANGUAGE plpython3u VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
@bootstrap@
from sabre_plpy import schedule
return schedule.refresh_job(plpy, output, cron)
$fn$;
COMMENT ON FUNCTION @schema@.sabre_schedule_refresh(regclass, text) IS
    'A pg_cron job that reruns the recorded sabre_anonymize call of an output; returns the job id';
