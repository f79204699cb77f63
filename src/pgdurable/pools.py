"""Connection pools that hand out the connection returned last (a stack), not the one idle longest.

psycopg_pool keeps its idle connections in a queue: a caller that enqueues one workflow after another gets a
different server process each time, and every one of them runs with cold caches (its own plans, catalog
entries and PL/pgSQL functions, and the CPU's). Handing out the most recently returned connection keeps the
work on as few processes as the concurrency needs; the others stay idle, and the pool's own shrinking
(``max_idle``) closes the longest idle first, as before. SQLAlchemy's ``pool_use_lifo`` and node-postgres do
the same. Measured (docs/benchmarks.md): one-at-a-time ``app.enqueue`` with two pooled connections 0.66-0.70
ms a call, 0.50-0.59 ms with this order.

``lend()`` is the lean form of ``connection()`` that pgdurable's own statements take (``Database.run`` and
the like): each enqueue and status look paid 10-30 us of client CPU for what surrounds the pool's own taking
and giving back of a connection (docs/benchmarks.md, "The client's share of an enqueue, trimmed").

The pools override one step of psycopg_pool (taking a ready connection): they move the newest connection to
the front of psycopg_pool's queue first; and ``lend()`` takes and gives back idle connections as psycopg_pool
does, under its lock. Should a psycopg_pool release rename that step, the pools fall back to its queue order,
which is slower and still correct; should it rename the state ``lend()`` uses, ``lend()`` falls back to
``getconn`` and ``putconn`` (tests/test_pools.py notices both).

A connection idle for ``CHECK_AFTER_IDLE_SECONDS`` or more is tested (an empty query) before ``lend()`` hands it
out, and one that fails is replaced: a server restart, a failover or an idle-session timeout while it sat in
the pool would otherwise fail the next call of every pooled connection (one failed request each). psycopg_pool's
own ``check`` tests every connection, and sleeps a second, then two, between failed ones.

A caller that waits ``PROBE_AFTER_SECONDS`` for a connection checks that the server answers at all (one
connection of its own): if not, it fails at once with what is wrong ("cannot reach a PostgreSQL server at
...: Connection refused"), instead of psycopg_pool's "couldn't get a connection after 30.00 sec" half a
minute later; if it does, the pool is only busy and the caller waits on.

A cancelled connection attempt is not logged as a failure to connect (``_CancelledConnectQuiet``): it is what
an event loop's end does to a pool that is still growing (db.py closes such pools).
"""

from __future__ import annotations

import asyncio
import logging
from math import inf
from time import monotonic
from typing import Any

import psycopg
from psycopg import pq
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from .dberrors import explain


class StackPool(ConnectionPool[psycopg.Connection[Any]]):
    """A ConnectionPool that hands out the connection returned last."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Whether this psycopg_pool keeps the state lend() reads and writes (else lend() is getconn/putconn).
        self._lean = all(hasattr(self, name) for name in _LEAN_STATE)

    def _get_ready_connection(self, timeout: float | None) -> psycopg.Connection[Any] | None:
        self._pool.rotate(1)  # under the pool's lock: the newest (right) end becomes the one taken (left)
        return super()._get_ready_connection(timeout)

    def lend(self) -> Lent:
        """As ``connection()``, for pgdurable's own statements, which leave no transaction open. In the
        common case (an idle connection to take, one in a clean state to give back, nobody waiting) it takes
        and returns the connection under the pool's lock as psycopg_pool does, without what surrounds that
        in ``connection()``: the connection's own context (a commit with nothing to commit), a generator,
        log lines and statistics. Any other case goes through ``getconn`` and ``putconn``."""
        return Lent(self)

    def putconn(self, conn: psycopg.Connection[Any]) -> None:
        conn._pgdurable_idle_since = monotonic()  # type: ignore[attr-defined]
        super().putconn(conn)

    def _wait_for_one(self) -> psycopg.Connection[Any]:
        """``getconn()``, which fails at once with the server's problem if it does not answer after a short wait."""
        try:
            return self.getconn(timeout=PROBE_AFTER_SECONDS)
        except PoolTimeout:
            if not isinstance(conninfo := self.conninfo, str):  # (psycopg_pool also takes a callable)
                raise
            try:
                psycopg.connect(conninfo, connect_timeout=PROBE_CONNECT_SECONDS).close()
            except psycopg.OperationalError as exc:
                raise _unanswered(exc, conninfo) from exc
        return self.getconn(timeout=max(self.timeout - PROBE_AFTER_SECONDS, 0.0))

    def _take_idle(self) -> psycopg.Connection[Any] | None:
        """The connection returned last, if one is idle (and the pool open, with no check to run on it)."""
        if not self._lean or self._check is not None:
            return None
        with self._lock:
            if self._closed or not self._pool:
                return None
            conn = self._pool.pop()  # the newest end, as _get_ready_connection takes
            self._nconns_min = min(self._nconns_min, len(self._pool))  # (what the pool shrinks by)
        conn._pool = self
        return conn

    def _give_back(self, conn: psycopg.Connection[Any]) -> bool:
        """Whether ``conn`` went back to the idle connections: it is idle, not due to be replaced, there is
        no reset to run and no client waiting. False: ``putconn`` has it to do."""
        if (not self._lean or self._reset is not None or self._pool_full_event is not None
                or getattr(conn, "_pool", None) is not self
                or conn.pgconn.transaction_status != pq.TransactionStatus.IDLE
                or getattr(conn, "_created_at", -inf) <= self._drained_at
                or getattr(conn, "_expire_at", -inf) <= monotonic()):
            return False
        with self._lock:
            if self._closed or self._waiting:
                return False
            conn._pool = None
            conn._pgdurable_idle_since = monotonic()  # type: ignore[attr-defined]
            self._pool.append(conn)
        return True


