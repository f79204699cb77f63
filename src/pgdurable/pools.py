"""Connection pools that hand out the connection returned last (a stack), not the one idle longest.

psycopg_pool keeps its idle connections in a queue: a caller that enqueues one workflow after another gets a
different server process each time, and every one of them runs with cold caches (its own plans, catalog
entries and PL/pgSQL functions, and the CPU's). Handing out the most recently returned connection keeps the
work on as few processes as the concurrency needs; the others stay idle, and the pool's own shrinking
(``max_idle``) closes the longest idle first, as before. SQLAlchemy's ``pool_use_lifo`` and node-postgres do
the same. Measured (docs/benchmarks.md): one-at-a-time ``app.enqueue`` with two pooled connections 0.66-0.70
ms a call, 0.50-0.59 ms with this order.

``lend()`` is the lean form of ``connection()`` that pgdurable's own statements take (``Database.run`` and
the like): each enqueue and status look used to pay 8 us of CPU for the parts of ``connection()`` they do not
need (docs/benchmarks.md, "A lean lend of a pooled connection").

The pools override one step of psycopg_pool (taking a ready connection): they move the newest connection to
the front of psycopg_pool's queue first. Should a psycopg_pool release rename that step, the pools fall back to
its queue order, which is slower and still correct (tests/test_pools.py notices).
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool


class StackPool(ConnectionPool[psycopg.Connection[Any]]):
    """A ConnectionPool that hands out the connection returned last."""

    def _get_ready_connection(self, timeout: float | None) -> psycopg.Connection[Any] | None:
        self._pool.rotate(1)  # under the pool's lock: the newest (right) end becomes the one taken (left)
        return super()._get_ready_connection(timeout)

    def lend(self) -> Lent:
        """As ``connection()``, for pgdurable's own statements, which leave no transaction open: without
        the connection's own context (a ``commit`` that has nothing to commit), the generator and the usage
        statistics around it. A connection returned in a transaction or mid-statement is rolled back or
        replaced by ``putconn``, as after ``connection()``."""
        return Lent(self)


class Lent:
    """A connection taken from a ``StackPool`` for the span of a ``with`` block."""

    __slots__ = ("_conn", "_pool")

    def __init__(self, pool: StackPool) -> None:
        self._pool = pool

    def __enter__(self) -> psycopg.Connection[Any]:
        self._conn = self._pool.getconn()
        return self._conn

    def __exit__(self, *exc: object) -> None:
        self._pool.putconn(self._conn)


class AsyncStackPool(AsyncConnectionPool[psycopg.AsyncConnection[Any]]):
    """An AsyncConnectionPool that hands out the connection returned last."""

    async def _get_ready_connection(self, timeout: float | None) -> psycopg.AsyncConnection[Any] | None:
        self._pool.rotate(1)
        return await super()._get_ready_connection(timeout)

    def lend(self) -> AsyncLent:
        """As ``StackPool.lend``, async."""
        return AsyncLent(self)


class AsyncLent:
    """A connection taken from an ``AsyncStackPool`` for the span of an ``async with`` block."""

    __slots__ = ("_conn", "_pool")

    def __init__(self, pool: AsyncStackPool) -> None:
        self._pool = pool

    async def __aenter__(self) -> psycopg.AsyncConnection[Any]:
        self._conn = await self._pool.getconn()
        return self._conn

    async def __aexit__(self, *exc: object) -> None:
        await self._pool.putconn(self._conn)
