"""Runs whose statements the caller's PL/pgSQL executes, not PL/Python (docs/scale-out.md,
"A worker lost mid-run").

Why. PL/Python runs every ``plpy.execute`` in a subtransaction. On a Citus coordinator whose
distributed transaction holds connections to the workers, starting a subtransaction sends
``SAVEPOINT`` to each of them; a worker that went away *between* two statements makes that
fail before PL/Python's error handling is set up. The error then jumps over the Python
interpreter's frames (a later Python call in the session can crash the server), and an
enclosing exception block (the wrappers' ``@errors@``) ends the session with FATAL
"RollbackAndReleaseCurrentSubTransaction: unexpected state SUBBEGIN". A statement that
PL/pgSQL executes itself (``EXECUTE``) opens no subtransaction: a lost worker fails that
statement like any error, and the wrapper reports it.

How. An entry point hands the rest of its run to :func:`later` (a job ``job(plpy)``) and
returns no rows. The wrapper then loops over ``sabre_driven_step``: the job runs in a thread
of the backend with :class:`Statements` as its ``plpy``; each statement it executes is handed
to the wrapper's loop, which executes it and passes the rows back (as JSON); the thread never
calls into the server. The main thread waits for the job while the wrapper runs nothing, and
the wrapper runs nothing while the job computes, so one of them runs at a time. At the end
``sabre_driven_result`` returns the job's rows. When a statement fails, the wrapper's error
handler calls :func:`failed`: the job sees the error where it executed the statement (as a
``plpy.SPIError`` with its SQLSTATE), its handlers may translate it into sabre's error (e.g.
08006 with a HINT for a lost node), and no further statement runs (the statements of the
handlers and ``finally`` blocks it passes through return no rows; a handler that needs a value
from the database reads it before the statement).

Statement errors cannot be caught *inside* the job (``subtransaction()`` is a no-op here): a
failed statement ends the run, as it must in a distributed transaction.
"""
from __future__ import annotations

import json
import queue
import re
import threading
from contextlib import nullcontext

from sabre_pg.core.checkpoint import checking
from sabre_pg.core.pages import small_pages

from . import errors as E
from . import progress
from .interrupts import Interrupts

_PARAM = re.compile(r"\$(\d+)(?![\d$])")
_current: list = []                 # the pending run of this backend (at most one)


class _Failed(Exception):
    """A job abandoned before it finished (a new run began in the same backend)."""


def literal(value) -> str:
    """``value`` as an SQL literal the way a bound parameter would arrive (its text form)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "'true'" if value else "'false'"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "'\\x%s'" % bytes(value).hex()
    if isinstance(value, (list, tuple)):
        return quote_literal(_array(value))
    if isinstance(value, dict):
        return quote_literal(json.dumps(value))
    if isinstance(value, float):
        return "'%s'" % ("NaN" if value != value else "Infinity" if value == float("inf")
                         else "-Infinity" if value == float("-inf") else repr(value))
    return quote_literal(str(value))


def _array(values) -> str:
    """A Python list as PostgreSQL's array text (nested lists: more dimensions)."""
    out = []
    for v in values:
        if v is None:
            out.append("NULL")
        elif isinstance(v, (list, tuple)):
            out.append(_array(v))
        elif isinstance(v, bool):
            out.append("t" if v else "f")
        elif isinstance(v, (bytes, bytearray, memoryview)):
            out.append('"\\\\x%s"' % bytes(v).hex())
        else:
            if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
                v = "NaN" if v != v else "Infinity" if v > 0 else "-Infinity"
            elif isinstance(v, dict):
                v = json.dumps(v)
            out.append('"%s"' % str(v).replace("\\", "\\\\").replace('"', '\\"'))
    return "{%s}" % ",".join(out)


def quote_literal(text: str) -> str:
    """PostgreSQL's ``quote_literal``: quotes doubled; with a backslash, an E'' string with
    backslashes doubled."""
    if "\\" in text:
        return "E'%s'" % text.replace("\\", "\\\\").replace("'", "''")
    return "'%s'" % text.replace("'", "''")


