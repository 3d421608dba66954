"""The candidates a HINT suggests (plpython/shared/common.py ``nearest``, ``nearest_text``): at most a
handful, the nearest names first."""
from __future__ import annotations

from tests.client.fake_plpy import sabre_plpy

C = sabre_plpy("shared.common")

HIERARCHIES = ["age_h", "bench_census_100000_sex", "bench_census_5000_sex", "census_birthplace", "census_education",
               "census_marital", "census_race", "census_sex", "census_workclass", "icd_h", "marital_h", "zip_h"]


def test_nearest_first_and_at_most_five():
    assert C.HINT_CANDIDATES == 5
    found = C.nearest("census_marial", HIERARCHIES)
    assert len(found) == 5 and found[0] == "census_marital"
    assert C.nearest("marital", HIERARCHIES, 2) == ["marital_h", "census_marital"]
    assert C.nearest("Age", ["sex", "age", "wage"])[0] == "age"          # case does not hide a near name


def test_ties_by_name_duplicates_once_and_cutoff():
    assert C.nearest("x", ["b", "a", "a"]) == ["a", "b"]                   # equally far: by name; once each
    assert C.nearest("knm", ["refine", "ak", "knn", "mondrian"], 1, cutoff=0.5) == ["knn"]
    assert C.nearest("zzzz", ["refine", "ak", "knn", "mondrian"], 1, cutoff=0.5) == []
    assert C.nearest(None, ["b", "a"]) == ["a", "b"]
    assert C.nearest("a", []) == []


def test_nearest_text():
    assert C.nearest_text("census_marial", HIERARCHIES).startswith("census_marital, ")
    assert C.nearest_text("census_marial", HIERARCHIES).endswith(" (5 of 12)")
    assert C.nearest_text("agge", {"age": 1, "sex": 2}) == "age, sex"     # a dict: its keys, all shown
    assert C.nearest_text("x", []) == "none"
