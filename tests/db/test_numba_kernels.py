"""The compiled loops of the cut search in the server (``sabre_pg.core.kernels``, issue 26): the
backend reports which path it runs, the compiled path makes the same classes as the numpy
path, and its cache is the data directory's private ``sabre_numba_cache``.

Tables below ``kernels.MIN_ROWS`` rows always take the numpy path; this test lowers the
threshold inside its backend (a DO block after a sabre call, which installed the module
loader) so a small table takes the compiled one."""
from __future__ import annotations

import json
import os

import pytest

from sabre_pg.datasets import CENSUS_QIS
from tests.db.helpers import anonymize, make_census, scalar


def backend_kernels(conn, min_rows: int | None = None) -> dict:
    """``kernels.status()`` in this connection's backend (``kernels.MIN_ROWS`` set first)."""
    notices = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary))
    set_rows = "" if min_rows is None else "kernels.MIN_ROWS = %d" % min_rows
    conn.execute("DO $$\nimport json\nfrom sabre_pg.core import kernels\n%s\n"
                 "plpy.notice('kernels ' + json.dumps(kernels.status()))\n$$ LANGUAGE plpython3u" % set_rows)
    return json.loads([n for n in notices if n.startswith("kernels ")][-1][len("kernels "):])


def classes(conn, output) -> list:
    return [r[0] for r in conn.execute("SELECT ec_id FROM %s ORDER BY id" % output).fetchall()]


def test_server_kernels_same_classes_private_cache(pg_conn):
    options = {"hierarchies": make_census(pg_conn, rows=5000), "key": "id", "keep": ["id"]}
    anonymize(pg_conn, "public.census", CENSUS_QIS, "salary", 0.35, 6, "refine", "public.out_numpy", options)
    before = backend_kernels(pg_conn)
    status = backend_kernels(pg_conn, min_rows=0)
    print("kernels in the server:", json.dumps(status))       # the suite says which path ran
    if not status["compiled"]:
        assert "numba" in status["error"]       # a server without numba: the numpy path, said why
        pytest.skip("the server's Python has no numba: %s" % status["error"])
    assert before["min_rows"] > 5000            # the first run was on the numpy path
    anonymize(pg_conn, "public.census", CENSUS_QIS, "salary", 0.35, 6, "refine", "public.out_compiled", options)
    assert classes(pg_conn, "public.out_compiled") == classes(pg_conn, "public.out_numpy")
    data = scalar(pg_conn, "SHOW data_directory")
    cache = os.path.join(data, "sabre_numba_cache")
    assert status["cache_dir"] == cache
    st = os.stat(cache)
    assert st.st_mode & 0o777 == 0o700 and st.st_uid == os.stat(data).st_uid
    assert any(name.endswith(".nbi") for _, _, files in os.walk(cache) for name in files)
