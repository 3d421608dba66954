-- sabre-pg catalog: hierarchies and runs.  Idempotent (install = upgrade = re-run).
--
-- Security model (docs/security.md):
-- * hierarchies: everyone reads them; a role the DBA grants INSERT, UPDATE, DELETE writes
--   only the hierarchies it owns (row-level security on owner).
-- * runs: nobody but the catalog's owner writes it directly.  A run records itself through
--   run_begin() / run_record(): run_begin issues a token bound to the calling role
--   (CURRENT_USER, as SET ROLE and SECURITY DEFINER make it) and to the transaction, which
--   expires; run_record (SECURITY DEFINER) accepts it only in that transaction, for
--   relations owned by that role whose COMMENT *ends* with the run's identity marker
--   " (sabre-pg run <id>, identity <token>)" (names are written before it, so no name can
--   supply it), and takes run_by from the server.  Each role reads its own runs; a
--   superuser reads all.

CREATE TABLE IF NOT EXISTS @schema@.hierarchies (
    name       text PRIMARY KEY,
    height     integer NOT NULL,
    leaves     integer NOT NULL,
    root       text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    owner      name NOT NULL DEFAULT CURRENT_USER
);
ALTER TABLE @schema@.hierarchies ADD COLUMN IF NOT EXISTS owner name NOT NULL DEFAULT CURRENT_USER;
COMMENT ON TABLE @schema@.hierarchies IS
    'Generalization hierarchies defined with sabre_define_hierarchy (ARX format, one row per leaf); '
    'a role writes only the hierarchies it owns';

CREATE TABLE IF NOT EXISTS @schema@.hierarchy_rows (
    hierarchy text    NOT NULL REFERENCES @schema@.hierarchies (name) ON DELETE CASCADE,
    ord       integer NOT NULL,          -- pre-order position of the leaf
    path      text[]  NOT NULL,          -- leaf, level 1, ..., root
    PRIMARY KEY (hierarchy, ord)
);
COMMENT ON TABLE @schema@.hierarchy_rows IS
    'Rows of each hierarchy in pre-order: path[1] is the leaf, path[height+1] the root';

ALTER TABLE @schema@.hierarchies ENABLE ROW LEVEL SECURITY;
ALTER TABLE @schema@.hierarchy_rows ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS read_all ON @schema@.hierarchies;
DROP POLICY IF EXISTS insert_own ON @schema@.hierarchies;
DROP POLICY IF EXISTS update_own ON @schema@.hierarchies;
DROP POLICY IF EXISTS delete_own ON @schema@.hierarchies;
CREATE POLICY read_all ON @schema@.hierarchies FOR SELECT USING (true);
CREATE POLICY insert_own ON @schema@.hierarchies FOR INSERT WITH CHECK (owner OPERATOR(pg_catalog.=) CURRENT_USER);
CREATE POLICY update_own ON @schema@.hierarchies FOR UPDATE
    USING (owner OPERATOR(pg_catalog.=) CURRENT_USER) WITH CHECK (owner OPERATOR(pg_catalog.=) CURRENT_USER);
CREATE POLICY delete_own ON @schema@.hierarchies FOR DELETE USING (owner OPERATOR(pg_catalog.=) CURRENT_USER);
DROP POLICY IF EXISTS read_all ON @schema@.hierarchy_rows;
DROP POLICY IF EXISTS write_own ON @schema@.hierarchy_rows;
CREATE POLICY read_all ON @schema@.hierarchy_rows FOR SELECT USING (true);
CREATE POLICY write_own ON @schema@.hierarchy_rows FOR ALL
    USING (EXISTS (SELECT 1 FROM @schema@.hierarchies h WHERE h.name OPERATOR(pg_catalog.=) hierarchy
                   AND h.owner OPERATOR(pg_catalog.=) CURRENT_USER))
    WITH CHECK (EXISTS (SELECT 1 FROM @schema@.hierarchies h WHERE h.name OPERATOR(pg_catalog.=) hierarchy
                        AND h.owner OPERATOR(pg_catalog.=) CURRENT_USER));
