"""Unit tests for the data sets (census domain, SQL generator, ARX loader) that need no database."""
from __future__ import annotations

import pytest

from sabre_pg import arx, census_sql
from sabre_pg import datasets as ds
from sabre_pg.core.hierarchy import HierarchyError

# column -> (number of leaves, height)
EXPECTED = {
    "sex": (2, 1),
    "marital": (6, 2),
    "race": (9, 1),
    "workclass": (10, 3),
    "birthplace": (83, 2),
}


def _rows(text: str) -> list[list[str]]:
    assert text.endswith("\n")
    return [line.split(";") for line in text.splitlines()]


@pytest.mark.parametrize("column", sorted(EXPECTED))
def test_census_hierarchy_shape(column):
    leaves, height = EXPECTED[column]
    rows = _rows(ds.census_hierarchy_csv(column))
    assert len(rows) == leaves
    assert {len(r) for r in rows} == {height + 1}, "every row must have the same length"
    assert ds.census_hierarchy_height(column) == height
    assert {r[-1] for r in rows} == {"*"}, "single root '*'"
    assert len({r[0] for r in rows}) == leaves, "leaves must be unique"
    assert all(label and label.strip() == label for r in rows for label in r)
    assert [r[0] for r in rows] == ds.census_values(column)


@pytest.mark.parametrize("column", sorted(EXPECTED))
def test_census_hierarchy_is_a_tree(column):
    """Every node has exactly one parent (identified by level and label)."""
    parent = {}
    for r in _rows(ds.census_hierarchy_csv(column)):
        for level in range(len(r) - 1):
            key = (level, r[level])
            assert parent.setdefault(key, r[level + 1]) == r[level + 1], (column, r)


def test_census_hierarchy_levels_group_values():
    marital = _rows(ds.census_hierarchy_csv("marital"))
    assert 2 <= len({r[1] for r in marital}) <= 3
    birth = _rows(ds.census_hierarchy_csv("birthplace"))
    regions = {r[1] for r in birth}
    assert 5 <= len(regions) < 83
    assert ["United-States", "North-America", "*"] in birth
    work = _rows(ds.census_hierarchy_csv("workclass"))
    assert len({r[1] for r in work}) > len({r[2] for r in work}) > 1


def test_census_hierarchy_delimiter():
    assert ds.census_hierarchy_csv("sex", delimiter=",") == "Male,*\nFemale,*\n"


def test_census_hierarchy_unknown_column():
    with pytest.raises(ValueError, match="age"):
        ds.census_hierarchy_csv("age")  # numerical: no hierarchy
    with pytest.raises(ValueError):
        ds.census_hierarchy_csv("nope")


def test_census_domains():
    assert ds.census_values("age") == list(range(17, 96))
    assert len(ds.census_values("age")) == 79
    assert ds.census_values("education") == list(range(1, 18))
    assert ds.census_values("salary") == list(range(1, 51))
    assert [c for c, _, _ in ds.CENSUS_COLUMNS] == [
        "age", "sex", "education", "marital", "race", "workclass", "birthplace", "salary"]


def test_census_column_lists_come_from_the_columns():
    assert ds.CENSUS_QIS == ["age", "sex", "education", "marital", "race", "workclass", "birthplace"]
    assert ds.CENSUS_CATEGORICAL == ["sex", "marital", "race", "workclass", "birthplace"]
    assert ds.CENSUS_NUMERICAL == ["age", "education"]
    assert ds.CENSUS_SENSITIVE == "salary"


@pytest.mark.parametrize("column", sorted(EXPECTED))
def test_census_hierarchy_object_keeps_the_domain_order(column):
    """The core Hierarchy's pre-order leaves are the domain order, so a value's index in
    ``census_values`` is its leaf position (the numpy generator relies on it)."""
    hierarchy = ds.census_hierarchy(column)
    assert hierarchy.leaves == ds.census_values(column)
    assert hierarchy.to_arx() == ds.census_hierarchy_csv(column)


def test_census_sql_uses_the_domain_and_the_seed():
    """The generator's statement: one stream per uniform, seeded by ``seed * 1000 + j``, and
    every census value spelled in it."""
    from psycopg import sql

    text = census_sql.census_sql(sql.Identifier("s", "t"), 500, 7).as_string(None)
    assert text.lstrip().startswith('CREATE TABLE "s"."t" AS')
    for name, stream in census_sql.STREAMS.items():
        assert "hashint8extended(i, %d)" % (7000 + stream) in text, name
    assert "generate_series(1::bigint, 500::bigint)" in text
    for column in ds.CENSUS_CATEGORICAL:
        for value in ds.census_values(column):
            assert "'%s'" % value in text, (column, value)


