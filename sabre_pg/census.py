"""The census domain: columns, value domains and generalization hierarchies.

The one definition of the CENSUS-like data set of the SABRE paper (Cao, Karras, Kalnis,
Tan, VLDB J. 2011, Table 5) that every generator and every consumer uses: the SQL
generator (:mod:`sabre_pg.census_sql`), the numpy generator (:mod:`sabre_pg.synthetic`),
``sabre-pg demo``, ``sabre-pg bench`` and ``benchmarks/``.  No database, no numpy.

* ``CENSUS_COLUMNS``: (column, SQL type, kind) in table order; ``CENSUS_QIS``,
  ``CENSUS_CATEGORICAL``, ``CENSUS_NUMERICAL`` and ``CENSUS_SENSITIVE`` are derived from it.
* value domains with their generating weights (``AGE_BANDS``, ``SEX``, ``MARITAL`` ...);
* :func:`census_values`, :func:`census_hierarchy` (a core ``Hierarchy``),
  :func:`census_hierarchy_csv` (ARX text) and :func:`census_hierarchy_height`.
"""
from __future__ import annotations

from sabre_pg.core.hierarchy import Hierarchy

#: (column, SQL type, kind) in table order, after ``id``.
CENSUS_COLUMNS: list[tuple[str, str, str]] = [
    ("age", "integer", "numerical"),
    ("sex", "text", "categorical"),
    ("education", "integer", "numerical"),
    ("marital", "text", "categorical"),
    ("race", "text", "categorical"),
    ("workclass", "text", "categorical"),
    ("birthplace", "text", "categorical"),
    ("salary", "integer", "sensitive"),
]
#: The quasi-identifiers, in table order (the first q of them are "q QIs" in the bench).
CENSUS_QIS = [column for column, _, kind in CENSUS_COLUMNS if kind != "sensitive"]
CENSUS_CATEGORICAL = [column for column, _, kind in CENSUS_COLUMNS if kind == "categorical"]
CENSUS_NUMERICAL = [column for column, _, kind in CENSUS_COLUMNS if kind == "numerical"]
(CENSUS_SENSITIVE,) = [column for column, _, kind in CENSUS_COLUMNS if kind == "sensitive"]

# Hours worked per week: a second numerical SA (docs/multiple-sa.md), not a column of the
# generated table; ``hours_sql`` derives it from salary, age and the row key:
# BASE + PER_SALARY * salary + PER_AGE * max(age - 50, 0) + NOISE * (u1 + u2 - 1), rounded,
# within [HOURS_MIN, HOURS_MAX] (u1, u2 uniform in [0, 1) drawn from the key).
HOURS_MIN, HOURS_MAX = 1, 99
HOURS_BASE, HOURS_PER_SALARY, HOURS_PER_AGE, HOURS_NOISE = 30.0, 0.4, -0.4, 10.0
AGE_MIN, AGE_MAX = 17, 95          # 79 distinct ages
EDU_MIN, EDU_MAX = 1, 17           # 17 education levels (1 = none ... 17 = doctorate)
SALARY_MIN, SALARY_MAX = 1, 50     # 50 income brackets of 2 k$; 50 = top-coded (>= 98 k$)

# Age distribution: (first age, number of ages, weight); uniform inside a band.
AGE_BANDS = [
    (17, 8, 0.14),   # 17-24
    (25, 10, 0.19),  # 25-34
    (35, 10, 0.19),  # 35-44
    (45, 10, 0.18),  # 45-54
    (55, 10, 0.14),  # 55-64
    (65, 10, 0.09),  # 65-74
    (75, 10, 0.05),  # 75-84
    (85, 11, 0.02),  # 85-95
]

SEX = [("Male", 0.49), ("Female", 0.51)]

# Education 1..17 (ordinal): weights peak at high school (9) and bachelor (13).
EDUCATION_WEIGHTS = [0.005, 0.008, 0.012, 0.018, 0.022, 0.028, 0.035, 0.045, 0.30,
                0.19, 0.07, 0.045, 0.13, 0.045, 0.02, 0.005, 0.002]

