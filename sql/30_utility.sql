-- sabre-pg utility metrics (SABRE §3.2 and §6.2): thin PL/Python wrappers around
-- sabre_plpy.batch.utility, which calls sabre_pg.core.metrics and sabre_pg.core.workload.
-- Every function reads the anonymized relation (output: ec_id, <qi>_lo/<qi>_hi, <qi> labels,
-- the sensitive attribute) and the original relation (source).  quasi_identifiers and
-- sensitive may be NULL for an output recorded in sabre.runs.  Idempotent.

CREATE OR REPLACE FUNCTION @schema@.sabre_utility_impl(
    output            regclass,
    source            regclass,
    quasi_identifiers text[] DEFAULT NULL,
    sensitive         text DEFAULT NULL,
    options           jsonb DEFAULT '{}'::jsonb)
RETURNS TABLE (rows bigint, classes bigint, ail double precision, discernibility bigint,
               aecs double precision, aecs_normalized double precision,
               min_class_size bigint, max_class_size bigint)
LANGUAGE plpython3u STABLE SET search_path = pg_catalog, pg_temp AS $fn$
@bootstrap@
from sabre_plpy.batch import utility
return utility.utility(plpy, output, source, quasi_identifiers, sensitive, options)
$fn$;
COMMENT ON FUNCTION @schema@.sabre_utility_impl(regclass, regclass, text[], text, jsonb) IS
    'Internal: the PL/Python implementation behind sabre_utility (which reports its errors)';
@wrap:sabre_utility@
COMMENT ON FUNCTION @schema@.sabre_utility(regclass, regclass, text[], text, jsonb) IS
    'Average information loss (SABRE §3.2), discernibility (sum |G|^2) and average class size n/C '
    '(normalized: n/(C k)) of an anonymized relation';

CREATE OR REPLACE FUNCTION @schema@.sabre_query_error_stats_impl(
    output            regclass,
    source            regclass,
    quasi_identifiers text[] DEFAULT NULL,
    sensitive         text DEFAULT NULL,
    queries           integer DEFAULT 10000,
    dimensionality    integer DEFAULT 3,
    selectivity       double precision DEFAULT 0.1,
    seed              integer DEFAULT 1,
    options           jsonb DEFAULT '{}'::jsonb)
RETURNS TABLE (median_relative_error double precision, mean_relative_error double precision,
               answered bigint, dropped bigint)
LANGUAGE plpython3u STABLE SET search_path = pg_catalog, pg_temp AS $fn$
@bootstrap@
from sabre_plpy.batch import utility
return utility.query_error(plpy, output, source, quasi_identifiers, sensitive, queries,
                           dimensionality, selectivity, seed, options)
$fn$;
COMMENT ON FUNCTION @schema@.sabre_query_error_stats_impl(regclass, regclass, text[], text, integer, integer, double precision, integer, jsonb) IS
    'Internal: the PL/Python implementation behind sabre_query_error_stats (which reports its errors)';
@wrap:sabre_query_error_stats@
COMMENT ON FUNCTION @schema@.sabre_query_error_stats(regclass, regclass, text[], text, integer, integer, double precision, integer, jsonb) IS
    'COUNT workload of SABRE §6.2 (lambda = dimensionality QI predicates + one SA predicate, expected '
    'selectivity theta): median and mean relative error, queries answered and dropped (exact count 0)';

CREATE OR REPLACE FUNCTION @schema@.sabre_query_error(
    output            regclass,
    source            regclass,
    quasi_identifiers text[] DEFAULT NULL,
    sensitive         text DEFAULT NULL,
    queries           integer DEFAULT 10000,
    dimensionality    integer DEFAULT 3,
    selectivity       double precision DEFAULT 0.1,
    seed              integer DEFAULT 1,
    options           jsonb DEFAULT '{}'::jsonb)
RETURNS double precision LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    RETURN (SELECT s.median_relative_error
            FROM @schema@.sabre_query_error_stats_impl($1, $2, $3, $4, $5, $6, $7, $8, $9) AS s);
@errors@
END
$fn$;
COMMENT ON FUNCTION @schema@.sabre_query_error(regclass, regclass, text[], text, integer, integer, double precision, integer, jsonb) IS
    'Median relative error of the random COUNT workload of SABRE §6.2 (see sabre_query_error_stats)';

CREATE OR REPLACE FUNCTION @schema@.sabre_kl_cuboids_impl(
    output            regclass,
    source            regclass,
    quasi_identifiers text[] DEFAULT NULL,
    sensitive         text DEFAULT NULL,
    level             integer DEFAULT 2,
    options           jsonb DEFAULT '{}'::jsonb)
RETURNS TABLE (cuboid text[], kl_divergence double precision)
LANGUAGE plpython3u STABLE SET search_path = pg_catalog, pg_temp AS $fn$
@bootstrap@
from sabre_plpy.batch import utility
return utility.kl_divergence(plpy, output, source, quasi_identifiers, sensitive, level, options)
$fn$;
COMMENT ON FUNCTION @schema@.sabre_kl_cuboids_impl(regclass, regclass, text[], text, integer, jsonb) IS
    'Internal: the PL/Python implementation behind sabre_kl_cuboids (which reports its errors)';
@wrap:sabre_kl_cuboids@
COMMENT ON FUNCTION @schema@.sabre_kl_cuboids(regclass, regclass, text[], text, integer, jsonb) IS
    'KL(original || estimate) of each cuboid GROUP BY <level QIs>, <sensitive> of the datacube of level mu';

CREATE OR REPLACE FUNCTION @schema@.sabre_kl_divergence(
    output            regclass,
    source            regclass,
    quasi_identifiers text[] DEFAULT NULL,
    sensitive         text DEFAULT NULL,
    level             integer DEFAULT 2,
    options           jsonb DEFAULT '{}'::jsonb)
RETURNS double precision LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    RETURN (SELECT pg_catalog.avg(c.kl_divergence) FROM @schema@.sabre_kl_cuboids_impl($1, $2, $3, $4, $5, $6) AS c);
@errors@
END
$fn$;
COMMENT ON FUNCTION @schema@.sabre_kl_divergence(regclass, regclass, text[], text, integer, jsonb) IS
    'KL-divergence of the datacube of level mu (SABRE §6.2): mean over its cuboids, in nats';
