"""Stage 4 of sabre_anonymize: publish the classes.

1. the run begins in the catalog (``run_begin``: its id and a secret token, bound to the
   calling role and transaction, expiring) and locks the
   output's row in ``output_locks``, so two runs to one output are serialized (the second
   fails fast); only the role itself can take that lock (``lock_output``);
2. a previous output is replaced only if a recorded run of the same owner created it and it
   still carries that run's identity (OID + the run's marker ending its COMMENT, so a name
   holding a token never matches), never by name alone;
3. the side table ``<output>_keys``, ``<output>_classes`` and ``<output>`` are built under
   temporary names; rows of a class appear in random order (nothing about source order or
   source values within a class can be read from the physical order);
4. the **pre-swap check** recomputes every class size and class EMD from the rows actually
   written, with the verifier's independent exact EMD: any mismatch aborts with 40001;
5. the **swap**, under ``lock_timeout``: objects depending on the previous output are never
   dropped silently, grants on it carry over, the new relations take its names;
6. the run records itself through ``run_record`` (run_by and identity from the server).

SQL is built by pure functions (``*_sql``) beside their execution, so it is unit-tested with
a fake ``plpy``.
"""
from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field

import numpy as np

from sabre_pg.core.generalize import ECIndex, stable_argsort

from ..shared import citus, closeness
from ..shared import common as C
from ..shared import errors as E
from ..shared import labels
from ..shared import transfer as T

# ranges of these types are the source's own values (min and max per class), not a float8 decoded
# back: an interval's float8 is justified ('400 days' read back as '1 year 1 mon 10 days'), a
# timestamp far from 1970 loses microseconds, a timetz its zone
EXACT_RANGE_TYPES = ("numeric", "interval", "timestamp", "timestamptz", "time", "timetz")
PACKED_OFFSET_BITS = 62        # integer range ends whose offsets need more travel as int8 (not packed)
SUBSCRIPT_LABELS = 256         # hierarchies with at most this many nodes label by array subscript
# labels of at most this many UTF-8 bytes fit a ``name`` (63 bytes) in any server encoding (a
# character takes at most 4/3 of its UTF-8 bytes there); NAME_LABELS bounds the name[] (64 B each)
NAME_LABEL_BYTES = 47
NAME_LABELS = 1 << 16
# methods whose classes are runs of the Hilbert order: their side table gets the btree on (bucket,
# hilbert_key) in the run; for the others ('refine', 'mondrian') the rows are written in that order
# and the index is left out (a quarter of write_keys; nothing sabre runs reads it; docs/anonymize.md)
HILBERT_METHODS = ("ak", "knn")
EXACT_TYPES = C.INTEGER_TYPES + ("float4", "float8", "date")


@dataclass(frozen=True)
class Run:
    run_id: int
    token: str

    def comment(self, text: str) -> str:
        return "%s (sabre-pg run %d, identity %s)" % (text, self.run_id, self.token)


@dataclass(frozen=True)
class Previous:
    """The relations of a previous output this run replaces: {suffix: oid}."""
    relations: dict

    @property
    def oids(self) -> list:
        return list(self.relations.values())


def begin(plpy, req) -> Run:
    """A run id and token from the catalog, and the output's lock (fail fast if taken)."""
    lock_output(plpy, req.output)
    r = plpy.execute("SELECT run_id, token FROM %s()" % C.catalog("run_begin"))[0]
    return Run(r["run_id"], r["token"])


def lock_output(plpy, output):
    """Lock the current role's row of ``output`` in ``output_locks`` until the transaction
    ends, or fail at once (55P03) when another transaction of this role holds it.  The row is
    keyed by the role, and row-level security lets a role insert, see and lock only its own:
    a role without rights on the output cannot block it (docs/security.md, finding 6).  The
    first run to an output inserts the row; a concurrent first run then waits on that
    uncommitted row, which ``lock_timeout`` cuts short."""
    key = "owner OPERATOR(pg_catalog.=) CURRENT_USER AND nsp OPERATOR(pg_catalog.=) n.oid " \
          "AND relname OPERATOR(pg_catalog.=) $2"
    statements = [
        ("SELECT 1 FROM %s AS l, pg_catalog.pg_namespace AS n WHERE n.nspname OPERATOR(pg_catalog.=) $1 AND %s "
         "FOR UPDATE OF l NOWAIT" % (C.catalog("output_locks"), key)),
        ("INSERT INTO %s (owner, nsp, relname) SELECT CURRENT_USER, n.oid, $2 FROM pg_catalog.pg_namespace AS n "
         "WHERE n.nspname OPERATOR(pg_catalog.=) $1 ON CONFLICT DO NOTHING RETURNING 1" % C.catalog("output_locks"))]
    try:
        with plpy.subtransaction(), C.settings(plpy, lock_timeout="1ms"):
            for _ in range(2):      # (an insert that lost to a committed one locks that row)
                for statement in statements:
                    if len(plpy.execute(plpy.prepare(statement, ["name", "name"]), [output.schema, output.name])):
                        return
    except plpy.SPIError as e:
        if getattr(e, "sqlstate", None) != E.LOCK_NOT_AVAILABLE:
            raise
    raise E.lock_not_available(
        "another sabre_anonymize run is writing the output %s" % output.qualified(),
        "Wait for it to finish and run again, or choose another output name.")


