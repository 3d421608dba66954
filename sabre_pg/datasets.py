"""Datasets for sabre-pg: a synthetic CENSUS-like generator and an ARX loader.

Two entry points work against a live PostgreSQL connection (psycopg 3):

* :func:`generate_census` builds a table shaped like the CENSUS data set of
  the SABRE paper (Cao, Karras, Kalnis, Tan, VLDB J. 2011, Table 5) entirely
  inside PostgreSQL with a single set-based ``CREATE TABLE ... AS SELECT``
  over ``generate_series``.  Per-row pseudo-random numbers come from
  ``hashint8extended(i, seed*1000 + j)``, so the output depends only on
  ``(rows, seed)``, never on ``random()`` or on the query plan.
* :func:`load_arx` loads an ARX-format data set (a ``;``-separated CSV with a
  header plus ``<prefix>_hierarchy_<column>.csv`` files) with ``COPY``.

Both register generalization hierarchies through the SQL function
``sabre.sabre_define_hierarchy(name text, csv text, delimiter text)``, and
return a dict whose ``"hierarchies"`` entry (``{column: hierarchy_name}``) has
exactly the shape ``options.hierarchies`` of ``sabre_anonymize`` takes.

:func:`census_hierarchy_csv` gives the census hierarchies as ARX text without
a database.  :func:`cli_gen` and :func:`cli_load` back the ``sabre-pg gen`` and
``sabre-pg load`` subcommands.
"""

from __future__ import annotations

import csv
import io
import re
import time
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from psycopg import sql

__all__ = [
    "CENSUS_COLUMNS",
    "CENSUS_CATEGORICAL",
    "CENSUS_NUMERICAL",
    "CENSUS_SENSITIVE",
    "census_values",
    "census_hierarchy_csv",
    "census_hierarchy_height",
    "generate_census",
    "load_arx",
    "define_hierarchy",
    "has_define_hierarchy",
    "cli_gen",
    "cli_load",
]

SABRE_SCHEMA = "sabre"
DEFINE_HIERARCHY_FN = "sabre_define_hierarchy"

# --------------------------------------------------------------------------
# CENSUS domain definitions (single source of truth for SQL and hierarchies)
# --------------------------------------------------------------------------

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
CENSUS_CATEGORICAL = ["sex", "marital", "race", "workclass", "birthplace"]
CENSUS_NUMERICAL = ["age", "education"]
CENSUS_SENSITIVE = "salary"

AGE_MIN, AGE_MAX = 17, 95          # 79 distinct ages
EDU_MIN, EDU_MAX = 1, 17           # 17 education levels (1 = none ... 17 = doctorate)
SALARY_MIN, SALARY_MAX = 1, 50     # 50 income brackets of 2 k$; 50 = top-coded (>= 98 k$)

# Age distribution: (first age, number of ages, weight); uniform inside a band.
_AGE_BANDS = [
    (17, 8, 0.14),   # 17-24
    (25, 10, 0.19),  # 25-34
    (35, 10, 0.19),  # 35-44
    (45, 10, 0.18),  # 45-54
    (55, 10, 0.14),  # 55-64
    (65, 10, 0.09),  # 65-74
    (75, 10, 0.05),  # 75-84
    (85, 11, 0.02),  # 85-95
]

_SEX = [("Male", 0.49), ("Female", 0.51)]

# Education 1..17 (ordinal): weights peak at high school (9) and bachelor (13).
_EDU_WEIGHTS = [0.005, 0.008, 0.012, 0.018, 0.022, 0.028, 0.035, 0.045, 0.30,
                0.19, 0.07, 0.045, 0.13, 0.045, 0.02, 0.005, 0.002]

