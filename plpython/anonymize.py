"""sabre_anonymize: SABRE inside PostgreSQL.

Pipeline (all data moves in bulk, never row by row; see docs/anonymize.md, Performance):
1. validate arguments and the source (SQLSTATE + message + HINT on every bad input) and load
   the hierarchies;
2. the SA frequency summary comes from one GROUP BY; bucketization and ECSize (the
   redistribution plan) run on that summary before any row is read;
3. one scan reads the key and every attribute in binary (categorical values as hashes
   mapped to hierarchy leaves), with the NULL and non-finite counts that validate them; its
   SA frequencies must equal the summary's (else the source changed: 40001);
4. the core engine (sabre_pg.core.sabre) computes Hilbert keys, takes ECs out of the
   buckets, generalizes them and measures their EMDs;
5. the side table <output>_keys (source key, bucket, hilbert_key, ec_id; btree on
   (bucket, hilbert_key)) is written with one unnest of bit-packed arrays, in the output's
   schema (where the caller needs CREATE anyway);
6. <output>_classes and <output> are built with set-based SQL under temporary names and
   swapped in at the end, so a rerun replaces them atomically;
7. the run is recorded in <schema>.runs.  Any error rolls everything back.
"""
from __future__ import annotations

import json
import math
import time

import numpy as np

from sabre_pg.core.emd import SADomain
from sabre_pg.core.hierarchy import Hierarchy
from sabre_pg.core.sabre import QuasiIdentifier, anonymize, plan_from_counts

from . import common as C
from . import transfer as T

OPTION_KEYS = ("hierarchies", "key", "seed", "keep", "weights", "nulls", "replace", "takeout", "lookahead")


class Attr:
    """A QI or the SA as read from the source."""

    def __init__(self, name, col, kind, hierarchy_name=None):
        self.name, self.col, self.kind, self.hname = name, col, kind, hierarchy_name
        self.hierarchy: Hierarchy | None = None
        self.seed = 0                       # of hashtextextended for categorical values
        self.leaf_hashes = None             # 32-bit hash of each hierarchy leaf (pre-order)
        self.check_hashes = None            # 64-bit check hash of each leaf

    @property
    def numerical(self):
        return self.kind == "numerical"


def _options(plpy, options) -> dict:
    return C.parse_options(plpy, options, OPTION_KEYS, '{"key": "id", "seed": 1}')


def _validate_scalars(plpy, t, k, method, opts):
    if t is None or not isinstance(t, (int, float)) or math.isnan(t) or not (0 < t <= 1):
        C.fail(plpy, C.INVALID_PARAMETER, "t must satisfy 0 < t <= 1, got %s" % t,
               "t is the largest Earth Mover's Distance allowed between an equivalence class "
               "and the whole table; typical values are 0.1 to 0.5.")
    if k is None or k < 1:
        C.fail(plpy, C.INVALID_PARAMETER, "k must be at least 1, got %s" % k,
               "k is the minimum number of rows per equivalence class.")
    if method not in ("ak", "knn"):
        C.fail(plpy, C.INVALID_PARAMETER, "unknown method %s" % json.dumps(method),
               "Use method => 'ak' (SABRE-AK, Hilbert curve) or 'knn' (SABRE-KNN, exact nearest neighbours).")
    takeout = opts.get("takeout", "sweep")
    if takeout not in ("sweep", "random"):
        C.fail(plpy, C.INVALID_PARAMETER, "unknown takeout %s" % json.dumps(takeout),
               "Use 'sweep' (seeds in Hilbert order, default) or 'random' (the paper's random seeds).")
    nulls = opts.get("nulls", "error")
    if nulls not in ("error", "drop"):
        C.fail(plpy, C.INVALID_PARAMETER, "options.nulls must be 'error' or 'drop', got %s" % json.dumps(nulls),
               "'drop' excludes rows with a NULL quasi-identifier or sensitive value.")
    seed = opts.get("seed", 1)
    if not isinstance(seed, int) or isinstance(seed, bool):
        C.fail(plpy, C.INVALID_PARAMETER, "options.seed must be an integer",
               'For example options => \'{"seed": 42}\'; the same seed gives the same classes.')
    replace = opts.get("replace", True)
    if not isinstance(replace, bool):
        C.fail(plpy, C.INVALID_PARAMETER, "options.replace must be true or false",
               "true (the default) replaces sabre's previous output of the same name.")
    lookahead = opts.get("lookahead", 4)
    if not isinstance(lookahead, int) or isinstance(lookahead, bool) or not 0 <= lookahead <= 64:
        C.fail(plpy, C.INVALID_PARAMETER, "options.lookahead must be an integer from 0 to 64",
               "0 is the paper's rule (stop bucketization at the first U < t); the default 4 also "
               "tries up to 4 further splits and keeps the one giving the most classes.")
    return takeout, nulls, seed, replace, lookahead