def previous(plpy, req) -> Previous:
    """The previous output's relations, each checked to be replaceable (see module doc)."""
    found = {}
    for suffix in ("", "_classes", "_keys", labels.SUFFIX):
        name = req.output.qualified(suffix)
        r = plpy.execute(plpy.prepare(
            "SELECT c.oid, c.relowner OPERATOR(pg_catalog.=) u.oid AS mine, EXISTS (SELECT 1 FROM %s() x "
            "WHERE x.relation OPERATOR(pg_catalog.=) c.oid) AS recorded FROM pg_catalog.pg_class c "
            "JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace, "
            "pg_catalog.pg_roles u WHERE u.rolname OPERATOR(pg_catalog.=) CURRENT_USER "
            "AND n.nspname OPERATOR(pg_catalog.=) $1 AND c.relname OPERATOR(pg_catalog.=) $2"
            % C.catalog("recorded_relations"), ["name", "name"]),
            [req.output.schema, req.output.name + suffix])
        if not len(r):
            continue
        if r[0]["oid"] == req.source["oid"]:
            raise E.duplicate_table("the output %s is the source itself" % name,
                                    "The source is never modified: choose another output name.")
        if not (r[0]["recorded"] and r[0]["mine"]):
            if suffix == labels.SUFFIX and not req.options.labels:
                continue          # not sabre's, and this run makes no label view
            raise E.duplicate_table(
                "relation %s already exists and is not an output of one of your recorded runs" % name,
                "Choose another output name or drop that relation yourself; sabre replaces only outputs "
                "a recorded run of the same owner created and that still carry its identity (the run "
                "token in their COMMENT).")
        if not req.options.replace:
            raise E.duplicate_table("output %s already exists" % name,
                                    "Set options.replace to true (the default) to replace sabre's previous output.")
        found[suffix] = r[0]["oid"]
    return Previous(found)


@dataclass(frozen=True)
class Into:
    """A part of a partitioned run writing straight into the run's own (not yet swapped)
    relations (docs/scale-out.md): its class ids start at ``offset``; the first part creates
    the relations, the others append.  Indexes and the pre-swap check are the run's."""
    tables: dict             # {"": output, "_classes": ..., "_keys": ...}: temporary qualified names
    offset: int = 0
    create: bool = True
    # the table's SA counts the part's classes are cut against, or None; keyword-only, so a
    # subclass's positional fields (citus_shards.ShardInto) never shift when one is added here
    reference: object = field(default=None, kw_only=True)
    # what the parts wrote, kept for the run's check (PartsWritten), or None
    written: object = field(default=None, kw_only=True)

    def write(self, suffix: str, select: str, unlogged: bool = False) -> str:
        """The statement writing ``select``'s rows into the relation ``suffix``."""
        if self.create:
            return "CREATE %sTABLE %s AS %s" % ("UNLOGGED " if unlogged else "", self.tables[suffix], select)
        return "INSERT INTO %s %s" % (self.tables[suffix], select)


class PartsWritten:
    """What the parts of one partitioned run wrote into its relations, kept in memory for the
    run's check instead of reading the side table back (its writes are this run's own statements,
    as the one-piece check trusts its own): every class's rows (class ids in the order the parts
    wrote them) and, with an integer key and at most ``keys_rows`` rows, every key written, in one
    array of ``rows`` (the split's count of the table) filled part by part (8 bytes a row; a part
    with more rows than announced drops the keys, and the check reads the source and the side
    table in SQL instead)."""

    def __init__(self, rows: int, keys_rows: int):
        self.sizes = []
        self.filled = 0
        self.keys = np.empty(rows, dtype=np.int64) if 0 <= rows <= keys_rows else None

    def add(self, sizes, keys) -> None:
        """A part's classes' rows (in class id order) and its keys (an integer ndarray, else None)."""
        self.sizes.append(np.asarray(sizes, dtype=np.int64))
        n = len(keys) if keys is not None else 0
        if self.keys is not None and isinstance(keys, np.ndarray) and self.filled + n <= len(self.keys):
            self.keys[self.filled:self.filled + n] = keys
        else:
            self.keys = None
        self.filled += n

    def class_sizes(self) -> np.ndarray:
        """Every class's rows, by class id (0..C-1)."""
        return np.concatenate(self.sizes) if self.sizes else np.zeros(0, dtype=np.int64)

    def written_keys(self):
        """The keys the parts wrote (an int64 array), or None when they were not kept."""
        return self.keys if self.keys is not None and self.filled == len(self.keys) else None