# Marital status: leaf -> level-1 node (height 2: leaf;group;*).
_MARITAL = [
    ("Never-married", "Single"),
    ("Married-civ-spouse", "Married"),
    ("Married-spouse-absent", "Married"),
    ("Divorced", "Previously-married"),
    ("Separated", "Previously-married"),
    ("Widowed", "Previously-married"),
]
# Marital weights per age band: (upper age bound exclusive, weights in _MARITAL order).
_MARITAL_BY_AGE = [
    (25, [0.850, 0.110, 0.020, 0.012, 0.006, 0.002]),
    (35, [0.450, 0.420, 0.030, 0.070, 0.025, 0.005]),
    (50, [0.150, 0.620, 0.030, 0.140, 0.040, 0.020]),
    (65, [0.070, 0.650, 0.020, 0.150, 0.030, 0.080]),
    (None, [0.040, 0.520, 0.020, 0.090, 0.010, 0.320]),
]

# Race (IPUMS general race codes), flat hierarchy (height 1: leaf;*).
_RACE = [
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
_WORKCLASS = [
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
_BIRTHPLACE_REGIONS: list[tuple[str, list[str]]] = [
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
_BIRTHPLACE_WEIGHTS = {
    "United-States": 0.820, "Mexico": 0.040, "Canada": 0.008, "Philippines": 0.008,
    "Puerto-Rico": 0.006, "Germany": 0.006, "China": 0.005, "India": 0.005,
    "Cuba": 0.005, "England": 0.004, "Vietnam": 0.004, "Korea": 0.004,
    "El-Salvador": 0.004, "Italy": 0.003, "Japan": 0.003,
    "Dominican-Republic": 0.003, "Poland": 0.003, "Jamaica": 0.003,
}


def _birthplace() -> list[tuple[str, str, float]]:
    countries = [(c, region) for region, cs in _BIRTHPLACE_REGIONS for c in cs]
    rest = [c for c, _ in countries if c not in _BIRTHPLACE_WEIGHTS]
    rest_w = (1.0 - sum(_BIRTHPLACE_WEIGHTS.values())) / len(rest)
    return [(c, r, _BIRTHPLACE_WEIGHTS.get(c, rest_w)) for c, r in countries]


_BIRTHPLACE = _birthplace()

# Hierarchies: column -> list of rows [leaf, level1, ..., '*'].
_HIERARCHY_ROWS: dict[str, list[list[str]]] = {
    "sex": [[v, "*"] for v, _ in _SEX],
    "marital": [[leaf, grp, "*"] for leaf, grp in _MARITAL],
    "race": [[v, "*"] for v, _ in _RACE],
    "workclass": [[leaf, l1, l2, "*"] for leaf, l1, l2, _, _ in _WORKCLASS],
    "birthplace": [[c, r, "*"] for c, r, _ in _BIRTHPLACE],
}

assert len(_EDU_WEIGHTS) == EDU_MAX - EDU_MIN + 1
assert sum(n for _, n, _ in _AGE_BANDS) == AGE_MAX - AGE_MIN + 1
assert len(_BIRTHPLACE) == 83 and len({c for c, _, _ in _BIRTHPLACE}) == 83


def census_values(column: str) -> list:
    """The full domain (all distinct values) of a census column, in domain order."""
    if column == "age":
        return list(range(AGE_MIN, AGE_MAX + 1))
    if column == "education":
        return list(range(EDU_MIN, EDU_MAX + 1))
    if column == "salary":
        return list(range(SALARY_MIN, SALARY_MAX + 1))
    if column in _HIERARCHY_ROWS:
        return [row[0] for row in _HIERARCHY_ROWS[column]]
    raise ValueError(f"unknown census column {column!r}; columns: "
                     + ", ".join(c for c, _, _ in CENSUS_COLUMNS))


def census_hierarchy_csv(column: str, delimiter: str = ";") -> str:
    """ARX-format hierarchy text for a categorical census column.

    One line per leaf: ``leaf;level1;...;*`` (all lines the same length),
    terminated by a newline.  Columns: sex (height 1), marital (2), race (1),
    workclass (3), birthplace (2).
    """
    if column not in _HIERARCHY_ROWS:
        raise ValueError(f"no hierarchy for census column {column!r}; "
                         f"categorical columns: {', '.join(CENSUS_CATEGORICAL)}")
    return "".join(delimiter.join(row) + "\n" for row in _HIERARCHY_ROWS[column])


def census_hierarchy_height(column: str) -> int:
    """Height of a census hierarchy (number of generalization steps leaf -> '*')."""
    census_hierarchy_csv(column)  # validates the name
    return len(_HIERARCHY_ROWS[column][0]) - 1


# --------------------------------------------------------------------------
# SQL helpers
# --------------------------------------------------------------------------

def _thresholds(weights: list[float]) -> sql.Composable:
    """Inner cumulative thresholds for width_bucket(u, ARRAY[...]): k-1 values."""
    total = float(sum(weights))
    if total <= 0 or any(w <= 0 for w in weights):
        raise ValueError("weights must be positive")
    acc, cuts = 0.0, []
    for w in weights[:-1]:
        acc += w / total
        cuts.append(round(acc, 12))
    return sql.SQL("'{{{}}}'::float8[]").format(sql.SQL(",".join(repr(c) for c in cuts)))


def _text_array(values: list[str]) -> sql.Composable:
    return sql.SQL("ARRAY[{}]::text[]").format(sql.SQL(",").join(sql.Literal(v) for v in values))


def _float_array(values: list[float]) -> sql.Composable:
    return sql.SQL("'{{{}}}'::float8[]").format(sql.SQL(",".join(repr(float(v)) for v in values)))


def _int_array(values: list[int]) -> sql.Composable:
    return sql.SQL("'{{{}}}'::int[]").format(sql.SQL(",".join(str(int(v)) for v in values)))


def _pick(u: str, weights: list[float]) -> sql.Composable:
    """1-based index drawn from weights with uniform column ``u``."""
    return sql.SQL("(width_bucket({}, {}) + 1)").format(sql.Identifier(u), _thresholds(weights))


def has_define_hierarchy(conn, sabre_schema: str = SABRE_SCHEMA) -> bool:
    """True when ``<sabre_schema>.sabre_define_hierarchy`` exists in the connected database."""
    row = conn.execute(
        "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
        "WHERE n.nspname = %s AND p.proname = %s",
        (sabre_schema, DEFINE_HIERARCHY_FN),
    ).fetchone()
    return bool(row[0])


def _require_define_hierarchy(conn, sabre_schema: str) -> None:
    if not has_define_hierarchy(conn, sabre_schema):
        raise RuntimeError(
            f"function {sabre_schema}.{DEFINE_HIERARCHY_FN}(name text, csv text, "
            "delimiter text) does not exist in this database: install sabre-pg first "
            "(sabre-pg install), or do not register hierarchies (hierarchies=False / "
            "--no-hierarchies)")


def define_hierarchy(conn, name: str, csv_text: str, delimiter: str = ";",
                     sabre_schema: str = SABRE_SCHEMA) -> None:
    """Register one ARX hierarchy via ``<sabre_schema>.sabre_define_hierarchy``."""
    conn.execute(
        sql.SQL("SELECT {}.{}(%s, %s, %s)").format(
            sql.Identifier(sabre_schema), sql.Identifier(DEFINE_HIERARCHY_FN)),
        (name, csv_text, delimiter),
    )


def _table_exists(conn, schema: str, table: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = %s", (schema, table)).fetchone()
    return row is not None


def _prepare_target(conn, schema: str, table: str, replace: bool) -> sql.Composable:
    qname = sql.Identifier(schema, table)
    if _table_exists(conn, schema, table):
        if not replace:
            raise ValueError(f"table {schema}.{table} already exists "
                             "(pass replace=True, or --replace on the command line, to overwrite it)")
        conn.execute(sql.SQL("DROP TABLE {}").format(qname))
    return qname


# --------------------------------------------------------------------------
# CENSUS generator
# --------------------------------------------------------------------------

# Uniform streams: stream j of row i is hashint8extended(i, seed*1000 + j)
# reduced to its low 53 bits / 2^53, a float8 in [0, 1).
_STREAMS = {
    "u_age_band": 1, "u_age": 2, "u_sex": 3, "u_edu": 4, "u_marital": 5,
    "u_race": 6, "u_work": 7, "u_birth": 8, "u_sal1": 9, "u_sal2": 10,
}
_FORCED = 83  # the first ids cycle through every domain value (max cardinality 83)


def _census_sql(qname: sql.Composable, rows: int, seed: int) -> sql.Composed:
    base = seed * 1000
    uniforms = sql.SQL(",\n           ").join(
        sql.SQL("(hashint8extended(i, {}) & 9007199254740991)::float8 / 9007199254740992.0 AS {}")
        .format(sql.Literal(base + j), sql.Identifier(name))
        for name, j in _STREAMS.items())

    age_lo = _int_array([lo for lo, _, _ in _AGE_BANDS])
    age_n = _int_array([n for _, n, _ in _AGE_BANDS])
    age_band = _pick("u_age_band", [w for _, _, w in _AGE_BANDS])

    marital_cases = []
    for upper, weights in _MARITAL_BY_AGE:
        pick = _pick("u_marital", weights)
        if upper is None:
            marital_cases.append(sql.SQL("ELSE {}").format(pick))
        else:
            marital_cases.append(sql.SQL("WHEN age < {} THEN {}").format(sql.Literal(upper), pick))

    work_names = [w[0] for w in _WORKCLASS]
    work_effect = _float_array([w[4] for w in _WORKCLASS])

    query = sql.SQL("""
CREATE TABLE {qname} AS
SELECT id::bigint AS id, age, sex, education, marital, race, workclass, birthplace,
       CASE WHEN id <= {n_sal} THEN id::int
            ELSE least({smax}, greatest({smin},
                 floor(exp(mu + 0.6::float8 * sqrt(-2.0::float8 * ln(1.0::float8 - u_sal1))
                                * cos(2.0::float8 * pi() * u_sal2)) / 2.0::float8)::int + 1))
       END AS salary
FROM (
    SELECT id, age, sex, education, marital, race, workclass, birthplace, u_sal1, u_sal2,
           3.4011973816621555::float8                      -- ln(30): median ~30 k$
           + 0.08::float8 * (education - 9)
           + 0.04::float8 * (age - 40) - 0.0012::float8 * ((age - 40) * (age - 40))
           + CASE WHEN sex = 'Male' THEN 0.15::float8 ELSE -0.15::float8 END
           + ({work_effect})[work_idx] AS mu
    FROM (
        SELECT id, age, education, u_sal1, u_sal2, work_idx,
               ({sex_names})[CASE WHEN id <= {forced} THEN 1 + (id - 1) % 2 ELSE {sex_pick} END] AS sex,
               ({marital_names})[CASE WHEN id <= {forced} THEN 1 + (id - 1) % {n_marital}
                                      ELSE CASE {marital_cases} END END] AS marital,
               ({race_names})[CASE WHEN id <= {forced} THEN 1 + (id - 1) % {n_race} ELSE {race_pick} END] AS race,
               ({work_names})[work_idx] AS workclass,
               ({birth_names})[CASE WHEN id <= {forced} THEN 1 + (id - 1) % {n_birth} ELSE {birth_pick} END] AS birthplace
        FROM (
            SELECT id, u_sex, u_marital, u_race, u_birth, u_sal1, u_sal2,
                   CASE WHEN id <= {forced} THEN {amin} + ((id - 1) % {n_age})::int
                        ELSE ({age_lo})[{band}] + floor(u_age * ({age_n})[{band}])::int END AS age,
                   CASE WHEN id <= {forced} THEN {emin} + ((id - 1) % {n_edu})::int
                        ELSE {edu_pick} + {emin} - 1 END AS education,
                   CASE WHEN id <= {forced} THEN 1 + ((id - 1) % {n_work})::int
                        ELSE {work_pick} END AS work_idx
            FROM (
                SELECT i AS id,
                       {uniforms}
                FROM generate_series(1::bigint, {rows}::bigint) AS g(i)
                OFFSET 0
            ) r
            OFFSET 0
        ) a
        OFFSET 0
    ) b
    OFFSET 0
) c
""").format(
        qname=qname,
        rows=sql.Literal(rows),
        uniforms=uniforms,
        forced=sql.Literal(_FORCED),
        n_sal=sql.Literal(SALARY_MAX - SALARY_MIN + 1),
        smin=sql.Literal(SALARY_MIN), smax=sql.Literal(SALARY_MAX),
        amin=sql.Literal(AGE_MIN), n_age=sql.Literal(AGE_MAX - AGE_MIN + 1),
        age_lo=age_lo, age_n=age_n,
        band=age_band,
        emin=sql.Literal(EDU_MIN), n_edu=sql.Literal(EDU_MAX - EDU_MIN + 1),
        edu_pick=_pick("u_edu", _EDU_WEIGHTS),
        sex_names=_text_array([v for v, _ in _SEX]),
        sex_pick=_pick("u_sex", [w for _, w in _SEX]),
        marital_names=_text_array([m for m, _ in _MARITAL]),
        n_marital=sql.Literal(len(_MARITAL)),
        marital_cases=sql.SQL(" ").join(marital_cases),
        race_names=_text_array([v for v, _ in _RACE]),
        n_race=sql.Literal(len(_RACE)),
        race_pick=_pick("u_race", [w for _, w in _RACE]),
        work_names=_text_array(work_names),
        n_work=sql.Literal(len(_WORKCLASS)),
        work_pick=_pick("u_work", [w[3] for w in _WORKCLASS]),
        work_effect=work_effect,
        birth_names=_text_array([c for c, _, _ in _BIRTHPLACE]),
        n_birth=sql.Literal(len(_BIRTHPLACE)),
        birth_pick=_pick("u_birth", [w for _, _, w in _BIRTHPLACE]),
    )
    return query


def generate_census(conn, table: str = "census", rows: int = 100_000, seed: int = 1,
                    schema: str = "public", hierarchies: bool = True,
                    replace: bool = False, sabre_schema: str = SABRE_SCHEMA) -> dict[str, Any]:
    """Create a synthetic CENSUS-like table inside PostgreSQL.

    Columns: ``id bigint PRIMARY KEY`` (1..rows), ``age`` integer 17..95 (79
    values), ``sex`` text (2), ``education`` integer 1..17, ``marital`` text
    (6, hierarchy height 2), ``race`` text (9, height 1), ``workclass`` text
    (10, height 3), ``birthplace`` text (83, height 2) and the sensitive
    ``salary`` integer 1..50 (brackets of 2 k$, 50 = top-coded >= 98 k$).
    Salary depends on age, education, work class and sex; marital status
    depends on age.  Ids 1..83 cycle through every domain value, so every
    value occurs at any size.  Deterministic in ``(rows, seed)``.

    With ``hierarchies=True`` the categorical columns' hierarchies are
    registered as ``<table>_<column>`` via ``sabre.sabre_define_hierarchy``
    (RuntimeError if that function is missing).

    Returns ``{"table", "schema", "rows", "seed", "seconds", "hierarchies"}``,
    where ``hierarchies`` maps column -> hierarchy name (empty when
    ``hierarchies=False``).
    """
    rows = _as_int(rows, "rows")
    seed = _as_int(seed, "seed")
    if rows < 1:
        raise ValueError("rows must be >= 1")
    if not 0 <= seed < 2**53 // 1000:
        raise ValueError("seed must be a non-negative integer below 9e12")
    if not table or not schema:
        raise ValueError("table and schema must be non-empty")
    if hierarchies:
        _require_define_hierarchy(conn, sabre_schema)

    t0 = time.perf_counter()
    names: dict[str, str] = {}
    with conn.transaction():
        qname = _prepare_target(conn, schema, table, replace)
        conn.execute(_census_sql(qname, rows, seed))
        # One ALTER: a single verification scan for all NOT NULLs plus the PK build.
        conn.execute(sql.SQL("ALTER TABLE {} {}").format(qname, sql.SQL(", ").join(
            [sql.SQL("ALTER COLUMN {} SET NOT NULL").format(sql.Identifier(col))
             for col, _, _ in CENSUS_COLUMNS] + [sql.SQL("ADD PRIMARY KEY (id)")])))
        conn.execute(sql.SQL("ANALYZE {}").format(qname))
        if hierarchies:
            for col in CENSUS_CATEGORICAL:
                name = f"{table}_{col}"
                define_hierarchy(conn, name, census_hierarchy_csv(col), ";", sabre_schema)
                names[col] = name
    seconds = time.perf_counter() - t0
    return {"table": table, "schema": schema, "rows": rows, "seed": seed,
            "seconds": round(seconds, 3), "hierarchies": names}


def _as_int(value, what: str) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{what} must be an integer")
    try:
        out = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be an integer, got {value!r}") from None
    if out != value and not isinstance(value, str):
        raise ValueError(f"{what} must be an integer, got {value!r}")
    return out


# --------------------------------------------------------------------------
# ARX loader
# --------------------------------------------------------------------------

_INT_RE = re.compile(r"^[+-]?(0|[1-9][0-9]*)$")   # no leading zeros (ZIP codes stay text)
_INT4_MIN, _INT4_MAX = -2**31, 2**31 - 1


def _read_text(path: Path) -> str:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ValueError(f"file not found: {path}") from None
    except IsADirectoryError:
        raise ValueError(f"not a file: {path}") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def _parse_rows(text: str, delimiter: str, path: Path) -> list[tuple[int, list[str]]]:
    """(line number, fields) for each non-blank record."""
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    out = []
    try:
        for fields in reader:
            if not fields or all(f.strip() == "" for f in fields):
                continue
            out.append((reader.line_num, fields))
    except csv.Error as exc:
        raise ValueError(f"{path}: line {reader.line_num}: malformed CSV: {exc}") from None
    return out


def _is_number(v: str) -> bool:
    try:
        d = Decimal(v)
    except InvalidOperation:
        return False
    return d.is_finite()


def _infer_type(values) -> str:
    seen = False
    is_int = is_num = True
    big = False
    for v in values:
        if v == "":
            continue
        seen = True
        if is_int:
            if _INT_RE.match(v):
                if not _INT4_MIN <= int(v) <= _INT4_MAX:
                    big = True
            else:
                is_int = False
        if not is_int and is_num:
            is_num = _is_number(v) and not _has_leading_zero(v)
        if not is_num:
            return "text"
    if not seen:
        return "text"
    if is_int:
        return "bigint" if big else "integer"
    return "numeric"


def _has_leading_zero(v: str) -> bool:
    s = v.lstrip("+-")
    return len(s) > 1 and s[0] == "0" and s[1].isdigit()


def _find_hierarchies(csv_path: Path, hierarchy_dir: Path, columns: list[str]) -> dict[str, Path]:
    prefix = csv_path.stem
    found: dict[str, Path] = {}
    files = sorted(p for p in hierarchy_dir.glob("*_hierarchy_*.csv") if p.is_file())
    for p in files:
        if p.name.startswith(prefix + "_hierarchy_"):
            col = p.name[len(prefix) + len("_hierarchy_"):-len(".csv")]
            found[col] = p
    if not found and hierarchy_dir.resolve() != csv_path.parent.resolve():
        # A separate hierarchy folder may use another prefix: match by column name.
        for p in files:
            for col in columns:
                if p.name.endswith("_hierarchy_" + col + ".csv") and col not in found:
                    found[col] = p
    unknown = sorted(c for c in found if c not in columns)
    if unknown:
        raise ValueError(
            f"hierarchy file(s) for unknown column(s) {unknown} in {hierarchy_dir}; "
            f"columns of {csv_path.name}: {columns}")
    return {c: found[c] for c in columns if c in found}


def _normalize_hierarchy(path: Path, delimiter: str) -> str:
    """Validated hierarchy text with LF line ends (one row per leaf, equal lengths)."""
    text = _read_text(path)
    rows = _parse_rows(text, delimiter, path)
    if not rows:
        raise ValueError(f"hierarchy file {path} is empty")
    width = len(rows[0][1])
    leaves = set()
    for line, fields in rows:
        if len(fields) != width:
            raise ValueError(f"hierarchy file {path}: line {line} has {len(fields)} "
                             f"fields, expected {width} like line {rows[0][0]}")
        if fields[0] in leaves:
            raise ValueError(f"hierarchy file {path}: line {line}: duplicate leaf {fields[0]!r}")
        leaves.add(fields[0])
    lines = [ln for ln in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
             if ln.strip() != ""]
    return "\n".join(lines) + "\n"


def load_arx(conn, csv_path, hierarchy_dir=None, table: str | None = None,
             schema: str = "public", delimiter: str = ";",
             replace: bool = False, sabre_schema: str = SABRE_SCHEMA,
             hierarchies: bool = True) -> dict[str, Any]:
    """Load an ARX-format dataset into a new table and register its hierarchies.

    ``csv_path`` is a ``delimiter``-separated file with a header line.  The
    table (default: the file's stem, e.g. ``adult``) gets ``id bigserial
    PRIMARY KEY`` unless a column named ``id`` exists.  Column types are
    inferred: ``integer`` (``bigint`` when out of int4 range) if every value
    is an integer without leading zeros, ``numeric`` if every value is a
    number, else ``text``; empty fields load as NULL.  Column names keep their
    spelling (e.g. ``marital-status``).  Rows are loaded with ``COPY``.

    Every ``<prefix>_hierarchy_<column>.csv`` in ``hierarchy_dir`` (default:
    the CSV's folder; ``<prefix>`` is the CSV's stem) is registered via
    ``sabre.sabre_define_hierarchy('<table>_<column>', text, delimiter)``
    (validated first: equal-length rows, unique leaves); ``hierarchies=False``
    skips them.

    Returns ``{"table", "schema", "rows", "columns": {name: type},
    "hierarchies": {column: hierarchy_name}, "seconds"}``.  Raises
    ValueError on a missing file, a missing header, ragged rows (with the
    line number) or an existing table without ``replace=True``.
    """
    if not delimiter or len(delimiter) != 1:
        raise ValueError(f"delimiter must be a single character, got {delimiter!r}")
    t0 = time.perf_counter()
    csv_path = Path(csv_path)
    if not csv_path.is_file():
        raise ValueError(f"CSV file not found: {csv_path}")
    hdir = Path(hierarchy_dir) if hierarchy_dir is not None else csv_path.parent
    if not hdir.is_dir():
        raise ValueError(f"hierarchy directory not found: {hdir}")
    table = table or csv_path.stem
    if not table:
        raise ValueError("table name must be non-empty")

    records = _parse_rows(_read_text(csv_path), delimiter, csv_path)
    if not records:
        raise ValueError(f"{csv_path}: empty file, header missing")
    header_line, header = records[0]
    header = [h.strip() for h in header]
    if any(h == "" for h in header):
        raise ValueError(f"{csv_path}: line {header_line}: header missing or has an empty "
                         f"column name: {header!r}")
    if all(_is_number(h) for h in header):
        raise ValueError(f"{csv_path}: line {header_line}: header missing (first line "
                         f"is all numbers: {header!r})")
    if len(set(header)) != len(header):
        dups = sorted({h for h in header if header.count(h) > 1})
        raise ValueError(f"{csv_path}: duplicate column name(s) in header: {dups}")
    data = records[1:]
    width = len(header)
    for line, fields in data:
        if len(fields) != width:
            raise ValueError(f"{csv_path}: line {line} has {len(fields)} fields, "
                             f"expected {width} (header: {delimiter.join(header)})")

    types = {col: _infer_type(fields[k] for _, fields in data) for k, col in enumerate(header)}
    hier_files = _find_hierarchies(csv_path, hdir, header) if hierarchies else {}
    hier_texts = {col: _normalize_hierarchy(p, delimiter) for col, p in hier_files.items()}
    if hier_texts:
        _require_define_hierarchy(conn, sabre_schema)

    hnames: dict[str, str] = {}
    with conn.transaction():
        qname = _prepare_target(conn, schema, table, replace)
        coldefs = [sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(types[c])) for c in header]
        if "id" not in header:
            coldefs.insert(0, sql.SQL("id bigserial PRIMARY KEY"))
        conn.execute(sql.SQL("CREATE TABLE {} ({})").format(qname, sql.SQL(", ").join(coldefs)))
        copy_sql = sql.SQL("COPY {} ({}) FROM STDIN").format(
            qname, sql.SQL(", ").join(sql.Identifier(c) for c in header))
        with conn.cursor() as cur:
            with cur.copy(copy_sql) as cp:
                for _, fields in data:
                    cp.write_row([None if f == "" else f for f in fields])
        conn.execute(sql.SQL("ANALYZE {}").format(qname))
        for col, text in hier_texts.items():
            name = f"{table}_{col}"
            define_hierarchy(conn, name, text, delimiter, sabre_schema)
            hnames[col] = name
    return {"table": table, "schema": schema, "rows": len(data), "columns": types,
            "hierarchies": hnames, "seconds": round(time.perf_counter() - t0, 3)}


# --------------------------------------------------------------------------
# CLI hooks (called by sabre_pg.cli for `sabre-pg gen` / `sabre-pg load`)
# --------------------------------------------------------------------------

def _user_errors(fn, *a, **kw):
    """Run fn, turning our ValueError/RuntimeError into SabreError (no traceback in the CLI)."""
    from sabre_pg.errors import SabreError
    try:
        return fn(*a, **kw)
    except (ValueError, RuntimeError) as exc:
        raise SabreError(str(exc)) from exc


def cli_gen(args, conn) -> dict[str, Any]:
    """``sabre-pg gen``: args.table, args.rows, args.seed; optional args.schema,
    args.replace, args.no_hierarchies, args.sabre_schema."""
    result = _user_errors(
        generate_census,
        conn,
        table=getattr(args, "table", None) or "census",
        rows=100_000 if getattr(args, "rows", None) is None else args.rows,
        seed=1 if getattr(args, "seed", None) is None else args.seed,
        schema=getattr(args, "schema", None) or "public",
        hierarchies=not getattr(args, "no_hierarchies", False),
        replace=bool(getattr(args, "replace", False)),
        sabre_schema=getattr(args, "sabre_schema", None) or SABRE_SCHEMA,
    )
    print(f"generated {result['schema']}.{result['table']}: {result['rows']} rows "
          f"(seed {result['seed']}) in {result['seconds']:.2f} s; hierarchies: "
          + (", ".join(f"{c}={n}" for c, n in result["hierarchies"].items()) or "none"))
    return result


def cli_load(args, conn) -> dict[str, Any]:
    """``sabre-pg load``: args.csv, args.hierarchies (folder), args.table,
    args.delimiter (default ';'); optional args.schema, args.replace, args.sabre_schema."""
    result = _user_errors(
        load_arx,
        conn,
        args.csv,
        hierarchy_dir=getattr(args, "hierarchies", None),
        table=getattr(args, "table", None),
        schema=getattr(args, "schema", None) or "public",
        delimiter=getattr(args, "delimiter", None) or ";",
        replace=bool(getattr(args, "replace", False)),
        sabre_schema=getattr(args, "sabre_schema", None) or SABRE_SCHEMA,
        hierarchies=not getattr(args, "no_hierarchies", False),
    )
    cols = ", ".join(f"{c} {t}" for c, t in result["columns"].items())
    print(f"loaded {result['schema']}.{result['table']}: {result['rows']} rows ({cols}) "
          f"in {result['seconds']:.2f} s; hierarchies: "
          + (", ".join(f"{c}={n}" for c, n in result["hierarchies"].items()) or "none"))
    return result
