"""The ARX loader: an ARX-format data set into a new table, its hierarchies registered.

An ARX data set is a ``;``-separated CSV with a header plus ``<prefix>_hierarchy_<column>.csv``
files.  :func:`load_arx` checks everything it can before it touches the database: the CSV's
shape (with line numbers), and every hierarchy by the core's own rules
(:class:`sabre_pg.core.hierarchy.Hierarchy` over :func:`~sabre_pg.core.hierarchy.parse_arx`,
exactly what ``sabre_define_hierarchy`` runs in the server).  Then it creates the table,
loads the rows with ``COPY`` and registers the hierarchies, in one transaction.
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

from sabre_pg.catalog import SABRE_SCHEMA, define_hierarchy, prepare_target, require_define_hierarchy
from sabre_pg.core.hierarchy import Hierarchy, parse_arx

_INT_RE = re.compile(r"^[+-]?(0|[1-9][0-9]*)$")   # no leading zeros (ZIP codes stay text)
_INT4_MIN, _INT4_MAX = -2**31, 2**31 - 1


def _read_text(path: Path) -> str:
    """A file's text: UTF-8 (a byte-order mark dropped), else Latin-1."""
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


def _parse_records(text: str, delimiter: str, path: Path) -> list[tuple[int, list[str]]]:
    """(line number, fields) for each non-blank CSV record."""
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    records = []
    try:
        for fields in reader:
            if not fields or all(field.strip() == "" for field in fields):
                continue
            records.append((reader.line_num, fields))
    except csv.Error as exc:
        raise ValueError(f"{path}: line {reader.line_num}: malformed CSV: {exc}") from None
    return records


def _is_number(value: str) -> bool:
    try:
        number = Decimal(value)
    except InvalidOperation:
        return False
    return number.is_finite()


def _has_leading_zero(value: str) -> bool:
    digits = value.lstrip("+-")
    return len(digits) > 1 and digits[0] == "0" and digits[1].isdigit()


def infer_type(values) -> str:
    """``integer`` (``bigint`` out of int4 range) when every non-empty value is an integer
    without leading zeros, ``numeric`` when every one is a finite number without leading
    zeros, else ``text`` (also when all are empty)."""
    seen = False
    is_int = is_num = True
    big = False
    for value in values:
        if value == "":
            continue
        seen = True
        if is_int:
            if _INT_RE.match(value):
                if not _INT4_MIN <= int(value) <= _INT4_MAX:
                    big = True
            else:
                is_int = False
        if not is_int and is_num:
            is_num = _is_number(value) and not _has_leading_zero(value)
        if not is_num:
            return "text"
    if not seen:
        return "text"
    if is_int:
        return "bigint" if big else "integer"
    return "numeric"


def find_hierarchies(csv_path: Path, hierarchy_dir: Path, columns: list[str]) -> dict[str, Path]:
    """column -> ``<prefix>_hierarchy_<column>.csv`` in ``hierarchy_dir``, in column order.

    ``<prefix>`` is the CSV's stem; a separate folder with no such file may use another
    prefix, and its files are then matched by column name.  A file for a column the CSV does
    not have is a ValueError."""
    prefix = csv_path.stem
    found: dict[str, Path] = {}
    files = sorted(p for p in hierarchy_dir.glob("*_hierarchy_*.csv") if p.is_file())
    for path in files:
        if path.name.startswith(prefix + "_hierarchy_"):
            found[path.name[len(prefix) + len("_hierarchy_"):-len(".csv")]] = path
    if not found and hierarchy_dir.resolve() != csv_path.parent.resolve():
        for path in files:
            for column in columns:
                if path.name.endswith("_hierarchy_" + column + ".csv") and column not in found:
                    found[column] = path
    unknown = sorted(column for column in found if column not in columns)
    if unknown:
        raise ValueError(
            f"hierarchy file(s) for unknown column(s) {unknown} in {hierarchy_dir}; "
            f"columns of {csv_path.name}: {columns}")
    return {column: found[column] for column in columns if column in found}


def read_hierarchy(path: Path, delimiter: str) -> str:
    """A hierarchy file checked by the core's rules (:class:`Hierarchy`), as ARX text with LF
    line ends and no blank lines: the text ``sabre_define_hierarchy`` is given."""
    rows = parse_arx(_read_text(path), delimiter)
    Hierarchy(rows, name=str(path))       # HierarchyError (a ValueError) names the file and row
    return "".join(delimiter.join(row) + "\n" for row in rows)