# ---------------------------------------------------------------------------- side table
def keys_sql(table, key, keys, result, into: Into | None = None):
    """(SQL, types, params) of the side table, in index order (bucket, hilbert_key): the
    Hilbert keys as one bytea read back through a varbit (a list past transfer.BYTEA_VALUES),
    and an unnest of bit-packed words holding the EC id, the bucket and (integer keys whose
    range fits) the source key as an offset from its minimum; other keys as text."""
    order = result.by_bucket_and_key()
    fields = [("ec", result.ec[order]), ("bucket", result.bucket_of_tuple[order])]
    integer = isinstance(keys, np.ndarray)
    base = int(keys.min()) if integer else 0
    packed_key = integer and int(keys.max()) - base < 1 << T.WORD_BITS
    if packed_key:
        fields.insert(0, ("key", keys[order] - base))
    pack = T.BitPack(fields)
    words = ["u.w%d" % j for j in range(len(pack.words))]
    hilbert = result.keys[order]
    columns = ["pg_catalog.unnest($%d::int8[]) AS w%d" % (j + 2, j) for j in range(len(words))]
    params = [None] + [w.tolist() for w in pack.words]
    types = ["int8[]"] * len(params)
    source = ""
    if len(hilbert) <= T.BYTEA_VALUES:     # the 19-digit keys as one bytea (transfer.BYTEA_VALUES)
        params[0], types[0], hilbert_key = T.int8_bytea(hilbert), "bytea", T.int8_at("u.bits", "u.i")
        columns[:0] = ["b.bits", "pg_catalog.generate_series(0, %d) AS i" % (len(hilbert) - 1)]
        source = " FROM (SELECT %s AS bits) AS b" % T.bytea_bits_sql("$1")
    else:
        params[0], hilbert_key = hilbert.tolist(), "u.hilbert_key"
        columns.insert(0, "pg_catalog.unnest($1::int8[]) AS hilbert_key")
    if packed_key:
        key_expr = "(%d::int8 + %s)" % (base, pack.sql("key", words))
    else:
        key_expr = "u.key"
        columns.append("pg_catalog.unnest($%d::%s[]) AS key" % (len(params) + 1, "int8" if integer else "text"))
        params.append(keys[order].tolist() if integer else [keys[i] for i in order.tolist()])
        types.append("int8[]" if integer else "text[]")
    # UNLOGGED: derived data, rebuilt by rerunning; skipping WAL halves the write.
    # (unnest in the select list streams; in FROM it would first materialize the rows)
    ec = pack.sql("ec", words)
    if into is not None:        # class ids from the part's offset
        ec = "(%d::pg_catalog.int8 OPERATOR(pg_catalog.+) %s)" % (into.offset, ec)
    select = "SELECT %s::%s AS key, %s::int AS bucket, %s AS hilbert_key, %s AS ec_id FROM (SELECT %s%s) AS u" % (
        key_expr, key.col["type"], pack.sql("bucket", words), hilbert_key, ec, ", ".join(columns), source)
    sql = "CREATE UNLOGGED TABLE %s AS %s" % (table, select) if into is None else into.write("_keys", select, True)
    return sql, types, params


def write_keys(plpy, req, run, keys, result, into: Into | None = None):
    if into is not None:
        execute(plpy, keys_sql(None, req.key, keys, result, into))
        return into.tables["_keys"]
    table = req.output.temporary_qualified(run.run_id, "k")
    execute(plpy, keys_sql(table, req.key, keys, result))
    index_keys(plpy, req, run, table, len(result.ec))
    owner_only(plpy, table)
    return table


def index_keys(plpy, req, run, table, rows: int | None = None):
    """The side table's btree on (bucket, hilbert_key), for the Hilbert methods only: with
    ``rows`` known and few enough (:func:`index_sort_settings`), one serial in-memory sort."""
    if req.method in HILBERT_METHODS:
        with C.settings(plpy, **index_sort_settings(plpy, rows)):
            plpy.execute("CREATE INDEX %s ON %s (bucket, hilbert_key)" % (
                C.ident(req.output.temporary(run.run_id, "k_idx")), table))


# bytes of maintenance_work_mem per row for the side table's index build to sort in memory
# (trace_sort: 71,452 kB for 1M rows); up to INDEX_SORT_MAX_BYTES a run raises it for that build
INDEX_SORT_BYTES_PER_ROW = 80
INDEX_SORT_MAX_BYTES = 256 << 20


def index_sort_settings(plpy, rows: int | None) -> dict:
    """Transaction-local settings for the side table's CREATE INDEX: the rows arrive presorted,
    so one serial in-memory sort (a linear pass) beats the default (parallel workers, each
    spilling a sorted run to disk for the leader to merge, at 64MB): 1M rows under load 9,
    1.18-1.59 s against 1.73-1.77 s, half the CPU (docs/evaluation.md).  Nothing is changed
    when the rows are unknown, too many, or the server's memory is already enough."""
    if not rows:
        return {}
    need = rows * INDEX_SORT_BYTES_PER_ROW
    if need > INDEX_SORT_MAX_BYTES:
        return {}
    have = plpy.execute("SELECT pg_catalog.pg_size_bytes(pg_catalog.current_setting('maintenance_work_mem')) AS b")
    kb = max(int(have[0]["b"]), need) // 1024 + 1
    return {"maintenance_work_mem": "%dkB" % kb, "max_parallel_maintenance_workers": 0}


def execute(plpy, statement):
    """Execute a (SQL, types, params) statement, as the builders here return them."""
    sql, types, params = statement
    plpy.execute(plpy.prepare(sql, types), params)


def owner_only(plpy, table):
    """Drop privileges that default privileges gave to others: the side table maps source
    keys to SA buckets and is for sabre and its owner only."""
    for r in plpy.execute(plpy.prepare(grants_sql(), ["regclass"]), [table]):
        plpy.execute("REVOKE ALL ON %s FROM %s" % (table, r["grantee"]))


def grants_sql():
    """Each grant on a relation ($1, regclass) to a role other than its owner: grantee (quoted,
    or PUBLIC), privilege, grant option."""
    return ("SELECT CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC' "
            "ELSE pg_catalog.quote_ident(r.rolname) END AS grantee, a.privilege_type, a.is_grantable "
            "FROM pg_catalog.pg_class c CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) a "
            "LEFT JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) a.grantee "
            "WHERE c.oid OPERATOR(pg_catalog.=) $1 "
            "AND a.grantee OPERATOR(pg_catalog.<>) c.relowner")


