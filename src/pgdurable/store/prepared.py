"""Named queries as server-side prepared statements, run through libpq by pgdurable's own sync connections
(the application's enqueues and reads, the workflow threads that write step checkpoints).

A psycopg cursor looks again, at every execute, how to convert the query, which prepared statement it is, how
to send each parameter and how to read the result, and waits for the answer one step of a generator at a
time: on a one-row statement about 70 us of client CPU and up to 150 us of wall time more than libpq's own
calls (docs/benchmarks.md, "Named queries through libpq"). Here each named query is converted once
(``%(name)s`` to ``$n``), prepared once per connection with its parameters' types left to the server (the
named queries cast their parameters, or use them where their type is known), and each call sends the
parameters as text, dumped by psycopg's adapters, waits in ``poll`` with the GIL released, and reads the rows
with psycopg's loaders and the call's row factory. The wait can be interrupted, as psycopg's can: Ctrl-C on
the main thread cancels the statement on the server (one that waits on a lock, or a server gone) and raises
``KeyboardInterrupt``, and a connection the cancel does not bring back is closed. A statement inside a
transaction keeps the cursor (one the server refused to prepare would abort it). A query the server cannot
prepare untyped goes on through a cursor. A statement deallocated behind pgdurable's back, or whose result
columns a migration changed (which the server refuses before running it), is prepared again, once.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import select
from collections.abc import Callable, Generator, Mapping
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
    """The prepared statements of one connection, sync or async, and the adapters that send and read their
    values. One exchange with the server is written once (``_exchange``, a generator that yields whenever it
    needs libpq to have a whole result) and driven by ``run`` in ``poll`` or by ``arun`` on the event loop."""

    __slots__ = ("_conn", "_encoding", "_makers", "_numbers", "_prepared", "_refused", "_tx")

    def __init__(self, conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
        self._conn = conn
        self._prepared: dict[tuple[str, bool], bytes] = {}
        self._numbers = itertools.count()  # statement names are never reused on the connection
        self._refused: set[tuple[str, bool]] = set()  # queries the server would not prepare untyped
        self._tx = Transformer(conn)
        # Read once: pgdurable's own connections never change their client_encoding (conn.info makes a new
        # object at every access, and its encoding looks the setting up again).
        self._encoding = conn.info.encoding
        # The row maker of each (prepared statement, row factory): a row factory reads the result's column
        # names to make it, and a prepared statement's columns do not change (the server refuses to run it
        # after a migration changed them, and it is prepared again under a new name). Cleared when it grows
        # past _MAX_MAKERS (a row factory made anew for each call never hits it).
        self._makers: dict[tuple[bytes, Any], Callable[[Any], Any]] = {}

    def usable(self, name: str, citus: bool) -> bool:
        """Outside a transaction only: a statement the server refuses to prepare must not abort the caller's
        transaction before the cursor runs it. (Where ``select.poll`` is missing, Windows, a sync connection
        keeps the cursor.)"""
        pgconn = self._conn.pgconn
        return ((name, citus) not in self._refused and pgconn.transaction_status == pq.TransactionStatus.IDLE
                and pgconn.pipeline_status == pq.PipelineStatus.OFF
                and (_POLL or isinstance(self._conn, psycopg.AsyncConnection)))

    def run(self, name: str, citus: bool, params: Mapping[str, Any],
            read: Callable[[list[Any]], Any], row_factory: BaseRowFactory[Any] | None) -> Any:
        """The call's result, or ``NOT_PREPARED`` if the server would not prepare the query (the caller then
        runs it through a cursor)."""
        conn = self._conn
        assert isinstance(conn, psycopg.Connection)
        with conn.lock:
            exchange = self._exchange(name, citus, params)
            try:
                next(exchange)
                while True:
                    try:
                        _wait(conn.pgconn, None)
                    except psycopg.Error:
                        raise  # the connection lost: nothing to cancel
                    except BaseException:  # interrupted: Ctrl-C, a signal handler's exception
                        _cancel(conn)
                        raise
                    exchange.send(None)
            except StopIteration as done:
                statement, result = done.value
                return self._rows(statement, result, read, row_factory)

    async def arun(self, name: str, citus: bool, params: Mapping[str, Any],
                   read: Callable[[list[Any]], Any], row_factory: BaseRowFactory[Any] | None) -> Any:
        """As ``run``, waiting on the event loop; a cancelled task cancels the statement, as Ctrl-C does."""
        conn = self._conn
        assert isinstance(conn, psycopg.AsyncConnection)
        async with conn.lock:
            exchange = self._exchange(name, citus, params)
            try:
                next(exchange)
                while True:
                    try:
                        await _wait_async(conn.pgconn, None)
                    except psycopg.Error:
                        raise
                    except BaseException:  # the task cancelled, or interrupted
                        await _cancel_async(conn)
                        raise
                    exchange.send(None)
            except StopIteration as done:
                statement, result = done.value
                return self._rows(statement, result, read, row_factory)

    def _exchange(self, name: str, citus: bool, params: Mapping[str, Any],
                  ) -> Generator[None, None, tuple[bytes, Any]]:
        """Prepare the query if this connection has not, execute it: the statement and its result, or
        NOT_PREPARED for both."""
        statement = self._prepared.get((name, citus))
        if statement is None:
            statement = yield from self._prepare(name, citus)
            if statement is None:
                return b"", NOT_PREPARED
        names = converted(name, citus).names
        values = self._tx.dump_sequence([params[n] for n in names], _text_formats(len(names)))
        try:
            return statement, (yield from self._execute(statement, values))
        except (_GONE, errors.FeatureNotSupported) as exc:
            if isinstance(exc, _GONE):  # deallocated behind our back (DEALLOCATE ALL, DISCARD ALL)
                self._prepared.clear()
            elif _replanned(exc):  # refused before it ran: a migration changed a column it returns
                yield from self._deallocate(name, citus)
            else:
                raise
        statement = yield from self._prepare(name, citus)  # prepared again, once
        if statement is None:
            return b"", NOT_PREPARED
        return statement, (yield from self._execute(statement, values))

    def _prepare(self, name: str, citus: bool) -> Generator[None, None, bytes | None]:
        """The statement's name once prepared; None if the server would not prepare it (then the cursor runs
        the call: it raises the same error, through pgdurable's mapping of errors, if that was not typing)."""
        statement = f"pgdurable_{next(self._numbers)}_{name}".encode()
        self._conn.pgconn.send_prepare(statement, converted(name, citus).text)
        result = yield from _result(self._conn.pgconn)
        if result.status == pq.ExecStatus.FATAL_ERROR:
            if isinstance(errors.error_from_result(result, encoding=self._encoding), _UNTYPED):
                self._refused.add((name, citus))
            return None
        self._prepared[(name, citus)] = statement
        return statement

    def _deallocate(self, name: str, citus: bool) -> Generator[None, None, None]:
        statement = self._prepared.pop((name, citus))
        self._conn.pgconn.send_query(sql.SQL("DEALLOCATE {}").format(sql.Identifier(statement.decode()))
                                     .as_bytes(self._conn))
        self._check((yield from _result(self._conn.pgconn)))

    def _execute(self, statement: bytes, values: Any) -> Generator[None, None, pq.abc.PGresult]:
        self._conn.pgconn.send_query_prepared(statement, values)
        return self._check((yield from _result(self._conn.pgconn)))

    def _check(self, result: pq.abc.PGresult) -> pq.abc.PGresult:
        if result.status != pq.ExecStatus.FATAL_ERROR:
            return result
        error = errors.error_from_result(result, encoding=self._encoding)
        if result.error_field(pq.DiagnosticField.SQLSTATE) is None:
            # libpq's own error, not the server's (which always has a SQLSTATE): the connection was lost (a
            # server gone, a network cut). An OperationalError, which the writer and the pools take for a
            # connection to replace and the waits for something to try again.
            raise psycopg.OperationalError(str(error) or "the connection to the server was lost") from error
        raise error

    def _rows(self, statement: bytes, result: Any, read: Callable[[list[Any]], Any],
              row_factory: BaseRowFactory[Any] | None) -> Any:
        if result is NOT_PREPARED:
            return result
        if result.status != pq.ExecStatus.TUPLES_OK:  # (a statement with no RETURNING)
            return read([])
        self._tx.set_pgresult(result)
        make_row = tuple if row_factory is None else self._maker(statement, result, row_factory)
        try:
            return read(self._tx.load_rows(0, result.ntuples, make_row))
        finally:
            self._tx.set_pgresult(None)
            result.clear()

    def _maker(self, statement: bytes, result: pq.abc.PGresult, row_factory: BaseRowFactory[Any],
               ) -> Callable[[Any], Any]:
        """The row maker ``row_factory`` made for ``statement``'s results (see ``_makers``)."""
        found = self._makers.get((statement, row_factory))
        if found is None:
            if len(self._makers) >= _MAX_MAKERS:
                self._makers.clear()
            found = self._makers[(statement, row_factory)] = row_factory(_Rows(result, self._encoding))  # type: ignore[arg-type]
        return found


