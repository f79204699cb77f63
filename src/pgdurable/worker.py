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

from . import channels, failures, retention, store
from .batcher import Completion, WriteBatcher
from .context import ExecutionContext
from .errors import LeaseLost, SerializationError
from .runtime import Runtime
from .scheduler import Scheduler
from .waits import Suspended

if TYPE_CHECKING:
    from psycopg_pool import AsyncConnectionPool

    from .workflows import Workflow

log = logging.getLogger("pgdurable.worker")
T = TypeVar("T")

_IDLE_TIMEOUT_SQL = "SELECT set_config('idle_in_transaction_session_timeout', %s, false)"

# Claim at most this many executions per round trip.
_CLAIM_BATCH = 64
# A busy worker claims at most this often while few slots are free or its queue keeps running dry.
_CLAIM_COALESCE_SECONDS = 0.005
# After a short claim on a queue with limits in SQL, look again this soon (doubling while nothing comes).
_POLICY_RECHECK_SECONDS = 0.01


@dataclass
class Running:
    claimed: store.Claimed
    context: ExecutionContext
    task: asyncio.Task[None] | None = None
    queue: str | None = None


class Worker:
    """Runs the workflows registered on an application's runtime from the given queues (default: every queue
    they use). ``app`` is the runtime, or the App whose runtime it is."""

    def __init__(self, app: Any, *, queues: list[str] | None = None, concurrency: int = 16,
                 claim: bool = True) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        runtime: Runtime = getattr(app, "runtime", app)
        self.app = app = runtime
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
        # Twice the slots: a sync workflow given up while stuck in a step (lease lost, cancelled, timed out)
        # frees its slot at once, but Python cannot stop its thread, which stays busy until the step returns.
        self._threads = ThreadPoolExecutor(max_workers=2 * concurrency, thread_name_prefix="pgdurable-workflow")
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        self._stop_requests = 0
        self._signals = False
        self._started = asyncio.Event()
        # Sync workflows inside a thread right now. Counted in the thread itself: a released workflow's task
        # is cancelled at loop shutdown while its thread runs on, so self.running no longer shows it.
        self._busy_threads = 0
        self._busy_lock = threading.Lock()
        self.version = app.version
        # The timer sleeps until the next known wake-up; a workflow of ours that suspends sooner pokes it.
        self._timer_kick = asyncio.Event()
        self._timer_due: float | None = None
        # Queue policies of the served queues (see App.queue), refreshed by the sweeper.
        self.policies: dict[str, store.QueuePolicy] = {}
        self.observers = app.observers

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
        self._signals = handle_signals
        if handle_signals:
            for signum in (signal.SIGTERM, signal.SIGINT):
                self.loop.add_signal_handler(signum, self.stop)
        background = [asyncio.create_task(self._heartbeat_loop(), name="pgdurable-heartbeat")]
        if self.claims:
            for policy in self.app.queue_policies.values():
                await self._run(store.set_queue_policy(policy))
            self.policies = await self._run(store.queue_policies(self.queues))
            await self._run(store.register_worker(
                id=self.id, hostname=socket.gethostname(), pid=os.getpid(), queues=self.queues,
                workflows=self.names, concurrency=self.concurrency, version=self.version))
            self._scheduler = Scheduler(self.app, self._pool, self.id)
            background += [asyncio.create_task(self._listen_loop(), name="pgdurable-listen"),
                           asyncio.create_task(self._sweep_loop(), name="pgdurable-sweep"),
                           asyncio.create_task(self._timer_loop(), name="pgdurable-timer"),
                           asyncio.create_task(self._scheduler.run(), name="pgdurable-schedules")]
            log.info("worker %s: queues %s, %d workflows, concurrency %d, version %s",
                     self.id, ",".join(self.queues), len(self.names), self.concurrency, self.version)
        self._started.set()
        try:
            if self.claims:
                await self._claim_loop()
            else:
                await self._stop.wait()
        finally:
            await self._shutdown(background)

    def stop(self) -> None:
        """Ask the worker to stop: no new claims, a grace period, then release. When the worker handles signals,
        a second SIGTERM/SIGINT exits at once."""
        self._stop_requests += 1
        if self._stop_requests > 1 and self._signals:  # an operator's second Ctrl-C, not a second API call
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
        # A queue with limits in SQL frees capacity without any NOTIFY (a slot's holder finished elsewhere,
        # a rate window moved on): after a short claim there, look again soon, backing off while it stays
        # empty, instead of waiting for the poll interval.
        recheck: dict[str, float] = {}
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
                policy = self.policies.get(queue)
                if policy is not None and policy.worker_concurrency is not None:
                    here = sum(1 for r in self.running.values() if r.queue == queue)
                    limit = min(limit, policy.worker_concurrency - here)
                    if limit <= 0:
                        if len(self.queues) > 1 and self._next_queue % len(self.queues):
                            continue
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self._wake.wait(), self.settings.poll_seconds)
                        continue
                claim = store.claim_with_policy if policy is not None and policy.claims_in_sql else store.claim
                try:
                    claimed = await self._run(claim(
                        queue=queue, names=self.names, owner=self.id, lease=lease, limit=limit,
                        version=self.version))
                    if self.observers:
                        self.observers.claimed(queue, len(claimed), time.monotonic() - last_claim)
                    last_was_short = len(claimed) < limit
                    lost_connections = 0
                    if claim is store.claim_with_policy:
                        if not last_was_short:
                            recheck.pop(queue, None)
                        else:
                            previous = recheck.get(queue) if not claimed else None
                            recheck[queue] = min(previous * 2 if previous else _POLICY_RECHECK_SECONDS,
                                                 self.settings.poll_seconds)
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
                    if not await self._launch(claimed, queue):
                        await asyncio.sleep(1.0)  # as after a failed claim
                        continue
                    if len(claimed) == limit:
                        continue  # there may be more waiting
                if len(self.queues) > 1 and self._next_queue % len(self.queues):
                    continue  # look at the other queues before sleeping
            wait = min([self.settings.poll_seconds, *recheck.values()])
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait)

    async def _launch(self, claimed: list[store.Claimed], queue: str | None = None) -> bool:
        """Start the claimed executions; False if they could not be started (and were handed back)."""
        resumed = [c.id for c in claimed if c.has_history]
        try:
            recorded = await self._run(store.load_steps(resumed)) if resumed else {}
            traces = await self._run(store.trace_contexts([c.id for c in claimed])) if self.observers else {}
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
            self.adopt(execution, recorded.get(execution.id, {}), queue, traces.get(execution.id))
        return True

    def adopt(self, claimed: store.Claimed, recorded: dict[int, store.RecordedStep],
              queue: str | None = None, trace: str | None = None) -> asyncio.Task[None]:
        """Run an execution this worker owns (claimed, or started in-process by App.start)."""
        assert self.loop is not None and self._batcher is not None
        context = ExecutionContext(
            execution_id=claimed.id, workflow_name=claimed.name, attempt=claimed.attempt, recorded=recorded,
            serializer=self.app.serializer, batcher=self._batcher, loop=self.loop, db_now=claimed.db_now,
            on_suspend=self._suspended, runtime=self.app, observers=self.observers)
        if self.observers:
            context.telemetry = self.observers.workflow_started(claimed.id, claimed.name, claimed.attempt,
                                                                json.loads(trace) if trace else None)
        running = Running(claimed, context, queue=queue)
        self.running[claimed.id] = running
        running.task = asyncio.create_task(self._execute(running), name=f"pgdurable:{claimed.id}")
        return running.task

    async def adopt_new(self, claimed: store.Claimed, trace: str | None = None) -> None:
        """Entry point for App.start from another thread: a new execution has no recorded steps."""
        await self._started.wait()
        self.adopt(claimed, {}, trace=trace)

    # -- executing ----------------------------------------------------------------------------------------

    async def _execute(self, running: Running) -> None:
        claimed, context = running.claimed, running.context
        workflow = self.app.registry.get(claimed.name)
        began, outcome = time.monotonic(), "abandoned"
        try:
            if workflow is None:  # claim filters by name, so only an in-process start can get here
                raise LookupError(f"workflow {claimed.name!r} is not registered in this process")
            try:
                value = await self._call(workflow, context, claimed.input)
                status, output, error = "succeeded", self.app.serializer.dumps(value), None
            except Suspended:
                outcome = "suspended"
                return  # waiting in the database now; a worker claims it again when it is woken
            except (LeaseLost, asyncio.CancelledError):
                if context.lost:
                    log.info("execution %s attempt %d: stopped, no longer owned", claimed.id, claimed.attempt)
                    return
                raise
            except Exception as exc:
                if context.lost:
                    return
                status, output, error = "failed", None, failures.encode(exc)
            assert self._batcher is not None
            completion = Completion(claimed.id, claimed.attempt, status, output, error)
            try:
                completed = await self._batcher.submit(completion)
            except SerializationError as refused:  # the database refused the result: that is the failure
                status, completion.status, completion.output = "failed", "failed", None
                completion.error = failures.encode(SerializationError(
                    f"the outcome of workflow {claimed.name!r} could not be recorded: {refused}"))
                completed = await self._batcher.submit(completion)
            if completed:
                outcome = status
                return
            log.warning("execution %s attempt %d: finished, but its lease was lost; result discarded",
                        claimed.id, claimed.attempt)
        except Exception:
            log.exception("execution %s: could not be completed; its lease will expire and it will be retried",
                          claimed.id)
        finally:
            if self.observers:
                self.observers.workflow_finished(context.telemetry, claimed.id, claimed.name, outcome,
                                                 time.monotonic() - began)
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

    def _abandon(self, running: Running, why: str = "lease lost") -> None:
        """Another worker took this execution over, or it was cancelled or timed out: stop it without writing."""
        log.warning("execution %s attempt %d: %s, stopping it", running.claimed.id, running.claimed.attempt, why)
        running.context.lost = True
        if running.task is not None and running.claimed.name in self._async_names():
            running.task.cancel()
        elif self.running.get(running.claimed.id) is running:
            # A sync workflow stops at its next checkpoint, which may be far away (a hung step): its thread
            # runs on, but it no longer holds a slot here.
            del self.running[running.claimed.id]
            self._wake.set()
            if self._busy_threads > self.concurrency:
                log.warning("worker %s: %d workflow threads are busy for %d slots: steps that were given up "
                            "are still running; past %d, new sync workflows wait for a thread", self.id,
                            self._busy_threads, self.concurrency, 2 * self.concurrency)

    def _suspended(self, wake_at: Any) -> None:
        """A workflow of ours suspended until ``wake_at``: make sure the timer looks by then."""
        if wake_at is None or self.loop is None:
            return
        due = wake_at.timestamp()
        if self._timer_due is None or due < self._timer_due:
            self._timer_due = due
            with contextlib.suppress(RuntimeError):  # a closed loop: the worker is exiting
                self.loop.call_soon_threadsafe(self._timer_kick.set)

    async def _timer_loop(self) -> None:
        """Enqueue waiting executions whose time has come (durable sleeps, delayed starts, wait timeouts).
        Sleeps until the next known wake-up, at most a poll interval (others may add earlier ones)."""
        while True:
            self._timer_kick.clear()
            wait = self.settings.poll_seconds
            try:
                woken, next_due, db_now = await self._run(store.wake_due())
                if woken:
                    log.debug("worker %s: timer enqueued %d waiting executions", self.id, woken)
                offset = db_now.timestamp() - time.time()  # compare wake-ups on the database's clock
                due = next_due.timestamp() - offset if next_due is not None else None
                local_due = self._timer_due - offset if self._timer_due is not None else None
                self._timer_due = None
                for candidate in (due, local_due):
                    if candidate is not None:
                        wait = min(wait, max(candidate - time.time(), 0.0))
            except Exception as exc:
                log.warning("worker %s: timer failed (%s)", self.id, exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._timer_kick.wait(), wait + 0.002)

    async def _sweep_loop(self) -> None:
        interval = self.settings.sweep_seconds
        while True:
            await asyncio.sleep(interval * random.uniform(0.5, 1.5))  # spread sweeps of many workers
            try:
                expired = await self._run(store.sweep_expired())
                for execution_id, status, recoveries in expired:
                    log.warning("execution %s: lease expired, %s (recovery %d)", execution_id,
                                "dead-lettered" if status == "failed" else "re-enqueued", recoveries)
                late = await self._run(store.expire_deadlines())
                for execution_id in late:
                    log.warning("execution %s: deadline passed, failed with pgdurable.WorkflowTimeout", execution_id)
                if self.observers and (expired or late):
                    dead = sum(1 for _, status, _ in expired if status == "failed")
                    self.observers.swept(len(expired) - dead, dead, len(late))
                grace = self.settings.unknown_workflow_grace_seconds
                if grace is not None:
                    for execution_id, name in await self._run(store.fail_unrunnable(grace)):
                        log.warning("execution %s: failed, no live worker knows workflow %r", execution_id, name)
                await self._run(store.prune_workers())
                self.policies = await self._run(store.queue_policies(self.queues))
                if self.settings.retention_seconds is not None:
                    await self._retain(self.settings.retention_seconds)
            except Exception as exc:
                log.warning("worker %s: sweep failed (%s)", self.id, exc)

    async def _retain(self, older_than: float) -> None:
        """Automatic retention: one small batch per sweep, so deleting never competes with the work."""
        cutoff = await self._run(retention.cutoff(older_than))
        deleted = await self._run(retention.batch(cutoff, sorted(store.TERMINAL),
                                                  self.settings.retention_batch_size))
        if deleted.executions:
            log.info("worker %s: retention deleted %d finished executions and %d step outputs", self.id,
                     deleted.executions, deleted.steps)

    async def _listen_loop(self) -> None:
        schema = self.app.db.schema
        work, schedules_channel = channels.channel(schema, "work"), channels.channel(schema, "schedules")
        queues = set(self.queues)
        while True:
            try:
                conn = await self.app.db.aconnect()
                async with conn:
                    await conn.execute(channels.listen(schema, "work", "stop", "schedules"))
                    self._wake.set()  # catch up on whatever was enqueued while not listening
                    if self._scheduler is not None:
                        self._scheduler.wake()
                    async for notice in conn.notifies():
                        if notice.channel == work:
                            if notice.payload in queues:
                                self._wake.set()
                        elif notice.channel == schedules_channel:
                            if self._scheduler is not None:
                                self._scheduler.wake()
                        elif (running := self.running.get(notice.payload)) is not None and not running.context.lost:
                            self._abandon(running, "cancelled or timed out")  # now, not at the next heartbeat
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
