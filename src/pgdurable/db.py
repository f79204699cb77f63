"""Connections for one App: a lazily opened sync pool, async pools per event loop, dedicated listeners."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Generator
from typing import Any, TypeVar

import psycopg
from psycopg import sql
from psycopg.types.string import TextLoader
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from . import citus, forks, store
from .display import register_loaders
from .migrations import applied_version, migrate_and_layout
from .pools import AsyncStackPool, StackPool
from .redaction import check_database_url

T = TypeVar("T")
P = TypeVar("P", bound=AsyncConnectionPool[Any])
# Statements that depend on each other's results, written once for both drivers: a generator that yields
# each store.Call and receives its result (run_plan and arun_plan run it, on one connection).
CallPlan = Generator["store.Call[Any]", Any, T]


def configure(conn: psycopg.Connection[Any], schema: str, distributed: bool | None = None) -> None:
    """Make a connection speak to pgdurable: its schema first on the search_path, jsonb kept as text, and
    any timestamptz loaded (infinity or a year past 9999 as display.ExtremeTime, not DataError).
    ``distributed``: whether the schema has the Citus layout (None: look it up on this connection)."""
    conn.adapters.register_loader("jsonb", TextLoader)
    register_loaders(conn.adapters)
    conn.execute(sql.SQL("SET search_path TO {}, public").format(sql.Identifier(schema)))
    if distributed is None:
        distributed = citus.has_layout(conn, schema)
    store.calls.remember_schema(conn, schema, distributed)


async def aconfigure(conn: psycopg.AsyncConnection[Any], schema: str, distributed: bool | None = None) -> None:
    conn.adapters.register_loader("jsonb", TextLoader)
    register_loaders(conn.adapters)
    await conn.execute(sql.SQL("SET search_path TO {}, public").format(sql.Identifier(schema)))
    if distributed is None:
        row = await (await conn.execute(*citus.layout_lookup(schema))).fetchone()
        distributed = bool(row and row[0])
    store.calls.remember_schema(conn, schema, distributed)


class Database:
    """The one place that opens connections. Migrates the schema on first use unless told not to."""

    def __init__(self, conninfo: Callable[[], str], schema: str, *, auto_migrate: bool = True,
                 pool_size: int = 4, citus_mode: str | None = None) -> None:
        self._conninfo_source = conninfo
        self._conninfo: str | None = None
        self.schema = schema
        self.auto_migrate = auto_migrate
        self.pool_size = pool_size
        self._lock = threading.RLock()
        self._pool: StackPool | None = None
        self._async_pools: dict[asyncio.AbstractEventLoop, AsyncStackPool] = {}
        # Connections for transactional steps: the application's own settings, untouched by pgdurable.
        self._app_pool: ConnectionPool[psycopg.Connection[Any]] | None = None
        self._app_async_pools: dict[asyncio.AbstractEventLoop, AsyncConnectionPool[Any]] = {}
        # One task per event loop that closes that loop's pools when the loop ends (see _watch_loop).
        self._loop_watchers: dict[asyncio.AbstractEventLoop, asyncio.Task[None]] = {}
        self._migrated = False
        self.citus_mode = citus_mode
        # The Citus layout's buckets, in shard order, once known (ensure_schema); None: a single-node schema.
        self.buckets: tuple[int, ...] | None = None
        forks.forget_in_forked_child(self)

    def _forget_inherited(self) -> list[Any]:
        """In a forked child: the parent's pools are the parent's (forks.py)."""
        dropped: list[Any] = [self._pool, self._app_pool, self._async_pools, self._app_async_pools,
                              self._loop_watchers]
        self._lock = threading.RLock()  # another thread may have held it at the fork
        self._pool = self._app_pool = None
        self._async_pools, self._app_async_pools, self._loop_watchers = {}, {}, {}
        engine = getattr(self, "_sa_engine", None)  # orm.py's; SQLAlchemy's own way to leave them be
        if engine is not None:
            engine.dispose(close=False)
        self.__dict__.pop("_sa_async_engines", None)
        return dropped

    @property
    def conninfo(self) -> str:
        if self._conninfo is None:
            with self._lock:
                if self._conninfo is None:
                    # A malformed URL is refused here, once, with its password redacted (libpq would quote it).
                    self._conninfo = check_database_url(self._conninfo_source())
        return self._conninfo

    @property
    def known_conninfo(self) -> str | None:
        """The connection string if it was resolved already (resolving may start the embedded server)."""
        return self._conninfo

    def ensure_schema(self) -> None:
        if not self._migrated:
            with self._lock:
                if self._migrated:
                    return
                # The layout decides which version of the named queries every connection runs.
                _, self.buckets = migrate_and_layout(self.conninfo, self.schema, apply=self.auto_migrate,
                                                     citus_mode=self.citus_mode)
                self._migrated = True

    @property
    def distributed(self) -> bool:
        """Whether the schema has the Citus layout (known once ensure_schema ran)."""
        return self.buckets is not None

    def check(self, connect_timeout: int = 10) -> int:
        """Connect once and return the schema's migration version: raises psycopg.OperationalError when the
        database does not answer (a worker that does not migrate checks this before it starts)."""
        with psycopg.connect(self.conninfo, autocommit=True, connect_timeout=connect_timeout) as conn:
            return applied_version(conn, self.schema)

    # -- sync ---------------------------------------------------------------------------------------------

    def connect(self) -> psycopg.Connection[Any]:
        """A dedicated autocommit connection (listeners, long-lived loops). The caller closes it."""
        self.ensure_schema()
        conn = store.calls.OwnConnection.connect(self.conninfo, autocommit=True)
        configure(conn, self.schema, self.distributed)
        return conn

    @property
    def pool(self) -> StackPool:
        if self._pool is None:
            with self._lock:
                if self._pool is None:
                    self.ensure_schema()
                    schema, distributed = self.schema, self.distributed
                    self._pool = StackPool(
                        self.conninfo, connection_class=store.calls.OwnConnection, min_size=1,
                        max_size=self.pool_size, open=True,
                        kwargs={"autocommit": True}, configure=lambda c: configure(c, schema, distributed),
                        name="pgdurable")
        return self._pool

    @property
    def app_pool(self) -> ConnectionPool[psycopg.Connection[Any]]:
        if self._app_pool is None:
            with self._lock:
                if self._app_pool is None:
                    self.ensure_schema()
                    self._app_pool = StackPool(self.conninfo, min_size=1, max_size=self.pool_size * 4,
                                               open=True, kwargs={"autocommit": True},
                                               name="pgdurable-transactions")
        return self._app_pool

    def run(self, call: store.Call[T]) -> T:
        with self.pool.lend() as conn:
            return store.run(conn, call)

    def run_plan(self, plan: CallPlan[T], *, transaction: bool = False) -> T:
        """Run the statements of ``plan`` on one connection (all in one transaction with ``transaction``)."""
        with self.pool.lend() as conn, conn.transaction() if transaction else contextlib.nullcontext():
            result: Any = None
            while True:
                try:
                    call = plan.send(result)
                except StopIteration as done:
                    return done.value  # type: ignore[no-any-return]
                result = store.run(conn, call)

    # -- async --------------------------------------------------------------------------------------------

    async def aconnect(self) -> psycopg.AsyncConnection[Any]:
        await asyncio.to_thread(self.ensure_schema)
        conn = await store.calls.AsyncOwnConnection.connect(self.conninfo, autocommit=True)
        await aconfigure(conn, self.schema, self.distributed)
        return conn

    async def async_pool(self, size: int | None = None) -> AsyncStackPool:
        """The async pool of the running event loop (async pools cannot be shared across loops)."""
        pool = self._async_pools.get(asyncio.get_running_loop())
        return pool if pool is not None else await self._open_loop_pool(self._async_pools,
                                                                        lambda: self._new_async_pool(size))

    async def app_async_pool(self) -> AsyncConnectionPool[Any]:
        pool = self._app_async_pools.get(asyncio.get_running_loop())
        return pool if pool is not None else await self._open_loop_pool(self._app_async_pools,
                                                                        self._new_app_async_pool)

    def _new_app_async_pool(self) -> AsyncConnectionPool[Any]:
        return AsyncStackPool(self.conninfo, min_size=1, max_size=self.pool_size * 4, open=False,
                              kwargs={"autocommit": True}, name="pgdurable-transactions-async")

    def _new_async_pool(self, size: int | None) -> AsyncStackPool:
        schema, distributed = self.schema, self.distributed

        async def _configure(conn: psycopg.AsyncConnection[Any]) -> None:
            await aconfigure(conn, schema, distributed)

        return AsyncStackPool(
            self.conninfo, connection_class=store.calls.AsyncOwnConnection, min_size=1,
            max_size=size or self.pool_size, open=False,
            kwargs={"autocommit": True}, configure=_configure, name="pgdurable-async")

    async def _open_loop_pool(self, pools: dict[asyncio.AbstractEventLoop, P], make: Callable[[], P]) -> P:
        """The running loop's pool in ``pools``, made (``make``, once the schema is known) unless a task of this
        loop made it while this one waited; closed when the loop ends (_watch_loop)."""
        loop = asyncio.get_running_loop()
        await asyncio.to_thread(self.ensure_schema)
        pool = pools.get(loop)
        if pool is None:
            pool = make()
            await pool.open()
            pool = await _keep_first(pools, loop, pool)
            self._watch_loop(loop)
        return pool

    async def arun(self, call: store.Call[T]) -> T:
        pool = await self.async_pool()
        async with pool.lend() as conn:
            return await store.arun(conn, call)

    async def arun_plan(self, plan: CallPlan[T], *, transaction: bool = False) -> T:
        pool = await self.async_pool()
        async with pool.lend() as conn, conn.transaction() if transaction else contextlib.nullcontext():
            result: Any = None
            while True:
                try:
                    call = plan.send(result)
                except StopIteration as done:
                    return done.value  # type: ignore[no-any-return]
                result = await store.arun(conn, call)

    async def aclose_loop_pool(self) -> None:
        """Close the running loop's pools now (the loop's end closes them otherwise)."""
        loop = asyncio.get_running_loop()
        watcher = self._loop_watchers.pop(loop, None)
        if watcher is not None and watcher is not asyncio.current_task():
            watcher.cancel()
            await asyncio.wait([watcher])  # it closes the pools; wait() does not raise its cancellation
        await self._close_pools_of(loop)

    def _watch_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Close ``loop``'s pools when the loop ends. ``asyncio.run`` cancels every task still pending once
        its coroutine returns, and waits for them: a psycopg_pool worker cancelled while it makes a
        connection swallows the cancellation and waits for its next task forever, so a script that ends
        with one (``asyncio.run(app.enqueue_async(...))``) would never return, and every such run would
        leave its connections open. This task, cancelled with the others, closes the pools, which stops
        their workers. Loops closed without cancelling their tasks are forgotten here, dropping their pools."""
        # list(): a copy, as other threads may register their loops meanwhile.
        for gone in [other for other in list(self._loop_watchers) if other.is_closed()]:
            self._loop_watchers.pop(gone, None)
            self._async_pools.pop(gone, None)
            self._app_async_pools.pop(gone, None)
        if loop not in self._loop_watchers:
            self._loop_watchers[loop] = loop.create_task(self._close_when_cancelled(loop),
                                                         name="pgdurable-loop-pools")

    async def _close_when_cancelled(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            self._loop_watchers.pop(loop, None)
            await self._close_pools_of(loop)

    async def _close_pools_of(self, loop: asyncio.AbstractEventLoop) -> None:
        for pools in (self._async_pools, self._app_async_pools):
            pool = pools.pop(loop, None)
            if pool is not None:
                await pool.close()

    def close(self) -> None:
        engine = getattr(self, "_sa_engine", None)  # SQLAlchemy's, made by orm.py for Session-typed steps
        if engine is not None:
            engine.dispose()
        for pool in (self._pool, self._app_pool):
            if pool is not None:
                pool.close()
        self._pool = self._app_pool = None


async def _keep_first(pools: dict[asyncio.AbstractEventLoop, P], loop: asyncio.AbstractEventLoop, pool: P) -> P:
    """Register a new pool for ``loop``, unless another task of that loop registered one while this one was
    being made (both awaited on the way): then close this one and use that one. Overwriting it instead would
    leave it unreferenced, with its connections open and its worker tasks pending until collected."""
    kept = pools.setdefault(loop, pool)
    if kept is not pool:
        await pool.close()
    return kept
