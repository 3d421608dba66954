"""The split's cells (plpython/batch/partition.py) without a server: how many buckets each numerical
QI gets, so that the one grouped scan of the split holds at most CELL_CAP cells."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from tests.client.fake_plpy import sabre_plpy

partition = sabre_plpy("batch.partition")


def qi(typname):
    return SimpleNamespace(col={"typname": typname})


def test_small_integer_spans_get_one_bucket_per_value():
    assert partition.bucket_counts([qi("int4"), qi("int2")], [(17.0, 90.0), (1.0, 16.0)], 50) == [74, 16]


def test_floats_and_wide_spans_get_equal_width_buckets():
    assert partition.bucket_counts([qi("float8"), qi("int8")], [(0.0, 1.0), (0.0, 1e9)], 2) == \
        [partition.HIST_BUCKETS, partition.HIST_BUCKETS]


@pytest.mark.parametrize("qis, m", [(7, 50), (3, 10_000), (1, 3 * partition.CELL_CAP)])
def test_cells_stay_within_the_cap(qis, m):
    sizes = partition.bucket_counts([qi("float8")] * qis, [(0.0, 1.0)] * qis, m)
    assert all(s >= 1 for s in sizes)
    assert np.prod(sizes, dtype=float) * m <= partition.CELL_CAP or max(sizes) == 1


def test_part_case_is_a_tree_of_the_cuts():
    a, b = "x < 1", "y < 2"
    leaves = [([a, b], 0), ([a, "NOT (%s)" % b], 1), (["NOT (%s)" % a], 2)]
    assert partition.part_case(leaves) == (
        "CASE WHEN x < 1 THEN CASE WHEN y < 2 THEN 0 WHEN NOT (y < 2) THEN 1 END WHEN NOT (x < 1) THEN 2 END")
    assert partition.part_case([([], 0)]) == "0"


@pytest.mark.parametrize("dense", [True, False])
def test_same_keys_counts_dense_keys_and_sorts_sparse_ones(dense):
    """``same_keys`` (the exactly-once check of a partitioned run): the same values each as often,
    whether counted (dense keys, negative ones included) or sorted (sparse keys)."""
    rng = np.random.default_rng(3)
    keys = (np.arange(-500, 1500) if dense else rng.choice(1 << 60, 2000, replace=False) - (1 << 59)).astype(np.int64)
    shuffled = rng.permutation(keys)
    assert partition.same_keys(keys.copy(), shuffled.copy())
    twice = shuffled.copy()
    twice[7] = twice[8]                              # one key twice, another missing
    assert not partition.same_keys(keys.copy(), twice)
    assert not partition.same_keys(keys.copy(), shuffled[:-1].copy())
    other = shuffled.copy()
    other[0] = keys.max() + 1                        # a key the other side lacks, same count
    assert not partition.same_keys(keys.copy(), other)
    assert partition.same_keys(np.zeros(0, np.int64), np.zeros(0, np.int64))
    span = int(max(keys.max(), other.max())) - int(min(keys.min(), other.min()))
    assert (span < partition.DENSE_KEYS * len(keys)) is dense


def test_one_value_buckets_are_integer_or_single_valued():
    assert partition._one_value_buckets(qi("int4"), 17.0, 90.0, 74)
    assert partition._one_value_buckets(qi("date"), 0.0, 10.0, 11)
    assert not partition._one_value_buckets(qi("int4"), 17.0, 90.0, 37)        # halved: two values a bucket
    assert not partition._one_value_buckets(qi("float8"), 0.0, 255.0, 256)     # 256 buckets of floats
    assert partition._one_value_buckets(qi("float8"), 2.5, 2.5, 256)           # one value
    assert not partition._one_value_buckets(qi("int8"), 0.0, float("inf"), 256)


def test_parts_written_keeps_keys_only_when_they_fit():
    """The tally drops its keys (the check then reads them in SQL) for a key that is no integer
    array, or a part with more rows than the split announced; it keeps every class's rows."""
    P = sabre_plpy("stages.publish")
    kept = P.PartsWritten(5, 10)
    kept.add([2, 1], np.array([4, 5, 6]))
    kept.add([2], np.array([1, 2]))
    assert kept.written_keys().tolist() == [4, 5, 6, 1, 2] and kept.class_sizes().tolist() == [2, 1, 2]
    short = P.PartsWritten(5, 10)
    short.add([3], np.array([1, 2, 3]))
    assert short.written_keys() is None                 # (two rows the split counted never came)
    over = P.PartsWritten(2, 10)
    over.add([3], np.array([1, 2, 3]))
    assert over.written_keys() is None and over.class_sizes().tolist() == [3]
    text = P.PartsWritten(2, 10)
    text.add([2], None)
    assert text.written_keys() is None
    big = P.PartsWritten(20, 10)
    big.add([2], np.array([1, 2]))
    assert big.written_keys() is None