def _attributes(plpy, cols, quasi_identifiers, sensitive, opts):
    if not quasi_identifiers:
        C.fail(plpy, C.INVALID_PARAMETER, "quasi_identifiers is empty",
               "List the columns an attacker may know, e.g. ARRAY['age','sex','zip'].")
    qnames = list(quasi_identifiers)
    seen = set()
    for q in qnames:
        if q is None:
            C.fail(plpy, C.INVALID_PARAMETER, "quasi_identifiers contains NULL",
                   "List column names only, e.g. ARRAY['age','sex'].")
        if q in seen:
            C.fail(plpy, C.DUPLICATE_COLUMN, 'quasi-identifier "%s" is listed twice' % q,
                   "List each column once.")
        seen.add(q)
    avail = ", ".join(list(cols)[:30])
    for q in qnames + [sensitive]:
        if q is None or q not in cols:
            C.fail(plpy, C.UNDEFINED_COLUMN, 'column "%s" does not exist in the source' % q,
                   "Available columns: %s. Names are case-sensitive and not parsed: pass them "
                   "exactly as stored." % avail)
    if sensitive in seen:
        C.fail(plpy, C.INVALID_PARAMETER,
               'the sensitive attribute "%s" is also listed among the quasi-identifiers' % sensitive,
               "Remove it from quasi_identifiers: its values are published unchanged.")
    hier = opts.get("hierarchies", {}) or {}
    if not isinstance(hier, dict):
        C.fail(plpy, C.INVALID_PARAMETER, "options.hierarchies must map column names to hierarchy names",
               'For example {"marital": "marital_h"}.')
    for col, hn in hier.items():
        if col not in seen and col != sensitive:
            C.fail(plpy, C.INVALID_PARAMETER,
                   'options.hierarchies names column "%s", which is neither a quasi-identifier '
                   'nor the sensitive attribute' % col, "Hierarchies apply to the listed columns only.")
        if not isinstance(hn, str):
            C.fail(plpy, C.INVALID_PARAMETER, "hierarchy name for %s must be a string" % col,
                   'For example {"marital": "marital_h"}.')
    attrs = []
    for name in qnames + [sensitive]:
        col = cols[name]
        kind = C.kind_of(col)
        if name in hier:
            kind = "categorical"        # a named hierarchy makes any column categorical
        if kind is None:
            C.fail(plpy, C.DATATYPE_MISMATCH,
                   'column "%s" has type %s, which is neither numerical nor categorical' % (name, col["type"]),
                   "Numeric and date/time types are numerical; text, varchar, bool and enum are "
                   "categorical. Cast the column in a view.")
        attrs.append(Attr(name, col, kind, hier.get(name)))
    return attrs[:-1], attrs[-1]


def _key(plpy, src, cols, opts):
    key = opts.get("key")
    if key is not None:
        if not isinstance(key, str) or key not in cols:
            C.fail(plpy, C.UNDEFINED_COLUMN, 'options.key column "%s" does not exist in the source' % key,
                   "Name a column that identifies each row uniquely.")
        unique_idx = plpy.execute(plpy.prepare(
            "SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
            "AND a.attnum = i.indkey[0] WHERE i.indrelid = $1 AND i.indisunique "
            "AND i.indnkeyatts = 1 AND i.indpred IS NULL AND a.attname = $2", ["oid", "text"]),
            [src["oid"], key])
        return key, bool(len(unique_idx))
    pk = plpy.execute(plpy.prepare(
        "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
        "AND a.attnum = ANY (i.indkey) WHERE i.indrelid = $1 AND i.indisprimary", ["oid"]),
        [src["oid"]])
    if len(pk) == 1:
        return pk[0]["attname"], True
    C.fail(plpy, C.INVALID_PARAMETER,
           "cannot identify rows of %s: %s" % (src["qname"], "it has a composite primary key"
                                                 if len(pk) > 1 else "it has no single-column primary key"),
           'Name a unique column with options => \'{"key": "id"}\'.')


def _output_name(plpy, src, output):
    if output is None:
        return src["nspname"], src["relname"] + "_sabre"
    try:
        parts = plpy.execute(plpy.prepare("SELECT parse_ident($1) AS p", ["text"]), [output])[0]["p"]
    except plpy.SPIError:
        C.fail(plpy, C.INVALID_NAME, "output %s is not a valid (optionally schema-qualified) name"
               % json.dumps(output),
               "Quote names with special characters, e.g. output => 'public.\"my;table\"'.")
    if len(parts) == 1:
        return src["nspname"], parts[0]
    if len(parts) == 2:
        return parts[0], parts[1]
    C.fail(plpy, C.INVALID_NAME, "output %s has too many dotted parts" % json.dumps(output),
           "Use schema.table or table.")


MAX_NAME = 63          # NAMEDATALEN - 1 bytes
LONGEST_SUFFIX = "_classes_pkey"


def _check_output(plpy, schema, src, oschema, oname, replace):
    """Existing relations named <output> / <output>_classes / <output>_keys must be sabre's own."""
    if len((oname + LONGEST_SUFFIX).encode()) > MAX_NAME:
        C.fail(plpy, "42622", "output name %s is too long" % json.dumps(oname),
               "sabre also creates %s_classes, %s_keys and their indexes; PostgreSQL names hold %d "
               "bytes, so the output name may have at most %d." % (
                   oname, oname, MAX_NAME, MAX_NAME - len(LONGEST_SUFFIX)))
    exists = plpy.execute(plpy.prepare("SELECT 1 FROM pg_namespace WHERE nspname = $1", ["text"]), [oschema])
    if not len(exists):
        C.fail(plpy, "3F000", 'schema "%s" of the output does not exist' % oschema,
               "Create it first or choose another output schema.")
    owned = []
    for name in (oname, oname + "_classes", oname + "_keys"):
        r = plpy.execute(plpy.prepare(
            "SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = $1 AND c.relname = $2", ["text", "text"]), [oschema, name])
        if not len(r):
            continue
        oid = r[0]["oid"]
        if oid == src["oid"]:
            C.fail(plpy, C.DUPLICATE_TABLE, "the output %s is the source itself" % C.qname(plpy, oschema, name),
                   "The source is never modified: choose another output name.")
        mine = plpy.execute(plpy.prepare(
            "SELECT 1 FROM %s.runs WHERE output_oid = $1 OR output_name = $2 LIMIT 1"
            % plpy.quote_ident(schema), ["oid", "text"]), [oid, C.qname(plpy, oschema, oname)])
        if not len(mine):
            C.fail(plpy, C.DUPLICATE_TABLE,
                   "relation %s already exists and was not created by sabre" % C.qname(plpy, oschema, name),
                   "Choose another output name or drop that relation yourself; options.replace only "
                   "replaces sabre's own outputs.")
        if not replace:
            C.fail(plpy, C.DUPLICATE_TABLE, "output %s already exists" % C.qname(plpy, oschema, name),
                   "Set options.replace to true (the default) to replace sabre's previous output.")
        owned.append(oid)
    return owned


