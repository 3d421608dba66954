-- sabre-pg partitioned runs (issue #11, part 3; docs/scale-out.md): the table split into parts
-- by aggregate SQL, each part anonymized with its budget by sabre_anonymize, the parts' outputs
-- published as one.  sabre_anonymize(options => '{"partitions": N}') does all three in one
-- backend, one part at a time; these two functions let a client (sabre-pg anonymize --parts)
-- run the parts in parallel on its own connections.  Thin wrappers around sabre_plpy.batch.partition.

-- (part_rows and stage_rows were added in 0.2: a function's result columns cannot be replaced in place)
DROP FUNCTION IF EXISTS @schema@.sabre_partitions(regclass, text[], text, double precision, integer, text, text, jsonb);
CREATE OR REPLACE FUNCTION @schema@.sabre_partitions_impl(
    source            regclass,
    quasi_identifiers text[],
    sensitive         text,
    t                 double precision,
    k                 integer DEFAULT 1,
    method            text DEFAULT 'refine',
    output            text DEFAULT NULL,
    options           jsonb DEFAULT '{}'::jsonb,
    stage_rows        boolean DEFAULT false)
RETURNS TABLE (part integer, rows bigint, emd double precision, budget double precision,
               predicate text, part_output text, part_options jsonb, part_rows text)
LANGUAGE plpython3u VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
@bootstrap@
from sabre_plpy.batch import partition
return partition.run_plan(plpy, source, quasi_identifiers, sensitive, t, k, method, output, options, stage_rows)
$fn$;
COMMENT ON FUNCTION @schema@.sabre_partitions_impl(regclass, text[], text, double precision, integer, text, text, jsonb, boolean) IS
    'Internal: the PL/Python implementation behind sabre_partitions (which reports its errors)';
@wrap:sabre_partitions@
COMMENT ON FUNCTION @schema@.sabre_partitions(regclass, text[], text, double precision, integer, text, text, jsonb, boolean) IS
    'The parts of a partitioned run (options.partitions): a predicate, its rows, its EMD to the table and the '
    'budget t its sabre_anonymize gets, with the part output name and options to pass; with stage_rows (and '
    'several parts), the owner-only table made to hold the part''s rows, to anonymize and then drop';

CREATE OR REPLACE FUNCTION @schema@.sabre_publish_parts_impl(
    source            regclass,
    quasi_identifiers text[],
    sensitive         text,
    t                 double precision,
    k                 integer,
    method            text,
    output            text,
    options           jsonb,
    parts             text[])
RETURNS TABLE (run_id bigint, output regclass, rows bigint, classes bigint,
               min_class_size bigint, max_emd double precision, ail double precision,
               seconds double precision)
LANGUAGE plpython3u VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
@bootstrap@
from sabre_plpy.batch import partition
return partition.run_publish(plpy, source, quasi_identifiers, sensitive, t, k, method, output, options, parts)
$fn$;
COMMENT ON FUNCTION @schema@.sabre_publish_parts_impl(regclass, text[], text, double precision, integer, text, text, jsonb, text[]) IS
    'Internal: the PL/Python implementation behind sabre_publish_parts (which reports its errors)';
@wrap:sabre_publish_parts:run_result@
COMMENT ON FUNCTION @schema@.sabre_publish_parts(regclass, text[], text, double precision, integer, text, text, jsonb, text[]) IS
    'Publish the outputs of a partitioned run''s parts as one output: every source row once, every class '
    'within t of the whole table (exact EMD) and >= k, swapped in atomically and recorded in sabre.runs';

-- Citus push-down (docs/scale-out.md, "Citus (built)"): one shard of a distributed source
-- anonymized on the worker that holds it, called by sabre_anonymize on the coordinator in one
-- multi-shard statement of its own distributed transaction.  Internal; it runs as the caller.
CREATE OR REPLACE FUNCTION @schema@.sabre_citus_shard(request jsonb, shard_value text DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpython3u VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
@bootstrap@
from sabre_plpy.batch import citus_shards
return citus_shards.shard_run(plpy, request, shard_value)
$fn$;
COMMENT ON FUNCTION @schema@.sabre_citus_shard(jsonb, text) IS
    'Internal: one shard of a Citus distributed source anonymized on its worker against the whole table''s SA '
    'counts, written into the colocated shards of the run''s relations and checked; returns aggregates only';