# ---------------------------------------------------------------------------- classes
class ClassesTable:
    """``<output>_classes``: one row per EC, from arrays sent in bulk.  Sizes, integer range
    ends (offsets from the column minimum) and hierarchy node ids travel bit-packed; float
    range ends and EMDs as float8; labels by subscript or join with each hierarchy's labels;
    numeric (arbitrary precision) ranges are exact aggregates over the source."""

    def __init__(self, req, result, data, keys_table, hierarchies):
        self.req, self.result, self.keys_table, self.hierarchies = req, result, keys_table, hierarchies
        self.fields = [("size", result.sizes)]
        self.arrays, self.selects, self.exact_aggs = [], [], []     # arrays: (values, SQL array type)
        self._index = getattr(result, "index", None)
        for i, a in enumerate(req.qis):
            if a.numerical and a.typname in EXACT_RANGE_TYPES:
                self._exact(a)
            elif a.numerical and a.typname in C.INTEGER_TYPES:
                self._integer(a, result.generalization[i], int(data[i].min()))
            elif a.numerical:
                self._float(a, self.ranges(data[i]))
            else:
                self._label(a, result.generalization[i])

    def ranges(self, values) -> tuple:
        """(min, max) per class of the scanned ``values``: a float QI's bounds are the source's
        values even where the engine worked on scaled ones (``scan.engine_values``)."""
        if self._index is None:
            self._index = ECIndex(self.result.ec, self.result.n_classes)
        return self._index.min_max(np.asarray(values, dtype=np.float64))

    # Each column is a function of the statement being built (pack, words, params, types,
    # joins) returning its select expression, so columns keep the QIs' order.
    def _exact(self, a):
        for suffix, agg in (("_lo", "min"), ("_hi", "max")):
            column = C.ident(a.name + suffix)
            self.exact_aggs.append("pg_catalog.%s(s.%s)::%s AS %s" % (agg, C.ident(a.name), a.col["type"], column))
            self.selects.append(lambda st, column=column: "g.%s" % column)

    def _integer(self, a, g, base):
        """Offsets from the column's minimum, bit-packed; a range too wide for that (a bigint
        column from -5e18 to 5e18 spans more than 2^63) travels as the ends themselves."""
        packed = int(np.max(g.hi)) - base < 1 << PACKED_OFFSET_BITS if len(g.hi) else True
        for suffix, ends in (("_lo", g.lo), ("_hi", g.hi)):
            name = a.name + suffix
            if not packed:
                self._array(np.asarray(ends, dtype=np.int64), "int8[]", a, name, "(%s)::%s" % ("%s", a.col["type"]))
                continue
            self.fields.append((name, np.asarray(ends, dtype=np.int64) - base))
            self.selects.append(lambda st, name=name: "(%d + %s)::%s AS %s" % (
                base, st.field(name), a.col["type"], C.ident(name)))

    def _float(self, a, ends):
        for suffix, values in zip(("_lo", "_hi"), ends):
            self._array(np.asarray(values, dtype=np.float64), "float8[]", a, a.name + suffix, from_float("%s", a.col))

    def _array(self, values, sqltype, a, name, cast):
        """A column sent as one array parameter; ``cast`` turns its element (``%s``) into the QI's type."""
        self.arrays.append((values, sqltype))
        expr = cast % ("u.f%d" % (len(self.arrays) - 1)) + " AS %s" % C.ident(name)
        self.selects.append(lambda st, expr=expr: expr)

    def _label(self, a, g):
        self.fields.append((a.name, g.node))
        labels = list(self.hierarchies[a.name].labels)
        self.selects.append(lambda st: st.label(a.name, labels))

    def emds(self) -> list:
        """(unnest alias, column, EMD per class) per SA: ``emd`` alone, or ``emd_<sa>`` each."""
        names = self.req.emd_columns()
        if len(names) == 1:
            return [("emd", "emd", self.result.emds)]
        return [("e%d" % i, name, self.result.emds_by_sa[:, i]) for i, name in enumerate(names)]

    def statement(self, table, into: Into | None = None):
        """(SQL, types, params); ``into``: class ids from its offset, into its classes relation."""
        offset = 0 if into is None else into.offset
        emds = self.emds()
        st = _Statement(T.BitPack(self.fields), emds, self.arrays)
        select = ["u.ec_id", "%s AS size" % st.field("size")] + [
            "u.emd" if alias == name else "u.%s AS %s" % (alias, C.ident(name)) for alias, name, _ in emds] + \
            [make(st) for make in self.selects]
        sql = "SELECT %s FROM (SELECT pg_catalog.generate_series(%d::int8, %d::int8) AS ec_id, %s) AS u %s" % (
            ", ".join(select), offset, offset + self.result.n_classes - 1, ", ".join(st.unnests), " ".join(st.joins))
        if self.exact_aggs:
            sql += (" JOIN (SELECT k.ec_id AS g_ec, %s FROM %s AS s JOIN %s AS k ON k.key = s.%s GROUP BY k.ec_id)"
                    " AS g ON g.g_ec = u.ec_id" % (", ".join(self.exact_aggs), self.req.source["read"],
                                                   self.keys_table, C.ident(self.req.key.name)))
        sql = "CREATE TABLE %s AS %s" % (table, sql) if into is None else into.write("_classes", sql)
        return sql, st.types, st.params


