"""Bulk transfer between SQL and numpy inside PL/Python.

PL/Python converts every element of an array argument or result through a Python object and
the element type's text I/O: about 0.3 microseconds per element, which for a million rows
costs more than the SABRE engine itself.  Two techniques keep that cost down:

* **Reading**: a column is aggregated as ``string_agg(int8send(expr), '')`` -- the values'
  binary send format back to back, one ``bytea`` that reaches Python as a single ``bytes``
  object -- and decoded with ``numpy.frombuffer`` (:func:`decode_array`).  No per-element
  Python objects (and cheaper in the server than ``array_send(array_agg(...))``).
* **Writing**: small non-negative integers (EC ids, buckets, codes, range ends) are bit-packed
  into as few ``bigint`` elements as possible (:class:`BitPack`) and unpacked in SQL with
  shifts and masks, so fewer elements cross the boundary.  Large int8 values (Hilbert keys),
  whose 19-digit text form is the costly part, travel as one ``bytea`` read back through a
  ``varbit`` (:func:`int8_bytea`, :func:`int8_at`).

Pure numpy: unit-tested without a server.
"""
from __future__ import annotations

import numpy as np

# element types sabre reads in binary: (send function, numpy dtype of the send format)
SEND = {"int8": ("int8send", ">i8"), "int4": ("int4send", ">i4"), "float8": ("float8send", ">f8")}


def binary_agg(expr: str, sqltype: str) -> str:
    """SQL aggregate reading ``expr`` as one binary ``bytea`` (see :func:`decode_array`)."""
    if sqltype not in SEND:
        raise ValueError("binary_agg supports %s, not %s" % (", ".join(SEND), sqltype))
    return ("pg_catalog.string_agg(pg_catalog.%s((%s)::pg_catalog.%s), ''::pg_catalog.bytea)"
            % (SEND[sqltype][0], expr, sqltype))


def int32_pair_sql(hi: str, lo: str) -> str:
    """One bigint holding two int4 (or int2) SQL expressions: fewer elements to aggregate."""
    return ("(((%s)::pg_catalog.int8 OPERATOR(pg_catalog.<<) 32) OPERATOR(pg_catalog.|) "
            "((%s)::pg_catalog.int8 OPERATOR(pg_catalog.&) 4294967295))" % (hi, lo))


def split_int32_pair(words: np.ndarray):
    """The two signed 32-bit values of :func:`int32_pair_sql` words, as int64 arrays."""
    words = np.asarray(words, dtype=np.int64)
    lo = (words & 0xFFFFFFFF).astype(np.uint32).view(np.int32).astype(np.int64)
    return words >> 32, lo


def decode_array(buf, sqltype: str, n: int) -> np.ndarray:
    """Decode :func:`binary_agg` of ``n`` non-NULL ``sqltype`` values into a native numpy
    array (int64 or float64)."""
    dt = np.dtype(SEND[sqltype][1])
    native = np.float64 if dt.kind == "f" else np.int64
    if n == 0:
        return np.empty(0, dtype=native)
    if buf is None:
        raise ValueError("expected %d %s values, got NULL" % (n, sqltype))
    if isinstance(buf, str) and buf.startswith("\\x"):    # a driven run's rows (shared/driven.py): bytea as hex
        buf = bytes.fromhex(buf[2:])
    if len(buf) != n * dt.itemsize:
        raise ValueError("expected %d %s values (%d bytes), got %d bytes: NULLs or a malformed read"
                         % (n, sqltype, n * dt.itemsize, len(buf)))
    return np.frombuffer(buf, dtype=dt, count=n).astype(native)


# An int8 column of at most this many values whose values are large (Hilbert keys: 19 digits,
# whose text form PL/Python builds and int8in parses per element) travels as one bytea instead
# of a list: 1M values 0.35 s against 0.48 s of backend CPU (benchmarks/bench_transfer.py).
# (Small values gain nothing: 0.27 s both.)  The bound keeps the varbit's bit positions in int4.
BYTEA_VALUES = 1 << 22


def int8_bytea(values) -> bytes:
    """``values`` as one ``bytea`` of big-endian int8 (what :func:`int8_at` reads back)."""
    return np.asarray(values, dtype=">i8").tobytes()


def bytea_bits_sql(param: str) -> str:
    """SQL ``varbit`` of the :func:`int8_bytea` parameter ``param`` (made once per statement)."""
    return ("('x' OPERATOR(pg_catalog.||) pg_catalog.encode(%s, 'hex'))::pg_catalog.varbit" % param)


