"""The stages of sabre_anonymize (request, scan, publish) without a server: argument checks,
generated SQL and its decoders, with a fake plpy."""
from __future__ import annotations

import struct

import numpy as np
import pytest

from sabre_pg.core.hierarchy import Hierarchy

from .fake_plpy import FakePlpy, PlpyError, sabre_plpy

E = sabre_plpy("shared.errors")
R = sabre_plpy("stages.request")
S = sabre_plpy("stages.scan")
P = sabre_plpy("stages.publish")

INT4 = {"type": "integer", "category": "N", "typname": "int4", "notnull": True}
INT8 = {"type": "bigint", "category": "N", "typname": "int8", "notnull": True}
FLOAT = {"type": "double precision", "category": "N", "typname": "float8", "notnull": False}
TEXT = {"type": "text", "category": "S", "typname": "text", "notnull": True}


def request(qis, sa, keep=(), given=None, nulls="error"):
    """A Request built from (name, col, kind) triples, as request.build would."""
    attrs = [R.Attr(n, c, k) for n, c, k in qis]
    opts = R.Options("sweep", nulls, 1, True, 4, tuple(keep), None, False, "5s", "swap", given or {})
    source = {"oid": 42, "nspname": "public", "relname": "t", "relkind": "r", "qname": '"public"."t"', "read": '"public"."t"'}
    return R.Request(source, {}, tuple(attrs), R.Attr(*sa), R.Key("id", INT8, True), 0.3, 5, "ak", opts,
                     R.Output("public", "t_sabre"))


def send(values, fmt):
    return b"".join(struct.pack(fmt, v) for v in values)


# ---------------------------------------------------------------------------- errors
def test_a_stage_error_becomes_a_postgres_error_with_sqlstate_and_hint():
    plpy = FakePlpy()

    @E.entry_point
    def entry(plpy):
        raise E.invalid_parameter("bad t", "use 0 < t <= 1")

    with pytest.raises(PlpyError) as e:
        entry(plpy)
    assert (str(e.value), e.value.sqlstate, e.value.hint) == ("bad t", "22023", "use 0 < t <= 1")


# ---------------------------------------------------------------------------- request
@pytest.mark.parametrize("t", [None, float("nan"), 0, -0.1, 1.5, True, "0.3"])
def test_check_t_refuses(t):
    C = sabre_plpy("shared.common")
    with pytest.raises(E.SabreError) as e:
        C.check_t(t, "hint")
    assert e.value.sqlstate == ("22004" if t is None else "22023") and e.value.hint == "hint"


@pytest.mark.parametrize("k", [None, 0, -3, True, 2.5])
def test_check_k_refuses(k):
    C = sabre_plpy("shared.common")
    with pytest.raises(E.SabreError):
        C.check_k(k, "hint")


@pytest.mark.parametrize("given, words", [
    ({"takeout": "zigzag"}, "options.takeout"), ({"nulls": "keep"}, "options.nulls"),
    ({"seed": 1.5}, "options.seed"), ({"seed": True}, "options.seed"), ({"lookahead": 65}, "options.lookahead"),
    ({"replace": "yes"}, "options.replace"), ({"cascade": 1}, "options.cascade"),
    ({"lock_timeout": ""}, "options.lock_timeout"), ({"refresh": "inplace"}, "options.refresh"), ({"keep": "id"}, "options.keep"),
    ({"keep": ["nope"]}, "options.keep"), ({"keep": ["age"]}, "options.keep"),
    ({"weights": {"age": -1}}, "options.weights"), ({"weights": {"zip": 1}}, "options.weights"),
    ({"weights": {"age": 0}}, "must not all be zero"),
])
def test_option_errors_name_the_option(given, words):
    qis = [R.Attr("age", INT4, "numerical")]
    with pytest.raises(E.SabreError) as e:
        R.parse_options(given, {"age": INT4, "id": INT8}, qis)
    assert words in e.value.message and e.value.hint


def test_weights_are_normalized_and_default_to_one():
    w = R.parse_weights({"a": 2}, ["a", "b", "c"])
    assert w.tolist() == [0.5, 0.25, 0.25]
    assert R.parse_weights(None, ["a"]) is None


