"""What the data set loaders ask of the database catalog: whether sabre's
``sabre_define_hierarchy`` is installed, registering a hierarchy with it, and making room
for a new table.  Shared by the census generator (:mod:`sabre_pg.census_sql`) and the ARX
loader (:mod:`sabre_pg.arx`).
"""
from __future__ import annotations

from psycopg import sql

SABRE_SCHEMA = "sabre"
DEFINE_HIERARCHY_FN = "sabre_define_hierarchy"


def has_define_hierarchy(conn, sabre_schema: str = SABRE_SCHEMA) -> bool:
    """True when ``<sabre_schema>.sabre_define_hierarchy`` exists in the connected database."""
    row = conn.execute(
        "SELECT pg_catalog.count(*) FROM pg_catalog.pg_proc p "
        "JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace "
        "WHERE n.nspname = %s AND p.proname = %s",
        (sabre_schema, DEFINE_HIERARCHY_FN),
    ).fetchone()
    return bool(row[0])


def require_define_hierarchy(conn, sabre_schema: str) -> None:
    """RuntimeError, before anything is written, when hierarchies cannot be registered."""
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


def table_exists(conn, schema: str, table: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
        "ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
        (schema, table)).fetchone()
    return row is not None


def prepare_target(conn, schema: str, table: str, replace: bool) -> sql.Composable:
    """The qualified name of a table about to be created: an existing one is dropped when
    ``replace``, else ValueError."""
    qualified = sql.Identifier(schema, table)
    if table_exists(conn, schema, table):
        if not replace:
            raise ValueError(f"table {schema}.{table} already exists "
                             "(pass replace=True, or --replace on the command line, to overwrite it)")
        conn.execute(sql.SQL("DROP TABLE {}").format(qualified))
    return qualified