# Marital status: leaf -> level-1 node (height 2: leaf;group;*).
MARITAL = [
    ("Never-married", "Single"),
    ("Married-civ-spouse", "Married"),
    ("Married-spouse-absent", "Married"),
    ("Divorced", "Previously-married"),
    ("Separated", "Previously-married"),
    ("Widowed", "Previously-married"),
]
# Marital weights per age band: (upper age bound exclusive, weights in MARITAL order).
MARITAL_BY_AGE = [
    (25, [0.850, 0.110, 0.020, 0.012, 0.006, 0.002]),
    (35, [0.450, 0.420, 0.030, 0.070, 0.025, 0.005]),
    (50, [0.150, 0.620, 0.030, 0.140, 0.040, 0.020]),
    (65, [0.070, 0.650, 0.020, 0.150, 0.030, 0.080]),
    (None, [0.040, 0.520, 0.020, 0.090, 0.010, 0.320]),
]

# Race (IPUMS general race codes), flat hierarchy (height 1: leaf;*).
RACE = [
    ("White", 0.780),
    ("Black", 0.110),
    ("American-Indian", 0.010),
    ("Chinese", 0.012),
    ("Japanese", 0.005),
    ("Other-Asian-Pacific", 0.030),
    ("Other-race", 0.040),
    ("Two-races", 0.012),
    ("Three-or-more-races", 0.001),
]

# Work class: (leaf, level 1, level 2, weight, log-income effect); height 3.
WORKCLASS = [
    ("Private-for-profit", "Private", "Wage-earner", 0.620, 0.00),
    ("Private-non-profit", "Private", "Wage-earner", 0.060, -0.05),
    ("Federal-gov", "Government", "Wage-earner", 0.030, 0.20),
    ("State-gov", "Government", "Wage-earner", 0.040, 0.05),
    ("Local-gov", "Government", "Wage-earner", 0.060, 0.00),
    ("Armed-forces", "Government", "Wage-earner", 0.005, -0.10),
    ("Self-emp-inc", "Self-employed", "Non-wage", 0.035, 0.40),
    ("Self-emp-not-inc", "Self-employed", "Non-wage", 0.070, -0.10),
    ("Without-pay", "Unpaid", "Non-wage", 0.005, -1.50),
    ("Never-worked", "Unpaid", "Non-wage", 0.070, -2.00),
]

# Birthplace: 83 countries under 10 regions (height 2: leaf;region;*).
BIRTHPLACE_REGIONS: list[tuple[str, list[str]]] = [
    ("North-America", ["United-States", "Canada"]),
    ("Central-America-Caribbean", [
        "Mexico", "Guatemala", "El-Salvador", "Honduras", "Nicaragua", "Costa-Rica",
        "Panama", "Cuba", "Jamaica", "Haiti", "Dominican-Republic", "Puerto-Rico",
        "Trinidad-and-Tobago"]),
    ("South-America", [
        "Colombia", "Venezuela", "Ecuador", "Peru", "Brazil", "Argentina", "Chile",
        "Bolivia", "Uruguay", "Guyana"]),
    ("Western-Europe", [
        "England", "Ireland", "Germany", "France", "Italy", "Spain", "Portugal",
        "Netherlands", "Belgium", "Switzerland", "Austria", "Sweden", "Norway",
        "Denmark", "Greece"]),
    ("Eastern-Europe", [
        "Poland", "Russia", "Ukraine", "Hungary", "Czech-Republic", "Yugoslavia",
        "Romania", "Lithuania", "Bulgaria"]),
    ("East-Asia", ["China", "Japan", "Korea", "Taiwan", "Hong-Kong", "Mongolia"]),
    ("South-Southeast-Asia", [
        "India", "Pakistan", "Bangladesh", "Sri-Lanka", "Philippines", "Vietnam",
        "Thailand", "Cambodia", "Laos", "Indonesia", "Malaysia"]),
    ("Middle-East-North-Africa", [
        "Iran", "Iraq", "Israel", "Lebanon", "Syria", "Turkey", "Egypt", "Morocco",
        "Jordan"]),
    ("Sub-Saharan-Africa", ["Nigeria", "Ethiopia", "Ghana", "Kenya", "South-Africa"]),
    ("Oceania", ["Australia", "New-Zealand", "Fiji"]),
]
BIRTHPLACE_WEIGHTS = {
    "United-States": 0.820, "Mexico": 0.040, "Canada": 0.008, "Philippines": 0.008,
    "Puerto-Rico": 0.006, "Germany": 0.006, "China": 0.005, "India": 0.005,
    "Cuba": 0.005, "England": 0.004, "Vietnam": 0.004, "Korea": 0.004,
    "El-Salvador": 0.004, "Italy": 0.003, "Japan": 0.003,
    "Dominican-Republic": 0.003, "Poland": 0.003, "Jamaica": 0.003,
}