@pytest.mark.parametrize("qis, sa, keep, state, words", [
    ([("x", INT4, "numerical"), ("x_lo", TEXT, "categorical")], ("s", INT4, "numerical"), (), "42701", "x_lo"),
    ([("x", INT4, "numerical")], ("ec_id", INT4, "numerical"), (), "42701", "sensitive"),
    ([("size", TEXT, "categorical")], ("s", INT4, "numerical"), (), "42701", "size"),
    ([("x", INT4, "numerical")], ("s", INT4, "numerical"), ("x_hi",), "42701", "options.keep"),
    ([("q" * 61, INT4, "numerical")], ("s", INT4, "numerical"), (), "42622", "63 bytes"),
])
def test_output_column_collisions(qis, sa, keep, state, words):
    req = request(qis, sa, keep)
    with pytest.raises(E.SabreError) as e:
        R.check_column_names(req)
    assert e.value.sqlstate == state and words in e.value.message and e.value.hint


def test_a_name_of_exactly_63_bytes_is_accepted():
    R.check_column_names(request([("q" * 60, INT4, "numerical")], ("s", INT4, "numerical")))


def test_output_names_length_limit():
    plpy = FakePlpy({"parse_ident": [{"p": ["n" * 50]}], "pg_namespace": [{"?column?": 1}]})
    src = {"nspname": "public", "relname": "t"}
    assert R.output_names(plpy, src, "n" * 50).name == "n" * 50           # 50 + 13 = 63 bytes
    plpy = FakePlpy({"parse_ident": [{"p": ["n" * 51]}], "pg_namespace": [{"?column?": 1}]})
    with pytest.raises(E.SabreError) as e:
        R.output_names(plpy, src, "n" * 51)
    assert e.value.sqlstate == "42622"


def test_missing_output_schema():
    plpy = FakePlpy({"parse_ident": [{"p": ["nope", "t"]}]})
    with pytest.raises(E.SabreError) as e:
        R.output_names(plpy, {"nspname": "public", "relname": "t"}, "nope.t")
    assert e.value.sqlstate == "3F000"


# ---------------------------------------------------------------------------- scan
def _encoding(leaves, low, high):
    low, high = np.asarray(low, dtype=np.int64), np.asarray(high, dtype=np.int64)
    return S.Encoding(list(leaves), 0, low, (high << 32) | low)


def test_a_value_sharing_a_leafs_low_32_bits_is_caught():
    """Categorical values travel as the low 32 bits of a hash; a value that is no leaf but
    shares a leaf's low bits is caught by the sum of the high 32 bits."""
    enc = _encoding(["a", "ab", "abc"], [1, 2, 3], [10, 20, 30])
    rows = np.array([1, 2, 2, 3], dtype=np.int64)
    positions, ok = S.ReadPlan._leaf_positions(rows, 10 + 20 + 20 + 30, enc)
    assert ok and positions.tolist() == [0, 1, 1, 2]
    positions, ok = S.ReadPlan._leaf_positions(rows, 10 + 20 + 99 + 30, enc)   # a stray value like 'ab'
    assert not ok
    positions, ok = S.ReadPlan._leaf_positions(np.array([7]), 0, enc)           # no leaf's low bits
    assert not ok


def test_read_plan_sql_and_decoder_agree():
    req = request([("age", INT4, "numerical"), ("zip", INT4, "numerical"), ("w", FLOAT, "numerical"),
                   ("big", INT8, "numerical"), ("tag", TEXT, "categorical")], ("sal", INT4, "numerical"))
    enc = {"tag": _encoding(["x", "y"], [5, 6], [1, 2])}
    plan = S.ReadPlan(req, enc)
    for alias in ("p0", "p4", "a2", "a3", "f2", "c2", "h4", "key"):
        assert " AS %s" % alias in plan.sql
    assert "pg_catalog.hashtextextended" in plan.sql and '"public"."t"' in plan.sql
    age, zp, w, big, tag, sal = [30, 41, 52], [-7, 8, 9], [0.5, 1.5, 2.5], [2 ** 40, -1, 3], [5, 6, 5], [1, 2, 3]
    pair = lambda hi, lo: [((h & 0xFFFFFFFF) << 32 | (l & 0xFFFFFFFF)) - (1 << 64 if h < 0 or h >= 2 ** 31 else 0)
                           for h, l in zip(hi, lo)]
    row = {"n": 3, "key": send([11, 12, 13], ">q"), "c2": 3, "f2": 0, "h4": 1 + 2 + 1,
           "p0": send(pair(age, zp), ">q"), "p4": send(pair(tag, sal), ">q"),
           "a2": send(w, ">d"), "a3": send(big, ">q")}
    n, keys, data, missing = plan.decode(row)
    assert n == 3 and keys.tolist() == [11, 12, 13] and missing == []
    assert [d.tolist() for d in data] == [age, zp, w, big, [0, 1, 0], sal]


