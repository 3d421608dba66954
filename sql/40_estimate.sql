-- sabre-pg estimate (issue #10, part 1): what sabre_anonymize will do, from pg_stats alone.
-- Thin PL/Python wrappers around sabre_plpy.preflight.estimate (docs/estimate.md); no row of the
-- source is read.  VOLATILE: options.analyze runs ANALYZE.  Idempotent.

-- The spread columns (buckets_min .. sample_rows) were added after 0.2.0, the method argument and
-- column with issue #28: a function's result columns cannot be replaced, and the forms without
-- method would make a call with six arguments ambiguous, so those forms are dropped first (the
-- SQL form calls the array form).  A current one is replaced in place.
DO $upgrade$
BEGIN
    DROP FUNCTION IF EXISTS @schema@.sabre_estimate(regclass, text[], text, double precision, integer, jsonb);
    DROP FUNCTION IF EXISTS @schema@.sabre_estimate(regclass, text[], text, double precision[], integer, jsonb);
END
$upgrade$;

CREATE OR REPLACE FUNCTION @schema@.sabre_estimate_impl(
    source            regclass,
    quasi_identifiers text[],
    sensitive         text,
    t                 double precision[],
    k                 integer DEFAULT 1,
    options           jsonb DEFAULT '{}'::jsonb,
    method            text DEFAULT 'refine')
RETURNS TABLE (t double precision, buckets integer, u double precision, ec_size double precision,
               classes bigint, feasible boolean, hint text, source_of_stats text,
               seconds double precision, hint_t double precision, knee boolean,
               buckets_min integer, buckets_max integer, classes_min bigint, classes_max bigint,
               stable boolean, sample_rows bigint, method text)
LANGUAGE plpython3u VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
@bootstrap@
from sabre_plpy.preflight import estimate
return estimate.estimate(plpy, source, quasi_identifiers, sensitive, t, k, options, method)
$fn$;
COMMENT ON FUNCTION @schema@.sabre_estimate_impl(regclass, text[], text, double precision[], integer, jsonb, text) IS
    'Internal: the PL/Python implementation behind sabre_estimate (which reports its errors)';
-- The result of sabre_estimate: its PL/pgSQL wrapper (installer.ERRORS) cannot declare a result column named like a parameter (t).
DO $type$
BEGIN
    IF pg_catalog.to_regtype('@schema@.estimate_result') IS NULL THEN
        CREATE TYPE @schema@.estimate_result AS (t double precision, buckets integer, u double precision, ec_size double precision,
            classes bigint, feasible boolean, hint text, source_of_stats text,
            seconds double precision, hint_t double precision, knee boolean,
            buckets_min integer, buckets_max integer, classes_min bigint, classes_max bigint,
            stable boolean, sample_rows bigint, method text);
    END IF;
END
$type$;

@wrap:sabre_estimate:estimate_result@
COMMENT ON FUNCTION @schema@.sabre_estimate(regclass, text[], text, double precision[], integer, jsonb, text) IS
    'Predict sabre_anonymize''s buckets, U, classes and class size for each t from pg_stats and '
    'reltuples, without reading the table, with their range over resampled frequencies when '
    'ANALYZE sampled the table; for method refine or mondrian, bounds on the classes; '
    'options.suggest: the curve over t and its knee';

-- One t: the array form with one element.
@drop_record_form:sabre_estimate(regclass, text[], text, double precision, integer, jsonb, text)@
CREATE OR REPLACE FUNCTION @schema@.sabre_estimate(
    source            regclass,
    quasi_identifiers text[],
    sensitive         text,
    t                 double precision,
    k                 integer DEFAULT 1,
    options           jsonb DEFAULT '{}'::jsonb,
    method            text DEFAULT 'refine')
RETURNS SETOF @schema@.estimate_result
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    RETURN QUERY SELECT * FROM @schema@.sabre_estimate_impl($1, $2, $3, ARRAY[$4]::pg_catalog.float8[], $5, $6, $7);
@errors@
END
$fn$;
COMMENT ON FUNCTION @schema@.sabre_estimate(regclass, text[], text, double precision, integer, jsonb, text) IS
    'sabre_estimate for one t';
