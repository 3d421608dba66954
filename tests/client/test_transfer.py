"""plpython/shared/transfer.py without a server: binary array decoding, bit packing, hash lookup.

The binary layout is PostgreSQL's ``array_send`` format; the DB tests check the same
functions against a live server (every sabre_anonymize reads through them)."""
from __future__ import annotations

import importlib.util
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

_path = Path(__file__).resolve().parents[2] / "plpython" / "shared" / "transfer.py"
_spec = importlib.util.spec_from_file_location("sabre_plpy_transfer", _path)
T = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(T)

FORMATS = {"int8": ">q", "int4": ">i", "float8": ">d"}


def string_agg_send(values, sqltype):
    """What string_agg(<type>send(x), '') produces: the send formats back to back."""
    return b"".join(struct.pack(FORMATS[sqltype], v) for v in values)


@pytest.mark.parametrize("sqltype,values", [
    ("int8", [0, -1, 2**62, -(2**63), 2**63 - 1]),
    ("int4", [0, -5, 2**31 - 1, -(2**31)]),
    ("float8", [0.0, -1.5, 1e300, 2.0**-1074]),
])
def test_decode_array_roundtrip(sqltype, values):
    got = T.decode_array(string_agg_send(values, sqltype), sqltype, len(values))
    assert got.tolist() == values
    assert got.dtype == (np.float64 if sqltype == "float8" else np.int64)


def test_decode_array_rejects_mismatches():
    buf = string_agg_send([1, 2, 3], "int8")
    with pytest.raises(ValueError, match="expected 4 int8 values"):
        T.decode_array(buf, "int8", 4)                          # a NULL was skipped
    with pytest.raises(ValueError, match=r"24 bytes\), got 23"):
        T.decode_array(buf[:-1], "int8", 3)
    with pytest.raises(ValueError, match="NULL"):
        T.decode_array(None, "int8", 2)
    assert len(T.decode_array(None, "int4", 0)) == 0


def test_binary_agg_sql():
    assert T.binary_agg("s.age", "int8") == ("pg_catalog.string_agg(pg_catalog.int8send((s.age)::pg_catalog.int8), "
                                             "''::pg_catalog.bytea)")
    with pytest.raises(ValueError):
        T.binary_agg("s.x", "text")


def _eval_sql(expr: str, words: list[np.ndarray]) -> np.ndarray:
    """Evaluate a BitPack SQL expression with numpy (bigint >> and & on int64)."""
    env = {"w%d" % j: w for j, w in enumerate(words)}
    return eval(expr.replace("u.", ""), {}, env)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 62), min_size=1, max_size=8), st.integers(1, 40), st.integers(0, 2**32))
def test_bitpack_roundtrip(bit_widths, n, seed):
    rng = np.random.default_rng(seed)
    fields = [("f%d" % i, rng.integers(0, 1 << b, n) if b else np.zeros(n, dtype=np.int64))
              for i, b in enumerate(bit_widths)]
    pack = T.BitPack(fields)
    assert len(pack.words) <= len(fields)
    assert all((w >= 0).all() for w in pack.words)             # the sign bit is never used
    exprs = ["u.w%d" % j for j in range(len(pack.words))]
    for name, values in fields:
        np.testing.assert_array_equal(pack.unpack(name), values)
        np.testing.assert_array_equal(_eval_sql(pack.sql(name, exprs), pack.words), values)


def test_bitpack_shares_words_and_rejects_bad_input():
    pack = T.BitPack([("ec", np.array([0, 131071])), ("bucket", np.array([2, 0])), ("code", np.array([49, 3]))])
    assert len(pack.words) == 1                                 # 17 + 2 + 6 bits
    with pytest.raises(ValueError, match="non-negative"):
        T.BitPack([("x", np.array([-1]))])
    with pytest.raises(ValueError, match="expected 2"):
        T.BitPack([("x", np.array([1, 2])), ("y", np.array([1]))])


@pytest.mark.parametrize("L", [1, 2, 83, 400, 5000])
def test_hash_positions_exact(L):
    rng = np.random.default_rng(L)
    leaves = rng.integers(-(2**63), 2**63 - 1, L, dtype=np.int64)
    pick = rng.integers(0, L, 10_000)
    rows = leaves[pick].copy()
    pos, missing = T.hash_positions(rows, leaves)
    assert missing == 0
    np.testing.assert_array_equal(pos, pick)
    # values that are no leaf, including one differing from a leaf only in its high bits
    rows[:3] = [leaves[0] ^ (1 << 62), leaves[-1] + 1, 12345]
    pos, missing = T.hash_positions(rows, leaves)
    assert missing == sum(1 for v in rows[:3] if v not in set(leaves.tolist()))
    np.testing.assert_array_equal(pos[3:], pick[3:])


def test_hash_positions_needs_distinct_leaves():
    with pytest.raises(ValueError, match="distinct"):
        T.hash_positions(np.array([1]), np.array([5, 5]))


def test_int32_pairs():
    hi = np.array([0, -1, 2**31 - 1, -(2**31), 7])
    lo = np.array([-(2**31), 2**31 - 1, -1, 0, -7])
    # what PostgreSQL computes for int32_pair_sql: (hi::int8 << 32) | (lo::int8 & 4294967295)
    words = (hi << 32) | (lo & 0xFFFFFFFF)
    a, b = T.split_int32_pair(words)
    np.testing.assert_array_equal(a, hi)
    np.testing.assert_array_equal(b, lo)
    assert T.int32_pair_sql("s.a", "s.b") == ("(((s.a)::pg_catalog.int8 OPERATOR(pg_catalog.<<) 32) "
                                              "OPERATOR(pg_catalog.|) ((s.b)::pg_catalog.int8 "
                                              "OPERATOR(pg_catalog.&) 4294967295))")