def run(plpy, source, quasi_identifiers, sensitive, t, k, method, output, options):
    T0 = time.perf_counter()
    phases = {}
    opts = _options(plpy, options)
    takeout, nulls, seed, replace, lookahead = _validate_scalars(plpy, t, k, method, opts)
    schema = C.sabre_schema(plpy)
    qs = plpy.quote_ident(schema)
    src = C.resolve_relation(plpy, source)
    if src["relkind"] not in ("r", "v", "m", "p", "f"):
        C.fail(plpy, C.INVALID_PARAMETER, "%s is not a table or view" % src["qname"],
               "Pass a table, view, materialized view or foreign table.")
    cols = C.columns(plpy, src["oid"])
    qis, sa = _attributes(plpy, cols, quasi_identifiers, sensitive, opts)
    key, key_unique = _key(plpy, src, cols, opts)
    keep = opts.get("keep", []) or []
    if not isinstance(keep, list) or not all(isinstance(c, str) for c in keep):
        C.fail(plpy, C.INVALID_PARAMETER, "options.keep must be a list of column names",
               'For example {"keep": ["id", "visit_date"]}.')
    out_cols = {"ec_id"}
    for a in qis:
        out_cols |= {a.name + "_lo", a.name + "_hi"} if a.numerical else {a.name}
    out_cols.add(sa.name)
    for c in keep:
        if c not in cols:
            C.fail(plpy, C.UNDEFINED_COLUMN, 'options.keep column "%s" does not exist in the source' % c,
                   "Available columns: %s." % ", ".join(list(cols)[:30]))
        if c in out_cols or c in [a.name for a in qis]:
            C.fail(plpy, C.DUPLICATE_COLUMN, 'options.keep column "%s" clashes with an output column' % c,
                   "Quasi-identifiers are published generalized only; keep other columns.")
        out_cols.add(c)
    weights = None
    if opts.get("weights"):
        w = opts["weights"]
        if not isinstance(w, dict) or any(n not in [a.name for a in qis] for n in w) or \
                any(not isinstance(v, (int, float)) or v < 0 for v in w.values()):
            C.fail(plpy, C.INVALID_PARAMETER, "options.weights must map quasi-identifiers to weights >= 0",
                   'For example {"age": 2, "sex": 1}; unnamed quasi-identifiers weigh 1; weights are normalized.')
        raw = np.array([float(w.get(a.name, 1.0)) for a in qis])
        if raw.sum() <= 0:
            C.fail(plpy, C.INVALID_PARAMETER, "options.weights must not all be zero",
                   "Give at least one quasi-identifier a positive weight.")
        weights = raw / raw.sum()
    oschema, oname = _output_name(plpy, src, output)
    owned = _check_output(plpy, schema, src, oschema, oname, replace)

    # hash joins of millions of rows: give this transaction room (restored at the end)
    old_wm = plpy.execute("SELECT current_setting('work_mem') AS w")[0]["w"]
    plpy.execute("SELECT set_config('work_mem', '256MB', true)")

    # ---- 2. hierarchies (before the scan: categorical values are read as hashes of leaves)
    S = src["qname"]
    attrs = qis + [sa]
    where = _not_null(plpy, attrs, "s.") if nulls == "drop" else ""
    for a in attrs:
        if a.kind != "categorical" or (a is sa and a.hname is None):
            continue                    # (a flat SA hierarchy comes from the SA summary)
        if a.hname is not None:
            a.hierarchy = C.load_hierarchy(plpy, schema, a.hname, 'for column "%s"' % a.name)
        else:
            vals = plpy.execute("SELECT array_agg(v ORDER BY v) AS vs FROM (SELECT DISTINCT s.%s::text AS v "
                                "FROM %s AS s%s) d" % (C.qi(plpy, a.name), S, where or
                                                       " WHERE s.%s IS NOT NULL" % C.qi(plpy, a.name)))[0]["vs"] or []
            a.hierarchy = Hierarchy.flat(vals, root="*" if "*" not in vals else "(any)", name=a.name) \
                if vals else None
        if a.hierarchy is not None:
            a.seed, a.leaf_hashes, a.check_hashes = _leaf_hashes(plpy, a.hierarchy.leaves)
    T1 = time.perf_counter()
    phases["validate"] = T1 - T0

    # ---- 3. the SA frequency summary (one GROUP BY); bucketization and ECSize run on it
    n_sa, counts, distinct = _sa_summary(plpy, S, sa, attrs, where, nulls)
    if not sa.numerical and sa.leaf_hashes is None:
        sa.seed, sa.leaf_hashes, sa.check_hashes = _leaf_hashes(plpy, sa.hierarchy.leaves)
    if k > n_sa:
        C.fail(plpy, C.INVALID_PARAMETER, "k = %d exceeds the %d rows of the source" % (k, n_sa),
               "Every equivalence class needs at least k rows: choose k <= %d." % n_sa)
    domain = SADomain("numerical", m=len(distinct)) if sa.numerical else \
        SADomain("categorical", hierarchy=sa.hierarchy)
    try:
        summary = plan_from_counts(counts, domain, t, k, lookahead)
    except ValueError as e:
        C.fail(plpy, C.INVALID_PARAMETER, str(e), "Check the arguments of sabre_anonymize.")
    T2 = time.perf_counter()
    phases["summary"] = T2 - T1 - sum(summary.phases.values())

    # ---- 4. one scan: counts (rows, NULLs, non-finite values) and every column, in binary
    n, keys, data = _read(plpy, S, key, cols[key], key_unique, attrs, where, nulls)
    if sa.numerical:
        codes = np.searchsorted(distinct, data[-1])
        np.minimum(codes, len(distinct) - 1, out=codes)
        same = bool((distinct[codes] == data[-1]).all())
    else:
        codes = data[-1]
        same = True
    if n != n_sa or not same or not np.array_equal(np.bincount(codes, minlength=domain.m), counts):
        C.fail(plpy, "40001", "the source %s changed while sabre read it (the SA frequencies of the "
               "summary and of the scan differ)" % S,
               "Run again, or call sabre_anonymize inside a REPEATABLE READ transaction so that "
               "all of its queries see one snapshot.")
    T3 = time.perf_counter()
    phases["read"] = T3 - T2

    # ---- 5. core: Hilbert keys, takeOut, generalization, per-class EMDs
    core_qis = [QuasiIdentifier(a.name, data[i], None if a.numerical else a.hierarchy)
                for i, a in enumerate(qis)]
    try:
        res = anonymize(core_qis, codes, domain, t, k, method=method, seed=seed, takeout=takeout,
                        weights=weights, summary=summary)
    except ValueError as e:
        C.fail(plpy, C.INVALID_PARAMETER, str(e), "Check the arguments of sabre_anonymize.")
    for name, sec in res.phases.items():
        if name != "total":
            phases[name] = sec
    T3 = time.perf_counter()

    # ---- 6. side table: source key -> bucket, Hilbert key, EC (one unnest)
    run_id = plpy.execute("SELECT nextval('%s.runs_run_id_seq') AS r" % qs)[0]["r"]
    keys_table = C.qname(plpy, oschema, "sabre_tmp_%d_k" % run_id)
    _write_keys(plpy, keys_table, C.qi(plpy, "sabre_tmp_%d_k_idx" % run_id), cols[key], keys, res)
    del keys
    plpy.execute("COMMENT ON TABLE %s IS %s" % (keys_table, plpy.quote_literal(
        "sabre-pg run %d: source key -> SA bucket, Hilbert key, equivalence class" % run_id)))
    T4 = time.perf_counter()
    phases["write_keys"] = T4 - T3

    # ---- 7. <output>_classes and <output>, built under temporary names, then swapped in
    tmp_c = C.qname(plpy, oschema, "sabre_tmp_%d_c" % run_id)
    tmp_o = C.qname(plpy, oschema, "sabre_tmp_%d_o" % run_id)
    gen_cols = _write_classes(plpy, tmp_c, qis, data, res, S, keys_table, key)
    plpy.execute("ALTER TABLE %s ADD CONSTRAINT %s PRIMARY KEY (ec_id)" % (
        tmp_c, C.qi(plpy, "sabre_tmp_%d_c_pkey" % run_id)))
    T4b = time.perf_counter()
    phases["build_classes"] = T4b - T4
    if not keep and _exact_from_codes(sa):
        # every output value is known here: expand the classes, no join with the source
        _write_output_from_classes(plpy, tmp_o, tmp_c, gen_cols, sa, codes, distinct, res)
    else:
        osel = ["k.ec_id"] + ["c.%s" % C.qi(plpy, g) for g in gen_cols] + \
               ["s.%s" % C.qi(plpy, sa.name)] + ["s.%s" % C.qi(plpy, c) for c in keep]
        plpy.execute("CREATE TABLE %s AS SELECT %s FROM %s AS s JOIN %s AS k ON k.key = s.%s "
                     "JOIN %s AS c ON c.ec_id = k.ec_id" % (
                         tmp_o, ", ".join(osel), S, keys_table, C.qi(plpy, key), tmp_c))
    # swap in: drop sabre's previous output (and its side table), rename the new one
    T4c = time.perf_counter()
    phases["build_output"] = T4c - T4b
    old = [C.relation_info(plpy, oid) for oid in owned]
    old = [C.qname(plpy, i["nspname"], i["relname"]) for i in old if i is not None]
    if old:
        # autovacuum may be analyzing the previous output; it yields to our lock only when we
        # have waited deadlock_timeout (1 s by default) -- shorten that where the caller may
        with C.settings(plpy, optional=True, deadlock_timeout="20ms"):
            plpy.execute("DROP TABLE IF EXISTS %s CASCADE" % ", ".join(old))
    plpy.execute("ALTER INDEX %s RENAME TO %s" % (
        C.qname(plpy, oschema, "sabre_tmp_%d_c_pkey" % run_id), C.qi(plpy, oname + "_classes_pkey")))
    plpy.execute("ALTER INDEX %s RENAME TO %s" % (
        C.qname(plpy, oschema, "sabre_tmp_%d_k_idx" % run_id), C.qi(plpy, oname + "_keys_idx")))
    plpy.execute("ALTER TABLE %s RENAME TO %s" % (keys_table, C.qi(plpy, oname + "_keys")))
    keys_table = C.qname(plpy, oschema, oname + "_keys")
    plpy.execute("ALTER TABLE %s RENAME TO %s" % (tmp_c, C.qi(plpy, oname + "_classes")))
    plpy.execute("ALTER TABLE %s RENAME TO %s" % (tmp_o, C.qi(plpy, oname)))
    out_q = C.qname(plpy, oschema, oname)
    plpy.execute("COMMENT ON TABLE %s IS %s" % (out_q, plpy.quote_literal(
        "sabre-pg output of run %d: %s anonymized with SABRE-%s, t = %g, k = %d"
        % (run_id, S, method.upper(), t, k))))
    T4d = time.perf_counter()
    phases["swap"] = T4d - T4c
    # no ANALYZE here: autovacuum analyzes the new tables (it costs ~15 % of a run)
    out_oid = plpy.execute(plpy.prepare("SELECT to_regclass($1)::oid AS o", ["text"]), [out_q])[0]["o"]
    C_n = res.n_classes

    # ---- 8. the run catalog
    summ = res.summary(k)
    seconds = time.perf_counter() - T0
    phases["total"] = seconds
    plpy.execute(plpy.prepare(
        "INSERT INTO %s.runs (run_id, source, source_oid, output_name, output_oid, keys_table, relations, "
        "quasi_identifiers, sensitive, t, k, method, options, status, started_at, finished_at, rows, "
        "classes, buckets, u, min_class_size, max_class_size, max_emd, ail, discernibility, phases, seconds) "
        "VALUES ($1, $2, $3, $4, $5, $6, $24, $7, $8, $9, $10, $11, $12, 'done', "
        "clock_timestamp() - make_interval(secs => $13), clock_timestamp(), $14, $15, $16, $17, $18, "
        "$19, $20, $21, $22, $23, $13)" % qs,
        ["bigint", "text", "oid", "text", "oid", "text", "text[]", "text", "float8", "int", "text",
         "jsonb", "float8", "bigint", "bigint", "int", "float8", "bigint", "bigint", "float8", "float8",
         "bigint", "jsonb", "text[]"]),
        [run_id, S, src["oid"], out_q, out_oid, keys_table, [a.name for a in qis], sa.name, t, k, method,
         json.dumps(opts), seconds, n, C_n, summ["buckets"], summ["U"], summ["min_class_size"],
         summ["max_class_size"], summ["max_emd"], summ["ail"], summ["discernibility"],
         json.dumps({p: round(v, 6) for p, v in phases.items()}),
         [out_q, C.qname(plpy, oschema, oname + "_classes"), keys_table]])
    plpy.execute(plpy.prepare("SELECT set_config('work_mem', $1, true)", ["text"]), [old_wm])
    return [(run_id, out_oid, n, C_n, summ["min_class_size"], summ["max_emd"], summ["ail"], seconds)]


