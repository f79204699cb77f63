"""The executor: runs the executions a worker owns, records how they ended, and gives them up when told.

Async workflows run as tasks on the worker's loop; sync workflows run in a thread pool and hand their
checkpoint writes to the loop, so every database write goes through one code path (the write batcher).
The executor also keeps the worker's slot count: producers claim only what it has room for.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import failures, store
from ..batcher import Completion, WriteBatcher
from ..context import ExecutionContext
from ..errors import LeaseLost, NonDeterminismError, SerializationError
from ..primitives import Suspended
from ..runtime import Runtime
from ..waiting import cancel_and_wait

if TYPE_CHECKING:
    from ..workflows import Workflow

log = logging.getLogger("pgdurable.worker")


@dataclass
class Running:
    claimed: store.claims.Claimed
    context: ExecutionContext
    task: asyncio.Task[None] | None = None
    queue: str | None = None
    finishing: bool = False  # its completion is being written (Executor.finishing counts these)


class Executor:
    """Runs owned executions within ``concurrency`` slots. ``on_free`` is called whenever a slot frees up
    (producers waiting for room claim again); ``on_suspend`` when a workflow suspends until a time;
    ``arm_with`` before completing the last running execution of a queue: given the queue, it returns None, or a
    callback that is told whether the completion (and the doorbell armed in its transaction) committed."""

    def __init__(self, runtime: Runtime, worker_id: str, concurrency: int, *, on_free: Callable[[], None],
                 on_suspend: Callable[[str, Any], None],
                 arm_with: Callable[[str], Callable[[bool], None] | None] = lambda queue: None) -> None:
        self.runtime = runtime
        self.worker_id = worker_id
        self.concurrency = concurrency
        self.observers = runtime.observers
        self.running: dict[str, Running] = {}
        # Slots promised to claims in flight: several producers claim at once, and together they must not
        # claim more than the free slots.
        self.reserved = 0
        # Executions whose completion is being written: their code has ended, so their slots count as free. A
        # claim sent meanwhile (an enqueue rang the bell as soon as the result committed) is then not cut
        # short by them, and tells whether the queue ran dry (arm_with, before the next completion).
        self.finishing = 0
        self.loop: asyncio.AbstractEventLoop | None = None
        self.batcher: WriteBatcher | None = None
        # Whether the worker turns SIGINT into a graceful stop (pgdurable worker): then no KeyboardInterrupt
        # comes from a signal, and one raised in a workflow is its code's.
        self.handles_signals = False
        self._on_free = on_free
        self._on_suspend = on_suspend
        self._arm_with = arm_with
        # Twice the slots: a sync workflow given up while stuck in a step (lease lost, cancelled, timed out)
        # frees its slot at once, but Python cannot stop its thread, which stays busy until the step returns.
        self.threads = ThreadPoolExecutor(max_workers=2 * concurrency, thread_name_prefix="pgdurable-workflow")
        # Sync workflows inside a thread right now. Counted in the thread itself: a released workflow's task
        # is cancelled at loop shutdown while its thread runs on, so self.running no longer shows it.
        self.busy_threads = 0
        self._busy_lock = threading.Lock()

    def _is_async(self, name: str) -> bool:
        workflow = self.runtime.registry.workflows.get(name)
        return workflow is not None and workflow.is_async

    def start(self, loop: asyncio.AbstractEventLoop, batcher: WriteBatcher) -> None:
        self.loop, self.batcher = loop, batcher

    def free(self) -> int:
        return self.concurrency - (len(self.running) - self.finishing) - self.reserved

    def busy(self) -> bool:
        """Whether any execution's code is running (not only completions being written)."""
        return self.running_code() > 0

    def running_code(self) -> int:
        """How many executions are running their code (not only having their completion written)."""
        return len(self.running) - self.finishing

    def _finishing(self, running: Running, finishing: bool) -> None:
        """Mark an execution (still held here) as having its completion written, or no longer."""
        if running.finishing != finishing and self.running.get(running.claimed.id) is running:
            running.finishing = finishing
            self.finishing += 1 if finishing else -1

    def count(self, queue: str) -> int:
        return sum(1 for r in self.running.values() if r.queue == queue)

    async def launch(self, claimed: list[store.claims.Claimed], queue: str, pool_run: Any) -> bool:
        """Start the claimed executions; False if they could not be started (and were handed back)."""
        resumed = [c.id for c in claimed if c.has_history]
        try:
            recorded = await pool_run(store.checkpoints.load_steps(resumed)) if resumed else {}
            traces = await pool_run(store.executions.trace_contexts([c.id for c in claimed])) if self.observers else {}
        except Exception as exc:
            # Not knowing their checkpoints, do not run them: hand them back to the queue at once (if that
            # fails too, their leases expire and they are swept). The producer carries on.
            log.warning("worker %s: could not load the checkpoints of %d resumed executions (%s); releasing "
                        "the %d just claimed", self.worker_id, len(resumed), exc, len(claimed))
            assert self.batcher is not None
            with contextlib.suppress(Exception):
                await self.batcher.run(store.claims.release(owner=self.worker_id, ids=[c.id for c in claimed]))
            return False
        for execution in claimed:
            self.adopt(execution, recorded.get(execution.id, {}), queue, traces.get(execution.id))
        return True

    def adopt(self, claimed: store.claims.Claimed, recorded: dict[int, store.checkpoints.RecordedStep],
              queue: str | None = None, trace: str | None = None) -> asyncio.Task[None]:
        """Run an execution this worker owns (claimed, or started in-process by App.start)."""
        assert self.loop is not None and self.batcher is not None
        context = ExecutionContext(
            execution_id=claimed.id, workflow_name=claimed.name, attempt=claimed.attempt, recorded=recorded,
            serializer=self.runtime.serializer, batcher=self.batcher, loop=self.loop, db_now=claimed.db_now,
            on_suspend=functools.partial(self._on_suspend, claimed.id), observers=self.observers,
            defer_checkpoints=not self.runtime.db.distributed)
        # The claim's lease (now() + lease on the server) ends before this moment's lease does.
        context.lease_ends_by = time.monotonic() + self.runtime.settings.lease_seconds
        if self.observers:
            context.telemetry = self.observers.workflow_started(claimed.id, claimed.name, claimed.attempt,
                                                                json.loads(trace) if trace else None)
        running = Running(claimed, context, queue=queue)
        self.running[claimed.id] = running
        running.task = asyncio.create_task(self._execute(running), name=f"pgdurable:{claimed.id}")
        return running.task

    async def _execute(self, running: Running) -> None:
        claimed, context = running.claimed, running.context
        workflow = self.runtime.registry.get(claimed.name)
        began, outcome = time.monotonic(), "abandoned"
        try:
            if workflow is None:  # claim filters by name, so only an in-process start can get here
                raise LookupError(f"workflow {claimed.name!r} is not registered in this process")
            try:
                value = await self._call(workflow, context, claimed.input)
                if context.replay_mismatch() is None:
                    status, output, error = "succeeded", self.runtime.serializer.dumps(value), None
            except Suspended:
                outcome = "suspended"
                return  # waiting in the database now; a worker claims it again when it is woken
            except NonDeterminismError:
                pass  # parked below
            except (LeaseLost, asyncio.CancelledError):
                if not context.lost:
                    raise
            except Exception as exc:
                if not context.lost and context.replay_mismatch() is None:
                    status, output, error = "failed", None, failures.encode(exc)
            except BaseException as exc:
                # SystemExit, KeyboardInterrupt or a class of the application's own, raised by the workflow's
                # code (sys.exit() in a step, argparse refusing its arguments): that workflow's failure. Let
                # through, it would end the worker, and then every worker that claimed the execution after it.
                if isinstance(exc, GeneratorExit) or self._may_be_ctrl_c(exc, workflow):
                    raise
                if not context.lost and context.replay_mismatch() is None:
                    status, output, error = "failed", None, failures.encode(exc)
            if context.lost:  # whatever the code did after that (it may have caught the LeaseLost)
                if context.replay_now:
                    await self._hand_back(claimed)
                else:
                    log.info("execution %s attempt %d: stopped, no longer owned", claimed.id, claimed.attempt)
                return
            if context.mismatch is not None:
                outcome = "parked"
                if await self._settle(context, claimed):
                    await self._park(claimed, context.mismatch)
                return
            assert self.batcher is not None
            queue = running.queue
            armed = self._arm_with(queue) if queue is not None and self.count(queue) == 1 else None
            completion = Completion(claimed.id, claimed.attempt, status, output, error,
                                    (self.worker_id, queue) if armed is not None and queue is not None else None)
            self._finishing(running, True)
            try:
                # In one batch with the checkpoints the workflow deferred (ExecutionContext.defer_step), which
                # went into the writer's queue before it.
                completed = await self.batcher.submit(completion)
                if not await self._settle(context, claimed):
                    return
            except SerializationError as refused:  # the database refused the result: that is the failure
                if not await self._settle(context, claimed):  # or a checkpoint the completion waited for
                    return
                status, completion.status, completion.output = "failed", "failed", None
                completion.error = failures.encode(SerializationError(
                    f"the outcome of workflow {claimed.name!r} could not be recorded: {refused}"))
                completed = await self.batcher.submit(completion)
            finally:
                self._finishing(running, False)
            if armed is not None:
                armed(completed)
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
            self._on_free()

    def _may_be_ctrl_c(self, exc: BaseException, workflow: Workflow[Any, Any] | None) -> bool:
        """Whether ``exc`` may be the operator's Ctrl-C rather than the code's: a KeyboardInterrupt on the main
        thread, where Python delivers signals (an async workflow runs on the loop's thread, which may be the
        main one; a sync workflow on a pool thread, which a signal never interrupts), in a worker that leaves
        SIGINT to Python."""
        return (isinstance(exc, KeyboardInterrupt) and not self.handles_signals and workflow is not None
                and workflow.is_async and threading.current_thread() is threading.main_thread())

    async def _settle(self, context: ExecutionContext, claimed: store.claims.Claimed) -> bool:
        """The checkpoints the workflow deferred, once written: False if one of them was not (refused, fenced,
        or lost with a failed batch; the completion was then not written either). This attempt is over: the
        execution replays, at once if the database refused a checkpoint (handed back to the queue: this attempt
        still owned it a moment ago), else once its lease runs out (this worker may own a newer attempt of it
        by then, which a hand-back by owner would take away)."""
        try:
            await context.settle_async()
        except LeaseLost as exc:
            log.warning("%s", exc)
            if context.replay_now:
                await self._hand_back(claimed)
            return False
        return True

    async def _hand_back(self, claimed: store.claims.Claimed) -> None:
        """Give the execution back to the queue at once (this attempt gave up so that it replays)."""
        assert self.batcher is not None
        with contextlib.suppress(Exception):  # if this fails, its lease runs out and it is swept
            await self.batcher.run(store.claims.release(owner=self.worker_id, ids=[claimed.id]))

    async def _park(self, claimed: store.claims.Claimed, reason: str) -> None:
        """The history does not replay on this code: park the execution, writing nothing else, for a worker of
        the version that recorded it (or an explicit ``pgdurable versions migrate``)."""
        assert self.batcher is not None
        previous = claimed.previous_version
        if await self.batcher.run(store.versions.park(id=claimed.id, attempt=claimed.attempt, reason=reason,
                                                      previous=previous)):
            log.warning("execution %s: parked, its history does not replay on version %s (%s); a worker of "
                        "version %s resumes it", claimed.id, self.runtime.version, reason, previous or "?")

    async def _call(self, workflow: Workflow[Any, Any], context: ExecutionContext, input_text: str) -> Any:
        args, kwargs = workflow.signature.decode_input(self.runtime.serializer, input_text)
        if workflow.is_async:
            context.activate()  # this task runs in its own copy of the context
            return await workflow.fn(*args, **kwargs)
        assert self.loop is not None
        return await self.loop.run_in_executor(self.threads, self._run_sync, context, workflow, args, kwargs)

    def _run_sync(self, context: ExecutionContext, workflow: Workflow[Any, Any], args: list[Any],
                  kwargs: dict[str, Any]) -> Any:
        with self._busy_lock:
            self.busy_threads += 1
        try:
            context.activate()  # worker threads are reused; each run sets its own context
            return workflow.fn(*args, **kwargs)
        finally:
            with self._busy_lock:
                self.busy_threads -= 1

    def abandon(self, running: Running, why: str = "lease lost") -> None:
        """Another worker took this execution over, or it was cancelled or timed out: stop it without writing."""
        log.warning("execution %s attempt %d: %s, stopping it", running.claimed.id, running.claimed.attempt, why)
        running.context.lost = True
        if running.task is not None and self._is_async(running.claimed.name):
            running.task.cancel()
        elif self.running.get(running.claimed.id) is running:
            # A sync workflow stops at its next checkpoint, which may be far away (a hung step): its thread
            # runs on, but it no longer holds a slot here.
            self._finishing(running, False)
            del self.running[running.claimed.id]
            self._on_free()
            if self.busy_threads > self.concurrency:
                log.warning("worker %s: %d workflow threads are busy for %d slots: steps that were given up "
                            "are still running; past %d, new sync workflows wait for a thread", self.worker_id,
                            self.busy_threads, self.concurrency, 2 * self.concurrency)

    async def release_all(self, grace: float) -> None:
        """Shutdown: give running executions ``grace`` seconds to finish, then hand the rest back to the queue."""
        pending = [r.task for r in self.running.values() if r.task is not None]
        if pending:
            await asyncio.wait(pending, timeout=grace)
        leftover = list(self.running.values())
        if not leftover:
            return
        cancelled: list[asyncio.Task[None]] = []
        for running in leftover:
            running.context.lost = True  # sync workflows stop at their next checkpoint
            if running.task is not None and self._is_async(running.claimed.name):
                running.task.cancel()
                cancelled.append(running.task)
        assert self.batcher is not None  # on the writer's connection: never races a batch on these rows
        try:
            released = await self.batcher.run(
                store.claims.release(owner=self.worker_id, ids=[r.claimed.id for r in leftover]))
            log.info("worker %s: released %d unfinished executions to the queue", self.worker_id, len(released))
        except Exception as exc:  # the database is out of reach: their leases expire and they are swept
            log.warning("worker %s: could not release %d unfinished executions (%s); they resume elsewhere "
                        "once their leases expire", self.worker_id, len(leftover), exc)
        # Cancelled again until they end: a workflow awaiting a pooled connection can miss one cancellation
        # (pgdurable.waiting), and the event loop cannot close over a task that runs on.
        if await cancel_and_wait(cancelled, patience=max(grace, 1.0)):
            log.warning("worker %s: async workflows still run %.0f s after their cancellation", self.worker_id,
                        max(grace, 1.0))
