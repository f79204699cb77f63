"""Connection pools that hand out the connection returned last (a stack), not the one idle longest.

psycopg_pool keeps its idle connections in a queue: a caller that enqueues one workflow after another gets a
different server process each time, and every one of them runs with cold caches (its own plans, catalog
entries and PL/pgSQL functions, and the CPU's). Handing out the most recently returned connection keeps the
work on as few processes as the concurrency needs; the others stay idle, and the pool's own shrinking
(``max_idle``) closes the longest idle first, as before. SQLAlchemy's ``pool_use_lifo`` and node-postgres do
the same. Measured (docs/benchmarks.md): one-at-a-time ``app.enqueue`` with two pooled connections 0.66-0.70
ms a call, 0.50-0.59 ms with this order.

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


class AsyncStackPool(AsyncConnectionPool[psycopg.AsyncConnection[Any]]):
    """An AsyncConnectionPool that hands out the connection returned last."""

    async def _get_ready_connection(self, timeout: float | None) -> psycopg.AsyncConnection[Any] | None:
        self._pool.rotate(1)
        return await super()._get_ready_connection(timeout)