REVOKE ALL ON @schema@.hierarchies, @schema@.hierarchy_rows FROM PUBLIC;
GRANT SELECT ON @schema@.hierarchies, @schema@.hierarchy_rows TO PUBLIC;

CREATE TABLE IF NOT EXISTS @schema@.runs (
    run_id            bigint PRIMARY KEY,
    source            text NOT NULL,     -- qualified name at run time
    source_oid        oid NOT NULL,
    output_name       text NOT NULL,     -- qualified, quoted name of the output table
    output_oid        oid NOT NULL,
    keys_table        text,              -- side table <output>_keys (source key, bucket, hilbert_key, ec_id)
    relations         text[] NOT NULL,   -- qualified names of every relation the run created
    quasi_identifiers text[] NOT NULL,
    sensitive         text NOT NULL,
    t                 double precision NOT NULL,
    k                 integer NOT NULL,
    method            text NOT NULL,
    options           jsonb NOT NULL,
    status            text NOT NULL CHECK (status IN ('running', 'done', 'failed')),
    started_at        timestamptz NOT NULL,
    finished_at       timestamptz,
    rows              bigint,
    classes           bigint,
    buckets           integer,
    u                 double precision,
    min_class_size    bigint,
    max_class_size    bigint,
    max_emd           double precision,
    ail               double precision,
    discernibility    bigint,
    phases            jsonb,             -- seconds per phase
    seconds           double precision,
    run_by            text NOT NULL DEFAULT CURRENT_USER
);
-- columns added after 0.1.0's first catalog: an upgrade adds them to an existing table
ALTER TABLE @schema@.runs ADD COLUMN IF NOT EXISTS relations text[] NOT NULL DEFAULT '{}';
-- identity: the OIDs of the relations the run created and the token their COMMENT carries.
-- Rows recorded before 0.2.0 have neither, so no rerun replaces and no purge drops them.
ALTER TABLE @schema@.runs ADD COLUMN IF NOT EXISTS relation_oids oid[] NOT NULL DEFAULT '{}';
ALTER TABLE @schema@.runs ADD COLUMN IF NOT EXISTS identity text;
-- several sensitive attributes (docs/multiple-sa.md): every SA, its t and its max EMD, in order;
-- sensitive, t and max_emd hold the first's
ALTER TABLE @schema@.runs ADD COLUMN IF NOT EXISTS sensitive_attributes text[];
ALTER TABLE @schema@.runs ADD COLUMN IF NOT EXISTS t_values double precision[];
ALTER TABLE @schema@.runs ADD COLUMN IF NOT EXISTS max_emds double precision[];
-- the hierarchies the run used: {name: {owner, sha256}}; sabre_refresh refuses one redefined since
-- (issue 25, finding 7; NULL for runs recorded before)
ALTER TABLE @schema@.runs ADD COLUMN IF NOT EXISTS hierarchies jsonb;
-- a run in parts (docs/scale-out.md): {"parts": n, "automatic": bool[, "auto_partition_rows": rows]};
-- NULL for a run in one piece (issue 26: a plain call over a large table goes in parts by itself)
-- (a run pushed down to Citus workers adds "citus_design": 'qi_local' | 'shard_local', docs/scale-out.md)
ALTER TABLE @schema@.runs ADD COLUMN IF NOT EXISTS partitions jsonb;

COMMENT ON TABLE @schema@.runs IS
    'One row per successful sabre_anonymize call (a failed call rolls back and leaves no row); '
    'each role reads its own runs';

CREATE SEQUENCE IF NOT EXISTS @schema@.runs_run_id_seq OWNED BY @schema@.runs.run_id;