# A categorical value travels as the low 32 bits of a 64-bit hash of its text (two values
# per bigint element) and is mapped to the hierarchy leaf with those bits; the seed is chosen
# so that the leaves' low 32 bits are distinct.  Exactness does not rest on 32 bits: the
# scan also sums the hashes' high 32 bits, and the sum over the mapped leaves must equal it
# -- a value that is no leaf but shares a leaf's low 32 bits changes the sum unless its high
# 32 bits also match (probability 2^-32 on top of the 2^-32 collision).
HASH = "hashtextextended({v}::text, {seed})"
LOW32 = 4294967295
NONFINITE = "IN ('NaN'::float8, 'Infinity'::float8, '-Infinity'::float8)"


def _leaf_hashes(plpy, leaves):
    """(seed, low 32 bits, full 64-bit hashes) of a hierarchy's leaves, in leaf order, with a
    seed under which the low 32 bits are distinct."""
    plan = plpy.prepare(
        "SELECT %s AS h FROM (SELECT v FROM unnest($1::text[]) WITH ORDINALITY AS u(v, i) "
        "ORDER BY i) AS u" % T.binary_agg(HASH.format(v="u.v", seed="$2"), "int8"), ["text[]", "int8"])
    for seed in range(64):
        full = T.decode_array(plpy.execute(plan, [leaves, seed])[0]["h"], "int8", len(leaves))
        low = full & LOW32
        if len(np.unique(low)) == len(low):
            return seed, low, full
    C.fail(plpy, "XX000", "cannot find distinct 32-bit hashes for the %d leaves of a hierarchy"
           % len(leaves), "Hierarchies of more than about 100,000 leaves are not supported.")