def _birthplace() -> list[tuple[str, str, float]]:
    """(country, region, weight): the countries without a weight share what is left equally."""
    countries = [(country, region) for region, names in BIRTHPLACE_REGIONS for country in names]
    rest = [country for country, _ in countries if country not in BIRTHPLACE_WEIGHTS]
    rest_weight = (1.0 - sum(BIRTHPLACE_WEIGHTS.values())) / len(rest)
    return [(country, region, BIRTHPLACE_WEIGHTS.get(country, rest_weight))
            for country, region in countries]


BIRTHPLACE = _birthplace()

# Hierarchies: column -> list of rows [leaf, level1, ..., '*'].
HIERARCHY_ROWS: dict[str, list[list[str]]] = {
    "sex": [[v, "*"] for v, _ in SEX],
    "marital": [[leaf, grp, "*"] for leaf, grp in MARITAL],
    "race": [[v, "*"] for v, _ in RACE],
    "workclass": [[leaf, l1, l2, "*"] for leaf, l1, l2, _, _ in WORKCLASS],
    "birthplace": [[c, r, "*"] for c, r, _ in BIRTHPLACE],
}

assert len(EDUCATION_WEIGHTS) == EDU_MAX - EDU_MIN + 1
assert sum(n for _, n, _ in AGE_BANDS) == AGE_MAX - AGE_MIN + 1
assert len(BIRTHPLACE) == 83 and len({c for c, _, _ in BIRTHPLACE}) == 83


def census_values(column: str) -> list:
    """The full domain (all distinct values) of a census column, in domain order."""
    if column == "age":
        return list(range(AGE_MIN, AGE_MAX + 1))
    if column == "education":
        return list(range(EDU_MIN, EDU_MAX + 1))
    if column == "salary":
        return list(range(SALARY_MIN, SALARY_MAX + 1))
    if column in HIERARCHY_ROWS:
        return [row[0] for row in HIERARCHY_ROWS[column]]
    raise ValueError(f"unknown census column {column!r}; columns: "
                     + ", ".join(c for c, _, _ in CENSUS_COLUMNS))


def census_hierarchy_csv(column: str, delimiter: str = ";") -> str:
    """ARX-format hierarchy text for a categorical census column.

    One line per leaf: ``leaf;level1;...;*`` (all lines the same length),
    terminated by a newline.  Columns: sex (height 1), marital (2), race (1),
    workclass (3), birthplace (2).
    """
    if column not in HIERARCHY_ROWS:
        raise ValueError(f"no hierarchy for census column {column!r}; "
                         f"categorical columns: {', '.join(CENSUS_CATEGORICAL)}")
    return "".join(delimiter.join(row) + "\n" for row in HIERARCHY_ROWS[column])


def census_hierarchy_height(column: str) -> int:
    """Height of a census hierarchy (number of generalization steps leaf -> '*')."""
    return census_hierarchy(column).height


def census_hierarchy(column: str) -> Hierarchy:
    """The hierarchy of a categorical census column, validated by the core's rules; its
    leaves keep the domain order (``census_values``), which is already pre-order."""
    census_hierarchy_csv(column)  # validates the name
    return Hierarchy(HIERARCHY_ROWS[column], name=column)


def hours_sql(salary: str = "salary", age: str = "age", key: str = "id") -> str:
    """SQL expression of the census's hours worked (see ``HOURS_*``) from the columns
    ``salary``, ``age`` and an integer ``key`` (names already quoted as needed)."""
    uniform = "((pg_catalog.hashint8extended((%s)::int8, %d) & 9007199254740991)::float8 / 9007199254740992.0)"
    value = "%r + %r * %s + %r * GREATEST(%s - 50, 0) + %r * (%s + %s - 1)" % (
        HOURS_BASE, HOURS_PER_SALARY, salary, HOURS_PER_AGE, age, HOURS_NOISE,
        uniform % (key, 71), uniform % (key, 72))
    return "LEAST(GREATEST(pg_catalog.round(%s)::int, %d), %d)" % (value, HOURS_MIN, HOURS_MAX)
