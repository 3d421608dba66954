"""Errors of the PL/Python entry points: named SQLSTATEs and one constructor per kind.

Stage code raises :class:`SabreError` (pure Python, so it can be tested without a server);
each entry point runs inside :func:`reported`, which turns it into a PostgreSQL error with
SQLSTATE, message, DETAIL and HINT.  (In the style of PostgreSQL Anonymizer's error.rs.)
"""
from __future__ import annotations

import functools
from contextlib import contextmanager

from sabre_pg.core import limits
from sabre_pg.core.checkpoint import checking
from sabre_pg.core.pages import small_pages

from . import kernel_cache, progress
from .interrupts import Interrupts

INVALID_PARAMETER = "22023"
NULL_NOT_ALLOWED = "22004"
BAD_FILE_FORMAT = "22P04"
UNDEFINED_TABLE = "42P01"
UNDEFINED_COLUMN = "42703"
UNDEFINED_OBJECT = "42704"
INVALID_SCHEMA = "3F000"
DUPLICATE_COLUMN = "42701"
DUPLICATE_TABLE = "42P07"
DATATYPE_MISMATCH = "42804"
INVALID_NAME = "42602"
NAME_TOO_LONG = "42622"
INSUFFICIENT_PRIVILEGE = "42501"
DEPENDENT_OBJECTS = "2BP01"
LOCK_NOT_AVAILABLE = "55P03"
NOT_IN_PREREQUISITE_STATE = "55000"
SERIALIZATION_FAILURE = "40001"
QUERY_CANCELED = "57014"
PROGRAM_LIMIT_EXCEEDED = "54000"
INTERNAL = "XX000"
CONNECTION_FAILURE = "08006"
FEATURE_NOT_SUPPORTED = "0A000"


class SabreError(Exception):
    """An error to report to the caller as a PostgreSQL error."""

    def __init__(self, sqlstate: str, message: str, hint: str | None = None, detail: str | None = None):
        super().__init__(message)
        self.sqlstate, self.message, self.hint, self.detail = sqlstate, message, hint, detail


def _kind(sqlstate: str):
    """The constructor of one error kind: ``kind(message, hint, detail=None) -> SabreError``."""
    def make(message: str, hint: str | None, detail: str | None = None) -> SabreError:
        return SabreError(sqlstate, message, hint, detail)
    return make


invalid_parameter = _kind(INVALID_PARAMETER)
null_not_allowed = _kind(NULL_NOT_ALLOWED)
undefined_column = _kind(UNDEFINED_COLUMN)
undefined_table = _kind(UNDEFINED_TABLE)
duplicate_column = _kind(DUPLICATE_COLUMN)
duplicate_table = _kind(DUPLICATE_TABLE)
datatype_mismatch = _kind(DATATYPE_MISMATCH)
invalid_name = _kind(INVALID_NAME)
name_too_long = _kind(NAME_TOO_LONG)
insufficient_privilege = _kind(INSUFFICIENT_PRIVILEGE)
dependent_objects = _kind(DEPENDENT_OBJECTS)
lock_not_available = _kind(LOCK_NOT_AVAILABLE)
not_in_prerequisite_state = _kind(NOT_IN_PREREQUISITE_STATE)
source_changed = _kind(SERIALIZATION_FAILURE)
program_limit_exceeded = _kind(PROGRAM_LIMIT_EXCEEDED)
connection_failure = _kind(CONNECTION_FAILURE)
feature_not_supported = _kind(FEATURE_NOT_SUPPORTED)


def cap(what: str, value: int, limit: int, hint: str):
    """Raise 54000 program_limit_exceeded when ``value`` exceeds ``limit`` (one of
    ``sabre_pg.core.limits``, documented in docs/security.md, "Caps")."""
    message = limits.over(what, value, limit)
    if message:
        raise program_limit_exceeded(message, hint)


def raise_sql(plpy, error: SabreError):
    """Raise ``error`` as a PostgreSQL error (plpy.error does not return)."""
    kw = {"sqlstate": error.sqlstate}
    if error.hint:
        kw["hint"] = error.hint
    if error.detail:
        kw["detail"] = error.detail
    plpy.error(error.message, **kw)


def canceled(error: BaseException | None) -> BaseException | None:
    """The query-canceled error (57014: a cancel or statement_timeout) ``error`` is or was
    raised while handling (its ``__context__`` chain), or None."""
    seen = set()
    while error is not None and id(error) not in seen:
        if getattr(error, "sqlstate", None) == QUERY_CANCELED and not isinstance(error, SabreError):
            return error
        seen.add(id(error))
        error = error.__context__
    return None


def reraise_canceled(error: BaseException) -> None:
    """Raise ``error``'s query-canceled error, if it has one: code that catches a database
    error to report it otherwise (or to ignore it) calls this first, since the cancel is
    consumed by the error and would be lost."""
    cancel = canceled(error)
    if cancel is not None:
        raise cancel


@contextmanager
def reported(plpy):
    """Run an entry point: a :class:`SabreError` raised inside becomes a PostgreSQL error; a
    cancel (57014) stays what it is, also when an error was raised while handling it."""
    try:
        yield
    except SabreError as e:
        reraise_canceled(e)
        raise_sql(plpy, e)


def entry_point(fn):
    """Decorate an entry point ``fn(plpy, ...)`` to run inside :func:`reported`, its phases
    reported as progress (``progress.reporting``), its arrays on small pages
    (``sabre_pg.core.pages``: 9% faster at 1M rows), the engine's checkpoints acting on a
    cancel (``sabre_pg.core.checkpoint``, :class:`.interrupts.Interrupts`), the compiled
    loops cached in the data directory (:mod:`.kernel_cache`)."""
    @functools.wraps(fn)
    def wrapper(plpy, *args, **kwargs):
        kernel_cache.configure()        # the compiled loops' cache, before any compilation
        with reported(plpy), progress.reporting(plpy, fn.__module__.rsplit(".", 1)[-1]), small_pages(), \
                checking(Interrupts(plpy)):
            return fn(plpy, *args, **kwargs)
    return wrapper
