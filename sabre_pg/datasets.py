"""Data sets for sabre-pg, and the ``sabre-pg gen`` / ``sabre-pg load`` commands.

The parts live in their own modules; this one gathers their public names and holds the
command-line hooks:

* :mod:`sabre_pg.census`: the census domain (columns, value domains, hierarchies);
* :mod:`sabre_pg.census_sql`: :func:`generate_census`, the census generator in SQL;
* :mod:`sabre_pg.arx`: :func:`load_arx`, the ARX loader;
* :mod:`sabre_pg.catalog`: :func:`define_hierarchy`, :func:`has_define_hierarchy` and the
  target-table check both loaders share.

Both loaders register generalization hierarchies through the SQL function
``sabre.sabre_define_hierarchy(name text, csv text, delimiter text)``, and return a dict
whose ``"hierarchies"`` entry (``{column: hierarchy_name}``) has exactly the shape
``options.hierarchies`` of ``sabre_anonymize`` takes.  :func:`cli_gen` and :func:`cli_load`
back the ``sabre-pg gen`` and ``sabre-pg load`` subcommands.
"""

from __future__ import annotations

from typing import Any

from sabre_pg.arx import load_arx
from sabre_pg.catalog import SABRE_SCHEMA, define_hierarchy, has_define_hierarchy
from sabre_pg.census import (
    CENSUS_CATEGORICAL,
    CENSUS_COLUMNS,
    CENSUS_NUMERICAL,
    CENSUS_QIS,
    CENSUS_SENSITIVE,
    census_hierarchy,
    census_hierarchy_csv,
    census_hierarchy_height,
    census_values,
)
from sabre_pg.census_sql import generate_census

__all__ = [
    "CENSUS_COLUMNS",
    "CENSUS_QIS",
    "CENSUS_CATEGORICAL",
    "CENSUS_NUMERICAL",
    "CENSUS_SENSITIVE",
    "census_values",
    "census_hierarchy",
    "census_hierarchy_csv",
    "census_hierarchy_height",
    "generate_census",
    "load_arx",
    "define_hierarchy",
    "has_define_hierarchy",
    "cli_gen",
    "cli_load",
]


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
