#!/usr/bin/env python3
"""Ways to move N integers from numpy in PL/Python into SQL rows, in one backend (issue 26).

Each way is timed in the backend's CPU seconds (``time.process_time`` inside a ``DO`` block:
far less sensitive to the machine's load than wall time), best of ``--repeat``, as the
statement ``SELECT sum(x) FROM <the N values as rows>`` including the Python preparation:

- ``list int8[]`` / ``list int4[]``: ``a.tolist()`` as an array parameter (what sabre does);
- ``bytea varbit``: ``a.astype('>i8').tobytes()`` as a ``bytea``, one ``varbit`` of it,
  ``substring(..., 64)::bit(64)::int8`` per row;
- ``bytea substring+hex``: the ``bytea``, ``('x' || encode(substring(b, 8i+1, 8), 'hex'))::bit(64)::int8``;
- ``text string_to_table``: ``','.join(map(str, a.tolist()))``, ``string_to_table(...)::int8``;
- ``text array literal``: ``'{...}'`` cast ``$1::text::int8[]`` (``--literal``; slow);
- the floor: ``generate_series`` of N rows.

Values: ``big`` (uniform below 2^62, like Hilbert keys) and ``small`` (below 2^17, like
class ids).  Needs a superuser (``DO ... LANGUAGE plpython3u``).

    python benchmarks/bench_transfer.py [--dsn CONNINFO] [--n 1000000] [--repeat 3] [--literal]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_DIR))

import psycopg  # noqa: E402

from sabre_pg.connect import resolve_dsn  # noqa: E402

BODY = r'''
import time
import numpy as np
N, REPEAT, LITERAL = %(n)d, %(repeat)d, %(literal)r
rng = np.random.default_rng(1)
SUM = "SELECT pg_catalog.sum(x) AS s FROM (SELECT pg_catalog.unnest(%%s) AS x) AS u"
VARBIT = ("SELECT pg_catalog.sum(pg_catalog.substring(b.v, i * 64 + 1, 64)::bit(64)::int8) AS s FROM "
          "(SELECT ('x' || pg_catalog.encode($1, 'hex'))::varbit AS v) AS b, pg_catalog.generate_series(0, %%d) AS i" %% (N - 1))
HEX = ("SELECT pg_catalog.sum(('x' || pg_catalog.encode(pg_catalog.substring($1, i * 8 + 1, 8), 'hex'))::bit(64)::int8) "
       "AS s FROM pg_catalog.generate_series(0, %%d) AS i" %% (N - 1))


def timed(name, sql, types, params):
    best = None
    for _ in range(REPEAT):
        t0 = time.process_time()
        plpy.execute(plpy.prepare(sql, types), params())
        dt = time.process_time() - t0
        best = dt if best is None else min(best, dt)
    plpy.notice("%%-34s %%.3f s" %% (name, best))


for label, a in (("big", rng.integers(0, 1 << 62, N)), ("small", rng.integers(0, 1 << 17, N))):
    timed(label + " list int8[]", SUM %% "$1::int8[]", ["int8[]"], lambda: [a.tolist()])
    if label == "small":
        timed(label + " list int4[]", SUM %% "$1::int4[]", ["int4[]"], lambda: [a.tolist()])
    timed(label + " bytea varbit", VARBIT, ["bytea"], lambda: [a.astype(">i8").tobytes()])
    timed(label + " bytea substring+hex", HEX, ["bytea"], lambda: [a.astype(">i8").tobytes()])
    timed(label + " text string_to_table", "SELECT pg_catalog.sum(x::int8) AS s FROM pg_catalog.string_to_table($1, ',') AS x",
          ["text"], lambda: [",".join(map(str, a.tolist()))])
    if LITERAL:
        timed(label + " text array literal", SUM %% "$1::text::int8[]", ["text"],
              lambda: ["{" + ",".join(map(str, a.tolist())) + "}"])
    timed(label + " floor (generate_series)", "SELECT pg_catalog.sum(i) AS s FROM pg_catalog.generate_series(0, %%d) AS i" %% (N - 1),
          [], lambda: [])
'''


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", help="conninfo or URL (default: $DATABASE_URL, PG*, else the embedded cluster)")
    parser.add_argument("--n", type=int, default=1_000_000, help="values per way (default 1000000)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per way; the best is shown (default 3)")
    parser.add_argument("--literal", action="store_true", help="also the text array literal (slow)")
    options = parser.parse_args(argv)
    dsn = resolve_dsn(argparse.Namespace(dsn=options.dsn, sabre_schema="sabre"))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.add_notice_handler(lambda d: print(d.message_primary, flush=True))
        print("backend CPU seconds per %d values (best of %d)" % (options.n, options.repeat), flush=True)
        conn.execute("DO $bench$" + BODY % {"n": options.n, "repeat": options.repeat, "literal": options.literal}
                     + "$bench$ LANGUAGE plpython3u")
    return 0


if __name__ == "__main__":
    sys.exit(main())