-- Tokens of runs in progress.  A row is issued by run_begin (an INSERT whose trigger fills
-- every column: the caller cannot choose one) and consumed by run_record; each role sees
-- only its own (and only the columns run_begin returns).
CREATE TABLE IF NOT EXISTS @schema@.run_tokens (
    run_id    bigint PRIMARY KEY,
    token     text NOT NULL,
    issued_at timestamptz NOT NULL DEFAULT pg_catalog.now()
);
-- the binding (after 0.2.0): the role that began the run, its transaction, the expiry
ALTER TABLE @schema@.run_tokens ADD COLUMN IF NOT EXISTS role name NOT NULL DEFAULT CURRENT_USER;
ALTER TABLE @schema@.run_tokens ADD COLUMN IF NOT EXISTS txid xid8 NOT NULL
    DEFAULT pg_catalog.pg_current_xact_id();
ALTER TABLE @schema@.run_tokens ADD COLUMN IF NOT EXISTS expires_at timestamptz NOT NULL DEFAULT pg_catalog.now();
COMMENT ON TABLE @schema@.run_tokens IS
    'Secret token of each run in progress, bound to the role and transaction that began it; '
    'it expires (see run_begin, run_record)';

-- The id of a new run, after deleting the tokens no run can use any more (those of ended
-- transactions -- the only other rows this transaction sees -- and expired ones; rows another
-- transaction is deleting are skipped, never waited for), and refusing more than
-- @limit:RUN_TOKENS_PER_TRANSACTION@ tokens outstanding in this transaction (issue 25, finding 7).
CREATE OR REPLACE FUNCTION @schema@.run_token_slot()
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    outstanding bigint;
BEGIN
    DELETE FROM @schema@.run_tokens AS t WHERE t.run_id OPERATOR(pg_catalog.=) ANY (ARRAY(
        SELECT d.run_id FROM @schema@.run_tokens AS d
        WHERE d.txid OPERATOR(pg_catalog.<>) pg_catalog.pg_current_xact_id()
           OR d.expires_at OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp()
        FOR UPDATE SKIP LOCKED));
    SELECT pg_catalog.count(*) INTO outstanding FROM @schema@.run_tokens AS t
    WHERE t.txid OPERATOR(pg_catalog.=) pg_catalog.pg_current_xact_id();
    IF outstanding OPERATOR(pg_catalog.>=) @limit:RUN_TOKENS_PER_TRANSACTION@ THEN
        RAISE EXCEPTION 'too many run tokens in this transaction: % outstanding, the cap is @limit:RUN_TOKENS_PER_TRANSACTION@',
            outstanding USING ERRCODE = '54000',
            HINT = 'A sabre run uses one token and consumes it when it records itself; commit or roll back '
                   'to release the tokens of runs that never finished.';
    END IF;
    RETURN pg_catalog.nextval('@schema@.runs_run_id_seq'::pg_catalog.regclass);
END
$fn$;
COMMENT ON FUNCTION @schema@.run_token_slot() IS
    'Internal (run_begin): delete unusable run tokens, enforce the cap per transaction, a new run id';

-- Fills every column of a new token.  SECURITY INVOKER on purpose: CURRENT_USER here is the
-- role that called run_begin (or inserted), which a SECURITY DEFINER function cannot see.
CREATE OR REPLACE FUNCTION @schema@.run_token_issue()
RETURNS trigger
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    NEW.run_id := @schema@.run_token_slot();
    NEW.token := pg_catalog.replace(pg_catalog.gen_random_uuid()::pg_catalog.text, '-', '')
                 OPERATOR(pg_catalog.||) pg_catalog.replace(pg_catalog.gen_random_uuid()::pg_catalog.text, '-', '');
    NEW.role := CURRENT_USER;
    NEW.txid := pg_catalog.pg_current_xact_id();
    NEW.issued_at := pg_catalog.clock_timestamp();
    NEW.expires_at := NEW.issued_at OPERATOR(pg_catalog.+)
                      pg_catalog.make_interval(secs => @limit:RUN_TOKEN_TTL_SECONDS@);
    RETURN NEW;