NOT_PREPARED = object()
_MAX_MAKERS = 64
log = logging.getLogger("pgdurable")
# How long an interrupted statement's cancellation may take before its connection is closed instead.
_CANCEL_SECONDS = 5.0
_POLL = hasattr(select, "poll")


def _result(pgconn: pq.abc.PGconn) -> Generator[None, None, pq.abc.PGresult]:
    """The result of the one statement just sent, read up to the end of the exchange (the server's
    ReadyForQuery). Yields whenever libpq needs the driver to wait for more of the answer.

    An error that comes after the rows wins: outside a transaction the statement commits after it has sent
    them, and a commit that fails (a deferred constraint, a full NOTIFY queue, on Citus a node's PREPARE
    cancelled) rolls back what the rows reported. Taking the rows then, as this once did, reported a child's
    start written when neither it nor its step was (`bench/chaos.py --scenarios cancelq --cluster DIR`)."""
    result = None
    while True:
        yield
        found = pgconn.get_result()
        if found is None:
            assert result is not None
            return result
        if result is None or (found.status == pq.ExecStatus.FATAL_ERROR
                              and result.status != pq.ExecStatus.FATAL_ERROR):
            result = found


def _wait(pgconn: pq.abc.PGconn, timeout: float | None) -> bool:
    """Send what is left of the statement and read the server's answer until libpq has a whole result (its
    get_result will not block); False if ``timeout`` seconds passed first. ``poll`` releases the GIL, and a
    signal on the main thread runs its Python handler (Ctrl-C raises here)."""
    flushing = pgconn.flush()
    if not flushing and not pgconn.is_busy():
        return True
    fd = pgconn.socket
    poller = select.poll()
    poller.register(fd, select.POLLIN | (select.POLLOUT if flushing else 0))
    while flushing or pgconn.is_busy():
        if not poller.poll(None if timeout is None else int(timeout * 1000)):
            return False
        pgconn.consume_input()
        if flushing and not (flushing := pgconn.flush()):
            poller.modify(fd, select.POLLIN)
    return True