def test_read_plan_reports_nulls_and_non_finite_values():
    req = request([("w", FLOAT, "numerical")], ("sal", INT4, "numerical"))
    plan = S.ReadPlan(req, {})
    with pytest.raises(E.SabreError) as e:
        plan.decode({"n": 3, "c0": 2, "f0": 0})
    assert e.value.sqlstate == "22004" and '"w" (1 rows)' in e.value.message
    with pytest.raises(S.NonFinite) as e:            # read() names the values (scan.nonfinite_error)
        plan.decode({"n": 3, "c0": 3, "f0": 2})
    assert e.value.bad == [("w", 2)]


def test_sa_codes_detect_values_outside_the_summary():
    summary = S.SASummary(3, np.array([1, 2]), np.array([10.0, 20.0]), None)
    codes, same = S.sa_codes(np.array([10.0, 20.0, 20.0]), summary)
    assert same and codes.tolist() == [0, 1, 1]
    assert not S.sa_codes(np.array([10.0, 21.0, 20.0]), summary)[1]


# ---------------------------------------------------------------------------- publish
def test_rows_of_a_class_are_shuffled_within_the_class():
    ec = np.repeat(np.arange(50), 40)
    order = P.shuffled_by_class(ec, 50)
    assert sorted(order.tolist()) == list(range(len(ec)))
    assert (np.diff(ec[order]) >= 0).all()                 # grouped by class, in id order
    in_source_order = sum(bool((np.diff(order[c * 40:(c + 1) * 40]) > 0).all()) for c in range(50))
    assert in_source_order == 0


class _Result:
    def __init__(self, generalization, sizes, emds):
        self.generalization, self.sizes, self.emds = generalization, np.asarray(sizes), np.asarray(emds)
        self.n_classes = len(sizes)
        self.ec = np.repeat(np.arange(len(sizes)), 1)        # one scanned row per class


def _classes_statement(prefix: str):
    """(SQL, types, params, small, large) of a classes statement with a 2-label and a 300-label
    hierarchy whose labels start with ``prefix``."""
    from sabre_pg.core.generalize import CategoricalNode, NumericalRange
    small = Hierarchy.flat([prefix + "a", prefix + "b"])
    large = Hierarchy.flat([prefix + "v%d" % i for i in range(300)])
    req = request([("tag", TEXT, "categorical"), ("age", INT4, "numerical"), ("w", FLOAT, "numerical"),
                   ("big", TEXT, "categorical")], ("sal", INT4, "numerical"))
    result = _Result([CategoricalNode(np.array([0, 2]), small), NumericalRange(np.array([20, 30]), np.array([29, 40])),
                      NumericalRange(np.array([0.5, 1.0]), np.array([0.9, 2.0])),
                      CategoricalNode(np.array([0, 300]), large)], [5, 6], [0.1, 0.2])
    table = P.ClassesTable(req, result, [None, np.array([20, 40]), np.array([0.5, 2.0]), None], "keys",
                           {"tag": small, "big": large})
    sql, types, params = table.statement('"public"."c"')
    return sql, types, params, small, large


def test_classes_statement_keeps_qi_order_and_labels():
    sql, types, params, small, large = _classes_statement("")
    select = sql.split(" FROM (SELECT ")[0]
    positions = [select.index(' AS "%s"' % c) for c in ("tag", "age_lo", "age_hi", "w_lo", "w_hi", "big")]
    assert positions == sorted(positions)
    # labels that fit a name: both hierarchies by O(1) subscript of a name[], default collation
    assert select.count('::pg_catalog.name[])[') == 2 and "WITH ORDINALITY" not in sql
    assert select.count('COLLATE pg_catalog."default"') == 2
    assert len(types) == len(params) and params[0] == [0.1, 0.2]
    assert types.count("pg_catalog.name[]") == 2 and small.labels == params[types.index("pg_catalog.name[]")]


