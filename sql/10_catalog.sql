-- sabre-pg catalog: hierarchies and runs.  Idempotent (install = upgrade = re-run).

CREATE TABLE IF NOT EXISTS @schema@.hierarchies (
    name       text PRIMARY KEY,
    height     integer NOT NULL,
    leaves     integer NOT NULL,
    root       text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE @schema@.hierarchies IS
    'Generalization hierarchies defined with sabre_define_hierarchy (ARX format, one row per leaf)';

CREATE TABLE IF NOT EXISTS @schema@.hierarchy_rows (
    hierarchy text    NOT NULL REFERENCES @schema@.hierarchies (name) ON DELETE CASCADE,
    ord       integer NOT NULL,          -- pre-order position of the leaf
    path      text[]  NOT NULL,          -- leaf, level 1, ..., root
    PRIMARY KEY (hierarchy, ord)
);
COMMENT ON TABLE @schema@.hierarchy_rows IS
    'Rows of each hierarchy in pre-order: path[1] is the leaf, path[height+1] the root';

CREATE TABLE IF NOT EXISTS @schema@.runs (
    run_id            bigint PRIMARY KEY,
    source            text NOT NULL,     -- qualified name at run time
    source_oid        oid NOT NULL,
    output_name       text NOT NULL,     -- qualified, quoted name of the output table
    output_oid        oid NOT NULL,
    keys_table        text,              -- side table <output>_keys (source key, bucket, hilbert_key, ec_id)
    relations         text[] NOT NULL,   -- every relation the run created (uninstall --purge drops them)
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
    run_by            text NOT NULL DEFAULT current_user
);
-- columns added after 0.1.0's first catalog: an upgrade adds them to an existing table
ALTER TABLE @schema@.runs ADD COLUMN IF NOT EXISTS relations text[] NOT NULL DEFAULT '{}';

COMMENT ON TABLE @schema@.runs IS
    'One row per successful sabre_anonymize call; a failed call rolls back and leaves no row';

CREATE SEQUENCE IF NOT EXISTS @schema@.runs_run_id_seq OWNED BY @schema@.runs.run_id;

CREATE OR REPLACE VIEW @schema@.outputs AS
SELECT DISTINCT ON (r.output_oid)
       r.output_oid::regclass AS output, r.run_id, r.source, r.quasi_identifiers, r.sensitive,
       r.t, r.k, r.method, r.rows, r.classes, r.max_emd, r.ail, r.finished_at
FROM @schema@.runs r
JOIN pg_class c ON c.oid = r.output_oid
ORDER BY r.output_oid, r.run_id DESC;
COMMENT ON VIEW @schema@.outputs IS 'Existing sabre outputs with the run that produced them';

GRANT SELECT ON @schema@.hierarchies, @schema@.hierarchy_rows, @schema@.runs, @schema@.outputs TO PUBLIC;
-- every caller of sabre_anonymize records its run (outputs themselves go to the caller's schemas)
GRANT INSERT ON @schema@.runs TO PUBLIC;
GRANT USAGE ON SEQUENCE @schema@.runs_run_id_seq TO PUBLIC;
