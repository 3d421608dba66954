"""The census generator in SQL: a CENSUS-like table built inside PostgreSQL.

:func:`generate_census` runs one set-based ``CREATE TABLE ... AS SELECT`` over
``generate_series`` whose values follow the census domain (:mod:`sabre_pg.census`).
Per-row pseudo-random numbers come from ``hashint8extended(i, seed*1000 + j)``, so the
output depends only on ``(rows, seed)``, never on ``random()`` or on the query plan.
:func:`census_sql` builds that statement without running it.
"""
from __future__ import annotations

import time
from typing import Any

from psycopg import sql

from sabre_pg import census
from sabre_pg.catalog import SABRE_SCHEMA, define_hierarchy, prepare_target, require_define_hierarchy

# Uniform streams: stream j of row i is hashint8extended(i, seed*1000 + j)
# reduced to its low 53 bits / 2^53, a float8 in [0, 1).
STREAMS = {
    "u_age_band": 1, "u_age": 2, "u_sex": 3, "u_edu": 4, "u_marital": 5,
    "u_race": 6, "u_work": 7, "u_birth": 8, "u_sal1": 9, "u_sal2": 10,
}
FORCED = 83  # the first ids cycle through every domain value (max cardinality 83)

# Salary is log-normal around a median that depends on education, age, sex and work class;
# marital status depends on age.  The innermost query draws the uniforms, the next ones
# turn them into values (ids 1..FORCED cycle through every value instead).
CENSUS_TEMPLATE = sql.SQL("""
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
""")


def _thresholds(weights: list[float]) -> sql.Composable:
    """Inner cumulative thresholds for width_bucket(u, ARRAY[...]): k-1 values."""
    total = float(sum(weights))
    if total <= 0 or any(weight <= 0 for weight in weights):
        raise ValueError("weights must be positive")
    cumulative, cuts = 0.0, []
    for weight in weights[:-1]:
        cumulative += weight / total
        cuts.append(round(cumulative, 12))
    return sql.SQL("'{{{}}}'::float8[]").format(sql.SQL(",".join(repr(c) for c in cuts)))


def _text_array(values: list[str]) -> sql.Composable:
    return sql.SQL("ARRAY[{}]::text[]").format(sql.SQL(",").join(sql.Literal(v) for v in values))


def _float_array(values: list[float]) -> sql.Composable:
    return sql.SQL("'{{{}}}'::float8[]").format(sql.SQL(",".join(repr(float(v)) for v in values)))


def _int_array(values: list[int]) -> sql.Composable:
    return sql.SQL("'{{{}}}'::int[]").format(sql.SQL(",".join(str(int(v)) for v in values)))


def _pick(uniform: str, weights: list[float]) -> sql.Composable:
    """1-based index drawn from weights with the uniform column ``uniform``."""
    return sql.SQL("(width_bucket({}, {}) + 1)").format(sql.Identifier(uniform), _thresholds(weights))


def _uniform_columns(seed: int) -> sql.Composable:
    base = seed * 1000
    return sql.SQL(",\n           ").join(
        sql.SQL("(hashint8extended(i, {}) & 9007199254740991)::float8 / 9007199254740992.0 AS {}")
        .format(sql.Literal(base + stream), sql.Identifier(name))
        for name, stream in STREAMS.items())


def _numerical_arguments() -> dict[str, sql.Composable]:
    """Template arguments of age (banded), education and salary."""
    age_band = _pick("u_age_band", [weight for _, _, weight in census.AGE_BANDS])
    return dict(
        n_sal=sql.Literal(census.SALARY_MAX - census.SALARY_MIN + 1),
        smin=sql.Literal(census.SALARY_MIN), smax=sql.Literal(census.SALARY_MAX),
        amin=sql.Literal(census.AGE_MIN), n_age=sql.Literal(census.AGE_MAX - census.AGE_MIN + 1),
        age_lo=_int_array([low for low, _, _ in census.AGE_BANDS]),
        age_n=_int_array([count for _, count, _ in census.AGE_BANDS]),
        band=age_band,
        emin=sql.Literal(census.EDU_MIN), n_edu=sql.Literal(census.EDU_MAX - census.EDU_MIN + 1),
        edu_pick=_pick("u_edu", census.EDUCATION_WEIGHTS),
    )


def _marital_cases() -> sql.Composable:
    """``WHEN age < upper THEN <pick> ... ELSE <pick>``: marital weights by age band."""
    cases = []
    for upper, weights in census.MARITAL_BY_AGE:
        pick = _pick("u_marital", weights)
        if upper is None:
            cases.append(sql.SQL("ELSE {}").format(pick))
        else:
            cases.append(sql.SQL("WHEN age < {} THEN {}").format(sql.Literal(upper), pick))
    return sql.SQL(" ").join(cases)


def _categorical_arguments() -> dict[str, sql.Composable]:
    """Template arguments of sex, marital, race, workclass and birthplace."""
    workclass = census.WORKCLASS
    return dict(
        sex_names=_text_array([value for value, _ in census.SEX]),
        sex_pick=_pick("u_sex", [weight for _, weight in census.SEX]),
        marital_names=_text_array([value for value, _ in census.MARITAL]),
        n_marital=sql.Literal(len(census.MARITAL)),
        marital_cases=_marital_cases(),
        race_names=_text_array([value for value, _ in census.RACE]),
        n_race=sql.Literal(len(census.RACE)),
        race_pick=_pick("u_race", [weight for _, weight in census.RACE]),
        work_names=_text_array([row[0] for row in workclass]),
        n_work=sql.Literal(len(workclass)),
        work_pick=_pick("u_work", [row[3] for row in workclass]),
        work_effect=_float_array([row[4] for row in workclass]),
        birth_names=_text_array([country for country, _, _ in census.BIRTHPLACE]),
        n_birth=sql.Literal(len(census.BIRTHPLACE)),
        birth_pick=_pick("u_birth", [weight for _, _, weight in census.BIRTHPLACE]),
    )


def census_sql(qualified_name: sql.Composable, rows: int, seed: int) -> sql.Composed:
    """The ``CREATE TABLE <qualified_name> AS SELECT ...`` of :func:`generate_census`."""
    return CENSUS_TEMPLATE.format(
        qname=qualified_name,
        rows=sql.Literal(rows),
        uniforms=_uniform_columns(seed),
        forced=sql.Literal(FORCED),
        **_numerical_arguments(),
        **_categorical_arguments(),
    )


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
        require_define_hierarchy(conn, sabre_schema)

    started = time.perf_counter()
    names: dict[str, str] = {}
    with conn.transaction():
        qualified = prepare_target(conn, schema, table, replace)
        conn.execute(census_sql(qualified, rows, seed))
        # One ALTER: a single verification scan for all NOT NULLs plus the PK build.
        conn.execute(sql.SQL("ALTER TABLE {} {}").format(qualified, sql.SQL(", ").join(
            [sql.SQL("ALTER COLUMN {} SET NOT NULL").format(sql.Identifier(column))
             for column, _, _ in census.CENSUS_COLUMNS] + [sql.SQL("ADD PRIMARY KEY (id)")])))
        conn.execute(sql.SQL("ANALYZE {}").format(qualified))
        if hierarchies:
            for column in census.CENSUS_CATEGORICAL:
                name = f"{table}_{column}"
                define_hierarchy(conn, name, census.census_hierarchy_csv(column), ";", sabre_schema)
                names[column] = name
    seconds = time.perf_counter() - started
    return {"table": table, "schema": schema, "rows": rows, "seed": seed,
            "seconds": round(seconds, 3), "hierarchies": names}
