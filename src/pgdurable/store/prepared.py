"""Named queries as server-side prepared statements, run through libpq by pgdurable's own sync connections
off the main thread (the workflow threads that write step checkpoints, the application's threads).

A psycopg cursor looks again, at every execute, how to convert the query, which prepared statement it is, how
to send each parameter and how to read the result, and waits for the answer in Python, one step of a
generator at a time: on a one-row statement about 30 us of client CPU and 30-60 us of wall time more than
libpq's own blocking call (docs/benchmarks.md, "Named queries through libpq"). Here each named query is
converted once (``%(name)s`` to ``$n``), prepared once per connection with its parameters' types left to the
server (the named queries cast their parameters, or use them where their type is known), and each call sends
the parameters as text, dumped by psycopg's adapters, waits in libpq with the GIL released, and reads the
rows with psycopg's loaders and the call's row factory. libpq's wait cannot be interrupted, so the main
thread keeps psycopg's (Ctrl-C cancels a statement that waits on a lock or a server gone), and so does a
statement inside a transaction (one the server refused to prepare would abort it). A query the server cannot
prepare untyped goes on through a cursor. A statement deallocated behind pgdurable's back, or whose result
columns a migration changed (which the server refuses before running it), is prepared again, once.
"""

from __future__ import annotations

import itertools
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

import psycopg
from psycopg import errors, pq, sql
from psycopg.adapt import PyFormat, Transformer
from psycopg.rows import BaseRowFactory

from ..sqlfiles import query

_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%%")
# SQLSTATE 26000: a statement prepared here was deallocated (DEALLOCATE ALL, DISCARD ALL on the connection).
_GONE = errors.InvalidSqlStatementName
# What the server answers a query it cannot type without psycopg's parameter types: it runs through a cursor.
_UNTYPED = (errors.IndeterminateDatatype, errors.AmbiguousFunction, errors.DatatypeMismatch)


@dataclass(frozen=True, slots=True)
class Converted:
    """A named query in libpq's form: ``$n`` placeholders, and the parameter names in their order."""

    text: bytes
    names: tuple[str, ...]


@cache
def converted(name: str, citus: bool) -> Converted:
    names: list[str] = []

    def placeholder(found: re.Match[str]) -> str:
        if found.group(0) == "%%":
            return "%"
        if found.group(1) not in names:
            names.append(found.group(1))
        return f"${names.index(found.group(1)) + 1}"

    return Converted(_PLACEHOLDER.sub(placeholder, query(name, citus)).encode(), tuple(names))


class Statements:
    """The prepared statements of one connection, and the adapters that send and read their values."""

    __slots__ = ("_conn", "_numbers", "_prepared", "_refused", "_tx")

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn
        self._prepared: dict[tuple[str, bool], bytes] = {}
        self._numbers = itertools.count()  # statement names are never reused on the connection
        self._refused: set[tuple[str, bool]] = set()  # queries the server would not prepare untyped
        self._tx = Transformer(conn)

    def usable(self, name: str, citus: bool) -> bool:
        """Not on the main thread: libpq's wait cannot be interrupted, and Ctrl-C must stop a statement that
        waits (a lock, a server gone), as psycopg's wait lets it. Outside a transaction only: a statement the
        server refuses to prepare must not abort the caller's transaction before the cursor runs it."""
        pgconn = self._conn.pgconn
        return ((name, citus) not in self._refused and threading.current_thread() is not _MAIN
                and pgconn.transaction_status == pq.TransactionStatus.IDLE
                and pgconn.pipeline_status == pq.PipelineStatus.OFF)

    def run(self, name: str, citus: bool, params: Mapping[str, Any],
            read: Callable[[list[Any]], Any], row_factory: BaseRowFactory[Any] | None) -> Any:
        """The call's result, or ``NOT_PREPARED`` if the server would not prepare the query (the caller then
        runs it through a cursor)."""
        with self._conn.lock:
            statement = self._prepared.get((name, citus))
            if statement is None:
                statement = self._prepare(name, citus)
                if statement is None:
                    return NOT_PREPARED
            form = converted(name, citus)
            values = self._tx.dump_sequence([params[n] for n in form.names], [PyFormat.TEXT] * len(form.names))
            try:
                result = self._execute(statement, values)
            except (_GONE, errors.FeatureNotSupported) as exc:
                if isinstance(exc, _GONE):  # deallocated behind our back (DEALLOCATE ALL, DISCARD ALL)
                    self._prepared.clear()
                elif _replanned(exc):  # refused before it ran: a migration changed a column it returns
                    self._deallocate(name, citus)
                else:
                    raise
                statement = self._prepare(name, citus)  # prepared again, once
                if statement is None:
                    return NOT_PREPARED
                result = self._execute(statement, values)
        if result.status != pq.ExecStatus.TUPLES_OK:  # (a statement with no RETURNING)
            return read([])
        self._tx.set_pgresult(result)
        make_row = (row_factory or _tuples)(_Rows(result, self._conn.info.encoding))  # type: ignore[arg-type]
        try:
            return read(self._tx.load_rows(0, result.ntuples, make_row))
        finally:
            self._tx.set_pgresult(None)
            result.clear()

    def _prepare(self, name: str, citus: bool) -> bytes | None:
        """The statement's name once prepared; None if the server would not prepare it (then the cursor runs
        the call: it raises the same error, through pgdurable's mapping of errors, if that was not typing)."""
        statement = f"pgdurable_{next(self._numbers)}_{name}".encode()
        result = self._conn.pgconn.prepare(statement, converted(name, citus).text)
        if result.status == pq.ExecStatus.FATAL_ERROR:
            if isinstance(errors.error_from_result(result, encoding=self._conn.info.encoding), _UNTYPED):
                self._refused.add((name, citus))
            return None
        self._prepared[(name, citus)] = statement
        return statement

    def _deallocate(self, name: str, citus: bool) -> None:
        statement = self._prepared.pop((name, citus))
        command = sql.SQL("DEALLOCATE {}").format(sql.Identifier(statement.decode()))
        self._check(self._conn.pgconn.exec_(command.as_bytes(self._conn)))

    def _execute(self, statement: bytes, values: Any) -> pq.abc.PGresult:
        return self._check(self._conn.pgconn.exec_prepared(statement, values))  # the GIL released as it waits

    def _check(self, result: pq.abc.PGresult) -> pq.abc.PGresult:
        if result.status != pq.ExecStatus.FATAL_ERROR:
            return result
        error = errors.error_from_result(result, encoding=self._conn.info.encoding)
        if result.error_field(pq.DiagnosticField.SQLSTATE) is None:
            # libpq's own error, not the server's (which always has a SQLSTATE): the connection was lost (a
            # server gone, a network cut). An OperationalError, which the writer and the pools take for a
            # connection to replace and the waits for something to try again.
            raise psycopg.OperationalError(str(error) or "the connection to the server was lost") from error
        raise error


NOT_PREPARED = object()
_MAIN = threading.main_thread()


def _replanned(exc: BaseException) -> bool:
    """A prepared statement whose result columns a DDL statement changed since it was prepared."""
    return "cached plan must not change result type" in str(exc)


class _Rows:
    """What psycopg's row factories read of a cursor: the result and the connection's encoding."""

    __slots__ = ("_encoding", "pgresult")

    def __init__(self, pgresult: pq.abc.PGresult, encoding: str) -> None:
        self.pgresult, self._encoding = pgresult, encoding


def _tuples(_: Any) -> Callable[[Any], tuple[Any, ...]]:
    return tuple