class _Statement:
    """Parameters, unnests and joins of the classes statement as its columns are added."""

    def __init__(self, pack, emds, arrays):
        self.pack, self.words = pack, ["u.w%d" % j for j in range(len(pack.words))]
        self.params, self.types, self.unnests, self.joins = [], [], [], []
        for alias, _, values in emds:
            self.array(alias, np.asarray(values, dtype=np.float64).tolist(), "float8[]")
        for j, w in enumerate(pack.words):
            self.array("w%d" % j, w.tolist(), "int8[]")
        for j, (values, sqltype) in enumerate(arrays):
            self.array("f%d" % j, values.tolist(), sqltype)

    def array(self, name, values, sqltype):
        self.params.append(values)
        self.types.append(sqltype)
        self.unnests.append("pg_catalog.unnest($%d::%s) AS %s" % (len(self.params), sqltype, name))

    def field(self, name):
        return self.pack.sql(name, self.words)

    def label(self, name, labels):
        """A hierarchy node's label: by subscript of a ``name[]`` when every label fits a
        ``name`` (fixed width: the subscript is O(1)), else of a short text list, else a hash join."""
        self.params.append(labels)
        if fits_name(labels):
            self.types.append("pg_catalog.name[]")
            # (a name's collation is "C": the label column keeps the default one, as text[] gave)
            return '(($%d::pg_catalog.name[])[%s + 1])::pg_catalog.text COLLATE pg_catalog."default" AS %s' % (
                len(self.params), self.field(name), C.ident(name))
        self.types.append("text[]")
        if len(labels) <= SUBSCRIPT_LABELS:     # a short text array: subscripting beats a join
            return "($%d::text[])[%s + 1] AS %s" % (len(self.params), self.field(name), C.ident(name))
        j = len(self.joins)
        self.joins.append("JOIN pg_catalog.unnest($%d::text[]) WITH ORDINALITY AS l%d(label, id) "
                          "ON l%d.id = %s + 1" % (len(self.params), j, j, self.field(name)))
        return "l%d.label AS %s" % (j, C.ident(name))


def fits_name(labels) -> bool:
    """Whether every label travels intact as a ``name`` (see NAME_LABEL_BYTES)."""
    return len(labels) <= NAME_LABELS and all(len(label.encode("utf-8")) <= NAME_LABEL_BYTES for label in labels)


def write_classes(plpy, req, run, result, data, keys_table, hierarchies, into: Into | None = None):
    table = req.output.temporary_qualified(run.run_id, "c") if into is None else into.tables["_classes"]
    # the planner cannot estimate joins on unpacked bit fields and would pick nested loops
    # over the label lists (quadratic); hash joins are right for these small lists
    with C.settings(plpy, enable_nestloop="off"):
        execute(plpy, ClassesTable(req, result, data, keys_table, hierarchies).statement(table, into))
    if into is not None:
        return table
    plpy.execute("ALTER TABLE %s ADD CONSTRAINT %s PRIMARY KEY (ec_id)" % (
        table, C.ident(req.output.temporary(run.run_id, "c_pkey"))))
    return table


# ---------------------------------------------------------------------------- output
def exact_from_codes(sa) -> bool:
    """Whether the SA's own values can be rebuilt exactly from what was read (so the output
    needs no join with the source): integers, float4/float8 and dates read as numbers, any
    categorical type from its leaf's text."""
    return not sa.numerical or sa.typname in EXACT_TYPES


def shuffled_by_class(ec: np.ndarray, n_classes: int) -> np.ndarray:
    """Row positions grouped by class (classes in id order), in a random order within each
    class drawn from the OS's randomness, not from options.seed: the physical order of a
    class's rows then says nothing about the source's order or values."""
    rng = np.random.default_rng(secrets.randbits(128))
    perm = rng.permutation(len(ec))
    return perm[stable_argsort(ec[perm])]       # (radix passes: 1M rows 0.04 s against 0.12 s)


def output_from_classes_query(req, classes, summary, codes, result, offset: int = 0):
    """(query, types, params): the rows of <output> by expanding each class (in ec_id order) into its rows'
    SA values: per SA one array grouped by EC (an integer SA's own values, else codes), each
    class unnests its slice (several SAs: ``summary`` a list, ``codes`` one column per SA,
    their slices unnested side by side)."""
    summaries = summary if isinstance(summary, list) else [summary]
    codes = np.asarray(codes, dtype=np.int64).reshape(len(result.ec), len(summaries))
    codes = codes[shuffled_by_class(result.ec, result.n_classes)]
    st = _Params([np.concatenate(([0], np.cumsum(result.sizes)[:-1])).tolist()], ["int8[]"])
    at = "($1::int8[])[c.ec_id - %d]" % (offset - 1) if offset else "($1::int8[])[c.ec_id + 1]"
    slice_ = "pg_catalog.unnest(($%%d::%%s[])[%s + 1 : %s + c.size]) AS a%%d" % (at, at)
    inner, outer, joins = [], [], []
    for j, (sa, one) in enumerate(zip(req.sensitive, summaries)):
        code = "x.a%d" % j
        if sa.numerical and sa.typname in C.INTEGER_TYPES:
            # the values themselves, in the column's own type: no lookup per row
            inner.append(slice_ % (st.add(one.distinct[codes[:, j]].tolist(), sa.typname + "[]"), sa.typname, j))
            value = code
        elif sa.numerical:
            inner.append(slice_ % (st.add(codes[:, j].tolist(), "int8[]"), "int8", j))
            values = np.asarray(one.distinct, dtype=np.float64).tolist()
            value = from_float("($%d::float8[])[%s + 1]" % (st.add(values, "float8[]"), code), sa.col)
        else:
            inner.append(slice_ % (st.add(codes[:, j].tolist(), "int8[]"), "int8", j))
            joins.append(" JOIN pg_catalog.unnest($%d::text[]) WITH ORDINALITY AS m%d(v, i) ON m%d.i = %s + 1"
                         % (st.add(list(one.hierarchy.leaves), "text[]"), j, j, code))
            value = "m%d.v::%s" % (j, sa.col["type"])
        outer.append("%s AS %s" % (value, C.ident(sa.name)))
    gen = req.generalized_columns()
    # (with an offset, ``classes`` also holds earlier parts' classes: only this part's expand)
    query = "SELECT x.ec_id, %s FROM (SELECT c.ec_id, %s FROM %s AS c%s) AS x%s" % (
        ", ".join(["x.%s" % C.ident(g) for g in gen] + outer),
        ", ".join(["c.%s" % C.ident(g) for g in gen] + inner), classes,
        " WHERE c.ec_id OPERATOR(pg_catalog.>=) %d" % offset if offset else "", "".join(joins))
    return query, st.types, st.params


