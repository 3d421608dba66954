"""sabre_define_hierarchy and sabre_drop_hierarchy (docs/hierarchies.md): what they return and
store, a dropped hierarchy named by a later run, and a redefined hierarchy replacing the old
one in the catalog and in the next run's labels."""
from __future__ import annotations

from tests.db.helpers import anonymize, check_exact_generalization, expect_error, scalar

# two hierarchies over the same leaves a..d: V1 groups {a, b} and {c, d}, V2 {a, c} and {b, d}
# (plus a leaf e), so a class of neighbouring leaves gets a label of its own hierarchy only
TAG_V1 = "a;AB;*\nb;AB;*\nc;CD;*\nd;CD;*"
TAG_V2 = "a;AC;*\nc;AC;*\nb;BD;*\nd;BD;*\ne;E;*"


def define(conn, name, csv):
    return conn.execute("SELECT * FROM sabre_define_hierarchy(%s, %s)", (name, csv)).fetchone()


def drop(conn, name):
    return scalar(conn, "SELECT sabre_drop_hierarchy(%s)", (name,))


def stored(conn, name):
    """(hierarchies row, [paths in pre-order]) of a stored hierarchy."""
    row = conn.execute("SELECT name, height, leaves, root FROM sabre.hierarchies WHERE name = %s",
                       (name,)).fetchone()
    paths = [r[0] for r in conn.execute(
        "SELECT path FROM sabre.hierarchy_rows WHERE hierarchy = %s ORDER BY ord", (name,))]
    return row, paths


def make_tags(conn):
    """public.tags: a categorical QI over the leaves a..d, a numerical SA."""
    conn.execute("CREATE TABLE tags AS SELECT i AS id, (ARRAY['a','b','c','d'])[1 + i % 4] AS tag, "
                 "1 + abs(hashint4(i)) % 20 AS salary FROM generate_series(1, 2000) i; "
                 "ALTER TABLE tags ADD PRIMARY KEY (id)")


def tag_labels(conn, output):
    return {r[0] for r in conn.execute("SELECT DISTINCT tag FROM %s_classes" % output)}


def test_define_returns_its_shape_and_drop_removes_it(pg_conn):
    assert define(pg_conn, "tag_h", TAG_V1) == ("tag_h", 4, 2)
    assert define(pg_conn, "other_h", "x;*\ny;*") == ("other_h", 2, 1)
    assert stored(pg_conn, "tag_h") == (("tag_h", 2, 4, "*"), [["a", "AB", "*"], ["b", "AB", "*"],
                                                                ["c", "CD", "*"], ["d", "CD", "*"]])
    other = stored(pg_conn, "other_h")
    assert drop(pg_conn, "tag_h") is True
    assert stored(pg_conn, "tag_h") == (None, [])
    assert stored(pg_conn, "other_h") == other                       # only the named one goes
    assert drop(pg_conn, "tag_h") is False                           # already dropped
    assert drop(pg_conn, "never_defined_h") is False
    assert stored(pg_conn, "other_h") == other


def test_a_dropped_hierarchy_is_an_undefined_object(pg_conn):
    """A run (or sabre_verify) naming a hierarchy that was dropped fails with 42704, names the
    hierarchy, has a HINT and changes nothing (expect_error)."""
    make_tags(pg_conn)
    define(pg_conn, "tag_h", TAG_V1)
    opts = {"hierarchies": {"tag": "tag_h"}}
    anonymize(pg_conn, "public.tags", ["tag"], "salary", 0.5, 4, "ak", "public.tags_out", opts)
    assert drop(pg_conn, "tag_h") is True
    expect_error(pg_conn, lambda c: anonymize(c, "public.tags", ["tag"], "salary", 0.5, 4, "ak",
                                              "public.tags_out", opts), "42704", "tag_h", source="tags")
    expect_error(pg_conn, lambda c: c.execute("SELECT * FROM sabre_verify('public.tags_out', 'tag', 0.5, 1, "
                                              "'tag_h')"), "42704", "tag_h", source="tags")


def test_a_redefined_hierarchy_replaces_the_old_one(pg_conn):
    """Defining an existing name replaces its rows; the next run generalizes with the new
    hierarchy only (its labels, its lowest common ancestors)."""
    make_tags(pg_conn)
    opts = {"hierarchies": {"tag": "tag_h"}}
    define(pg_conn, "tag_h", TAG_V1)
    anonymize(pg_conn, "public.tags", ["tag"], "salary", 0.5, 4, "ak", "public.v1_out", opts)
    check_exact_generalization(pg_conn, "public.v1_out", "public.tags", hierarchies=opts["hierarchies"])
    assert tag_labels(pg_conn, "v1_out") & {"AB", "CD"}

    assert define(pg_conn, "tag_h", TAG_V2) == ("tag_h", 5, 2)
    assert stored(pg_conn, "tag_h") == (("tag_h", 2, 5, "*"), [
        ["a", "AC", "*"], ["c", "AC", "*"], ["b", "BD", "*"], ["d", "BD", "*"], ["e", "E", "*"]])
    assert scalar(pg_conn, "SELECT count(*) FROM sabre.hierarchies WHERE name = 'tag_h'") == 1
    anonymize(pg_conn, "public.tags", ["tag"], "salary", 0.5, 4, "ak", "public.v2_out", opts)
    mixed = check_exact_generalization(pg_conn, "public.v2_out", "public.tags", hierarchies=opts["hierarchies"])
    labels = tag_labels(pg_conn, "v2_out")
    assert mixed["tag"] > 0 and labels & {"AC", "BD"} and not labels & {"AB", "CD"}, labels