def bind(sql: str, types: list, args) -> str:
    """``sql`` with each ``$n`` replaced by its argument as a literal cast to its type."""
    args = list(args or [])

    def one(m):
        i = int(m.group(1)) - 1
        if i >= len(args):
            raise ValueError("statement parameter $%d has no value" % (i + 1))
        typ = types[i] if i < len(types) and types[i] else "pg_catalog.text"
        return "(%s)::%s" % (literal(args[i]), typ)
    return _PARAM.sub(one, sql)


def kind(sql: str) -> str:
    """How the wrapper runs ``sql``: 'rows' (a query, as a subquery), 'returning' (a statement
    with RETURNING, as a WITH query) or 'command' (no rows: its row count)."""
    text = sql.lstrip().lstrip("(").lstrip()
    head = text.split(None, 1)[0].upper() if text else ""
    returning = re.search(r"\bRETURNING\b", sql, re.I) is not None
    if head in ("SELECT", "VALUES", "TABLE"):
        return "rows"
    if head == "WITH":
        if re.search(r"\)\s*(INSERT|UPDATE|DELETE|MERGE)\b", sql, re.I):
            return "returning" if returning else "command"
        return "rows"
    return "returning" if returning else "command"


class Result(list):
    """What ``plpy.execute`` returns, for the rows the wrapper passed back."""

    def __init__(self, rows, count: int | None = None):
        super().__init__(rows)
        self._count = len(rows) if count is None else count

    def nrows(self) -> int:
        return self._count

    def status(self) -> int:
        return 0


class Plan:
    """``plpy.prepare``'s result: the statement and its parameter types."""

    def __init__(self, sql: str, types):
        self.sql, self.types = sql, list(types or [])


def _decode(reply: str | None) -> list:
    """The wrapper's JSON rows as plpy's: a json/jsonb value as its text (plpy gives text)."""
    rows = json.loads(reply) if reply else []
    return [{k: (json.dumps(v) if isinstance(v, dict) else v) for k, v in r.items()} for r in rows]


class Statements:
    """The ``plpy`` of a job: statements go to the wrapper's loop; nothing calls the server."""
    standin = True

    def __init__(self, run, real):
        self._run = run
        self.SPIError, self.Error, self.Fatal = real.SPIError, real.Error, getattr(real, "Fatal", real.Error)
        self.spiexceptions = getattr(real, "spiexceptions", None)

    def prepare(self, sql, types=None):
        return Plan(sql, types)

    def execute(self, query, args=None, limit=0):
        if not isinstance(query, Plan) and isinstance(args, int):     # plpy.execute(query, max_rows)
            args, limit = None, args
        sql = bind(query.sql, query.types, args) if isinstance(query, Plan) else query
        how = kind(sql)
        if limit and how == "rows":
            sql = "SELECT * FROM (%s) AS q LIMIT %d" % (sql, int(limit))
        reply = self._run.ask(how, sql)
        if how == "command":
            return Result([], int(reply or 0))
        return Result(_decode(reply))

    def cursor(self, query, args=None):
        return iter(self.execute(query, args))

    def subtransaction(self):
        return nullcontext()

    def quote_literal(self, text):
        return quote_literal(str(text))

    def quote_nullable(self, text):
        return "NULL" if text is None else quote_literal(str(text))

    def quote_ident(self, text):
        return self.execute(Plan("SELECT pg_catalog.quote_ident($1) AS q", ["text"]), [str(text)])[0]["q"]

    def _message(self, level, message, hint=None, **_):
        self._run.ask(level, json.dumps({"message": str(message), "hint": hint}))

    def notice(self, message, **kw):
        self._message("notice", message, **kw)

    def warning(self, message, **kw):
        self._message("warning", message, **kw)

    def info(self, message, **kw):
        self._message("notice", message, **kw)

    def log(self, message, **_):
        pass

    def debug(self, message, **_):
        pass

    def error(self, message, detail=None, hint=None, sqlstate=None, **_):
        raise E.SabreError(sqlstate or E.INTERNAL, str(message), hint, detail)