async def _wait_async(pgconn: pq.abc.PGconn, timeout: float | None) -> bool:
    """As ``_wait``, on the event loop."""
    flushing = pgconn.flush()
    if not flushing and not pgconn.is_busy():
        return True
    loop = asyncio.get_running_loop()
    fd = pgconn.socket
    while flushing or pgconn.is_busy():
        ready = loop.create_future()
        loop.add_reader(fd, _ready, ready)
        if flushing:
            loop.add_writer(fd, _ready, ready)
        try:
            if timeout is None:
                await ready
            else:
                async with asyncio.timeout(timeout):
                    await ready
        except TimeoutError:
            return False
        finally:
            loop.remove_reader(fd)
            if flushing:
                loop.remove_writer(fd)
        pgconn.consume_input()
        if flushing:
            flushing = pgconn.flush()
    return True


def _ready(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _cancel(conn: psycopg.Connection[Any]) -> None:
    """The statement interrupted: ask the server to cancel it and read its answer; if that takes more than a
    few seconds or is interrupted again, close the connection (its state is unknown)."""
    pgconn = conn.pgconn
    try:
        conn.cancel_safe(timeout=_CANCEL_SECONDS)
        while _wait(pgconn, _CANCEL_SECONDS):
            if pgconn.get_result() is None:
                return  # the exchange has ended: the connection goes on
        _close(pgconn, None)
    except BaseException as again:
        _close(pgconn, again)
        if not isinstance(again, Exception):
            raise


async def _cancel_async(conn: psycopg.AsyncConnection[Any]) -> None:
    """As ``_cancel``, on the event loop."""
    pgconn = conn.pgconn
    try:
        await conn.cancel_safe(timeout=_CANCEL_SECONDS)
        while await _wait_async(pgconn, _CANCEL_SECONDS):
            if pgconn.get_result() is None:
                return
        _close(pgconn, None)
    except BaseException as again:
        _close(pgconn, again)
        if not isinstance(again, Exception):
            raise


def _close(pgconn: pq.abc.PGconn, why: BaseException | None) -> None:
    log.warning("statement cancellation %s: closing the connection",
                "not answered" if why is None else f"interrupted ({type(why).__name__})")
    pgconn.finish()


def _replanned(exc: BaseException) -> bool:
    """A prepared statement whose result columns a DDL statement changed since it was prepared."""
    return "cached plan must not change result type" in str(exc)


class _Rows:
    """What psycopg's row factories read of a cursor: the result and the connection's encoding."""

    __slots__ = ("_encoding", "pgresult")

    def __init__(self, pgresult: pq.abc.PGresult, encoding: str) -> None:
        self.pgresult, self._encoding = pgresult, encoding


@cache
def _text_formats(count: int) -> list[PyFormat]:
    """The formats of ``count`` parameters all sent as text (one list per count, read and never changed)."""
    return [PyFormat.TEXT] * count
