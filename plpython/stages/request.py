"""Stage 1 of sabre_anonymize: one validated, immutable request.

Every argument check lives here (ARX's ``checkBeforeEncoding``): t, k, method and the
options; the source, its columns and the key; the output's names, the names of the columns
the output and its classes will have, and the temporary names a run builds them under.  The
later stages (scan, publish) take a :class:`Request` and never check arguments again.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from sabre_pg.core import limits
from sabre_pg.core.sabre import METHODS

from ..shared import common as C
from ..shared import errors as E

OPTION_KEYS = ("hierarchies", "key", "seed", "keep", "weights", "nulls", "replace", "takeout",
               "lookahead", "cascade", "lock_timeout", "refresh", "labels", "partitions", "search", "threads",
               "auto_partition_rows", "citus_design")
OPTIONS_EXAMPLE = '{"key": "id", "seed": 1}'
MAX_THREADS = 64
CITUS_DESIGNS = ("qi_local", "shard_local")   # options.citus_design (docs/scale-out.md, "Citus (built)")
T_HINT = ("t is the largest Earth Mover's Distance allowed between an equivalence class and "
          "the whole table; typical values are 0.1 to 0.5.")
K_HINT = "k is the minimum number of rows per equivalence class."
MAX_NAME = 63                      # NAMEDATALEN - 1 bytes
LONGEST_SUFFIX = "_classes_pkey"
CLASS_COLUMNS = ("ec_id", "size", "emd")   # <output>_classes besides the generalized QIs
SENSITIVE_HINT = "Give one t per sensitive attribute, in the same order: sensitive => ARRAY['a','b'], t => ARRAY[0.2, 0.3]."
RELKINDS = ("r", "v", "m", "p", "f")


@dataclass(frozen=True)
class Attr:
    """A quasi-identifier or the sensitive attribute: its column and how it is compared."""
    name: str
    col: dict                      # common.columns() entry: type, category, typname, notnull
    kind: str                      # "numerical" | "categorical"
    hierarchy_name: str | None = None
    hierarchy: object = None       # its Hierarchy, where a stage has loaded it

    @property
    def numerical(self) -> bool:
        return self.kind == "numerical"

    @property
    def typname(self) -> str:
        return self.col["typname"]

    def published_as(self) -> tuple:
        """The output columns of a quasi-identifier: a range, or a hierarchy node's label."""
        return (self.name + "_lo", self.name + "_hi") if self.numerical else (self.name,)


@dataclass(frozen=True)
class Key:
    """The column identifying source rows (side table and joins)."""
    name: str
    col: dict
    unique: bool                   # proven unique by an index (else checked after the read)

    @property
    def integer(self) -> bool:
        return self.col["typname"] in C.INTEGER_TYPES


@dataclass(frozen=True)
class Options:
    takeout: str
    nulls: str
    seed: int
    replace: bool
    lookahead: int
    keep: tuple
    weights: object                # normalized numpy weights per QI, or None
    cascade: bool
    lock_timeout: str
    refresh: str                   # "swap" (new relations take the names) | "mvcc" (rows replaced in place)
    given: dict                    # as the caller gave them (recorded in the catalog)
    labels: bool = False           # the view <output>_labels (labels.py)
    search: str = "fast"           # method 'refine': cut search setting (core/cut_search.py)
    threads: int = 1               # method 'refine': threads of the cut search (core/refine.py)
    auto_partition_rows: int = limits.AUTO_PARTITION_ROWS   # a larger plain run goes in parts (0: never)
    citus_design: str | None = None  # a Citus distributed source: 'qi_local' | 'shard_local' (None: the default)


@dataclass(frozen=True)
class Output:
    """Where the output goes: <name>, <name>_classes, <name>_keys in ``schema``."""
    schema: str
    name: str

    def qualified(self, suffix: str = "") -> str:
        return C.qname(None, self.schema, self.name + suffix)

    def temporary(self, run_id: int, tag: str) -> str:
        """Unqualified name of a relation or index built under a temporary name."""
        return "sabre_tmp_%d_%s" % (run_id, tag)

    def temporary_qualified(self, run_id: int, tag: str) -> str:
        return C.qname(None, self.schema, self.temporary(run_id, tag))