class _Run:
    def __init__(self, plpy, job, what: str, owner: tuple):
        self.real, self.job, self.what, self.owner = plpy, job, what, owner
        self.inbox: queue.Queue = queue.Queue()
        self.outbox: queue.Queue = queue.Queue()
        self.thread = None
        self.error = None            # the statement error the wrapper reported
        self.result = None

    def ask(self, how: str, sql: str):
        """From the job's thread: have the wrapper run ``sql``; its reply (or its error)."""
        if self.error is not None:    # after a failed statement nothing more runs: the handlers
            return None               # the error passes through see no rows (the run ends with it)
        self.outbox.put((how, sql))
        what, value = self.inbox.get()
        if what == "error":
            self.error = value
            raise value
        return value

    def body(self):
        p = Statements(self, self.real)
        try:
            with progress.reporting(p, self.what), small_pages(), checking(Interrupts(p)):
                result = self.job(p)
            self.outbox.put(("done", result))
        except BaseException as e:      # noqa: BLE001 -- handed to the main thread as it is
            self.outbox.put(("raise", e))


def later(plpy, job, what: str) -> list:
    """Hand ``job(plpy)`` to the wrapper's loop (module doc); the entry point returns this (no rows)."""
    abandon()
    r = plpy.execute("SELECT CURRENT_USER::pg_catalog.text AS r, pg_catalog.statement_timestamp()::pg_catalog.text AS s")
    _current.append(_Run(plpy, job, what, (r[0]["r"], r[0]["s"])))
    return []


def then(after) -> bool:
    """When a job is pending and not started (an entry point called another's implementation,
    which handed its run to a job): have the job go on with ``after(plpy, its rows)`` and
    return that instead; True if there was one."""
    if not _current or _current[-1].thread is not None:
        return False
    run = _current[-1]
    job = run.job
    run.job = lambda p: after(p, job(p))
    return True


def abandon() -> None:
    """End a job left pending in this backend (its wrapper never drove it), without running more."""
    while _current:
        run = _current.pop()
        if run.thread is not None and run.thread.is_alive():
            run.inbox.put(("error", _Failed("abandoned")))
            run.thread.join(5)


def _next(run):
    """The job's next message; its thread joined once it ended ('done' or 'raise')."""
    what, value = run.outbox.get()
    if what in ("done", "raise"):
        run.thread.join()
    return what, value


def step(plpy, reply, role_name, statement) -> list:
    """``sabre_driven_step``: the next statement of the pending job as (kind, statement);
    (NULL, NULL) when there is none (the job finished: :func:`result`; or no job). A job is
    driven only by the role that began it, in the statement that began it: any other caller
    abandons it."""
    if not _current:
        return [(None, None)]
    run = _current[-1]
    if run.owner != (role_name, statement):
        abandon()
        return [(None, None)]
    if run.result is not None:        # finished: its rows wait for result()
        return [(None, None)]
    if run.thread is None:
        run.thread = threading.Thread(target=run.body, name="sabre-driven", daemon=True)
        run.thread.start()
    else:
        run.inbox.put(("reply", reply))
    what, value = _next(run)
    if what == "done":
        run.result = value            # kept for result()
        return [(None, None)]
    if what == "raise":
        _current.clear()
        raise_in_main(plpy, value)
    return [(what, value)]


def raise_in_main(plpy, error):
    if isinstance(error, E.SabreError):
        E.reraise_canceled(error)
        E.raise_sql(plpy, error)
    raise error


def result(plpy) -> list:
    """``sabre_driven_result``: the rows of the job that finished (none if no job did)."""
    if not _current or _current[-1].result is None:
        return []
    return _current.pop().result


def failed(plpy, state, message, detail, hint, context) -> list:
    """``sabre_driven_failed``, from the wrapper's error handler: the job sees its statement's
    error; returns (SQLSTATE, message, detail, hint) of the error to report instead, or NULLs
    (report the statement's own)."""
    if not _current or _current[-1].thread is None or _current[-1].result is not None:
        _current.clear()
        return [(None, None, None, None)]
    run = _current[-1]
    error = plpy.SPIError(message)
    error.sqlstate, error.detail, error.hint, error.context = state, detail, hint, context
    run.inbox.put(("error", error))
    what, value = _next(run)          # 'done' or 'raise': a failed job asks for no statement (_Run.ask)
    _current.clear()
    if what == "raise" and isinstance(value, E.SabreError) and E.canceled(value) is None:
        return [(value.sqlstate, value.message, value.detail, value.hint)]
    return [(None, None, None, None)]