END
$fn$;
COMMENT ON FUNCTION @schema@.run_token_issue() IS
    'Internal (trigger on run_tokens): a new token''s id, secret, role, transaction and expiry';
CREATE OR REPLACE TRIGGER run_token_issue BEFORE INSERT ON @schema@.run_tokens
    FOR EACH ROW EXECUTE FUNCTION @schema@.run_token_issue();

ALTER TABLE @schema@.run_tokens ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS own_tokens ON @schema@.run_tokens;
CREATE POLICY own_tokens ON @schema@.run_tokens FOR ALL
    USING (role OPERATOR(pg_catalog.=) CURRENT_USER) WITH CHECK (role OPERATOR(pg_catalog.=) CURRENT_USER);

ALTER TABLE @schema@.runs ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS read_own ON @schema@.runs;
CREATE POLICY read_own ON @schema@.runs FOR SELECT USING (
    EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) run_by
            AND pg_catalog.pg_has_role(r.oid, 'MEMBER')));

REVOKE ALL ON @schema@.runs, @schema@.run_tokens FROM PUBLIC;
REVOKE ALL ON SEQUENCE @schema@.runs_run_id_seq FROM PUBLIC;
GRANT SELECT ON @schema@.runs TO PUBLIC;
-- run_begin inserts as its caller; RETURNING reads back the two columns it returns
GRANT INSERT, SELECT (run_id, token) ON @schema@.run_tokens TO PUBLIC;

-- Runs to one output are serialized on a row of output_locks (publish.lock_output): one row per
-- (role, output schema, output name), locked FOR UPDATE NOWAIT by the run's transaction.  Row-level
-- security keeps each role to rows keyed by its own name, so no other role can insert, see or
-- lock them (a superuser or a member of the role can, as it can do anything that role does):
-- no lock a role without rights on an output can hold, unlike fixed advisory lock keys.
CREATE TABLE IF NOT EXISTS @schema@.output_locks (
    owner     name NOT NULL DEFAULT CURRENT_USER,
    nsp       oid NOT NULL,                -- the output's schema
    relname   name NOT NULL,               -- the output's name
    taken_at  timestamptz,
    PRIMARY KEY (owner, nsp, relname)
);
COMMENT ON TABLE @schema@.output_locks IS
    'One row per role and output name, locked by a run writing that output (each role sees and locks its own)';
ALTER TABLE @schema@.output_locks ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS own_rows ON @schema@.output_locks;
CREATE POLICY own_rows ON @schema@.output_locks FOR ALL
    USING (owner OPERATOR(pg_catalog.=) CURRENT_USER) WITH CHECK (owner OPERATOR(pg_catalog.=) CURRENT_USER);
REVOKE ALL ON @schema@.output_locks FROM PUBLIC;
GRANT SELECT, INSERT ON @schema@.output_locks TO PUBLIC;
GRANT UPDATE (taken_at) ON @schema@.output_locks TO PUBLIC;     -- SELECT ... FOR UPDATE needs it

-- SECURITY INVOKER: the token's role is the caller's CURRENT_USER (run_token_issue).
CREATE OR REPLACE FUNCTION @schema@.run_begin(OUT run_id bigint, OUT token text)
LANGUAGE sql VOLATILE SECURITY INVOKER SET search_path = pg_catalog, pg_temp AS $fn$
    INSERT INTO @schema@.run_tokens DEFAULT VALUES RETURNING run_tokens.run_id, run_tokens.token
$fn$;
COMMENT ON FUNCTION @schema@.run_begin() IS
    'Internal (sabre_anonymize): a new run id and the secret token its relations must carry at the end of '
    'their COMMENT for run_record to accept them; bound to the calling role and transaction, it expires';