@dataclass(frozen=True)
class Request:
    source: dict                   # resolve_relation(): oid, nspname, relname, relkind, qname
    columns: dict
    qis: tuple
    sa: Attr
    key: Key
    t: float
    k: int
    method: str
    options: Options
    output: Output
    sas: tuple = ()                # several SAs (the array overload): every SA, sa is the first
    ts: tuple = ()                 # their t, in the same order (t is the first)

    @property
    def sensitive(self) -> tuple:
        """Every sensitive attribute (one for the single-SA overload)."""
        return self.sas or (self.sa,)

    @property
    def thresholds(self) -> tuple:
        return self.ts or (self.t,)

    @property
    def attrs(self) -> tuple:
        return self.qis + self.sensitive

    def emd_columns(self) -> list:
        """The classes' EMD columns, one per SA: ``emd`` for a single SA, else ``emd_<sa>``."""
        return ["emd"] if len(self.sensitive) == 1 else ["emd_" + a.name for a in self.sensitive]

    def row_filter(self, prefix: str = "s.") -> str:
        """`` WHERE`` clause dropping rows with a NULL attribute (options.nulls = 'drop')."""
        if self.options.nulls != "drop":
            return ""
        return " WHERE " + " AND ".join("%s%s IS NOT NULL" % (prefix, C.ident(a.name)) for a in self.attrs)

    def generalized_columns(self) -> list:
        """The QIs' output columns, in QI order (the same in the output and its classes)."""
        return [c for a in self.qis for c in a.published_as()]

    def named_columns(self) -> dict:
        """{table: [(column, where it comes from)]} for the output and its classes."""
        own = [(n, "sabre's own column") for n in CLASS_COLUMNS[:2] + tuple(self.emd_columns())]
        qis = [(c, "quasi-identifier %s" % a.name) for a in self.qis for c in a.published_as()]
        sas = [(a.name, "the sensitive attribute") for a in self.sensitive]
        return {"output": own[:1] + qis + sas + [(c, "options.keep") for c in self.options.keep],
                "classes": own + qis}


def build(plpy, source, source_name, quasi_identifiers, sensitive, t, k, method, output, options) -> Request:
    """The request, or the first argument error (SabreError).  ``sensitive`` and ``t`` are a
    column name and a number, or (the array overload) lists of them, one t per SA."""
    given = C.parse_options(plpy, options, OPTION_KEYS, OPTIONS_EXAMPLE)
    several = isinstance(sensitive, list)
    ts = sensitive_thresholds(sensitive, t) if several else ()
    t = ts[0] if several else C.check_t(t, T_HINT)
    k = C.check_k(k, K_HINT)
    check_method(method)
    src = C.resolve_relation(plpy, source, source_name)
    if src["relkind"] not in RELKINDS:
        raise E.invalid_parameter("%s is not a table or view" % src["qname"],
                                  "Pass a table, view, materialized view or foreign table.")
    columns = C.columns(plpy, src["oid"])
    qis, sa = attributes(columns, quasi_identifiers, sensitive, given.get("hierarchies"))
    opts = parse_options(given, columns, qis)
    key = find_key(plpy, src, columns, given.get("key"))
    out = output_names(plpy, src, output)
    src["read"] = C.read_sql(src, columns, [a.name for a in qis + (sa if several else [sa])] + [key.name] + list(opts.keep))
    req = Request(src, columns, tuple(qis), sa[0], key, t, k, method, opts, out, tuple(sa), ts) if several \
        else Request(src, columns, tuple(qis), sa, key, t, k, method, opts, out)
    check_column_names(req)
    return req


def sensitive_thresholds(sensitive, t) -> tuple:
    """The SA names and t arrays of the several-SA overloads (sabre_anonymize, sabre_verify),
    checked: no NULL, one t per SA, no SA twice, every t in (0, 1]; returns the ts."""
    for name, value in (("sensitive", sensitive), ("t", t)):
        if value is None or not len(value) or any(v is None for v in value):
            raise E.SabreError(E.NULL_NOT_ALLOWED if value is None or len(value) else E.INVALID_PARAMETER,
                               "%s must be a non-empty array without NULLs" % name, SENSITIVE_HINT)
    E.cap("sensitive attributes", len(sensitive), limits.SENSITIVE_ATTRIBUTES,
          "Anonymize for fewer sensitive attributes at a time.")
    if len(sensitive) != len(t):
        raise E.invalid_parameter("sensitive has %d attributes but t has %d values (arrays of different lengths)"
                                  % (len(sensitive), len(t)), SENSITIVE_HINT)
    seen = set()
    for name in sensitive:
        if name in seen:
            raise E.duplicate_column('sensitive attribute "%s" is listed twice' % name,
                                     "List each sensitive column once, with its own t.")
        seen.add(name)
    return tuple(C.check_t(v, T_HINT) for v in t)