def int8_at(bits: str, i: str) -> str:
    """SQL int8: value number ``i`` (int4, from 0) of :func:`bytea_bits_sql` ``bits``."""
    return ("pg_catalog.substring(%s, %s OPERATOR(pg_catalog.*) 64 OPERATOR(pg_catalog.+) 1, 64)"
            "::pg_catalog.bit(64)::pg_catalog.int8" % (bits, i))


WORD_BITS = 63          # bigint without its sign bit: shifts stay non-negative


def bits_for(values: np.ndarray) -> int:
    """Bits needed for the non-negative integers ``values`` (at least 1)."""
    if len(values) == 0:
        return 1
    lo, hi = int(values.min()), int(values.max())
    if lo < 0:
        raise ValueError("only non-negative integers can be bit-packed, got %d" % lo)
    return max(1, hi.bit_length())


class BitPack:
    """Non-negative integer columns packed into as few ``bigint`` columns ("words") as fit.

    ``fields`` is a list of (name, values); every values array has the same length.  Fields
    are placed first-fit into 63-bit words in the given order; ``words`` are the int64 arrays
    to send and :meth:`sql` gives the expression that extracts a field from the words' SQL
    expressions.
    """

    def __init__(self, fields):
        self.layout = {}                    # name -> (word, shift, bits)
        used: list[int] = []
        n = None
        for name, values in fields:
            values = np.asarray(values, dtype=np.int64)
            if n is None:
                n = len(values)
            elif len(values) != n:
                raise ValueError("field %s has %d values, expected %d" % (name, len(values), n))
            b = bits_for(values)
            if b > WORD_BITS:
                raise ValueError("field %s needs %d bits" % (name, b))
            w = next((i for i, u in enumerate(used) if u + b <= WORD_BITS), len(used))
            if w == len(used):
                used.append(0)
            self.layout[name] = (w, used[w], b)
            used[w] += b
        self.n = n or 0
        self.words = [np.zeros(self.n, dtype=np.int64) for _ in used]
        for name, values in fields:
            w, shift, _ = self.layout[name]
            self.words[w] |= np.asarray(values, dtype=np.int64) << shift

    def sql(self, name: str, word_exprs) -> str:
        """SQL bigint expression of field ``name``, given the SQL expression of each word."""
        w, shift, b = self.layout[name]
        e = word_exprs[w]
        if shift:
            e = "(%s >> %d)" % (e, shift)
        if shift + b < WORD_BITS:
            e = "(%s & %d)" % (e, (1 << b) - 1)
        return e

    def unpack(self, name: str) -> np.ndarray:
        """The field back from the words (what the SQL expression computes)."""
        w, shift, b = self.layout[name]
        return (self.words[w] >> shift) & ((1 << b) - 1)


def hash_positions(row_hashes: np.ndarray, leaf_hashes: np.ndarray):
    """Position of the leaf whose hash each row's hash is, and how many rows match no leaf.

    ``leaf_hashes`` must be distinct (one per leaf, in leaf order).  Rows matching no leaf
    get position 0; the caller reports them as values missing from the hierarchy.

    A direct-address table over some bit field of the hashes where the leaves do not collide
    (a few passes over the rows), else a binary search; both compare the full 64-bit hash.
    """
    leaf_hashes = np.asarray(leaf_hashes, dtype=np.int64)
    row_hashes = np.asarray(row_hashes, dtype=np.int64)
    L = len(leaf_hashes)
    if len(np.unique(leaf_hashes)) != L:
        raise ValueError("leaf hashes are not distinct")
    cand = None
    bits = max(8, (4 * L * L).bit_length())               # ~exp(-1/8) chance per field
    if bits <= 20:
        mask = (1 << bits) - 1
        for shift in range(0, 64 - bits + 1, 3):
            slot = (leaf_hashes >> shift) & mask
            if len(np.unique(slot)) == L:
                table = np.zeros(mask + 1, dtype=np.int64)
                table[slot] = np.arange(L)
                cand = table[(row_hashes >> shift) & mask]
                break
    if cand is None:
        order = np.argsort(leaf_hashes, kind="stable")
        idx = np.searchsorted(leaf_hashes[order], row_hashes)
        np.minimum(idx, L - 1, out=idx)
        cand = order[idx]
    hit = leaf_hashes[cand] == row_hashes
    missing = int(len(hit) - np.count_nonzero(hit))
    if missing:
        cand[~hit] = 0
    return cand, missing