def test_classes_statement_long_labels():
    """Labels longer than a name may hold: a short list by text[] subscript, a long one by a join."""
    sql, types, params, small, large = _classes_statement("x" * P.NAME_LABEL_BYTES)
    select = sql.split(" FROM (SELECT ")[0]
    assert '::text[])[' in select and "name[]" not in sql    # the small hierarchy by subscript
    assert "WITH ORDINALITY AS l" in sql                    # the large one by a join
    assert small.labels == params[types.index("text[]")]


def test_fits_name():
    assert P.fits_name(["a" * P.NAME_LABEL_BYTES, "b"]) and not P.fits_name(["a" * (P.NAME_LABEL_BYTES + 1)])
    assert not P.fits_name(["é" * (P.NAME_LABEL_BYTES // 2 + 1)])       # UTF-8 bytes, not characters
    assert P.fits_name([]) and not P.fits_name(["v"] * (P.NAME_LABELS + 1))


def test_previous_output_must_be_a_recorded_run_of_the_caller():
    req = request([("age", INT4, "numerical")], ("sal", INT4, "numerical"))
    answers = lambda rows: {"FROM pg_catalog.pg_class c": rows}
    assert P.previous(FakePlpy(answers([])), req).relations == {}
    for row, words in (({"oid": 7, "mine": True, "recorded": False}, "not an output"),
                       ({"oid": 7, "mine": False, "recorded": True}, "not an output"),
                       ({"oid": 42, "mine": True, "recorded": True}, "the source itself")):
        with pytest.raises(E.SabreError) as e:
            P.previous(FakePlpy(answers([row])), req)
        assert e.value.sqlstate == "42P07" and words in e.value.message
    found = P.previous(FakePlpy(answers([{"oid": 7, "mine": True, "recorded": True}])), req)
    assert found.oids == [7, 7, 7, 7]    # output, _classes, _keys, _labels (labels.SUFFIX)


def test_dependents_block_a_replacement_unless_the_caller_opts_in():
    req = request([("age", INT4, "numerical")], ("sal", INT4, "numerical"))
    prev = P.Previous({"": 7})
    plpy = FakePlpy({"WITH RECURSIVE dep": [{"oid": 99, "what": "view bob.v"}]})
    with pytest.raises(E.SabreError) as e:
        P.check_dependents(plpy, req, prev)
    assert e.value.sqlstate == "2BP01" and "bob.v" in e.value.message and "cascade" in e.value.hint
    plpy = FakePlpy({"WITH RECURSIVE dep": [{"oid": 42, "what": "view public.t"}]})
    with pytest.raises(E.SabreError) as e:
        P.check_dependents(plpy, req, prev)                 # the source itself: never
    assert "the source" in e.value.message


def test_every_internal_call_in_the_generated_sql_is_qualified():
    """Belt and braces beside the pinned search_path: the catalog and set-returning calls the
    stages write name pg_catalog or sabre's schema."""
    req = request([("age", INT4, "numerical")], ("sal", INT4, "numerical"))
    for sql in (P.dependents_sql(), P.grants_sql(), P.output_from_source_query(req, "c", "k")):
        for word in ("pg_depend", "pg_class", "pg_rewrite", "aclexplode", "random()"):
            if word in sql:
                assert "pg_catalog." + word in sql


# ---------------------------------------------------------------------------- closeness
@pytest.mark.parametrize("values", [np.array([5, -3, 5, 2**40, 7, -3]), np.array([0.5, -1.0, 0.5, 2.0]),
                                    np.arange(10) * 3, np.array([2**62, 2**62 + 1, 2**62])])
def test_ranks_are_dense_ranks(values):
    K = sabre_plpy("shared.closeness")
    codes, m = K.ranks(values)
    distinct, expected = np.unique(values, return_inverse=True)
    assert codes.tolist() == expected.reshape(-1).tolist() and m == len(distinct)


@pytest.mark.parametrize("spread", [10, 10 ** 12])          # counting, and sorting for a wide range of ids
def test_groups_count_class_code_pairs(spread):
    K = sabre_plpy("shared.closeness")
    rng = np.random.default_rng(3)
    ec = rng.integers(0, 40, 5000) * spread - 7
    codes = rng.integers(0, 9, 5000)
    got = K.groups(ec, codes, 9)
    pairs, counts = np.unique(np.stack([ec, codes]), axis=1, return_counts=True)
    assert got[0].tolist() == pairs[0].tolist() and got[1].tolist() == pairs[1].tolist()
    assert got[2].tolist() == counts.tolist()
