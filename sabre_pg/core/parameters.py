"""The privacy parameters t and k: the one check of each, shared by every core entry point
(and of the bucketization look-ahead).

* t, the closeness threshold (§3): every equivalence class must have EMD <= t to the table,
  so 0 < t <= 1 (EMD is at most 1 under the normalized ground distances).  NaN, infinities,
  booleans, strings and None are rejected.
* k, the minimum class size: an integer >= 1 (an integral float such as ``6.0`` is accepted);
  with the table's size n it must also satisfy k <= n, and n = 0 is rejected as an empty table.

Both raise ``ValueError`` whose message starts with ``"t must"`` / ``"k must"`` (or names the
table size), so the database layer can wrap them in its own SQLSTATE and HINT.
"""
from __future__ import annotations

import decimal
import numbers

T_RULE = "t must satisfy 0 < t <= 1"
K_RULE = "k must be an integer >= 1"
EMPTY_TABLE = "the table is empty"


def _real(x) -> float | None:
    """``float(x)`` for a real number (int, float, numpy scalar, Decimal), else None."""
    if isinstance(x, bool) or not isinstance(x, (numbers.Real, decimal.Decimal)):
        return None
    try:
        return float(x)
    except (ValueError, OverflowError):              # a signalling NaN, a huge int
        return None


def check_t(t) -> float:
    """t as a float if 0 < t <= 1, else ``ValueError("t must satisfy 0 < t <= 1, got ...")``."""
    value = _real(t)
    if value is None or not 0.0 < value <= 1.0:          # NaN fails both comparisons
        raise ValueError("%s, got %r" % (T_RULE, t))
    return value


def _integer(x) -> int | None:
    """``int(x)`` for an integer or an integral real number (``6.0``), else None."""
    if isinstance(x, numbers.Integral) and not isinstance(x, bool):
        return int(x)
    real = _real(x)
    return int(real) if real is not None and real.is_integer() else None    # NaN, inf: None


def check_k(k, n: int | None = None) -> int:
    """k as an int if it is an integer >= 1 (and, given the table size n, k <= n).

    Raises ``ValueError``: ``"k must be an integer >= 1, got ..."``; with n,
    ``"the table is empty"`` for n = 0 and ``"k = 7 exceeds the 5 tuples of the table"``.
    """
    value = _integer(k)
    if value is None or value < 1:
        raise ValueError("%s, got %r" % (K_RULE, k))
    if n is not None:
        n = int(n)
        if n == 0:
            raise ValueError(EMPTY_TABLE)
        if value > n:
            raise ValueError("k = %d exceeds the %d tuples of the table" % (value, n))
    return value


def check_lookahead(lookahead) -> int:
    """The bucketization look-ahead (``sabre.plan_from_counts``) as an int >= 0."""
    value = _integer(lookahead)
    if value is None or value < 0:
        raise ValueError("lookahead must be an integer >= 0, got %r" % (lookahead,))
    return value