def check_method(method):
    if method not in METHODS:
        close = C.nearest(method, METHODS, 1, cutoff=0.5) if isinstance(method, str) else []
        raise E.invalid_parameter("unknown method %s" % json.dumps(method),
                                  ("Did you mean '%s'? " % close[0] if close else "")
                                  + "Use method => 'refine' (the default: t-Mondrian with a searched t-close cut), "
                                  "'ak' (SABRE-AK, Hilbert curve), 'knn' (SABRE-KNN, exact nearest neighbours) or "
                                  "'mondrian' (t-Mondrian).")


def _choice(opts, name, default, allowed, hint):
    value = opts.get(name, default)
    if value not in allowed:
        raise E.invalid_parameter("options.%s must be %s, got %s" % (
            name, " or ".join("'%s'" % a for a in allowed), json.dumps(value)), hint)
    return value


def _integer(opts, name, default, low, high, hint):
    value = opts.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise E.invalid_parameter("options.%s must be an integer from %d to %d" % (name, low, high), hint)
    return value


def boolean_option(opts, name, default, hint):
    """options.<name> as a bool (shared by the entry points that take boolean options)."""
    value = opts.get(name, default)
    if not isinstance(value, bool):
        raise E.invalid_parameter("options.%s must be true or false" % name, hint)
    return value


def parse_options(given: dict, columns: dict, qis) -> Options:
    """The scalar options, keep and weights, checked."""
    takeout = _choice(given, "takeout", "sweep", ("sweep", "random"),
                      "'sweep' (seeds in Hilbert order, default) or 'random' (the paper's random seeds).")
    nulls = _choice(given, "nulls", "error", ("error", "drop"),
                    "'drop' excludes rows with a NULL quasi-identifier or sensitive value.")
    seed = _integer(given, "seed", 1, -2 ** 63, 2 ** 63 - 1,
                    'For example options => \'{"seed": 42}\'; the same seed gives the same classes.')
    lookahead = _integer(given, "lookahead", 4, 0, 64,
                         "0 is the paper's rule (stop bucketization at the first U < t); the default 4 "
                         "also tries up to 4 further splits and keeps the one giving the most classes.")
    replace = boolean_option(given, "replace", True, "true (the default) replaces sabre's previous output of the same name.")
    cascade = boolean_option(given, "cascade", False,
                       "true drops objects that depend on the previous output when replacing it.")
    lock_timeout = given.get("lock_timeout", "5s")
    if not isinstance(lock_timeout, str) or not lock_timeout.strip():
        raise E.invalid_parameter("options.lock_timeout must be a duration such as '5s'",
                                  "It bounds the wait for readers of the previous output at the swap.")
    refresh = _choice(given, "refresh", "swap", ("swap", "mvcc"),
                      "'swap' (default) puts new relations in place; 'mvcc' replaces the rows of the previous "
                      "output in place, so REPEATABLE READ readers keep seeing the old rows.")
    keep = _keep(given.get("keep"), columns, qis)
    weights = parse_weights(given.get("weights"), [a.name for a in qis])
    labels = boolean_option(given, "labels", False, "true adds the view <output>_labels, numerical "
                            "quasi-identifiers as text labels such as [20, 29] (for BI tools).")
    search = _choice(given, "search", "fast", ("fast", "thorough"),
                     "method 'refine': 'fast' (default) searches small partitions' cuts on their widest "
                     "quasi-identifier; 'thorough' on every one (slower on large tables).")
    threads = _integer(given, "threads", 1, 1, MAX_THREADS,
                       "method 'refine' searches a large table in this many threads of the backend (default 1: "
                       "measured, 2 threads were no faster at 1M rows on 2 cores).")
    auto_rows = _integer(given, "auto_partition_rows", limits.AUTO_PARTITION_ROWS, 0, 2 ** 62,
                         "A run over more rows than this is split into parts of at most this many rows, so a "
                         "backend's memory stays bounded (default %d; 0 never splits; docs/scale-out.md)."
                         % limits.AUTO_PARTITION_ROWS)
    citus_design = given.get("citus_design")
    if citus_design is not None:
        citus_design = _choice(given, "citus_design", None, CITUS_DESIGNS,
                               "On a Citus distributed table, 'qi_local' (the default) repartitions the rows once by "
                               "the quasi-identifiers so each worker anonymizes a region of the QI space; "
                               "'shard_local' anonymizes each shard where it is, moving no row (docs/scale-out.md).")
    return Options(takeout, nulls, seed, replace, lookahead, keep, weights, cascade, lock_timeout, refresh, given,
                   labels, search, threads, auto_rows, citus_design)


