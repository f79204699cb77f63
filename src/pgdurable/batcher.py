"""Group commit for one worker: the checkpoints and completions of all its running executions, written
together in one statement on one connection.

While a write is in flight, new ones queue up and go out together in the next statement, so a lone
workflow pays one round trip per step and a busy worker pays one commit for many steps. Heartbeats run on
the same connection between batches: the worker's writes to its own rows never race each other.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import psycopg

from . import store

log = logging.getLogger("pgdurable.worker")
T = TypeVar("T")

# A batch that fails is retried this many times (reconnecting) before its writers are told it failed.
_FLUSH_ATTEMPTS = 3
_MAX_BATCH = 2000


@dataclass(slots=True)
class StepWrite:
    execution_id: str
    attempt: int
    step_id: int
    step_name: str
    output: str | None
    error: str | None
    tries: int
    started_at: datetime


@dataclass(slots=True)
class Completion:
    execution_id: str
    attempt: int
    status: str
    output: str | None
    error: str | None


class ThreadWaiter:
    """A one-shot result for a workflow thread: a held lock released by the writer. Much cheaper to wake
    than a concurrent.futures.Future (no condition variable, no callbacks)."""

    __slots__ = ("_lock", "_result")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self._result: bool | None = None

    def done(self) -> bool:
        return self._result is not None

    def set_result(self, result: bool) -> None:
        self._result = result
        self._lock.release()

    def result(self) -> bool:
        self._lock.acquire()
        assert self._result is not None
        return self._result


Write = StepWrite | Completion
Waiter = asyncio.Future[bool] | ThreadWaiter


class WriteBatcher:
    def __init__(self, connect: Callable[[], Awaitable[psycopg.AsyncConnection[Any]]]) -> None:
        self._connect = connect
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._conn_lock = asyncio.Lock()
        self._pending: list[tuple[Write, Waiter]] = []
        self._pending_lock = threading.Lock()
        self._scheduled = False
        self._kick = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.create_task(self._flush_loop(), name="pgdurable-writer")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._conn is not None:
            await self._conn.close()

    # -- submitting ---------------------------------------------------------------------------------------

    def submit(self, write: Write) -> asyncio.Future[bool]:
        """From the event loop: a future that is True once the write committed, False if it was fenced."""
        assert self._loop is not None
        future: asyncio.Future[bool] = self._loop.create_future()
        if self._enqueue(write, future):
            self._kick.set()
        return future

    def submit_threadsafe(self, write: Write) -> ThreadWaiter:
        """From a workflow thread: wait on ``.result()``. Wakes the loop only when the writer is idle."""
        assert self._loop is not None
        future = ThreadWaiter()
        if self._enqueue(write, future):
            self._loop.call_soon_threadsafe(self._kick.set)
        return future

    def _enqueue(self, write: Write, waiter: Waiter) -> bool:
        """Queue a write; True when the flusher must be woken (it is not already going to look)."""
        with self._pending_lock:
            self._pending.append((write, waiter))
            if self._scheduled:
                return False
            self._scheduled = True
            return True

    async def run(self, call: store.Call[T]) -> T:
        """Run another statement (a heartbeat) on the writer's connection, between batches."""
        async with self._conn_lock:
            conn = await self._connection()
            return await store.arun(conn, call)

    # -- flushing -----------------------------------------------------------------------------------------

    async def _flush_loop(self) -> None:
        while True:
            await self._kick.wait()
            self._kick.clear()
            while True:
                with self._pending_lock:
                    batch, self._pending = self._pending[:_MAX_BATCH], self._pending[_MAX_BATCH:]
                    if not batch:
                        self._scheduled = False
                        break
                await self._flush(batch)

    async def _flush(self, batch: list[tuple[Write, Waiter]]) -> None:
        calls = _batch_calls([write for write, _ in batch])
        written: set[tuple[str, int | None]] = set()
        failure: BaseException | None = None
        for attempt in range(1, _FLUSH_ATTEMPTS + 1):
            try:
                async with self._conn_lock:
                    conn = await self._connection()
                    if len(calls) == 1:
                        written = await store.arun(conn, calls[0])
                    else:  # both kinds: one transaction, so still one commit
                        async with conn.transaction():
                            written = set()
                            for call in calls:
                                rows: set[tuple[str, int | None]] = await store.arun(conn, call)
                                written.update(rows)
                failure = None
                break
            except psycopg.Error as exc:
                failure = exc
                log.warning("write batch of %d failed (attempt %d): %s", len(batch), attempt, exc)
                await self._drop_connection()
                await asyncio.sleep(0.2 * attempt)
        for write, waiter in batch:
            if failure is not None:
                _resolve(waiter, False)  # the writer stops; the lease runs out and another attempt resumes
                continue
            key = (write.execution_id, write.step_id if isinstance(write, StepWrite) else None)
            _resolve(waiter, key in written)

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = await self._connect()
        return self._conn

    async def _drop_connection(self) -> None:
        if self._conn is not None:
            try:
                await self._conn.close()
            finally:
                self._conn = None


def _resolve(waiter: Waiter, ok: bool) -> None:
    if not waiter.done():
        waiter.set_result(ok)


def _batch_calls(writes: list[Write]) -> list[store.Call[set[tuple[str, int | None]]]]:
    steps = [_step_row(w) for w in writes if isinstance(w, StepWrite)]
    done = [_completion_row(w) for w in writes if isinstance(w, Completion)]
    calls = []
    if steps:
        calls.append(store.write_steps("[" + ",".join(steps) + "]"))
    if done:
        calls.append(store.write_completions("[" + ",".join(done) + "]"))
    return calls


# Outputs and errors are already JSON text: they are spliced in as they are, not parsed and re-encoded.

def _step_row(w: StepWrite) -> str:
    head = json.dumps([w.execution_id, w.attempt, w.step_id, w.step_name, w.tries, w.started_at.isoformat()])
    return f"{head[:-1]},{w.output or 'null'},{w.error or 'null'}]"


def _completion_row(w: Completion) -> str:
    head = json.dumps([w.execution_id, w.attempt, w.status])
    return f"{head[:-1]},{w.output or 'null'},{w.error or 'null'}]"