def _sa_summary(plpy, S, sa, attrs, where, nulls):
    """The SA frequency summary: one ``GROUP BY`` over the sensitive column.

    Returns (rows with a non-NULL SA, counts per SA code, sorted distinct values for a
    numerical SA or None).  A numerical SA's codes index its distinct values (int8 for
    integer types, else the float8 of the read); a categorical SA's codes are its hierarchy's
    leaf positions, and a value that is no leaf is reported here, matched exactly by text.
    """
    c = "s." + C.qi(plpy, sa.name)
    if sa.numerical:
        integer = sa.col["typname"] in INTEGER_TYPES
        vtype = "int8" if integer else "float8"
        expr = "%s::int8" % c if integer else C.numeric_expr(plpy, sa.name, sa.col, "s.")
        r = plpy.execute(
            "SELECT coalesce(sum(g.n) FILTER (WHERE g.v IS NULL), 0) AS nulls, "
            "coalesce(sum(g.n) FILTER (WHERE g.v IS NOT NULL), 0) AS total, "
            "count(*) FILTER (WHERE g.v IS NOT NULL) AS m, %s AS bad, "
            "string_agg(%ssend(g.v), ''::bytea ORDER BY g.v) FILTER (WHERE g.v IS NOT NULL) AS vs, "
            "string_agg(int8send(g.n), ''::bytea ORDER BY g.v) FILTER (WHERE g.v IS NOT NULL) AS ns "
            "FROM (SELECT %s AS v, count(*) AS n FROM %s AS s%s GROUP BY 1) AS g" % (
                "0" if integer else "coalesce(sum(g.n) FILTER (WHERE g.v %s), 0)" % NONFINITE,
                vtype, expr, S, where))[0]
        if r["bad"]:
            _nonfinite_error(plpy, [(sa.name, r["bad"])])
        distinct = T.decode_array(r["vs"], vtype, r["m"])
        counts = T.decode_array(r["ns"], "int8", r["m"])
    else:
        r = plpy.execute(
            "SELECT coalesce(sum(g.n) FILTER (WHERE g.v IS NULL), 0) AS nulls, "
            "coalesce(sum(g.n) FILTER (WHERE g.v IS NOT NULL), 0) AS total, "
            "array_agg(g.v) FILTER (WHERE g.v IS NOT NULL) AS vs, "
            "array_agg(g.n) FILTER (WHERE g.v IS NOT NULL) AS ns "
            "FROM (SELECT %s::text AS v, count(*) AS n FROM %s AS s%s GROUP BY 1) AS g" % (c, S, where))[0]
        if sa.hierarchy is None and r["vs"]:           # no hierarchy named: the flat one
            vals = sorted(r["vs"])
            sa.hierarchy = Hierarchy.flat(vals, root="*" if "*" not in vals else "(any)", name=sa.name)
        leaf = {v: i for i, v in enumerate(sa.hierarchy.leaves)} if sa.hierarchy else {}
        missing = sorted(v for v in (r["vs"] or []) if v not in leaf)
        if missing:
            _missing_error(plpy, sa, len(missing), missing[:5])
        counts = np.zeros(len(leaf), dtype=np.int64)
        for v, cnt in zip(r["vs"] or [], r["ns"] or []):
            counts[leaf[v]] = cnt
        distinct = None
    if r["nulls"] and nulls == "error":
        _null_error(plpy, attrs, plpy.execute("SELECT count(*) AS n, %s FROM %s AS s" % (
            ", ".join("count(s.%s) AS c%d" % (C.qi(plpy, a.name), i) for i, a in enumerate(attrs)), S))[0])
    if r["total"] == 0:
        _no_rows(plpy, S, where)
    return int(r["total"]), counts, distinct


