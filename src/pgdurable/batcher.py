"""Group commit for one worker: the checkpoints and completions of all its running executions, written
together in one statement (on a schema with the Citus layout, one transaction per bucket: see ``_Plan``).

While a batch is in flight, new writes queue up and go out together in the next one, so a lone workflow
pays one round trip per step and a busy worker pays one commit for many steps. Exactly one batch runs at a
time, and the worker's other statements on its own rows (heartbeats, release) go through the same queue,
so those writes never race each other (no lock-order deadlocks between them).

Who runs a batch: when a workflow thread finds the writer idle, it runs the batch itself on a sync
connection (no hop to the event loop and back); otherwise the event loop's flusher does, on an async
connection. Both execute the same ``store.Call`` values.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg

from . import store
from .batch_plan import FLUSH_ATTEMPTS as _FLUSH_ATTEMPTS
from .batch_plan import Completion, Item, Statement, StepWrite, ThreadWaiter, Waiter, _Plan
from .errors import LeaseLost
from .waiting import cancel_and_wait

# The items and waiters are batch_plan's; they are imported from here too.
__all__ = ["LINGER_SECONDS", "Completion", "Item", "Statement", "StepWrite", "ThreadWaiter", "Waiter",
           "WriteBatcher", "_Plan"]

log = logging.getLogger("pgdurable.worker")
T = TypeVar("T")

_MAX_BATCH = 2000
# The buckets of execution ids a writer remembers (Citus), at most: then it forgets them all and asks again.
_MAX_BUCKETS = 50_000
# A deferred write (``defer``) waits at most about this long for another write to take it along, then is
# written on its own: it bounds how long a step that returned can go unrecorded (see ``defer``).
LINGER_SECONDS = 0.005
# The ticker that enforces LINGER_SECONDS stops after this many ticks without a deferred write.
_IDLE_TICKS = 200
# Gathering: a workflow thread about to lead a batch (``_lead``) first waits, at most GATHER_SECONDS, for the
# worker's other running executions to queue a write each, when at least GATHER_JOINERS of them have none
# queued yet: their writes then share its commit (one WAL flush). Every commit waits for its flush, and so does
# every other transaction committing meanwhile (an application enqueuing beside the worker), so fewer, fuller
# commits leave the disk to them. The wait ends as soon as every running execution has a write queued, so a
# few workflows stepping in lockstep lose nothing. The event loop's flusher does not gather: asyncio sleeps no
# shorter than a millisecond, and that pause made eight workflows stepping together 20% slower. (PostgreSQL's
# commit_delay and commit_siblings do the like on the server.) Measured in docs/benchmarks.md, "Durable time
# inlined, and a busy worker's writes gathered".
GATHER_SECONDS = 0.0005
GATHER_JOINERS = 2


class WriteBatcher:
    def __init__(self, aconnect: Callable[[], Awaitable[psycopg.AsyncConnection[Any]]],
                 connect: Callable[[], psycopg.Connection[Any]], running: Callable[[], int] = lambda: 0) -> None:
        """``running``: how many executions of the worker are running their code (they may write soon)."""
        self._aconnect = aconnect
        self._connect = connect
        self._running = running
        # A workflow thread gathering a batch's writes (see _gather), and what wakes it: a write queued.
        self._gathering = False
        self._joined = threading.Event()
        self._aconn: psycopg.AsyncConnection[Any] | None = None
        self._conn: psycopg.Connection[Any] | None = None
        self._pending: list[tuple[Item, Waiter]] = []
        self._lock = threading.Lock()
        self._busy = False  # a batch is running or the loop's flusher has been told to run one
        self._kick = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._buckets: dict[str, int] = {}  # execution id -> its bucket, on a schema with the Citus layout
        # (execution id, attempt) of deferred step checkpoints that were not written (see _Plan.lost_steps).
        self._lost_steps: dict[tuple[str, int], BaseException | None] = {}
        self._closed = False  # the writer has stopped: whatever is submitted now is not written
        # Deferred writes: the ticker that writes them when nothing else does, and when it last saw one.
        self._ticking = False
        self._idle_ticks = 0
        self._waiting_since: float | None = None  # when the oldest write now pending was deferred

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.create_task(self._flush_loop(), name="pgdurable-writer")

    async def close(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])
        # Nothing writes any more: what is still pending (submitted while the last batch ran, or since) is
        # settled as not written, or a workflow thread would wait on it forever, and with it the process's exit.
        with self._lock:
            self._closed = True
            left, self._pending = self._pending, []
        _not_written(left)
        if self._aconn is not None:
            await self._aconn.close()
        if self._conn is not None:
            self._conn.close()

    # -- submitting ---------------------------------------------------------------------------------------

    def submit(self, write: StepWrite | Completion) -> asyncio.Future[bool]:
        """From the event loop: True once the write committed, False if it was fenced (or failed)."""
        return self._submit_on_loop(write)

    async def run(self, call: store.Call[T]) -> T:
        """Run a statement on the worker's own rows between batches (heartbeat, release)."""
        result: T = await self._submit_on_loop(Statement(call))
        return result

    def _submit_on_loop(self, item: Item) -> asyncio.Future[Any]:
        assert self._loop is not None
        future: asyncio.Future[Any] = self._loop.create_future()
        with self._lock:
            if self._closed:
                _not_written([(item, future)])
                return future
            self._pending.append((item, future))
            idle, self._busy = not self._busy, True
        self._wake_gatherer()
        if idle:
            self._kick.set()
        return future

    def submit_threadsafe(self, write: StepWrite | Completion) -> ThreadWaiter:
        """From a workflow thread: wait on ``.result()``. If the writer is idle, this thread runs the batch."""
        return self.submit_all_threadsafe([write])[0]

    def run_threadsafe(self, call: store.Call[T]) -> ThreadWaiter:
        """From a workflow thread: ``run`` a statement on the worker's own rows; wait on ``.result()``."""
        return self.submit_all_threadsafe([Statement(call)])[0]

    def submit_all_threadsafe(self, items: list[Item]) -> list[ThreadWaiter]:
        """Several items at once, so that they go out in one batch."""
        waiters = [ThreadWaiter() for _ in items]
        with self._lock:
            if self._closed:
                _not_written(list(zip(items, waiters, strict=True)))
                return waiters
            self._pending.extend(zip(items, waiters, strict=True))
            idle, self._busy = not self._busy, True
        self._wake_gatherer()
        if idle:
            self._lead()
        return waiters

    def submit_all(self, items: list[Item]) -> list[asyncio.Future[Any]]:
        """From the event loop: several items at once, so that they go out in one batch."""
        return [self._submit_on_loop(item) for item in items]

    # -- deferring -----------------------------------------------------------------------------------------

    def defer(self, write: StepWrite) -> Waiter:
        """Queue a step checkpoint without starting a batch for it: the next batch takes it along (whoever
        starts it: the same execution's next write or completion, or any other execution's write), or, if
        none comes, the ticker writes it within about LINGER_SECONDS. From the event loop the waiter is a
        future, from a workflow thread a ThreadWaiter; ``hurry`` before waiting on it."""
        on_loop = self._loop is not None and getattr(self._loop, "_thread_id", None) == threading.get_ident()
        waiter: Waiter
        if on_loop:
            assert self._loop is not None
            waiter = self._loop.create_future()
        else:
            waiter = ThreadWaiter()
        with self._lock:
            if self._closed:
                _not_written([(write, waiter)])
                return waiter
            if not self._pending or self._waiting_since is None:
                self._waiting_since = time.monotonic()
            self._pending.append((write, waiter))
            self._idle_ticks = 0
            start = not self._ticking and self._loop is not None  # (no loop: a unit test's writer)
            self._ticking = self._ticking or start
        self._wake_gatherer()
        if start:
            if on_loop:
                self._tick()
            else:
                self._call_loop(self._tick)
        return waiter

    def hurry_threadsafe(self) -> None:
        """From a workflow thread about to wait on deferred writes: if no batch runs, run one now."""
        if self._take_idle():
            self._lead()

    def hurry(self) -> None:
        """From the event loop, as ``hurry_threadsafe``: the loop's flusher runs the batch."""
        if self._take_idle():
            self._kick.set()

    def _take_idle(self) -> bool:
        """Whether writes wait and no batch runs: then the writer is marked busy, and the caller starts one."""
        with self._lock:
            idle = not self._busy and bool(self._pending)
            if idle:
                self._busy = True
        return idle

    def _tick(self) -> None:
        """On the loop, every LINGER_SECONDS while writes are deferred: start a batch for deferred writes that
        waited that long with no batch running (a running batch takes them when it ends)."""
        with self._lock:
            if self._closed or (not self._pending and self._idle_ticks >= _IDLE_TICKS):
                self._ticking = False
                return
            self._idle_ticks += 1
            due = (not self._busy and bool(self._pending) and self._waiting_since is not None
                   and time.monotonic() - self._waiting_since >= LINGER_SECONDS)
            if due:
                self._busy = True
        if due:
            self._kick.set()
        assert self._loop is not None
        self._loop.call_later(LINGER_SECONDS, self._tick)

    # -- flushing -----------------------------------------------------------------------------------------

    def _take(self) -> list[tuple[Item, Waiter]]:
        """The next batch; when there is none, the writer becomes idle. Call with the lock held."""
        batch, self._pending = self._pending[:_MAX_BATCH], self._pending[_MAX_BATCH:]
        if not batch:
            self._busy = False
        self._waiting_since = time.monotonic() if self._pending else None
        return batch

    def _plan(self, batch: list[tuple[Item, Waiter]]) -> _Plan:
        if len(self._buckets) > _MAX_BUCKETS:
            self._buckets.clear()
        if len(self._lost_steps) > _MAX_BUCKETS:  # long over: their attempts have ended
            self._lost_steps.clear()
        return _Plan(batch, self._buckets, self._lost_steps)

    def _wake_gatherer(self) -> None:
        """After queueing a write: a leader gathering a batch looks again whether anyone is left to join."""
        if self._gathering:
            self._joined.set()

    def _joiners(self) -> int:
        """How many running executions have no write waiting: they could still join the next batch."""
        with self._lock:
            waiting = len({item.execution_id for item, _ in self._pending if not isinstance(item, Statement)})
        return self._running() - waiting

    def _gather(self) -> None:
        """From a workflow thread about to lead a batch: if at least GATHER_JOINERS executions could join it,
        wait until none can any more (each has a write waiting), at most GATHER_SECONDS."""
        # (The leader's own execution is one of the running ones, and has its write queued.)
        if self._running() <= GATHER_JOINERS or self._joiners() < GATHER_JOINERS:
            return
        deadline = time.monotonic() + GATHER_SECONDS
        self._gathering = True
        try:
            while (left := deadline - time.monotonic()) > 0:
                self._joined.clear()
                if self._joiners() <= 0:
                    return
                self._joined.wait(left)
        finally:
            self._gathering = False

    def _lead(self) -> None:
        """In a workflow thread that found the writer idle: run one batch, hand any rest to the loop."""
        self._gather()
        with self._lock:
            batch = self._take()
        if not batch:
            return
        plan = self._plan(batch)
        for attempt in range(1, _FLUSH_ATTEMPTS + 1):
            try:
                if self._conn is None or self._conn.closed:
                    if self._closed:  # the worker stopped meanwhile: no new connection for it
                        plan.failure = _stopped()
                        break
                    self._conn = self._connect()
                plan.execute(self._conn)
                break
            except Exception as exc:  # the connection (psycopg.Error), or a bug: never lose the waiters
                plan.failed(exc, attempt)
                if not _reusable(self._conn):
                    self._conn = None
                time.sleep(0.2 * attempt)
        plan.settle(self._loop)
        with self._lock:
            more = bool(self._pending)
            if not more:
                self._busy = False
        if more:  # our own write is done: let the loop's flusher carry on with the rest
            self._call_loop(self._kick.set)

    async def _flush_loop(self) -> None:
        while True:
            await self._kick.wait()
            self._kick.clear()
            while True:
                with self._lock:
                    batch = self._take()
                if not batch:
                    break
                await self._flush(batch)

    async def _flush(self, batch: list[tuple[Item, Waiter]]) -> None:
        plan = self._plan(batch)
        try:
            for attempt in range(1, _FLUSH_ATTEMPTS + 1):
                try:
                    if self._aconn is None or self._aconn.closed:
                        self._aconn = await self._aconnect()
                    await plan.aexecute(self._aconn)
                    break
                except Exception as exc:  # the connection (psycopg.Error), or a bug: never lose the waiters
                    plan.failed(exc, attempt)
                    if not _reusable(self._aconn):
                        self._aconn = None
                    await asyncio.sleep(0.2 * attempt)
        except asyncio.CancelledError:  # the worker stops: this batch's waiters must still hear of it
            plan.failure = plan.failure or _stopped()
            plan.settle(None)
            raise
        plan.settle(None)

    def _call_loop(self, callback: Callable[[], None]) -> None:
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # a closed loop: the worker is exiting
            self._loop.call_soon_threadsafe(callback)


def _stopped() -> LeaseLost:
    return LeaseLost("the worker stopped before this was written; the execution resumes from its checkpoints")


def _not_written(batch: list[tuple[Item, Waiter]]) -> None:
    """Settle a batch the writer will never run (it has stopped), on the caller's thread or loop: writes as
    not written (their workflow stops), statements with LeaseLost."""
    if batch:
        plan = _Plan(batch)
        plan.failure = _stopped()
        plan.settle(None)


def _reusable(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any] | None) -> bool:
    """Whether the writer's connection may run the batch's next attempt: a statement cancelled (a timeout, a
    pg_cancel_backend) leaves it whole and idle. A new session would cost more than the retry: on Citus its
    first statement also connects to the worker nodes, which under a short statement_timeout is cancelled in
    turn (and so is the first statement after a cancel, which Citus answers by dropping its node connection)."""
    return (conn is not None and not conn.closed and not conn.broken
            and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE)