def _keep(keep, columns, qis) -> tuple:
    keep = keep or []
    if not isinstance(keep, list) or not all(isinstance(c, str) for c in keep):
        raise E.invalid_parameter("options.keep must be a list of column names",
                                  'For example {"keep": ["id", "visit_date"]}.')
    for c in keep:
        if c not in columns:
            raise E.undefined_column('options.keep column "%s" does not exist in the source' % c,
                                     "Available columns, nearest first: %s." % C.nearest_text(c, columns))
        if c in [a.name for a in qis]:
            raise E.duplicate_column('options.keep column "%s" clashes with an output column' % c,
                                     "Quasi-identifiers are published generalized only; keep other columns.")
    return tuple(keep)


def parse_weights(weights, names):
    """options.weights ({qi: weight >= 0}, unnamed QIs weigh 1) normalized to sum 1, or None;
    one parser for every entry point."""
    if not weights:
        return None
    if not isinstance(weights, dict) or any(n not in names for n in weights) or \
            any(isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0 for v in weights.values()):
        raise E.invalid_parameter("options.weights must map quasi-identifiers to weights >= 0",
                                  'For example {"age": 2, "sex": 1}; unnamed quasi-identifiers weigh 1; '
                                  "weights are normalized.")
    raw = np.array([float(weights.get(n, 1.0)) for n in names])
    if raw.sum() <= 0:
        raise E.invalid_parameter("options.weights must not all be zero",
                                  "Give at least one quasi-identifier a positive weight.")
    return raw / raw.sum()


def attributes(columns, quasi_identifiers, sensitive, hierarchies):
    """(QIs, SA) as :class:`Attr`, with their kinds; a named hierarchy makes a column categorical.
    ``sensitive`` a list (several SAs): (QIs, list of SAs)."""
    sensitives = list(sensitive) if isinstance(sensitive, list) else [sensitive]
    if not quasi_identifiers:
        raise E.invalid_parameter("quasi_identifiers is empty",
                                  "List the columns an attacker may know, e.g. ARRAY['age','sex','zip'].")
    names = list(quasi_identifiers)
    E.cap("quasi-identifiers", len(names), limits.QUASI_IDENTIFIERS,
          "List the columns an attacker may know; more quasi-identifiers than this leave no utility.")
    seen = set()
    for q in names:
        if q is None:
            raise E.invalid_parameter("quasi_identifiers contains NULL",
                                      "List column names only, e.g. ARRAY['age','sex'].")
        if q in seen:
            raise E.duplicate_column('quasi-identifier "%s" is listed twice' % q, "List each column once.")
        seen.add(q)
    for q in names + sensitives:
        if q is None or q not in columns:
            raise E.undefined_column('column "%s" does not exist in the source' % q,
                                     "Available columns, nearest first: %s. Names are case-sensitive and not "
                                     "parsed: pass them exactly as stored." % C.nearest_text(q, columns))
    for sa in sensitives:
        if sa in seen:
            raise E.invalid_parameter(
                'the sensitive attribute "%s" is also listed among the quasi-identifiers' % sa,
                "Remove it from quasi_identifiers: its values are published unchanged.")
    hierarchies = _hierarchy_names(hierarchies or {}, seen, sensitives)
    attrs = []
    for name in names + sensitives:
        col = columns[name]
        kind = "categorical" if name in hierarchies else C.kind_of(col)
        if kind is None:
            raise E.datatype_mismatch(
                'column "%s" has type %s, which is neither numerical nor categorical' % (name, col["declared"]),
                "Numeric and date/time types are numerical; text, varchar, bool and enum are "
                "categorical. Cast the column in a view.")
        attrs.append(Attr(name, col, kind, hierarchies.get(name)))
    if isinstance(sensitive, list):
        return attrs[:len(names)], attrs[len(names):]
    return attrs[:-1], attrs[-1]