def _read(plpy, S, key, key_col, key_unique, attrs, where, nulls):
    """Read the key and every attribute in one scan, with the counts that validate them.

    An inner query computes each value once (categorical hashes, numbers as float8 where
    needed); the aggregate reads numerical columns as int8 (bigint), float8 or two per
    element (int2/int4), categorical ones as the low 32 bits of their hash, two per element,
    mapped here to pre-order leaf positions (see HASH).  NULL counts are read only for
    columns that may hold NULLs.  Returns (rows, keys, per-attribute arrays); keys is an
    int64 array for integer keys, else a list of the keys' text.
    """
    int_key = key_col["typname"] in INTEGER_TYPES
    inner = ["s.%s AS k" % C.qi(plpy, key)]
    sel = ["count(*) AS n",
           (T.binary_agg("s.k", "int8") if int_key else "array_agg(s.k::text)") + " AS key"]
    if not key_col["notnull"]:
        sel.append("count(s.k) AS nk")
    types, half = [None] * len(attrs), []          # half: 32-bit items, read two per element
    for i, a in enumerate(attrs):
        c = "s." + C.qi(plpy, a.name)
        v = "s.a%d" % i
        if not a.col["notnull"]:
            sel.append("count(%s) AS c%d" % (v, i))
        if not a.numerical:
            inner.append("%s AS a%d" % (HASH.format(v=c, seed=a.seed), i))
            half.append((i, "(%s & %d)" % (v, LOW32)))
            sel.append("sum((%s >> 32)::int4) AS k%d" % (v, i))
        elif a.col["typname"] in ("int2", "int4"):
            inner.append("%s AS a%d" % (c, i))
            half.append((i, v))
        elif a.col["typname"] == "int8":
            inner.append("%s AS a%d" % (c, i))
            sel.append("%s AS a%d" % (T.binary_agg(v, "int8"), i))
            types[i] = "int8"
        else:
            inner.append("%s AS a%d" % (C.numeric_expr(plpy, a.name, a.col, "s."), i))
            sel.append("count(*) FILTER (WHERE %s %s) AS f%d" % (v, NONFINITE, i))
            sel.append("%s AS a%d" % (T.binary_agg(v, "float8"), i))
            types[i] = "float8"
    pairs = [(half[j], half[j + 1] if j + 1 < len(half) else None) for j in range(0, len(half), 2)]
    for (i, e1), second in pairs:
        sel.append("%s AS p%d" % (T.binary_agg(T.int32_pair_sql(e1, second[1]) if second else e1, "int8"), i))
    # OFFSET 0 keeps the inner query a subquery, so each hash is computed once per row
    row = plpy.execute("SELECT %s FROM (SELECT %s FROM %s AS s%s OFFSET 0) AS s" % (
        ", ".join(sel), ", ".join(inner), S, where))[0]
    n = row["n"]
    if n == 0:
        _no_rows(plpy, S, where)
    _null_error(plpy, attrs, row)      # (only with nulls = 'error': 'drop' filtered them)
    bad = [(a.name, row["f%d" % i]) for i, a in enumerate(attrs) if row.get("f%d" % i)]
    if bad:
        _nonfinite_error(plpy, bad)
    if not key_col["notnull"] and row["nk"] < n:
        C.fail(plpy, C.NULL_NOT_ALLOWED, 'key column "%s" has %d NULLs' % (key, n - row["nk"]),
               "The key must identify each row: use a primary key or a unique NOT NULL column.")
    keys = T.decode_array(row["key"], "int8", n) if int_key else list(row["key"])
    row["key"] = None
    if not key_unique:
        distinct = len(np.unique(keys)) if int_key else len(set(keys))
        if distinct < n:
            C.fail(plpy, C.INVALID_PARAMETER, 'options.key column "%s" is not unique (%d duplicates)'
                   % (key, n - distinct),
                   "The key must identify each row; use a primary key or a unique column.")
    data = [None] * len(attrs)
    for (i, _), second in pairs:
        w = T.decode_array(row["p%d" % i], "int8", n)
        row["p%d" % i] = None
        if second:
            data[i], data[second[0]] = T.split_int32_pair(w)
        else:
            data[i] = w
    for i, a in enumerate(attrs):
        if types[i] is not None:
            data[i] = T.decode_array(row["a%d" % i], types[i], n)
            row["a%d" % i] = None
        elif not a.numerical:
            pos, missing = T.hash_positions(data[i] & LOW32, a.leaf_hashes)
            if missing or not _checksum_matches(row["k%d" % i], pos, a):
                _missing_values(plpy, a, S, where)
                C.fail(plpy, "XX000", 'inconsistent read of column "%s"' % a.name)
            data[i] = pos
    return n, keys, data


def _null_error(plpy, attrs, row):
    """Raise the NULL error naming every attribute with NULLs, given a row with the total
    ``n`` and ``c<i>`` = count(attribute i) (absent for NOT NULL columns)."""
    n = row["n"]
    nulls_by = [(a.name, n - row["c%d" % i]) for i, a in enumerate(attrs)
                if row.get("c%d" % i) is not None and row["c%d" % i] < n]
    if nulls_by:
        C.fail(plpy, C.NULL_NOT_ALLOWED, "NULL values in %s" % ", ".join('"%s" (%d rows)' % nc for nc in nulls_by),
               "Fill or filter them (e.g. in a view), or pass options => '{\"nulls\": \"drop\"}' to "
               "exclude those rows explicitly.")


def _checksum_matches(expected, positions, a) -> bool:
    """Whether the sum of the hashes' high 32 bits over the rows equals the sum over their
    mapped leaves."""
    counts = np.bincount(positions, minlength=len(a.check_hashes))
    high = (a.check_hashes >> 32).tolist()
    got = sum(int(c) * h for c, h in zip(counts.tolist(), high) if c)
    return int(expected) == got