# How long a pooled connection may sit unused before lend() tests it. Short enough that a server restart (which
# takes longer) is always noticed; long enough that a busy caller never pays the round trip.
CHECK_AFTER_IDLE_SECONDS = 1.0


def _idle_long(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    # Given back (putconn, lend), else made (psycopg_pool stamps _created_at) this long ago.
    since: float = getattr(conn, "_pgdurable_idle_since", 0.0) or getattr(conn, "_created_at", -inf)
    return monotonic() - since >= CHECK_AFTER_IDLE_SECONDS


# How long a caller waits for a pooled connection before it checks that the server answers at all, and how
# long that check may take to connect.
PROBE_AFTER_SECONDS = 2.0
PROBE_CONNECT_SECONDS = 5


def _unanswered(exc: psycopg.OperationalError, conninfo: str) -> psycopg.OperationalError:
    return psycopg.OperationalError(f"no database connection: {explain(exc, conninfo).message}")


def _answers(conn: psycopg.Connection[Any]) -> bool:
    try:
        conn.execute("")
    except psycopg.Error:
        return False
    return True


async def _answers_async(conn: psycopg.AsyncConnection[Any]) -> bool:
    try:
        await conn.execute("")
    except psycopg.Error:
        return False
    return True


# What StackPool.lend reads and writes of psycopg_pool's state (3.2 and later).
_LEAN_STATE = ("_check", "_lock", "_closed", "_pool", "_nconns_min", "_reset", "_pool_full_event", "_drained_at",
               "_waiting")


class Lent:
    """A connection taken from a ``StackPool`` for the span of a ``with`` block."""

    __slots__ = ("_conn", "_pool")

    def __init__(self, pool: StackPool) -> None:
        self._pool = pool

    def __enter__(self) -> psycopg.Connection[Any]:
        pool = self._pool
        while True:
            conn = pool._take_idle()
            if conn is None:
                conn = pool._wait_for_one()
            if not _idle_long(conn) or _answers(conn):
                self._conn = conn
                return conn
            pool.putconn(conn)  # broken: the pool discards it and makes another in the background

    def __exit__(self, *exc: object) -> None:
        if not self._pool._give_back(self._conn):
            self._pool.putconn(self._conn)


class AsyncStackPool(AsyncConnectionPool[psycopg.AsyncConnection[Any]]):
    """An AsyncConnectionPool that hands out the connection returned last."""

    async def _get_ready_connection(self, timeout: float | None) -> psycopg.AsyncConnection[Any] | None:
        self._pool.rotate(1)
        return await super()._get_ready_connection(timeout)

    def lend(self) -> AsyncLent:
        """As ``StackPool.lend``, async."""
        return AsyncLent(self)

    async def putconn(self, conn: psycopg.AsyncConnection[Any]) -> None:
        conn._pgdurable_idle_since = monotonic()  # type: ignore[attr-defined]
        await super().putconn(conn)

    async def _wait_for_one(self) -> psycopg.AsyncConnection[Any]:
        """As ``StackPool._wait_for_one``."""
        try:
            return await self.getconn(timeout=PROBE_AFTER_SECONDS)
        except PoolTimeout:
            if not isinstance(conninfo := self.conninfo, str):
                raise
            try:
                await (await psycopg.AsyncConnection.connect(conninfo, connect_timeout=PROBE_CONNECT_SECONDS)).close()
            except psycopg.OperationalError as exc:
                raise _unanswered(exc, conninfo) from exc
        return await self.getconn(timeout=max(self.timeout - PROBE_AFTER_SECONDS, 0.0))

    async def close(self, timeout: float = 5.0) -> None:
        """As psycopg_pool's, and the idle connections closed even when the pool's worker tasks were
        cancelled: psycopg_pool waits for its workers before it closes the idle connections, and raises a
        worker's cancellation instead. That is how an event loop's end finds them (``asyncio.run`` cancels
        every task left, the workers and the task that closes the pool alike: db.py)."""
        idle = list(self._pool)
        task = asyncio.current_task()
        cancelled_before = task.cancelling() if task is not None else 0
        try:
            await super().close(timeout)
        except asyncio.CancelledError:
            for conn in idle:
                await conn.close()
            if task is None or task.cancelling() > cancelled_before:
                raise  # this task was cancelled (again) while it closed the pool: not a worker's cancellation


class _CancelledConnectQuiet(logging.Filter):
    """Drops psycopg_pool's "error connecting" warning when the error is a cancellation: an event loop that
    ends while a pool connects (``asyncio.run`` cancels what is left) is not a failure to connect."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        return not (record.msg == "error connecting in %r: %s" and isinstance(args, tuple) and len(args) == 2
                    and isinstance(args[1], asyncio.CancelledError))


logging.getLogger("psycopg.pool").addFilter(_CancelledConnectQuiet())


class AsyncLent:
    """A connection taken from an ``AsyncStackPool`` for the span of an ``async with`` block."""

    __slots__ = ("_conn", "_pool")

    def __init__(self, pool: AsyncStackPool) -> None:
        self._pool = pool

    async def __aenter__(self) -> psycopg.AsyncConnection[Any]:
        pool = self._pool
        while True:
            conn = await pool._wait_for_one()
            if not _idle_long(conn) or await _answers_async(conn):
                self._conn = conn
                return conn
            await pool.putconn(conn)

    async def __aexit__(self, *exc: object) -> None:
        await self._pool.putconn(self._conn)