class _Params:
    """Parameters of a statement as they are added; ``add`` returns the new one's number."""

    def __init__(self, params, types):
        self.params, self.types = params, types

    def add(self, values, sqltype) -> int:
        self.params.append(values)
        self.types.append(sqltype)
        return len(self.params)


def output_from_source_query(req, classes, keys_table):
    """The rows of <output> joined from the source (keep columns, or an SA not rebuilt exactly
    from codes), rows of a class in random order."""
    select = ["k.ec_id"] + ["c.%s" % C.ident(g) for g in req.generalized_columns()] + \
             ["s.%s" % C.ident(a.name) for a in req.sensitive] + ["s.%s" % C.ident(c) for c in req.options.keep]
    return ("SELECT %s FROM %s AS s JOIN %s AS k ON k.key = s.%s "
            "JOIN %s AS c ON c.ec_id = k.ec_id ORDER BY k.ec_id, pg_catalog.random()" % (
                ", ".join(select), req.source["read"], keys_table, C.ident(req.key.name), classes))


def write_output(plpy, req, run, classes, keys_table, summary, codes, result, into: Into | None = None):
    table = req.output.temporary_qualified(run.run_id, "o") if into is None else into.tables[""]
    write = (lambda query: "CREATE TABLE %s AS %s" % (table, query)) if into is None else \
        (lambda query: into.write("", query))
    if not req.options.keep and all(exact_from_codes(sa) for sa in req.sensitive):
        # serial: a parallel worker would first copy the array parameters (+0.4 s at 1M rows)
        with C.settings(plpy, max_parallel_workers_per_gather=0):
            query, types, params = output_from_classes_query(req, classes, summary, codes, result,
                                                             0 if into is None else into.offset)
            execute(plpy, (write(query), types, params))
    else:
        plpy.execute(write(output_from_source_query(req, classes, keys_table)))
    return table


# ---------------------------------------------------------------------------- check
def check_written(plpy, req, table, result, hierarchy):
    """The pre-swap check: class sizes and EMDs recomputed from the rows written to ``table``
    with the independent exact EMD must be the engine's classes, each >= k rows and within t.
    Several SAs: ``hierarchy`` is a list (one per SA), each SA is checked against its own t,
    and the list of measurements is returned."""
    if isinstance(hierarchy, list):
        return [_check_one(plpy, req, table, result, h, sa, t)
                for h, sa, t in zip(hierarchy, req.sensitive, req.thresholds)]
    return _check_one(plpy, req, table, result, hierarchy, req.sa, req.t)


def _check_one(plpy, req, table, result, hierarchy, sa, t):
    # (class ids are 0..n_classes-1: below 2^31, so a 32-bit SA shares an int8 with its class)
    written = closeness.measure(plpy, table, sa.name, sa.col, hierarchy,
                                small_classes=result.n_classes < 1 << 31)
    expected = np.sort(result.sizes)
    if written.classes != result.n_classes or not np.array_equal(np.sort(written.sizes), expected):
        raise E.source_changed(
            "the output written differs from the classes computed (%d classes written, %d computed): "
            "the source changed while sabre read it" % (written.classes, result.n_classes),
            "Run again, or call sabre_anonymize inside a REPEATABLE READ transaction so that all of "
            "its queries see one snapshot.")
    violations = written.violations(t, req.k)
    if violations:
        raise E.source_changed(
            "%d class(es) of the output written violate t = %g%s or k = %d in exact arithmetic (max EMD %.6g, "
            "smallest class %d): the source changed while sabre read it" % (
                violations, t, "" if len(req.sensitive) == 1 else " on %s" % sa.name, req.k, written.max_emd,
                written.min_class_size),
            "Run again, or call sabre_anonymize inside a REPEATABLE READ transaction so that all of "
            "its queries see one snapshot.")
    return written


