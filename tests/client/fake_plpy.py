"""The PL/Python side without a server: ``sabre_plpy`` imported from plpython/ and a fake
``plpy`` that records SQL and answers from a script (MADlib tests its PL/Python this way with
plpy_mock)."""
from __future__ import annotations

import importlib
import sys
import types
from contextlib import contextmanager
from pathlib import Path

PLPYTHON_DIR = Path(__file__).resolve().parents[2] / "plpython"


def sabre_plpy(module: str):
    """Import ``sabre_plpy.<module>`` from the checkout (as the installer ships it)."""
    if "sabre_plpy" not in sys.modules:
        package = types.ModuleType("sabre_plpy")
        package.__path__ = [str(PLPYTHON_DIR)]
        sys.modules["sabre_plpy"] = package
        installed = types.ModuleType("sabre_plpy._installed")
        installed.SCHEMA = "sabre"
        sys.modules["sabre_plpy._installed"] = installed
    return importlib.import_module("sabre_plpy." + module)


class PlpyError(Exception):
    def __init__(self, message, sqlstate=None, hint=None, detail=None):
        super().__init__(message)
        self.sqlstate, self.hint, self.detail = sqlstate, hint, detail


class FakePlpy:
    """Records every statement; ``answers`` maps a substring of the SQL to the rows returned."""
    SPIError = PlpyError
    Error = PlpyError

    def __init__(self, answers=None):
        self.answers = list((answers or {}).items())
        self.executed = []

    def prepare(self, sql, types=None):
        return (sql, types)

    def execute(self, query, params=None):
        sql = query[0] if isinstance(query, tuple) else query
        self.executed.append((sql, params))
        for needle, rows in self.answers:
            if needle in sql:
                return rows(params) if callable(rows) else rows
        return []

    def quote_literal(self, value):
        return "'%s'" % str(value).replace("'", "''")

    def error(self, message, sqlstate=None, hint=None, detail=None):
        raise PlpyError(message, sqlstate, hint, detail)

    @contextmanager
    def subtransaction(self):
        yield