def _hierarchy_names(hierarchies, qis, sensitives) -> dict:
    if not isinstance(hierarchies, dict):
        raise E.invalid_parameter("options.hierarchies must map column names to hierarchy names",
                                  'For example {"marital": "marital_h"}.')
    for col, name in hierarchies.items():
        if col not in qis and col not in sensitives:
            raise E.invalid_parameter(
                'options.hierarchies names column "%s", which is neither a quasi-identifier nor the '
                'sensitive attribute' % col, "Hierarchies apply to the listed columns only.")
        if not isinstance(name, str):
            raise E.invalid_parameter("hierarchy name for %s must be a string" % col,
                                      'For example {"marital": "marital_h"}.')
    return hierarchies


def find_key(plpy, src, columns, key) -> Key:
    """options.key (unique by an index, or checked after the read), else the primary key."""
    if key is not None:
        if not isinstance(key, str) or key not in columns:
            raise E.undefined_column('options.key column "%s" does not exist in the source' % key,
                                     "Name a column that identifies each row uniquely.")
        unique = plpy.execute(plpy.prepare(
            "SELECT 1 FROM pg_catalog.pg_index i JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid "
            "AND a.attnum = i.indkey[0] WHERE i.indrelid = $1 AND i.indisunique "
            "AND i.indnkeyatts = 1 AND i.indpred IS NULL AND a.attname = $2", ["oid", "name"]),
            [src["oid"], key])
        return Key(key, columns[key], bool(len(unique)))
    primary = plpy.execute(plpy.prepare(
        "SELECT a.attname FROM pg_catalog.pg_index i JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid "
        "AND a.attnum = ANY (i.indkey) WHERE i.indrelid = $1 AND i.indisprimary", ["oid"]), [src["oid"]])
    if len(primary) == 1:
        return Key(primary[0]["attname"], columns[primary[0]["attname"]], True)
    raise E.invalid_parameter(
        "cannot identify rows of %s: %s" % (src["qname"], "it has a composite primary key"
                                            if len(primary) > 1 else "it has no single-column primary key"),
        'Name a unique column with options => \'{"key": "id"}\'.')


def output_names(plpy, src, output) -> Output:
    """<output> (default <source>_sabre in the source's schema; unqualified: the source's
    schema), checked for length and an existing schema."""
    if output is None:
        out = Output(src["nspname"], src["relname"] + "_sabre")
    else:
        try:
            parts = plpy.execute(plpy.prepare("SELECT pg_catalog.parse_ident($1) AS p", ["text"]),
                                 [output])[0]["p"]
        except plpy.SPIError:
            raise E.invalid_name("output %s is not a valid (optionally schema-qualified) name" % json.dumps(output, ensure_ascii=False),
                                 "Quote names with special characters, e.g. output => 'public.\"my;table\"'.")
        if len(parts) > 2:
            raise E.invalid_name("output %s has too many dotted parts" % json.dumps(output, ensure_ascii=False),
                                 "Use schema.table or table.")
        out = Output(src["nspname"], parts[0]) if len(parts) == 1 else Output(parts[0], parts[1])
    if len((out.name + LONGEST_SUFFIX).encode()) > MAX_NAME:
        raise E.name_too_long("output name %s is too long" % json.dumps(out.name, ensure_ascii=False),
                              "sabre also creates %s_classes, %s_keys and their indexes; PostgreSQL names hold "
                              "%d bytes, so the output name may have at most %d." % (
                                  out.name, out.name, MAX_NAME, MAX_NAME - len(LONGEST_SUFFIX)))
    exists = plpy.execute(plpy.prepare("SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $1", ["name"]),
                          [out.schema])
    if not len(exists):
        raise E.SabreError(E.INVALID_SCHEMA, 'schema "%s" of the output does not exist' % out.schema,
                           "Create it first or choose another output schema.")
    return out


def check_column_names(req: Request):
    """The output's and its classes' column names fit PostgreSQL names and do not collide."""
    for table, named in req.named_columns().items():
        seen = {}
        for name, origin in named:
            if len(name.encode()) > MAX_NAME:
                raise E.name_too_long(
                    'the %s column "%s" would be longer than %d bytes' % (table, name, MAX_NAME),
                    "A numerical quasi-identifier is published as <name>_lo and <name>_hi: rename the "
                    "column to at most %d bytes in a view." % (MAX_NAME - 3))
            if name in seen:
                raise E.duplicate_column(
                    'the %s would have two columns named "%s" (%s and %s)' % (table, name, seen[name], origin),
                    "Rename one of the source columns in a view: ec_id, size and emd are sabre's own "
                    "columns, and a numerical quasi-identifier x is published as x_lo and x_hi.")
            seen[name] = origin