def _write_keys(plpy, table, index, key_col, keys, res):
    """The side table, in index order (bucket, hilbert_key): one unnest of the Hilbert keys
    and bit-packed words holding the EC id, the bucket and (integer keys whose range fits)
    the source key as an offset from its minimum; other keys travel as text.  Then its btree."""
    order = res.by_bucket_and_key()
    fields = [("ec", res.ec[order]), ("bucket", res.bucket_of_tuple[order])]
    int_key = isinstance(keys, np.ndarray)
    kmin = int(keys.min()) if int_key else 0
    packed_key = int_key and int(keys.max()) - kmin < 1 << T.WORD_BITS
    if packed_key:
        fields.insert(0, ("key", keys[order] - kmin))
    pack = T.BitPack(fields)
    words = ["u.w%d" % j for j in range(len(pack.words))]
    cols = ["unnest($1::int8[]) AS hilbert_key"] + [
        "unnest($%d::int8[]) AS w%d" % (j + 2, j) for j in range(len(words))]
    params = [res.keys[order].tolist()] + [w.tolist() for w in pack.words]
    types = ["int8[]"] * len(params)
    if packed_key:
        key_expr = "(%d::int8 + %s)" % (kmin, pack.sql("key", words))
    else:
        key_expr = "u.key"
        cols.append("unnest($%d::%s[]) AS key" % (len(params) + 1, "int8" if int_key else "text"))
        params.append(keys[order].tolist() if int_key else [keys[i] for i in order.tolist()])
        types.append("int8[]" if int_key else "text[]")
    plpy.execute(plpy.prepare(
        # UNLOGGED: derived data, rebuilt by rerunning; skipping WAL halves the write.
        # (unnest in the select list streams; in FROM it would first materialize the rows)
        "CREATE UNLOGGED TABLE %s AS SELECT %s::%s AS key, %s::int AS bucket, u.hilbert_key, "
        "%s AS ec_id FROM (SELECT %s) AS u" % (
            table, key_expr, key_col["type"], pack.sql("bucket", words), pack.sql("ec", words),
            ", ".join(cols)), types), params)
    del params
    plpy.execute("CREATE INDEX %s ON %s (bucket, hilbert_key)" % (index, table))
    _owner_only(plpy, table)


def _owner_only(plpy, table):
    """Drop privileges that default privileges gave to others: the side table maps source
    keys to SA buckets and is for sabre and its owner only."""
    for r in plpy.execute(plpy.prepare(
            "SELECT DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(r.rolname) END AS g "
            "FROM pg_class c, aclexplode(c.relacl) a LEFT JOIN pg_roles r ON r.oid = a.grantee "
            "WHERE c.oid = $1::regclass AND a.grantee <> c.relowner", ["text"]), [table]):
        plpy.execute("REVOKE ALL ON %s FROM %s" % (table, r["g"]))


def _write_classes(plpy, table, qis, data, res, S, keys_table, key):
    """<output>_classes: one row per EC.  Sizes, integer range ends (as
    offsets from the column minimum) and hierarchy node ids travel bit-packed; float range
    ends and EMDs as float8; labels come from a join with each hierarchy's node labels;
    numeric (arbitrary precision) ranges are exact aggregates over the source."""
    fields = [("size", res.sizes)]
    floats, exprs, gen_cols, joins, exact_aggs = [], [], [], [], []
    label_params = []
    for i, a in enumerate(qis):
        g = res.generalization[i]
        if a.numerical and a.col["typname"] == "numeric":
            for suffix, agg in (("_lo", "min"), ("_hi", "max")):
                name = a.name + suffix
                exact_aggs.append("%s(s.%s)::%s AS %s" % (agg, C.qi(plpy, a.name), a.col["type"],
                                                          C.qi(plpy, name)))
                exprs.append("g.%s" % C.qi(plpy, name))
                gen_cols.append(name)
        elif a.numerical and a.col["typname"] in INTEGER_TYPES:
            base = int(data[i].min())
            for suffix, arr in (("_lo", g.lo), ("_hi", g.hi)):
                fields.append((a.name + suffix, np.asarray(arr, dtype=np.int64) - base))
                exprs.append(("int", a, suffix, base))
                gen_cols.append(a.name + suffix)
        elif a.numerical:
            for suffix, arr in (("_lo", g.lo), ("_hi", g.hi)):
                floats.append(np.asarray(arr, dtype=np.float64))
                exprs.append(_from_float(plpy, "u.f%d" % (len(floats) - 1), a.col) + " AS %s"
                             % C.qi(plpy, a.name + suffix))
                gen_cols.append(a.name + suffix)
        else:
            fields.append((a.name, g.node))
            label_params.append(list(a.hierarchy.labels))
            j = len(label_params)
            joins.append("JOIN unnest($%%d::text[]) WITH ORDINALITY AS l%d(label, id) ON l%d.id = %%s + 1"
                         % (j, j))
            exprs.append(("cat", a, j))
            gen_cols.append(a.name)
    pack = T.BitPack(fields)
    words = ["u.w%d" % j for j in range(len(pack.words))]
    params = [res.emds.tolist()] + [w.tolist() for w in pack.words] + [f.tolist() for f in floats]
    types = ["float8[]"] + ["int8[]"] * len(pack.words) + ["float8[]"] * len(floats)
    cols = ["emd"] + ["w%d" % j for j in range(len(pack.words))] + ["f%d" % j for j in range(len(floats))]
    sel = ["u.ec_id", "%s AS size" % pack.sql("size", words), "u.emd"]
    join_sql = []
    for e in exprs:
        if isinstance(e, str):
            sel.append(e)
        elif e[0] == "int":
            _, a, suffix, base = e
            sel.append("(%d + %s)::%s AS %s" % (base, pack.sql(a.name + suffix, words), a.col["type"],
                                                C.qi(plpy, a.name + suffix)))
        else:
            _, a, j = e
            params.append(label_params[j - 1])
            types.append("text[]")
            if len(label_params[j - 1]) <= SUBSCRIPT_LABELS:
                # a short text array: subscripting (a linear walk) beats a join
                sel.append("($%d::text[])[%s + 1] AS %s" % (len(params), pack.sql(a.name, words),
                                                             C.qi(plpy, a.name)))
            else:
                join_sql.append(joins[j - 1] % (len(params), pack.sql(a.name, words)))
                sel.append("l%d.label AS %s" % (j, C.qi(plpy, a.name)))
    q = "CREATE TABLE %s AS SELECT %s FROM (SELECT generate_series(0::bigint, %d) AS ec_id, %s) AS u %s" % (
        table, ", ".join(sel), res.n_classes - 1, ", ".join(
            "unnest($%d::%s) AS %s" % (j + 1, types[j], cols[j]) for j in range(len(cols))),
        " ".join(join_sql))
    if exact_aggs:
        q += (" JOIN (SELECT k.ec_id AS g_ec, %s FROM %s AS s JOIN %s AS k ON k.key = s.%s GROUP BY k.ec_id)"
              " AS g ON g.g_ec = u.ec_id" % (", ".join(exact_aggs), S, keys_table, C.qi(plpy, key)))
    # the planner cannot estimate joins on unpacked bit fields and would pick nested loops
    # over the label lists (quadratic); hash joins are right for these small lists
    with C.settings(plpy, enable_nestloop="off"):
        plpy.execute(plpy.prepare(q, types), params)
    return gen_cols