-- The identity marker a run's relations end their COMMENT with (publish.Run.comment writes it).
CREATE OR REPLACE FUNCTION @schema@.run_marker(run_id bigint, token text)
RETURNS text
LANGUAGE sql IMMUTABLE STRICT SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT pg_catalog.format(' (sabre-pg run %s, identity %s)', run_id, token)
$fn$;
COMMENT ON FUNCTION @schema@.run_marker(bigint, text) IS
    'Internal: the suffix of the COMMENT of a run''s relations that carries the run''s identity';

-- Whether a relation's COMMENT ends with the run's marker (the whole suffix, never a substring).
CREATE OR REPLACE FUNCTION @schema@.carries_identity(relation oid, run_id bigint, token text)
RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT COALESCE(pg_catalog.right(pg_catalog.obj_description(relation, 'pg_class'),
                                     pg_catalog.length(@schema@.run_marker(run_id, token)))
                    OPERATOR(pg_catalog.=) @schema@.run_marker(run_id, token), false)
$fn$;
COMMENT ON FUNCTION @schema@.carries_identity(oid, bigint, text) IS
    'Internal: whether the relation''s COMMENT ends with the identity marker of the run';

CREATE OR REPLACE FUNCTION @schema@.run_record(
    run_id bigint, output regclass, relations regclass[], source regclass, facts jsonb)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    secret text;
    issuer name;
    expiry timestamptz;
    owner_oid oid;
    rel regclass;
BEGIN
    -- the token is consumed only by the transaction that began the run
    DELETE FROM @schema@.run_tokens AS t WHERE t.run_id OPERATOR(pg_catalog.=) run_record.run_id
        AND t.txid OPERATOR(pg_catalog.=) pg_catalog.pg_current_xact_id()
        RETURNING t.token, t.role, t.expires_at INTO secret, issuer, expiry;
    IF secret IS NULL THEN
        RAISE EXCEPTION 'run % was not begun by run_begin in this transaction', run_record.run_id
            USING ERRCODE = '42501', HINT = 'Runs are recorded by sabre_anonymize only.';
    END IF;
    IF expiry OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp() THEN
        RAISE EXCEPTION 'the token of run % expired at %', run_record.run_id, expiry
            USING ERRCODE = '42501',
                  HINT = 'A run token is valid for @limit:RUN_TOKEN_TTL_SECONDS@ seconds: run again.';
    END IF;
    IF NOT (output OPERATOR(pg_catalog.=) ANY (relations)) THEN
        RAISE EXCEPTION 'the output % is not among the relations of run %', output, run_record.run_id
            USING ERRCODE = '22023', HINT = 'Runs are recorded by sabre_anonymize only.';
    END IF;
    -- every relation belongs to the role that began the run, and ends its COMMENT with the marker
    SELECT r.oid INTO owner_oid FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) issuer;
    FOREACH rel IN ARRAY relations LOOP
        IF (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) rel)
              IS DISTINCT FROM owner_oid THEN
            RAISE EXCEPTION 'relation % is not owned by %, the role that began run %', rel, issuer, run_record.run_id
                USING ERRCODE = '42501', HINT = 'Runs are recorded by sabre_anonymize only.';
        END IF;
        IF NOT @schema@.carries_identity(rel, run_record.run_id, secret) THEN
            RAISE EXCEPTION 'relation % does not carry the identity of run %', rel, run_record.run_id
                USING ERRCODE = '42501', HINT = 'Runs are recorded by sabre_anonymize only.';
        END IF;
    END LOOP;
    INSERT INTO @schema@.runs (
        run_id, source, source_oid, output_name, output_oid, keys_table, relations, relation_oids,
        identity, quasi_identifiers, sensitive, t, k, method, options, status, started_at,
        finished_at, rows, classes, buckets, u, min_class_size, max_class_size, max_emd, ail,
        discernibility, phases, seconds, run_by, sensitive_attributes, t_values, max_emds, hierarchies,
        partitions)
    SELECT run_record.run_id, source::pg_catalog.text, source, output::pg_catalog.text, output,
           relations[pg_catalog.array_length(relations, 1)]::pg_catalog.text,
           (SELECT pg_catalog.array_agg(r::pg_catalog.text) FROM pg_catalog.unnest(relations) AS r),
           relations::pg_catalog.oid[], secret,
           (SELECT pg_catalog.array_agg(q) FROM pg_catalog.jsonb_array_elements_text(facts->'quasi_identifiers') AS q),
           facts->>'sensitive', (facts->>'t')::float8, (facts->>'k')::int, facts->>'method',
           facts->'options', 'done',
           pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-)
               pg_catalog.make_interval(secs => (facts->>'seconds')::float8),
           pg_catalog.clock_timestamp(), (facts->>'rows')::bigint, (facts->>'classes')::bigint,
           (facts->>'buckets')::int, (facts->>'u')::float8, (facts->>'min_class_size')::bigint,
           (facts->>'max_class_size')::bigint, (facts->>'max_emd')::float8, (facts->>'ail')::float8,
           (facts->>'discernibility')::bigint, facts->'phases', (facts->>'seconds')::float8,
           pg_catalog.pg_get_userbyid(owner_oid),
           (SELECT pg_catalog.array_agg(x ORDER BY i) FROM pg_catalog.jsonb_array_elements_text(facts->'sensitive_attributes')
                   WITH ORDINALITY AS a(x, i)),
           (SELECT pg_catalog.array_agg(x::pg_catalog.float8 ORDER BY i)
              FROM pg_catalog.jsonb_array_elements_text(facts->'t_values') WITH ORDINALITY AS a(x, i)),
           (SELECT pg_catalog.array_agg(x::pg_catalog.float8 ORDER BY i)
              FROM pg_catalog.jsonb_array_elements_text(facts->'max_emds') WITH ORDINALITY AS a(x, i)),
           facts->'hierarchies', facts->'partitions';
