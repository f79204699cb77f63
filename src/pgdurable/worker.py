"""The worker: claims executions, runs them, heartbeats their leases, sweeps expired ones, shuts down cleanly.

One asyncio loop per worker process. Async workflows run as tasks on it; sync workflows run in a thread
pool and hand their checkpoint writes to the loop, so every database write goes through one code path.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import signal
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
from psycopg import sql

from . import failures, store
from .batcher import Completion, WriteBatcher
from .context import ExecutionContext
from .errors import LeaseLost
from .scheduler import Scheduler

if TYPE_CHECKING:
    from psycopg_pool import AsyncConnectionPool

    from .app import App
    from .workflows import Workflow

log = logging.getLogger("pgdurable.worker")
T = TypeVar("T")

_IDLE_TIMEOUT_SQL = "SELECT set_config('idle_in_transaction_session_timeout', %s, false)"

# Claim at most this many executions per round trip.
_CLAIM_BATCH = 64
# A busy worker claims at most this often while few slots are free or its queue keeps running dry.
_CLAIM_COALESCE_SECONDS = 0.005


@dataclass
class Running:
    claimed: store.Claimed
    context: ExecutionContext
    task: asyncio.Task[None] | None = None


class Worker:
    """Runs the workflows registered on ``app`` from the given queues (default: every queue they use)."""

    def __init__(self, app: App, *, queues: list[str] | None = None, concurrency: int = 16,
                 claim: bool = True) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.app = app
        self.settings = app.settings
        self.id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.names = app.registry.names()
        self.queues = sorted(set(queues or {wf.queue for wf in app.registry.workflows.values()} or {"default"}))
        self.concurrency = concurrency
        self.claims = claim
        self.running: dict[str, Running] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self._pool: AsyncConnectionPool[Any] | None = None
        self._batcher: WriteBatcher | None = None
        self._scheduler: Scheduler | None = None
        self._next_queue = 0
        self._threads = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="pgdurable-workflow")
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        self._stop_requests = 0
        self._started = asyncio.Event()
        # Sync workflows inside a thread right now. Counted in the thread itself: a released workflow's task
        # is cancelled at loop shutdown while its thread runs on, so self.running no longer shows it.
        self._busy_threads = 0
        self._busy_lock = threading.Lock()

    # -- database -----------------------------------------------------------------------------------------

    async def _run(self, call: store.Call[T]) -> T:
        assert self._pool is not None
        async with self._pool.connection() as conn:
            return await store.arun(conn, call)

    # A batch holding both checkpoints and completions is one transaction over two round trips, with the
    # execution rows locked: a worker paused in between must not hold them past its lease, so the server
    # ends a writer session that idles in a transaction that long.
    def _writer_connect(self) -> psycopg.Connection[Any]:
        conn = self.app.db.connect()
        conn.execute(_IDLE_TIMEOUT_SQL, (str(int(self.settings.lease_seconds * 1000)),))
        return conn

    async def _writer_aconnect(self) -> psycopg.AsyncConnection[Any]:
        conn = await self.app.db.aconnect()
        await conn.execute(_IDLE_TIMEOUT_SQL, (str(int(self.settings.lease_seconds * 1000)),))
        return conn

    # -- lifecycle ----------------------------------------------------------------------------------------

    async def run(self, *, handle_signals: bool = False) -> None:
        """Work until ``stop()`` (or SIGTERM/SIGINT when ``handle_signals``), then shut down gracefully."""
        self.loop = asyncio.get_running_loop()
        self._pool = await self.app.db.async_pool(size=4)
        self._batcher = WriteBatcher(self._writer_aconnect, self._writer_connect)
        await self._batcher.start()
        if handle_signals:
            for signum in (signal.SIGTERM, signal.SIGINT):
                self.loop.add_signal_handler(signum, self.stop)
        background = [asyncio.create_task(self._heartbeat_loop(), name="pgdurable-heartbeat")]
        if self.claims:
            await self._run(store.register_worker(
                id=self.id, hostname=socket.gethostname(), pid=os.getpid(), queues=self.queues,
                workflows=self.names, concurrency=self.concurrency))
            self._scheduler = Scheduler(self.app, self._pool, self.id)
            background += [asyncio.create_task(self._listen_loop(), name="pgdurable-listen"),
                           asyncio.create_task(self._sweep_loop(), name="pgdurable-sweep"),
                           asyncio.create_task(self._scheduler.run(), name="pgdurable-schedules")]
            log.info("worker %s: queues %s, %d workflows, concurrency %d",
                     self.id, ",".join(self.queues), len(self.names), self.concurrency)
        self._started.set()
        try:
            if self.claims:
                await self._claim_loop()
            else:
                await self._stop.wait()
        finally:
            await self._shutdown(background)

    def stop(self) -> None:
        """Ask the worker to stop: no new claims, a grace period, then release. A second call exits now."""
        self._stop_requests += 1
        if self._stop_requests > 1:
            log.warning("worker %s: second stop signal, exiting at once", self.id)
            os._exit(130)
        log.info("worker %s: stopping (grace %.0fs)", self.id, self.settings.shutdown_grace_seconds)
        self._stop.set()
        self._wake.set()

    def stop_threadsafe(self) -> None:
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.stop)

    async def _shutdown(self, background: list[asyncio.Task[None]]) -> None:
        pending = [r.task for r in self.running.values() if r.task is not None]
        if pending:
            await asyncio.wait(pending, timeout=self.settings.shutdown_grace_seconds)
        leftover = list(self.running.values())
        if leftover:
            for running in leftover:
                running.context.lost = True  # sync workflows stop at their next checkpoint
                if running.task is not None and running.claimed.name in self._async_names():
                    running.task.cancel()
            assert self._batcher is not None  # on the writer's connection: never races a batch on these rows
            try:
                released = await self._batcher.run(
                    store.release(owner=self.id, ids=[r.claimed.id for r in leftover]))
                log.info("worker %s: released %d unfinished executions to the queue", self.id, len(released))
            except Exception as exc:  # the database is out of reach: their leases expire and they are swept
                log.warning("worker %s: could not release %d unfinished executions (%s); they resume elsewhere "
                            "once their leases expire", self.id, len(leftover), exc)
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        # Whatever fails below, the pools must be closed: an open pool's tasks swallow cancellation, so the
        # event loop could never finish and the process would hang instead of exiting.
        try:
            if self._batcher is not None:
                await self._batcher.close()
            if self.claims:
                await self._deregister()
        finally:
            self._threads.shutdown(wait=False, cancel_futures=True)
            await self.app.db.aclose_loop_pool()

    async def _deregister(self) -> None:
        # Pooled connections may have been cut (server restart, pg_terminate_backend); each failure drops one.
        for attempt in range(1, 4):
            try:
                await self._run(store.deregister_worker(self.id))
                return
            except Exception as exc:
                if attempt == 3:
                    log.warning("worker %s: could not deregister (%s); the registry shows it stale", self.id, exc)
                else:
                    await asyncio.sleep(0.1 * attempt)

    def _async_names(self) -> set[str]:
        return {wf.name for wf in self.app.registry.workflows.values() if wf.is_async}

    @property
    def busy_threads(self) -> int:
        """Sync workflows still running in threads (a released one runs on until its next checkpoint)."""
        return self._busy_threads

    # -- claiming -----------------------------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        lease = self.settings.lease_seconds
        batch_floor = max(1, self.concurrency // 4)
        last_claim, last_was_short = 0.0, False
        lost_connections = 0
        while not self._stop.is_set():
            # Clear before claiming: a NOTIFY that arrives during the claim still wakes the next wait.
            self._wake.clear()
            free = self.concurrency - len(self.running)
            limit = min(free, _CLAIM_BATCH)
            if limit > 0 and self.running and (limit < batch_floor or last_was_short):
                # Busy, and either few slots are free or the queue was just drained: let wake-ups (NOTIFYs,
                # completions) pile up for a moment so that claims come in batches. An idle worker claims
                # at once.
                pause = last_claim + _CLAIM_COALESCE_SECONDS - time.monotonic()
                if pause > 0:
                    await asyncio.sleep(pause)
                    continue
            if limit > 0:
                # One queue per claim (equality keeps the claim an ordered index scan); take turns.
                queue = self.queues[self._next_queue % len(self.queues)]
                self._next_queue += 1
                last_claim = time.monotonic()
                try:
                    claimed = await self._run(store.claim(
                        queue=queue, names=self.names, owner=self.id, lease=lease, limit=limit))
                    last_was_short = len(claimed) < limit
                    lost_connections = 0
                except psycopg.OperationalError as exc:
                    # A lost connection (server restart, terminated backend): the pool drops it, and others
                    # it holds may be dead too. Retry soon, backing off while the server stays away.
                    lost_connections += 1
                    log.warning("worker %s: claim failed (%s); retrying", self.id, exc)
                    await asyncio.sleep(min(0.05 * 2 ** (lost_connections - 1), 1.0))
                    continue
                except Exception:
                    log.exception("worker %s: claim failed; retrying", self.id)
                    await asyncio.sleep(1.0)
                    continue
                if claimed:
                    if not await self._launch(claimed):
                        await asyncio.sleep(1.0)  # as after a failed claim
                        continue
                    if len(claimed) == limit:
                        continue  # there may be more waiting
                if len(self.queues) > 1 and self._next_queue % len(self.queues):
                    continue  # look at the other queues before sleeping
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.settings.poll_seconds)

    async def _launch(self, claimed: list[store.Claimed]) -> bool:
        """Start the claimed executions; False if they could not be started (and were handed back)."""
        resumed = [c.id for c in claimed if c.attempt > 1]
        try:
            recorded = await self._run(store.load_steps(resumed)) if resumed else {}
        except Exception as exc:
            # Not knowing their checkpoints, do not run them: hand them back to the queue at once (if that
            # fails too, their leases expire and they are swept). The claim loop carries on.
            log.warning("worker %s: could not load the checkpoints of %d resumed executions (%s); releasing "
                        "the %d just claimed", self.id, len(resumed), exc, len(claimed))
            assert self._batcher is not None
            with contextlib.suppress(Exception):
                await self._batcher.run(store.release(owner=self.id, ids=[c.id for c in claimed]))
            return False
        for execution in claimed:
            self.adopt(execution, recorded.get(execution.id, {}))
        return True

    def adopt(self, claimed: store.Claimed, recorded: dict[int, store.RecordedStep]) -> asyncio.Task[None]:
        """Run an execution this worker owns (claimed, or started in-process by App.start)."""
        assert self.loop is not None and self._batcher is not None
        context = ExecutionContext(
            execution_id=claimed.id, workflow_name=claimed.name, attempt=claimed.attempt, recorded=recorded,
            serializer=self.app.serializer, batcher=self._batcher, loop=self.loop)
        running = Running(claimed, context)
        self.running[claimed.id] = running
        running.task = asyncio.create_task(self._execute(running), name=f"pgdurable:{claimed.id}")
        return running.task

    async def adopt_new(self, claimed: store.Claimed) -> None:
        """Entry point for App.start from another thread: a new execution has no recorded steps."""
        await self._started.wait()
        self.adopt(claimed, {})

    # -- executing ----------------------------------------------------------------------------------------

    async def _execute(self, running: Running) -> None:
        claimed, context = running.claimed, running.context
        workflow = self.app.registry.get(claimed.name)
        try:
            if workflow is None:  # claim filters by name, so only an in-process start can get here
                raise LookupError(f"workflow {claimed.name!r} is not registered in this process")
            try:
                value = await self._call(workflow, context, claimed.input)
                status, output, error = "succeeded", self.app.serializer.dumps(value), None
            except (LeaseLost, asyncio.CancelledError):
                if context.lost:
                    log.info("execution %s attempt %d: stopped, no longer owned", claimed.id, claimed.attempt)
                    return
                raise
            except Exception as exc:
                if context.lost:
                    return
                status, output, error = "failed", None, json.dumps(failures.describe(exc))
            assert self._batcher is not None
            if await self._batcher.submit(Completion(claimed.id, claimed.attempt, status, output, error)):
                return
            log.warning("execution %s attempt %d: finished, but its lease was lost; result discarded",
                        claimed.id, claimed.attempt)
        except Exception:
            log.exception("execution %s: could not be completed; its lease will expire and it will be retried",
                          claimed.id)
        finally:
            # Only our own entry: if this attempt lost its lease and this worker has since claimed the execution
            # again, the entry is the new attempt's, which must stay (heartbeats renew only what is listed).
            if self.running.get(claimed.id) is running:
                del self.running[claimed.id]
            self._wake.set()

    async def _call(self, workflow: Workflow[Any, Any], context: ExecutionContext, input_text: str) -> Any:
        args, kwargs = workflow.signature.decode_input(self.app.serializer, input_text)
        if workflow.is_async:
            context.activate()  # this task runs in its own copy of the context
            return await workflow.fn(*args, **kwargs)
        assert self.loop is not None
        return await self.loop.run_in_executor(self._threads, self._run_sync, context, workflow, args, kwargs)

    def _run_sync(self, context: ExecutionContext, workflow: Workflow[Any, Any], args: list[Any],
                  kwargs: dict[str, Any]) -> Any:
        with self._busy_lock:
            self._busy_threads += 1
        try:
            return _run_sync(context, workflow, args, kwargs)
        finally:
            with self._busy_lock:
                self._busy_threads -= 1

    # -- background duties --------------------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.heartbeat_seconds)
            assert self._batcher is not None
            held = {execution_id: r for execution_id, r in self.running.items() if not r.context.lost}
            try:
                owned = await self._batcher.run(store.heartbeat(
                    owner=self.id, lease=self.settings.lease_seconds, ids=list(held)))
                if self.claims:
                    await self._run(store.worker_heartbeat(self.id))
            except Exception as exc:
                log.warning("worker %s: heartbeat failed (%s)", self.id, exc)
                continue
            for execution_id, running in held.items():
                # Not running any more: it finished while the heartbeat was queued (its completion can share
                # the heartbeat's batch), so the heartbeat no longer finds it running; it was not lost.
                if self.running.get(execution_id) is not running:
                    continue
                if owned.get(execution_id) != running.claimed.attempt and not running.context.lost:
                    self._abandon(running)

    def _abandon(self, running: Running) -> None:
        """Another worker took this execution over (or it was cancelled): stop it without writing."""
        log.warning("execution %s attempt %d: lease lost, stopping it", running.claimed.id,
                    running.claimed.attempt)
        running.context.lost = True
        if running.task is not None and running.claimed.name in self._async_names():
            running.task.cancel()

    async def _sweep_loop(self) -> None:
        interval = self.settings.sweep_seconds
        while True:
            await asyncio.sleep(interval * random.uniform(0.5, 1.5))  # spread sweeps of many workers
            try:
                for execution_id, status, recoveries in await self._run(store.sweep_expired()):
                    log.warning("execution %s: lease expired, %s (recovery %d)", execution_id,
                                "dead-lettered" if status == "failed" else "re-enqueued", recoveries)
                grace = self.settings.unknown_workflow_grace_seconds
                if grace is not None:
                    for execution_id, name in await self._run(store.fail_unrunnable(grace)):
                        log.warning("execution %s: failed, no live worker knows workflow %r", execution_id, name)
                await self._run(store.prune_workers())
            except Exception as exc:
                log.warning("worker %s: sweep failed (%s)", self.id, exc)

    async def _listen_loop(self) -> None:
        channel = sql.Identifier(f"{self.app.db.schema}_work")
        schedules_channel = f"{self.app.db.schema}_schedules"
        queues = set(self.queues)
        while True:
            try:
                conn = await self.app.db.aconnect()
                async with conn:
                    await conn.execute(sql.SQL("LISTEN {}").format(channel))
                    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(schedules_channel)))
                    self._wake.set()  # catch up on whatever was enqueued while not listening
                    if self._scheduler is not None:
                        self._scheduler.wake()
                    async for notice in conn.notifies():
                        if notice.channel == schedules_channel:
                            if self._scheduler is not None:
                                self._scheduler.wake()
                        elif notice.payload in queues:
                            self._wake.set()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("worker %s: listener lost its connection (%s); polling until it is back",
                            self.id, exc)
                await asyncio.sleep(1.0)


def _run_sync(context: ExecutionContext, workflow: Workflow[Any, Any], args: list[Any],
              kwargs: dict[str, Any]) -> Any:
    context.activate()  # worker threads are reused; each run sets its own context
    return workflow.fn(*args, **kwargs)
