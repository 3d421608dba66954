"""Census-like synthetic data in numpy (client side, no database): for core tests and the
core benchmark.  Its columns, value domains and hierarchies are the census domain's
(:mod:`sabre_pg.census`, shaped like the SABRE paper's Table 5: 7 QIs, age 79 values, sex 2,
education 17, marital 6/h2, race 9/h1, workclass 10/h3, birthplace 83/h2, and the numerical
SA salary with 50 values); only the distributions are its own, simpler than the SQL
generator's: salary depends on age, education, workclass and sex.
"""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from . import census as domain
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


def census_hierarchies() -> dict[str, Hierarchy]:
    """The census domain's hierarchies, by categorical column."""
    return {column: domain.census_hierarchy(column) for column in domain.CENSUS_CATEGORICAL}


def _cycle_domain(values: np.ndarray, first: int, last: int) -> None:
    """Make the first rows take every value of [first, last] once, so every value occurs."""
    count = min(len(values), last - first + 1)
    values[:count] = np.arange(first, first + count)


def census(n: int, seed: int = 0):
    """Return (qis, sa_codes, sa_domain) for n census-like tuples, QIs in ``CENSUS_QIS`` order.

    Categorical QIs are leaf positions of their census hierarchy (the index of the value in
    ``census.census_values``, which is the hierarchy's pre-order)."""
    rng = np.random.default_rng(seed)
    age = np.clip(np.rint(rng.normal(40, 14, n)), domain.AGE_MIN, domain.AGE_MAX)
    _cycle_domain(age, domain.AGE_MIN, domain.AGE_MAX)
    sex = rng.integers(0, len(domain.SEX), n)                       # 0 = Male
    education = np.clip(np.rint(rng.normal(9 + (age - 40) * 0.02, 3, n)), domain.EDU_MIN, domain.EDU_MAX)
    _cycle_domain(education, domain.EDU_MIN, domain.EDU_MAX)
    life_stage = np.where(age < 30, 0, np.where(age < 60, 1, 2))
    marital = np.clip(life_stage * 2 + rng.integers(0, 2, n) + (rng.random(n) < 0.1),
                      0, len(domain.MARITAL) - 1).astype(np.int64)
    race = np.minimum(rng.geometric(0.5, n) - 1, len(domain.RACE) - 1)
    workclass = rng.integers(0, len(domain.WORKCLASS), n)
    birthplace = np.minimum(rng.geometric(0.08, n) - 1, len(domain.BIRTHPLACE) - 1)
    _cycle_domain(birthplace, 0, len(domain.BIRTHPLACE) - 1)
    score = (0.35 * (education - 9) / 3 + 0.3 * np.minimum(age - 17, 40) / 14
             + 0.2 * (workclass % 4) / 2 + 0.25 * (sex == 0) + rng.normal(0, 1, n))
    salary = np.clip(np.rint(18 + 8 * score), domain.SALARY_MIN, domain.SALARY_MAX).astype(np.int64)
    _cycle_domain(salary, domain.SALARY_MIN, domain.SALARY_MAX)
    values = {"age": age, "sex": sex, "education": education, "marital": marital, "race": race,
              "workclass": workclass, "birthplace": birthplace}
    hierarchies = census_hierarchies()
    qis = [QuasiIdentifier(column, values[column].astype(np.int64), hierarchies[column])
           if column in hierarchies else QuasiIdentifier(column, values[column].astype(np.float64))
           for column in domain.CENSUS_QIS]
    codes, distinct = encode_numerical(salary)
    return qis, codes, SADomain("numerical", m=len(distinct))


def adult(directory: Path):
    """(qis, sa_codes, sa_domain) of the ARX Adult data in ``directory`` (``adult.csv`` and its
    ``adult_hierarchy_<column>.csv``): occupation as hierarchical SA, the other 8 columns as
    QIs (age numerical, the rest with their hierarchies).  The benchmarks' and the core tests'
    Adult."""
    with open(directory / "adult.csv", newline="") as f:
        rows = list(csv.reader(f, delimiter=";"))
    head, rows = rows[0], rows[1:]
    cols = {h: [r[i] for r in rows] for i, h in enumerate(head)}

    def hierarchy(c):
        return Hierarchy.from_arx((directory / ("adult_hierarchy_%s.csv" % c)).read_text())

    qis = []
    for c in head:
        if c == "age":
            qis.append(QuasiIdentifier(c, np.array(cols[c], dtype=np.float64)))
        elif c != "occupation":
            h = hierarchy(c)
            qis.append(QuasiIdentifier(c, h.codes(cols[c]), h))
    h = hierarchy("occupation")
    return qis, h.codes(cols["occupation"]), SADomain("categorical", hierarchy=h)