END
$fn$;
COMMENT ON FUNCTION @schema@.run_record(bigint, regclass, regclass[], regclass, jsonb) IS
    'Internal (sabre_anonymize): record a run begun by run_begin in this transaction; run_by is the role '
    'that began it, which must own its relations, each ending its COMMENT with the run''s identity marker';

-- The relations recorded runs created that still carry their run's identity (OID and token):
-- what a rerun may replace and what uninstall --purge drops.  Each role sees its own.
CREATE OR REPLACE FUNCTION @schema@.recorded_relations()
RETURNS TABLE (run_id bigint, relation regclass, relkind "char")
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT r.run_id, c.oid::pg_catalog.regclass, c.relkind
    FROM @schema@.runs AS r
    CROSS JOIN LATERAL pg_catalog.unnest(r.relation_oids) AS o(oid)
    JOIN pg_catalog.pg_class AS c ON c.oid OPERATOR(pg_catalog.=) o.oid
    WHERE r.identity IS NOT NULL AND @schema@.carries_identity(c.oid, r.run_id, r.identity)
$fn$;
COMMENT ON FUNCTION @schema@.recorded_relations() IS
    'Relations created by recorded runs that still carry the run''s identity (OID + the marker ending their COMMENT)';

CREATE OR REPLACE VIEW @schema@.outputs WITH (security_invoker = true) AS
SELECT r.output_oid::pg_catalog.regclass AS output, r.run_id, r.source, r.quasi_identifiers, r.sensitive,
       r.t, r.k, r.method, r.rows, r.classes, r.max_emd, r.ail, r.finished_at, r.run_by
FROM @schema@.runs AS r
JOIN @schema@.recorded_relations() AS x
  ON x.run_id OPERATOR(pg_catalog.=) r.run_id AND x.relation::pg_catalog.oid OPERATOR(pg_catalog.=) r.output_oid;
COMMENT ON VIEW @schema@.outputs IS 'Existing sabre outputs with the run that produced them (your own runs)';
REVOKE ALL ON @schema@.outputs FROM PUBLIC;
GRANT SELECT ON @schema@.outputs TO PUBLIC;
