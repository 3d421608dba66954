-- sabre-pg S-INSTANT (issue #10, part 2): full-domain k-anonymity / distinct l-diversity
-- predicted from pg_stats (and pg_stats_ext MCV lists), validated on the data with
-- GROUPING SETS.  Thin PL/Python wrapper around sabre_plpy.preflight.instant (docs/instant.md).
-- VOLATILE: it writes the output (and, on request, statistics).  Idempotent.

-- The result of sabre_instant: its PL/pgSQL wrapper (installer.ERRORS) cannot declare a result column named like a parameter (output).
DO $type$
BEGIN
    IF pg_catalog.to_regtype('@schema@.instant_result') IS NULL THEN
        CREATE TYPE @schema@.instant_result AS (output regclass, levels integer[], scans integer, candidates_tried integer,
            predicted_probability double precision, suppressed bigint, lm double precision,
            classes bigint, seconds double precision);
    END IF;
END
$type$;

CREATE OR REPLACE FUNCTION @schema@.sabre_instant_impl(
    source            regclass,
    quasi_identifiers text[],
    k                 integer,
    l                 integer DEFAULT NULL,
    sensitive         text DEFAULT NULL,
    max_suppressed    double precision DEFAULT 0.0,
    output            text DEFAULT NULL,
    options           jsonb DEFAULT '{}'::jsonb)
RETURNS TABLE (output regclass, levels integer[], scans integer, candidates_tried integer,
               predicted_probability double precision, suppressed bigint, lm double precision,
               classes bigint, seconds double precision)
LANGUAGE plpython3u VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
@bootstrap@
from sabre_plpy.preflight import instant
return instant.instant(plpy, source, quasi_identifiers, k, l, sensitive, max_suppressed, output, options)
$fn$;
COMMENT ON FUNCTION @schema@.sabre_instant_impl(regclass, text[], integer, integer, text, double precision, text, jsonb) IS
    'Internal: the PL/Python implementation behind sabre_instant (which reports its errors)';
@wrap:sabre_instant:instant_result@
COMMENT ON FUNCTION @schema@.sabre_instant(regclass, text[], integer, integer, text, double precision, text, jsonb) IS
    'S-INSTANT (Nergiz et al., TODS 2011): the least-loss full-domain generalization predicted k-anonymous '
    '(and distinct l-diverse) from the statistics, validated on the data, materialized as <source>_instant';