# ---------------------------------------------------------------------------- swap
def dependents_sql():
    """Objects outside the relations $1 (oid[]) that depend on them, recursively through views
    and materialized views: (oid of a dependent relation or NULL, description)."""
    return (
        "WITH RECURSIVE dep(oid, what) AS ("
        " SELECT CASE WHEN d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_rewrite'::pg_catalog.regclass"
        "   THEN rw.ev_class END, pg_catalog.pg_describe_object(d.classid, d.objid, 0)"
        " FROM pg_catalog.pg_depend d LEFT JOIN pg_catalog.pg_rewrite rw"
        "   ON d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_rewrite'::pg_catalog.regclass"
        "  AND rw.oid OPERATOR(pg_catalog.=) d.objid"
        " LEFT JOIN pg_catalog.pg_constraint co"
        "   ON d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_constraint'::pg_catalog.regclass"
        "  AND co.oid OPERATOR(pg_catalog.=) d.objid"
        " WHERE d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass"
        "   AND d.refobjid OPERATOR(pg_catalog.=) ANY ($1) AND d.deptype OPERATOR(pg_catalog.=) 'n'"
        "   AND NOT COALESCE(rw.ev_class OPERATOR(pg_catalog.=) ANY ($1), false)"
        "   AND NOT COALESCE(co.conrelid OPERATOR(pg_catalog.=) ANY ($1), false)"
        "   AND NOT (d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass"
        "            AND d.objid OPERATOR(pg_catalog.=) ANY ($1))"
        " UNION"
        " SELECT rw.ev_class, pg_catalog.pg_describe_object('pg_catalog.pg_class'::pg_catalog.regclass, rw.ev_class, 0)"
        " FROM dep JOIN pg_catalog.pg_depend d ON d.refobjid OPERATOR(pg_catalog.=) dep.oid"
        "  AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass"
        "  AND d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_rewrite'::pg_catalog.regclass"
        " JOIN pg_catalog.pg_rewrite rw ON rw.oid OPERATOR(pg_catalog.=) d.objid"
        "  AND rw.ev_class OPERATOR(pg_catalog.<>) dep.oid"
        ") SELECT DISTINCT oid, what FROM dep ORDER BY what")


def check_dependents(plpy, req, prev: Previous):
    """Dependent objects of the previous output: never dropped silently; the source never."""
    if not prev.oids:
        return
    found = plpy.execute(plpy.prepare(dependents_sql(), ["oid[]"]), [prev.oids])
    if not len(found):
        return
    names = [r["what"] for r in found]
    if any(r["oid"] == req.source["oid"] for r in found):
        raise E.dependent_objects(
            "the source %s depends on the previous output %s, which this run would replace"
            % (req.source["qname"], req.output.qualified()),
            "Choose another output name: the source is never dropped.", "dependent objects: %s" % ", ".join(names))
    if not req.options.cascade:
        raise E.dependent_objects(
            "cannot replace the output %s: other objects depend on it: %s"
            % (req.output.qualified(), ", ".join(names[:10]) + (" and %d more" % (len(names) - 10)
                                                               if len(names) > 10 else "")),
            "Drop or change them first, choose another output name, or pass options => "
            "'{\"cascade\": true}' to drop them with the previous output.")


def swap(plpy, req, run, prev: Previous, built: dict):
    """Replace the previous output by the relations ``built`` ({suffix: temporary qualified
    name}) under lock_timeout: grants carry over, comments carry the run's identity.  With
    options.refresh = 'mvcc' the previous relations keep their identity and get the new rows.
    The label view (options.labels) is built first, on the new output.  On a Citus distributed
    source the relations are made Citus tables first (plpython/shared/citus.py)."""
    citus.distribute_outputs(plpy, req, built)
    built = {**labels.build(plpy, req, run, built[""]), **built}    # the view before its tables
    if req.options.refresh == "mvcc" and set(prev.relations) == set(built):
        return refresh_in_place(plpy, req, prev, built)
    check_dependents(plpy, req, prev)
    grants = {suffix: list(plpy.execute(plpy.prepare(grants_sql(), ["regclass"]), [str(oid)]))
              for suffix, oid in prev.relations.items()}
    try:
        with plpy.subtransaction(), C.settings(plpy, lock_timeout=req.options.lock_timeout):
            if prev.oids:
                # autovacuum may be analyzing the previous output; it yields to our lock only
                # after deadlock_timeout (1 s by default) -- shorten that where the caller may
                with C.settings(plpy, optional=True, deadlock_timeout="20ms"):
                    for kind, suffixes in (("VIEW", [labels.SUFFIX]), ("TABLE", ["", "_classes", "_keys"])):
                        names = [req.output.qualified(s) for s in suffixes if s in prev.relations]
                        if names:
                            plpy.execute("DROP %s %s%s" % (kind, ", ".join(names),
                                                           " CASCADE" if req.options.cascade else ""))
            _rename(plpy, req, run, built)
    except plpy.SPIError as e:
        if getattr(e, "sqlstate", None) != E.LOCK_NOT_AVAILABLE:
            raise
        raise E.lock_not_available(
            "could not replace the output %s within lock_timeout %s: other sessions are reading it"
            % (req.output.qualified(), req.options.lock_timeout),
            "Run again when the readers are done, or raise options.lock_timeout (e.g. '30s').")
    for suffix, rows in grants.items():
        for g in rows if suffix in built else ():
            plpy.execute("GRANT %s ON %s TO %s%s" % (g["privilege_type"], req.output.qualified(suffix),
                                                     g["grantee"], " WITH GRANT OPTION" if g["is_grantable"] else ""))