def test_census_rejects_bad_arguments():
    # argument checks happen before the connection is touched
    with pytest.raises(ValueError):
        ds.generate_census(None, rows=0)
    with pytest.raises(ValueError):
        ds.generate_census(None, rows="many")
    with pytest.raises(ValueError):
        ds.generate_census(None, seed=-1)
    with pytest.raises(ValueError):
        ds.generate_census(None, rows=1.5)


# ---- ARX loader: everything that fails before the database is used ----------

def test_infer_type():
    assert arx.infer_type(["1", "22", "-3"]) == "integer"
    assert arx.infer_type(["1", "", "3"]) == "integer"
    assert arx.infer_type(["1", "2.5"]) == "numeric"
    assert arx.infer_type(["1e3", "2"]) == "numeric"
    assert arx.infer_type(["1", "x"]) == "text"
    assert arx.infer_type(["01234", "47677"]) == "text", "leading zeros (ZIP codes) stay text"
    assert arx.infer_type(["9999999999"]) == "bigint"
    assert arx.infer_type(["NaN"]) == "text"
    assert arx.infer_type(["", ""]) == "text"


def test_load_missing_file(tmp_path):
    with pytest.raises(ValueError, match="not found"):
        ds.load_arx(None, tmp_path / "nope.csv")


def test_load_missing_hierarchy_dir(tmp_path):
    f = tmp_path / "d.csv"
    f.write_text("a;b\n1;2\n")
    with pytest.raises(ValueError, match="hierarchy directory not found"):
        ds.load_arx(None, f, hierarchy_dir=tmp_path / "nope")


@pytest.mark.parametrize("content,message", [
    (b"a;b;c\n1;2;3\n4;5\n7;8;9\n", r"line 3 has 2 fields, expected 3"),
    (b"a;b\r\n1;2\r\n3;4\r\n5;6;7\r\n", r"line 4 has 3 fields"),
    (b"", "header missing"),
    (b"1;2;3\n4;5;6\n", "header missing"),
    (b"a;;c\n1;2;3\n", "empty column name"),
    (b"a;b;a\n1;2;3\n", "duplicate column"),
])
def test_load_rejects_a_malformed_csv(tmp_path, content, message):
    """Ragged rows (naming the line, CRLF too), an empty file, no header, an empty or a
    repeated column name: all refused before the database is used."""
    f = tmp_path / "d.csv"
    f.write_bytes(content)
    with pytest.raises(ValueError, match=message):
        ds.load_arx(None, f)


def test_load_ragged_hierarchy(tmp_path):
    (tmp_path / "d.csv").write_text("a;b\nx;1\ny;2\n")
    (tmp_path / "d_hierarchy_a.csv").write_text("x;g;*\ny;*\n")
    with pytest.raises(HierarchyError, match=r"d_hierarchy_a.csv': row 2 has 2 fields, row 1 has 3"):
        ds.load_arx(None, tmp_path / "d.csv")


@pytest.mark.parametrize("text,message", [
    ("x;g;*\ny;g;top\n", "two roots"),
    ("x;g;*\nx;h;*\n", "leaf 'x' appears twice"),
    ("x;g;*\ny;h;*\nz;g;*\nw;;*\n", "empty label"),
    ("x;g;a;*\ny;g;b;*\n", "node 'g' has two parents"),
    ("\n\n", "no rows"),
])
def test_load_checks_hierarchies_by_the_core_rules(tmp_path, text, message):
    """The loader rejects what sabre_define_hierarchy would, before the database is used."""
    (tmp_path / "d.csv").write_text("a;b\nx;1\n")
    (tmp_path / "d_hierarchy_a.csv").write_text(text)
    with pytest.raises(HierarchyError, match=message):
        ds.load_arx(None, tmp_path / "d.csv")


def test_load_hierarchy_for_unknown_column(tmp_path):
    (tmp_path / "d.csv").write_text("a;b\nx;1\n")
    (tmp_path / "d_hierarchy_zz.csv").write_text("x;*\n")
    with pytest.raises(ValueError, match="unknown column"):
        ds.load_arx(None, tmp_path / "d.csv")


def test_find_hierarchies_by_prefix(tmp_path):
    (tmp_path / "d.csv").write_text("a;b-c\n")
    (tmp_path / "d_hierarchy_a.csv").write_text("x;*\n")
    (tmp_path / "d_hierarchy_b-c.csv").write_text("x;*\n")
    (tmp_path / "other_hierarchy_a.csv").write_text("x;*\n")
    found = arx.find_hierarchies(tmp_path / "d.csv", tmp_path, ["a", "b-c"])
    assert {c: p.name for c, p in found.items()} == {
        "a": "d_hierarchy_a.csv", "b-c": "d_hierarchy_b-c.csv"}


def test_read_hierarchy_crlf(tmp_path):
    p = tmp_path / "h.csv"
    p.write_bytes(b"\xef\xbb\xbfx;g;*\r\ny;g;*\r\n\r\n")
    assert arx.read_hierarchy(p, ";") == "x;g;*\ny;g;*\n"