def read_table(csv_path: Path, delimiter: str) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """(header, data records) of a CSV with a header line; ValueError on a missing or
    malformed header and on ragged rows (naming the line)."""
    records = _parse_records(_read_text(csv_path), delimiter, csv_path)
    if not records:
        raise ValueError(f"{csv_path}: empty file, header missing")
    header_line, header = records[0]
    header = [name.strip() for name in header]
    if any(name == "" for name in header):
        raise ValueError(f"{csv_path}: line {header_line}: header missing or has an empty "
                         f"column name: {header!r}")
    if all(_is_number(name) for name in header):
        raise ValueError(f"{csv_path}: line {header_line}: header missing (first line "
                         f"is all numbers: {header!r})")
    if len(set(header)) != len(header):
        duplicates = sorted({name for name in header if header.count(name) > 1})
        raise ValueError(f"{csv_path}: duplicate column name(s) in header: {duplicates}")
    data = records[1:]
    for line, fields in data:
        if len(fields) != len(header):
            raise ValueError(f"{csv_path}: line {line} has {len(fields)} fields, "
                             f"expected {len(header)} (header: {delimiter.join(header)})")
    return header, data


def _create_and_copy(conn, qualified: sql.Composable, header: list[str], types: dict[str, str],
                     data: list[tuple[int, list[str]]]) -> None:
    """CREATE TABLE (with ``id bigserial PRIMARY KEY`` unless the CSV has ``id``), COPY, ANALYZE."""
    column_defs = [sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(types[c])) for c in header]
    if "id" not in header:
        column_defs.insert(0, sql.SQL("id bigserial PRIMARY KEY"))
    conn.execute(sql.SQL("CREATE TABLE {} ({})").format(qualified, sql.SQL(", ").join(column_defs)))
    copy_sql = sql.SQL("COPY {} ({}) FROM STDIN").format(
        qualified, sql.SQL(", ").join(sql.Identifier(c) for c in header))
    with conn.cursor() as cursor:
        with cursor.copy(copy_sql) as copy:
            for _, fields in data:
                copy.write_row([None if field == "" else field for field in fields])
    conn.execute(sql.SQL("ANALYZE {}").format(qualified))


def load_arx(conn, csv_path, hierarchy_dir=None, table: str | None = None,
             schema: str = "public", delimiter: str = ";",
             replace: bool = False, sabre_schema: str = SABRE_SCHEMA,
             hierarchies: bool = True) -> dict[str, Any]:
    """Load an ARX-format dataset into a new table and register its hierarchies.

    ``csv_path`` is a ``delimiter``-separated file with a header line.  The
    table (default: the file's stem, e.g. ``adult``) gets ``id bigserial
    PRIMARY KEY`` unless a column named ``id`` exists.  Column types are
    inferred (:func:`infer_type`); empty fields load as NULL.  Column names keep
    their spelling (e.g. ``marital-status``).  Rows are loaded with ``COPY``.

    Every ``<prefix>_hierarchy_<column>.csv`` in ``hierarchy_dir`` (default:
    the CSV's folder; ``<prefix>`` is the CSV's stem) is registered via
    ``sabre.sabre_define_hierarchy('<table>_<column>', text, delimiter)``
    (checked first by :func:`read_hierarchy`); ``hierarchies=False`` skips them.

    Returns ``{"table", "schema", "rows", "columns": {name: type},
    "hierarchies": {column: hierarchy_name}, "seconds"}``.  Raises
    ValueError on a missing file, a missing header, ragged rows (with the
    line number), a malformed hierarchy or an existing table without ``replace=True``.
    """
    if not delimiter or len(delimiter) != 1:
        raise ValueError(f"delimiter must be a single character, got {delimiter!r}")
    started = time.perf_counter()
    csv_path = Path(csv_path)
    if not csv_path.is_file():
        raise ValueError(f"CSV file not found: {csv_path}")
    hierarchy_dir = Path(hierarchy_dir) if hierarchy_dir is not None else csv_path.parent
    if not hierarchy_dir.is_dir():
        raise ValueError(f"hierarchy directory not found: {hierarchy_dir}")
    table = table or csv_path.stem
    if not table:
        raise ValueError("table name must be non-empty")

    header, data = read_table(csv_path, delimiter)
    types = {column: infer_type(fields[index] for _, fields in data)
             for index, column in enumerate(header)}
    files = find_hierarchies(csv_path, hierarchy_dir, header) if hierarchies else {}
    texts = {column: read_hierarchy(path, delimiter) for column, path in files.items()}
    if texts:
        require_define_hierarchy(conn, sabre_schema)

    names: dict[str, str] = {}
    with conn.transaction():
        _create_and_copy(conn, prepare_target(conn, schema, table, replace), header, types, data)
        for column, text in texts.items():
            names[column] = f"{table}_{column}"
            define_hierarchy(conn, names[column], text, delimiter, sabre_schema)
    return {"table": table, "schema": schema, "rows": len(data), "columns": types,
            "hierarchies": names, "seconds": round(time.perf_counter() - started, 3)}