def refresh_in_place(plpy, req, prev: Previous, built: dict):
    """MVCC-safe refresh: each previous relation's rows are deleted and the new ones inserted
    (row locks only: readers are not blocked, and a reader whose snapshot predates the run
    keeps seeing the old rows); objects, grants and dependents stay as they are."""
    for suffix, table in built.items():
        if suffix == labels.SUFFIX:      # the previous view reads the refreshed output
            plpy.execute("DROP VIEW %s" % table)
            continue
        old = req.output.qualified(suffix)
        shapes = [list(C.columns(plpy, oid).items()) for oid in (prev.relations[suffix], _oid(plpy, table))]
        if [(n, c["type"]) for n, c in shapes[0]] != [(n, c["type"]) for n, c in shapes[1]]:
            raise E.datatype_mismatch(
                "options.refresh = 'mvcc' needs the previous output %s to have the new one's columns" % old,
                "Use the default refresh ('swap') when quasi-identifiers, types or kept columns change.")
        plpy.execute("DELETE FROM %s" % old)
        plpy.execute("INSERT INTO %s SELECT * FROM %s" % (old, table))
        plpy.execute("DROP TABLE %s" % table)


def _oid(plpy, table):
    return plpy.execute(plpy.prepare("SELECT pg_catalog.to_regclass($1)::pg_catalog.oid AS oid", ["text"]),
                        [table])[0]["oid"]


def _rename(plpy, req, run, built):
    out = req.output
    for suffix, tag, name in (("_classes", "c_pkey", "_classes_pkey"), ("_keys", "k_idx", "_keys_idx")):
        if suffix in built and (suffix != "_keys" or req.method in HILBERT_METHODS):
            # (sabre_instant builds the output alone; index_keys: the Hilbert methods' index)
            plpy.execute("ALTER INDEX %s RENAME TO %s" % (out.temporary_qualified(run.run_id, tag),
                                                          C.ident(out.name + name)))
    for suffix, table in built.items():
        plpy.execute("ALTER TABLE %s RENAME TO %s" % (table, C.ident(out.name + suffix)))


def comment(plpy, req, run):
    """Each relation's COMMENT, carrying the run's identity (only an owner can set it)."""
    closeness_text = "t = %g" % req.t if len(req.sensitive) == 1 else ", ".join(
        "t = %g on %s" % (t, a.name) for a, t in zip(req.sensitive, req.thresholds))
    texts = {"": "sabre-pg output of run %d: %s anonymized with SABRE-%s, %s, k = %d" % (
                 run.run_id, req.source["qname"], req.method.upper(), closeness_text, req.k),
             "_classes": "sabre-pg equivalence classes of run %d" % run.run_id,
             "_keys": "sabre-pg run %d: source key -> SA bucket, Hilbert key, equivalence class" % run.run_id}
    if req.options.labels:
        texts[labels.SUFFIX] = "sabre-pg labels of run %d (numerical quasi-identifiers as text)" % run.run_id
    for suffix, text in texts.items():
        plpy.execute("COMMENT ON %s %s IS %s" % ("VIEW" if suffix == labels.SUFFIX else "TABLE",
                                                 req.output.qualified(suffix), plpy.quote_literal(run.comment(text))))


def record(plpy, req, run, facts: dict, hierarchies: dict | None = None) -> int:
    """Record the run through the catalog's owner-defined path; returns the output's OID.
    The facts get the owner and content hash of each named hierarchy: those of the objects the
    run used (``hierarchies``, {attribute: Hierarchy}), else read now (partitioned runs)."""
    facts = dict(facts, hierarchies=used_hierarchies(plpy, req, hierarchies))
    # the side table last (run_record takes it as keys_table)
    names = [req.output.qualified(s) for s in ("", "_classes") + ((labels.SUFFIX,) if req.options.labels else ())
             + ("_keys",)]
    out = plpy.execute(plpy.prepare(
        "SELECT %s($1, $2::pg_catalog.regclass, $3::pg_catalog.regclass[], $4::pg_catalog.oid::pg_catalog.regclass, "
        "$5::jsonb), $2::pg_catalog.regclass::pg_catalog.oid AS output" % C.catalog("run_record"),
        ["int8", "text", "text[]", "oid", "text"]),
        [run.run_id, names[0], names, req.source["oid"], json.dumps(facts)])
    return out[0]["output"]


def used_hierarchies(plpy, req, hierarchies: dict | None) -> dict:
    """{name: {owner, sha256}} of the hierarchies the request names (what sabre_refresh checks)."""
    names = {a.name: a.hierarchy_name for a in req.attrs if a.hierarchy_name is not None}
    found = {}
    for attribute, name in names.items():
        h = (hierarchies or {}).get(attribute)
        if getattr(h, "fingerprint", None) is not None:
            found[name] = h.fingerprint
    missing = sorted(set(names.values()) - set(found))
    if missing:
        found.update(C.hierarchy_fingerprints(plpy, missing))
    return found


def from_float(expr, col):
    """Cast a float8 expression back to the column's own type."""
    typname = col["typname"]
    if typname == "date":
        return "(date '1970-01-01' + (%s)::int)" % expr
    if typname == "timestamptz":
        return "pg_catalog.to_timestamp(%s)" % expr
    if typname == "timestamp":
        return "(pg_catalog.to_timestamp(%s) AT TIME ZONE 'UTC')" % expr
    if typname == "interval":       # months of 30 days, as interval comparison counts them
        return "pg_catalog.justify_interval(pg_catalog.make_interval(secs => %s))" % expr
    if typname in ("time", "timetz"):
        return "(time '00:00' + pg_catalog.make_interval(secs => %s))::%s" % (expr, col["type"])
    return "(%s)::%s" % (expr, col["type"])
