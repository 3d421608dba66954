"""Exceptions raised by the sabre-pg client (the CLI prints them without a traceback).

One hierarchy: every error the client raises is a :class:`SabreError`.

* :class:`DatabaseError` is a PostgreSQL error raised by sabre's SQL functions (or the
  server), carrying its ``sqlstate``, ``hint`` and ``detail``; :func:`from_database`
  turns a psycopg error (or SQLAlchemy's wrapper of one) into the subclass of its SQLSTATE:
  :class:`InvalidParameter` (class 22), :class:`UndefinedObject` (42P01, 42703, 42704,
  3F000), :class:`InsufficientPrivilege` (42501), :class:`ObjectInUse` (55P03, 2BP01,
  42P07, 42701), :class:`SourceChanged` (40001);
* :class:`MissingExtra`: a command or function needs an optional dependency that is not
  installed; the message names the extra to install (``pip install 'sabre-pg[api]'``).
"""
from __future__ import annotations

import importlib


class SabreError(Exception):
    """A failure with a message meant for the user; ``sqlstate``/``hint``/``detail`` are set
    when the server reported it."""

    sqlstate: str | None = None
    hint: str | None = None
    detail: str | None = None


class MissingExtra(SabreError):
    """An optional dependency is missing: ``module`` is it, ``extra`` the extra providing it."""

    def __init__(self, module: str, extra: str, what: str):
        self.module, self.extra = module, extra
        super().__init__(f"{what} needs the Python package {module!r}, which is not installed: "
                         f"pip install 'sabre-pg[{extra}]'")


class DatabaseError(SabreError):
    """A PostgreSQL error: message, ``sqlstate``, ``hint`` and ``detail`` as the server sent them."""

    def __init__(self, message: str, sqlstate: str | None = None, hint: str | None = None,
                 detail: str | None = None):
        super().__init__(message)
        self.message, self.sqlstate, self.hint, self.detail = message, sqlstate, hint, detail

    def __str__(self) -> str:
        parts = [self.message]
        if self.detail:
            parts.append(f"DETAIL: {self.detail}")
        if self.hint:
            parts.append(f"HINT: {self.hint}")
        if self.sqlstate:
            parts.append(f"SQLSTATE: {self.sqlstate}")
        return "\n".join(parts)


class InvalidParameter(DatabaseError):
    """An argument was refused (SQLSTATE class 22: data exception)."""


class UndefinedObject(DatabaseError):
    """A relation, column, hierarchy or schema does not exist."""


class InsufficientPrivilege(DatabaseError):
    """The role may not read the source, write the output, or run the operation."""


class ObjectInUse(DatabaseError):
    """The output is locked, has dependents, or takes a name that is not sabre's to replace."""


class SourceChanged(DatabaseError):
    """The source changed while a run read it (the pre-swap check failed); run again."""


_BY_SQLSTATE = {"42P01": UndefinedObject, "42703": UndefinedObject, "42704": UndefinedObject,
                "3F000": UndefinedObject, "42501": InsufficientPrivilege, "55P03": ObjectInUse,
                "2BP01": ObjectInUse, "42P07": ObjectInUse, "42701": ObjectInUse,
                "40001": SourceChanged}


def error_class(sqlstate: str | None) -> type[DatabaseError]:
    """The :class:`DatabaseError` subclass of a SQLSTATE (the class itself when none fits)."""
    if sqlstate in _BY_SQLSTATE:
        return _BY_SQLSTATE[sqlstate]
    if sqlstate and sqlstate.startswith("22"):
        return InvalidParameter
    return DatabaseError


def from_database(error: BaseException) -> DatabaseError | None:
    """The :class:`DatabaseError` for a psycopg error, or for SQLAlchemy's ``DBAPIError``
    wrapping one (its ``orig``); None for anything else."""
    error = getattr(error, "orig", None) or error
    diag = getattr(error, "diag", None)
    if diag is None or not hasattr(error, "sqlstate"):
        return None
    message = diag.message_primary or str(error).strip()
    return error_class(error.sqlstate)(message, error.sqlstate, diag.message_hint, diag.message_detail)


def missing_extra(error: ModuleNotFoundError, extras: dict[str, str], what: str) -> MissingExtra | None:
    """The :class:`MissingExtra` for ``error`` when the missing top-level module is one of
    ``extras`` ({module: extra}); None otherwise (a bug, not a missing extra)."""
    top = (error.name or "").split(".")[0]
    return MissingExtra(top, extras[top], what) if top in extras else None


def require(module: str, extra: str, what: str):
    """Import ``module`` or raise :class:`MissingExtra` naming ``extra``."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        raise missing_extra(e, {module.split(".")[0]: extra}, what) or e from None
