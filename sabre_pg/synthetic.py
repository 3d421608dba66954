"""Census-like synthetic data in numpy (client side, no database): for core tests and the
core benchmark.  Shaped like the SABRE paper's Table 5: 7 QIs (age 79 values, sex 2,
education 17, marital 6/h2, race 9/h1, workclass 10/h3, birthplace 83/h2) and a numerical
SA salary with 50 values that depends on age, education, workclass and sex.
"""
from __future__ import annotations

import numpy as np

from .core.emd import SADomain
from .core.hierarchy import Hierarchy
from .core.sabre import QuasiIdentifier, encode_numerical


def tree_hierarchy(n_leaves: int, fanouts: list[int], prefix: str, name: str | None = None) -> Hierarchy:
    """A balanced hierarchy of height len(fanouts)+1 over n_leaves leaves ``<prefix><i>``:
    level j groups consecutive level j-1 nodes ``fanouts[j-1]`` at a time."""
    rows = []
    for i in range(n_leaves):
        row = ["%s%d" % (prefix, i)]
        g = i
        for j, f in enumerate(fanouts):
            g //= f
            row.append("%s_L%d_%d" % (prefix, j + 1, g))
        row.append("*")
        rows.append(row)
    return Hierarchy(rows, name=name)


def census_hierarchies() -> dict:
    return {
        "sex": Hierarchy.flat(["M", "F"], name="sex"),
        "marital": tree_hierarchy(6, [3], "mar", "marital"),            # height 2
        "race": Hierarchy.flat(["race%d" % i for i in range(9)], name="race"),   # height 1
        "workclass": tree_hierarchy(10, [2, 3], "wc", "workclass"),     # height 3
        "birthplace": tree_hierarchy(83, [10], "bp", "birthplace"),     # height 2
    }


def census(n: int, seed: int = 0):
    """Return (qis, sa_codes, domain) for n census-like tuples."""
    rng = np.random.default_rng(seed)
    H = census_hierarchies()
    age = np.clip(np.rint(rng.normal(40, 14, n)), 17, 95)
    age[:79] = np.arange(17, 96)
    sex = rng.integers(0, 2, n)
    education = np.clip(np.rint(rng.normal(9 + (age - 40) * 0.02, 3, n)), 1, 17)
    education[:17] = np.arange(1, 18)
    mar_p = np.where(age < 30, 0, np.where(age < 60, 1, 2))
    marital = np.clip(mar_p * 2 + rng.integers(0, 2, n) + (rng.random(n) < 0.1), 0, 5).astype(np.int64)
    race = np.minimum(rng.geometric(0.5, n) - 1, 8)
    workclass = rng.integers(0, 10, n)
    birthplace = np.minimum(rng.geometric(0.08, n) - 1, 82)
    birthplace[:83] = np.arange(83)
    score = (0.35 * (education - 9) / 3 + 0.3 * np.minimum(age - 17, 40) / 14
             + 0.2 * (workclass % 4) / 2 + 0.25 * sex + rng.normal(0, 1, n))
    salary = np.clip(np.rint(18 + 8 * score), 1, 50).astype(np.int64)
    salary[:50] = np.arange(1, 51)
    qis = [
        QuasiIdentifier("age", age.astype(np.float64)),
        QuasiIdentifier("sex", sex.astype(np.int64), H["sex"]),
        QuasiIdentifier("education", education.astype(np.float64)),
        QuasiIdentifier("marital", marital, H["marital"]),
        QuasiIdentifier("race", race.astype(np.int64), H["race"]),
        QuasiIdentifier("workclass", workclass.astype(np.int64), H["workclass"]),
        QuasiIdentifier("birthplace", birthplace.astype(np.int64), H["birthplace"]),
    ]
    codes, distinct = encode_numerical(salary)
    return qis, codes, SADomain("numerical", m=len(distinct))
