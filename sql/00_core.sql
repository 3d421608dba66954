-- sabre-pg core: metadata, shipped Python modules, version and self-test.
-- Placeholders are expanded by sabre_pg.installer (see its docstring): the schema
-- placeholder becomes the quoted schema name, the bootstrap placeholder the PL/Python
-- preamble that makes sabre_pg.* / sabre_plpy.* importable in the backend.
-- Idempotent: install = upgrade = re-run.

CREATE TABLE IF NOT EXISTS @schema@.meta (
    key   text PRIMARY KEY,
    value text NOT NULL
);
COMMENT ON TABLE @schema@.meta IS
    'sabre-pg installation metadata: version, build_id (new on every install/upgrade), source_hash, installed_at';

CREATE TABLE IF NOT EXISTS @schema@.modules (
    name       text PRIMARY KEY,
    source     text NOT NULL,
    is_package bool NOT NULL
);
COMMENT ON TABLE @schema@.modules IS
    'Python source served to PL/Python functions by the sabre-pg import hook (written by the installer)';

-- Every PL/Python function reads both at its start (the bootstrap preamble), so any role
-- allowed to use the schema must be able to read them. Nothing in them is secret.
REVOKE ALL ON @schema@.meta, @schema@.modules FROM PUBLIC;
GRANT SELECT ON @schema@.meta, @schema@.modules TO PUBLIC;

CREATE OR REPLACE FUNCTION @schema@.sabre_version() RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT m.value FROM @schema@.meta AS m WHERE m.key OPERATOR(pg_catalog.=) 'version'
$fn$;
COMMENT ON FUNCTION @schema@.sabre_version() IS 'Installed sabre-pg version';

CREATE OR REPLACE FUNCTION @schema@.sabre_selftest() RETURNS jsonb
LANGUAGE plpython3u VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
@bootstrap@
import json
import sys

import numpy as np

import sabre_pg
from sabre_pg.core.emd import ordered_emd

# Li, Li and Venkatasubramanian (ICDE 2007): salaries {3,4,5}k against all nine -> 0.375.
p = np.array([1 / 3, 1 / 3, 1 / 3, 0, 0, 0, 0, 0, 0])
q = np.full(9, 1 / 9)
emd = float(ordered_emd(p, q))
return json.dumps({
    "ok": abs(emd - 0.375) < 1e-9,
    "sabre_pg": sabre_pg.__version__,
    "python": sys.version.split()[0],
    "numpy": np.__version__,
    "emd_li2007": emd,
})
$fn$;
COMMENT ON FUNCTION @schema@.sabre_selftest() IS
    'Imports numpy and sabre_pg.core in the backend and checks the ordered EMD of Li et al. (0.375)';
