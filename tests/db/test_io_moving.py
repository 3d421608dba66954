"""Moving rows (issue 26): the label lookup of ``<output>_classes`` and the side table's index
build keep what a run publishes unchanged.

- A categorical QI's labels are looked up in a ``name[]`` (O(1) subscript) when every label fits a
  ``name``, else in a ``text[]``/join: both give the full label, and the label columns keep the
  default collation (a ``name`` is "C").
- The side table's btree for 'ak' is built with a transaction-local in-memory sort: it exists,
  and the caller's settings are what they were after the call.
"""
from __future__ import annotations

from psycopg import sql

from tests.db.helpers import anonymize, scalar

LONG = "a label far longer than a name's sixty-three bytes, with ünïcödé " * 2


def _table(conn, labels):
    """1,200 rows: an integer QI, a categorical QI taking the given ``labels``, a numerical SA."""
    conn.execute("CREATE TABLE public.lab (id int PRIMARY KEY, age int, place text, sa int)")
    conn.execute("INSERT INTO public.lab SELECT i, 18 + i %% 50, (%s::text[])[1 + i %% %s], i %% 7 "
                 "FROM generate_series(1, 1200) AS i", (labels, len(labels)))
    conn.execute("SELECT sabre_define_hierarchy('lab_place', %s)",
                 ("\n".join("%s;%s;*" % (v, "group %d" % (j % 2)) for j, v in enumerate(labels)),))


def _label_columns(conn, relation):
    """{column: collation name} of the text columns of ``relation``."""
    return dict(conn.execute(
        "SELECT a.attname, c.collname FROM pg_attribute a JOIN pg_collation c ON c.oid = a.attcollation "
        "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped", (relation,)).fetchall())


def _run(conn, labels, output):
    _table(conn, labels)
    anonymize(conn, "public.lab", ["age", "place"], "sa", 0.4, 5, "ak", output,
              {"hierarchies": {"place": "lab_place"}, "seed": 3})
    got = {r[0] for r in conn.execute(sql.SQL("SELECT DISTINCT place FROM {}").format(
        sql.Identifier("public", output + "_classes")))}
    return got


def test_short_labels_whole_and_default_collation(pg_conn):
    labels = ["place %d" % i for i in range(12)]
    got = _run(pg_conn, labels, "lab_short")
    assert got & set(labels) and got <= set(labels) | {"group 0", "group 1", "*"}
    # every leaf label of a class of one place is a source value, compared whole
    leaves = scalar(pg_conn, "SELECT count(*) FROM public.lab_short_classes c WHERE c.place LIKE 'place %%' "
                             "AND NOT EXISTS (SELECT 1 FROM public.lab s WHERE s.place = c.place)")
    assert leaves == 0
    assert _label_columns(pg_conn, "public.lab_short_classes")["place"] == "default"
    assert _label_columns(pg_conn, "public.lab_short")["place"] == "default"


def test_long_labels_whole(pg_conn):
    labels = ["%s %d" % (LONG, i) for i in range(12)]
    got = _run(pg_conn, labels, "lab_long")
    assert got & set(labels) and got <= set(labels) | {"group 0", "group 1", "*"}
    assert _label_columns(pg_conn, "public.lab_long_classes")["place"] == "default"


def test_ak_index_and_settings_restored(pg_conn):
    with pg_conn.transaction():         # (a setting left by the run would show before the commit)
        pg_conn.execute("SET LOCAL maintenance_work_mem = '1MB'")
        pg_conn.execute("SET LOCAL max_parallel_maintenance_workers = 1")
        _run(pg_conn, ["place %d" % i for i in range(6)], "lab_ak")
        assert scalar(pg_conn, "SELECT current_setting('maintenance_work_mem')") == "1MB"
        assert scalar(pg_conn, "SELECT current_setting('max_parallel_maintenance_workers')") == "1"
    assert scalar(pg_conn, "SELECT pg_get_indexdef('public.lab_ak_keys_idx'::regclass)").endswith(
        "(bucket, hilbert_key)")