SUBSCRIPT_LABELS = 256      # hierarchies with at most this many nodes label by array subscript


def _exact_from_codes(sa):
    """Whether the SA's own values can be rebuilt exactly from what was read (so the output
    needs no join with the source): integers, float4/float8 and dates read as numbers, any
    categorical type from its leaf's text."""
    if not sa.numerical:
        return True
    return sa.col["typname"] in INTEGER_TYPES + ("float4", "float8", "date")


def _write_output_from_classes(plpy, table, classes, gen_cols, sa, codes, distinct, res):
    """<output> by expanding each class (in ec_id order) into its rows' SA values: one array
    sorted by EC (an integer SA's own values, else codes) and each class unnests its slice."""
    idx = res.index
    sorted_codes = np.asarray(codes, dtype=np.int64)[idx.order]
    gsel = ", ".join("c.%s" % C.qi(plpy, g) for g in gen_cols)
    qsa = C.qi(plpy, sa.name)
    slice_ = "unnest(($1::%s[])[($2::int8[])[c.ec_id + 1] + 1 : ($2::int8[])[c.ec_id + 1] + c.size])"
    if sa.numerical and sa.col["typname"] in INTEGER_TYPES:
        # the values themselves, in the column's own type: no lookup per row
        q = "CREATE TABLE %s AS SELECT c.ec_id, %s, %s AS %s FROM %s AS c" % (
            table, gsel, slice_ % sa.col["typname"], qsa, classes)
        params = [np.asarray(distinct, dtype=np.int64)[sorted_codes].tolist(), idx.starts.tolist()]
        types = ["%s[]" % sa.col["typname"], "int8[]"]
    else:
        xsel = ", ".join("x.%s" % C.qi(plpy, g) for g in gen_cols)
        if sa.numerical:
            value = _from_float(plpy, "($3::float8[])[x.code + 1]", sa.col)
            join, vals, vtype = "", np.asarray(distinct, dtype=np.float64).tolist(), "float8[]"
        else:
            value = "m.v::%s" % sa.col["type"]
            join = " JOIN unnest($3::text[]) WITH ORDINALITY AS m(v, i) ON m.i = x.code + 1"
            vals, vtype = list(sa.hierarchy.leaves), "text[]"
        q = "CREATE TABLE %s AS SELECT x.ec_id, %s, %s AS %s FROM (SELECT c.ec_id, %s, %s AS code " \
            "FROM %s AS c) AS x%s" % (table, xsel, value, qsa, gsel, slice_ % "int8", classes, join)
        params = [sorted_codes.tolist(), idx.starts.tolist(), vals]
        types = ["int8[]", "int8[]", vtype]
    # serial: a parallel worker would first copy the array parameters (measured +0.4 s at 1M rows)
    with C.settings(plpy, max_parallel_workers_per_gather=0):
        plpy.execute(plpy.prepare(q, types), params)


INTEGER_TYPES = ("int2", "int4", "int8")


def _missing_values(plpy, a, S, where):
    """Raise the error for values of a categorical column that are not hierarchy leaves."""
    miss = plpy.execute(plpy.prepare(
        "SELECT v, count(*) OVER () AS m FROM (SELECT DISTINCT s.%s::text AS v FROM %s AS s%s) d "
        "WHERE NOT (v = ANY ($1)) ORDER BY v LIMIT 5" % (C.qi(plpy, a.name), S, where), ["text[]"]),
        [a.hierarchy.leaves])
    _missing_error(plpy, a, miss[0]["m"] if len(miss) else 0, [r["v"] for r in miss])


def _missing_error(plpy, a, count, examples):
    C.fail(plpy, C.INVALID_PARAMETER, 'column "%s" has %d value(s) missing from hierarchy "%s", e.g. %s'
           % (a.name, count, a.hname, ", ".join(json.dumps(v) for v in examples)),
           "Add every value as a leaf of the hierarchy (sabre_define_hierarchy replaces it).")


def _nonfinite_error(plpy, bad):
    """bad: [(column, rows)] of numerical attributes holding NaN or infinities."""
    C.fail(plpy, C.INVALID_PARAMETER, "non-finite values (NaN or infinity) in %s" % ", ".join(
        '"%s" (%d rows)' % b for b in bad),
        "A numerical attribute needs finite values to be generalized to a range: filter or "
        "replace them in a view.")


def _no_rows(plpy, S, where):
    C.fail(plpy, C.INVALID_PARAMETER, "the source %s has no rows%s" % (
        S, " without NULLs" if where else ""), "There is nothing to anonymize.")


def _not_null(plpy, attrs, prefix):
    return " WHERE " + " AND ".join("%s%s IS NOT NULL" % (prefix, C.qi(plpy, a.name)) for a in attrs)


def _from_float(plpy, expr, col):
    """Cast a float8 expression back to the column's own type."""
    if col["typname"] == "date":
        return "(date '1970-01-01' + (%s)::int)" % expr
    if col["typname"] in ("timestamptz",):
        return "to_timestamp(%s)" % expr
    if col["typname"] in ("timestamp",):
        return "(to_timestamp(%s) AT TIME ZONE 'UTC')" % expr
    if col["typname"] in ("interval",):
        return "make_interval(secs => %s)" % expr
    if col["typname"] in ("time", "timetz"):
        return "(time '00:00' + make_interval(secs => %s))::%s" % (expr, col["type"])
    return "(%s)::%s" % (expr, col["type"])

