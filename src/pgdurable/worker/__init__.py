"""The worker: a set of named services on one asyncio loop per worker process.

    producer.py     one Producer per served queue: claims into free slots (Debouncer, Backoff)
    executor.py     runs owned executions (sync on threads, async on the loop), completes or abandons them
    lease.py        heartbeats: renew leases, abandon what is no longer ours (fencing bookkeeping)
    listener.py     LISTEN: NOTIFYs become wake-ups (work, schedules, stop)
    leader.py       elects one leader per schema (advisory lock) to run the leader-only duties
    watchdog.py     a worker process's stop that hangs is reported (every stack), then forced
    loop_watch.py   an event loop blocked by a workflow's code is reported, with that code's stack
    maintenance/    one duty per file: sweeper, deadlines, unrunnable, retention, registry pruning (leader
                    only); timer, scheduler, queue-policy refresh (every worker; each file says why)

``Worker`` wires them together and owns the lifecycle: start, graceful stop (a grace period, then release),
deregistration. Imports point down: this package imports the runtime and lower modules, never the App.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg

from .. import store
from ..batcher import WriteBatcher
from ..runtime import Runtime
from ..waiting import cancel_and_wait
from .executor import Executor, Running
from .leader import Leadership
from .lease import Heartbeat
from .listener import Listener
from .loop_watch import LoopWatch
from .maintenance import Deps
from .maintenance.deadlines import Deadlines
from .maintenance.policies import PolicyRefresh
from .maintenance.registry import WorkerPruning
from .maintenance.retention import Retention
from .maintenance.scheduler import Scheduler
from .maintenance.sweeper import Sweeper
from .maintenance.timer import Timer
from .maintenance.unrunnable import Unrunnable
from .producer import Producer
from .watchdog import ExitWatchdog

if TYPE_CHECKING:
    from psycopg_pool import AsyncConnectionPool

__all__ = ["Running", "Worker", "run_until_stopped"]

log = logging.getLogger("pgdurable.worker")
T = TypeVar("T")

_IDLE_TIMEOUT_SQL = "SELECT set_config('idle_in_transaction_session_timeout', %s, false)"


def declared_queues(runtime: Runtime) -> set[str]:
    """The queues a worker serves when none are named: ``default``, every queue a workflow names
    (``@app.workflow(queue=...)``), every queue with declared limits (``app.queue(...)``) and every queue a
    declared schedule enqueues on. An enqueue may name any queue; these are the ones the application declares."""
    return ({"default"} | {wf.queue for wf in runtime.registry.workflows.values()} | set(runtime.queue_policies)
            | {d.queue for d in runtime.declared_schedules.values() if d.queue})


class Worker:
    """Runs the workflows registered on an application's runtime from the given queues (default: every queue
    the application declares, see ``declared_queues``). ``app`` is the runtime, or the App whose runtime it
    is. With ``claim=False`` it claims nothing and runs no maintenance: it only runs what it is handed
    (``adopt``), as App.start's local runtime."""

    def __init__(self, app: Any, *, queues: list[str] | None = None, concurrency: int = 16,
                 claim: bool = True) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        runtime: Runtime = getattr(app, "runtime", app)
        self.app = runtime
        self.settings = runtime.settings
        self.id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.names = runtime.registry.names()
        self.queues = sorted(set(queues or declared_queues(runtime)))
        self.concurrency = concurrency
        self.claims = claim
        self.version = runtime.version
        self.observers = runtime.observers
        self.loop: asyncio.AbstractEventLoop | None = None
        self._pool: AsyncConnectionPool[Any] | None = None
        self._batcher: WriteBatcher | None = None
        self._stop = asyncio.Event()
        self._stop_requests = 0
        self._signals = False
        self._watchdog: ExitWatchdog | None = None
        self.loop_watch: LoopWatch | None = None
        self._started = asyncio.Event()
        # Queue policies of the served queues (see App.queue), refreshed by maintenance.policies.
        self.policies: dict[str, store.queues.QueuePolicy] = {}

        deps = Deps(run=self._run, worker_id=self.id, settings=self.settings, observers=self.observers,
                    buckets=lambda: runtime.db.buckets)
        self.timer = Timer(deps)
        self.executor = Executor(runtime, self.id, concurrency, on_free=self._slot_freed,
                                 on_suspend=self.timer.suspended, arm_with=self._arm_with_completion)
        self.producers = {queue: Producer(queue, worker_id=self.id, names=self.names, version=self.version,
                                          settings=self.settings, executor=self.executor,
                                          policies=lambda: self.policies, run=self._run, stopping=self._stop,
                                          buckets=lambda: runtime.db.buckets)
                          for queue in self.queues} if claim else {}
        self.heartbeat = Heartbeat(self.id, self.settings, self.executor, registered=claim, run=self._run,
                                   buckets=lambda: runtime.db.buckets)
        self.listener = Listener(runtime.db, self.id, on_work=self._work_notified,
                                 on_schedules=self._schedules_notified, on_stop=self._stop_notified)
        self.policy_refresh = PolicyRefresh(deps, self.queues, self._set_policies)
        self.leadership = Leadership(runtime.db, self.id, self.settings.poll_seconds, [
            Sweeper(deps), Deadlines(deps), Unrunnable(deps), Retention(deps), WorkerPruning(deps)],
            stopping=lambda: self._stop.is_set())
        self.scheduler: Scheduler | None = None

    # -- what callers and tests read --------------------------------------------------------------------------

    @property
    def running(self) -> dict[str, Running]:
        return self.executor.running

    @property
    def busy_threads(self) -> int:
        """Sync workflows still running in threads (a released one runs on until its next checkpoint)."""
        return self.executor.busy_threads

    @property
    def is_leader(self) -> bool:
        """Whether this worker runs the schema's leader-only maintenance duties right now."""
        return self.leadership.is_leader

    # -- database -----------------------------------------------------------------------------------------

    async def _run(self, call: store.Call[T]) -> T:
        assert self._pool is not None
        async with self._pool.connection() as conn:
            return await store.arun(conn, call)

    async def _start_up(self, call: store.Call[T]) -> T:
        """A start-up statement (each is idempotent): a cancelled or timed-out one is tried again a few
        times rather than failing the worker's start."""
        for attempt in range(1, 5):
            try:
                return await self._run(call)
            except psycopg.errors.QueryCanceled:
                if attempt == 4:
                    raise
                await asyncio.sleep(0.1 * attempt)
        raise AssertionError("unreachable")

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

    # -- wake-ups -----------------------------------------------------------------------------------------

    def _slot_freed(self) -> None:
        for producer in self.producers.values():
            producer.slot_freed()

    def _arm_with_completion(self, queue: str) -> Callable[[bool], None] | None:
        producer = self.producers.get(queue)
        return producer.arm_with_completion() if producer is not None else None

    def _work_notified(self, queue: str | None) -> None:
        # None: anything may have happened (the listener reconnected, the worker stops): re-arm every bell.
        if queue is None:
            for producer in self.producers.values():
                producer.rung()
        elif queue in self.producers:
            self.producers[queue].rung()

    def _schedules_notified(self) -> None:
        if self.scheduler is not None:
            self.scheduler.wake()

    def _stop_notified(self, execution_id: str) -> None:
        running = self.executor.running.get(execution_id)
        if running is not None and not running.context.lost:
            self.executor.abandon(running, "cancelled or timed out")  # now, not at the next heartbeat

    def _set_policies(self, policies: dict[str, store.queues.QueuePolicy]) -> None:
        self.policies = policies

    # -- lifecycle ----------------------------------------------------------------------------------------

    async def run(self, *, handle_signals: bool = False) -> None:
        """Work until ``stop()`` (or SIGTERM/SIGINT when ``handle_signals``), then shut down gracefully."""
        self.loop = asyncio.get_running_loop()
        self._pool = await self.app.db.async_pool(size=4)
        self._batcher = WriteBatcher(self._writer_aconnect, self._writer_connect, self.executor.running_code)
        await self._batcher.start()
        self.executor.start(self.loop, self._batcher)
        self._signals = self.executor.handles_signals = handle_signals
        if handle_signals:  # the process is this worker's: it also bounds the process's exit
            self._watchdog = ExitWatchdog(self.loop, self.settings.shutdown_grace_seconds,
                                          self.settings.shutdown_patience_seconds)
            for signum in (signal.SIGTERM, signal.SIGINT):
                self.loop.add_signal_handler(signum, self.stop)
        self.loop_watch = LoopWatch(self.id, self.settings.lease_seconds)
        background = [asyncio.create_task(self.heartbeat.run(), name="pgdurable-heartbeat"),
                      asyncio.create_task(self.loop_watch.beat(), name="pgdurable-loop-watch")]
        if self.claims:
            for policy in self.app.queue_policies.values():
                await self._start_up(store.queues.set_queue_policy(policy))
            self.policies = await self._start_up(store.queues.queue_policies(self.queues))
            await self._start_up(store.workers.register_worker(
                id=self.id, hostname=socket.gethostname(), pid=os.getpid(), queues=self.queues,
                workflows=self.names, concurrency=self.concurrency, version=self.version,
                adopt=self.settings.adopt_after_seconds, lease=self.settings.lease_seconds))
            # Parked executions of this version (their history did not replay on another version's code)
            # resume here: rolling a deploy back un-parks them.
            try:
                unparked = await self._start_up(store.versions.unpark(version=self.version, names=self.names))
            except psycopg.errors.QueryCanceled as exc:  # not worth failing the start: the next start tries again
                log.warning("worker %s: could not un-park executions of version %s (%s)", self.id, self.version,
                            exc)
                unparked = 0
            if unparked:
                log.info("worker %s: re-enqueued %d parked executions of version %s", self.id, unparked,
                         self.version)
            self.scheduler = Scheduler(self.app, self._pool, self.id)
            services = {"listen": self.listener.run(), "timer": self.timer.run(),
                        "schedules": self.scheduler.run(), "policies": self.policy_refresh.run(),
                        "leadership": self.leadership.run()}
            background += [asyncio.create_task(service, name=f"pgdurable-{name}")
                           for name, service in services.items()]
            log.info("worker %s: queues %s, %d workflows, concurrency %d, version %s",
                     self.id, ",".join(self.queues), len(self.names), self.concurrency, self.version)
        self._started.set()
        producing = [asyncio.create_task(producer.run(), name=f"pgdurable-producer:{queue}")
                     for queue, producer in self.producers.items()]
        try:
            if producing:
                await asyncio.gather(*producing)  # they return once stopped; one that fails stops the worker
            else:
                await self._stop.wait()
        finally:
            if self._watchdog is not None:  # also when no stop() came (a producer failed)
                self._watchdog.arm()
            await cancel_and_wait(producing)
            await self._shutdown(background)

    def stop(self) -> None:
        """Ask the worker to stop: no new claims, a grace period, then release. When the worker handles signals,
        a second SIGTERM/SIGINT exits at once."""
        self._stop_requests += 1
        if self._stop_requests > 1 and self._signals:  # an operator's second Ctrl-C, not a second API call
            log.warning("worker %s: second stop signal, exiting at once", self.id)
            os._exit(130)
        log.info("worker %s: stopping (grace %.0fs)", self.id, self.settings.shutdown_grace_seconds)
        if self._watchdog is not None:
            self._watchdog.arm()
        self._stop.set()
        self._work_notified(None)

    def stop_threadsafe(self) -> None:
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.stop)

    async def _shutdown(self, background: list[asyncio.Task[None]]) -> None:
        await self.executor.release_all(self.settings.shutdown_grace_seconds)
        await cancel_and_wait(background)
        # Whatever fails below, the pools must be closed: an open pool's tasks swallow cancellation, so the
        # event loop could never finish and the process would hang instead of exiting.
        try:
            if self._batcher is not None:
                await self._batcher.close()
            if self.claims:
                await self._deregister()
        finally:
            self.executor.threads.shutdown(wait=False, cancel_futures=True)
            await self.app.db.aclose_loop_pool()

    async def _deregister(self) -> None:
        # Pooled connections may have been cut (server restart, pg_terminate_backend); each failure drops one.
        for attempt in range(1, 4):
            try:
                await self._run(store.workers.deregister_worker(self.id))
                return
            except Exception as exc:
                if attempt == 3:
                    log.warning("worker %s: could not deregister (%s); the registry shows it stale", self.id, exc)
                else:
                    await asyncio.sleep(0.1 * attempt)

    # -- executions handed in -----------------------------------------------------------------------------

    def adopt(self, claimed: store.claims.Claimed, recorded: dict[int, store.checkpoints.RecordedStep],
              queue: str | None = None, trace: str | None = None) -> asyncio.Task[None]:
        """Run an execution this worker owns (claimed, or started in-process by App.start)."""
        return self.executor.adopt(claimed, recorded, queue, trace)

    async def adopt_new(self, claimed: store.claims.Claimed, trace: str | None = None) -> None:
        """Entry point for App.start from another thread: a new execution has no recorded steps."""
        await self._started.wait()
        self.adopt(claimed, {}, trace=trace)


def run_until_stopped(worker: Worker) -> None:
    """A worker process's main: run ``worker`` until SIGTERM/SIGINT (``pgdurable worker``, ``manage.py
    pgdurable_worker``). Released sync workflows may still sit in a step at the end, their work back on the
    queue: then the process leaves at once instead of waiting for their threads."""
    asyncio.run(worker.run(handle_signals=True))
    if worker.busy_threads:
        log.info("exiting with %d released workflow thread(s) still busy", worker.busy_threads)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
