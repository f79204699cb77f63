"""The running workflow's context: step counter, recorded steps for replay, and the fencing token."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from . import failures, store
from .batcher import StepWrite, ThreadWaiter, Waiter, WriteBatcher
from .effects import Defer
from .errors import ConfigurationError, LeaseLost, NonDeterminismError, SerializationError
from .serialization import Serializer

_SYNC_ON_LOOP = ("a sync pgdurable primitive was called from an async workflow; use its _async form (for example "
                 "`await pgdurable.sleep_async(...)`)")

_current: ContextVar[ExecutionContext | None] = ContextVar("pgdurable_execution", default=None)
# True while a step body runs: steps called from inside a step are plain calls, not checkpoints.
_in_step: ContextVar[bool] = ContextVar("pgdurable_in_step", default=False)


def current() -> ExecutionContext | None:
    """The context of the workflow running in this thread or task, or None outside workflows and steps."""
    if _in_step.get():
        return None
    return _current.get()


def current_workflow_id() -> str | None:
    """The id of the workflow execution this code runs in, or None outside a workflow."""
    ctx = _current.get()
    return ctx.execution_id if ctx else None


@dataclass(slots=True)
class Unwritten:
    """A step checkpoint handed to the writer without waiting (``ExecutionContext.defer_step``)."""

    write: StepWrite
    waiter: Waiter
    ended_at: datetime | None  # when the step returned, for metrics and tracing (None: nobody observes)


async def _awaited(future: asyncio.Future[Any]) -> Any:
    return await future


class ExecutionContext:
    """One attempt of one execution, as run by one worker."""

    def __init__(self, *, execution_id: str, workflow_name: str, attempt: int,
                 recorded: dict[int, store.checkpoints.RecordedStep], serializer: Serializer,
                 batcher: WriteBatcher, loop: asyncio.AbstractEventLoop, db_now: datetime | None = None,
                 on_suspend: Callable[[datetime | None], None] | None = None,
                 observers: Any = None, defer_checkpoints: bool = True) -> None:
        self.execution_id = execution_id
        self.workflow_name = workflow_name
        self.attempt = attempt
        self.recorded = recorded
        self.serializer = serializer
        self._batcher = batcher
        self.loop = loop
        self._next_step = 0
        self.lost = False
        # A bound, on this process's monotonic clock, after which the lease has certainly run out unless a
        # heartbeat renewed it (set from the claim, moved on by each heartbeat that found it owned): a
        # worker that was paused past it knows it lost the execution without asking the database.
        self.lease_ends_by: float | None = None
        # Set when the code called another step than the history has at an ordinal: the attempt stops and
        # the execution is parked, whatever the workflow does with the exception.
        self.mismatch: str | None = None
        # Durable timers use the database's clock: remember how far this machine's clock is from it.
        self._clock_offset = (db_now.timestamp() - time.time()) if db_now is not None else 0.0
        self._on_suspend = on_suspend
        # Metrics and tracing: the observers, and what workflow_started returned for this attempt.
        self.observers = observers
        self.telemetry: Any = None
        # Step checkpoints handed to the writer and not yet known written: settled before the workflow's next
        # durable operation (see defer_step), or with its completion.
        self.unwritten: list[Unwritten] = []
        # Whether steps defer their checkpoints (not on a Citus schema: there a batch's steps and completions
        # are separate statements, and a step waits for its own, as before deferring existed).
        self.defer_checkpoints = defer_checkpoints
        # Set when this attempt gave up so that the execution replays at once (a deferred checkpoint the
        # database refused): the executor hands the execution back to the queue instead of letting its lease
        # run out.
        self.replay_now = False

    def lease_ran_out(self) -> bool:
        return self.lease_ends_by is not None and time.monotonic() > self.lease_ends_by

    def activate(self) -> Any:
        return _current.set(self)

    # -- replay -------------------------------------------------------------------------------------------

    def begin_step(self, step_name: str) -> tuple[int, store.checkpoints.RecordedStep | None]:
        """Take the next step ordinal; return it with the recorded outcome if this step already ran."""
        if self.mismatch is not None:
            raise NonDeterminismError(self.mismatch)
        if self.lost:
            raise LeaseLost(f"execution {self.execution_id} attempt {self.attempt} is no longer owned")
        step_id = self._next_step
        self._next_step += 1
        recorded = self.recorded.get(step_id)
        if recorded is not None and recorded.step_name != step_name:
            self.mismatch = (f"workflow {self.workflow_name!r} called step {step_name!r} as step #{step_id}, "
                             f"but the recorded history has {recorded.step_name!r} there")
            raise NonDeterminismError(self.mismatch)
        return step_id, recorded

    def replay_mismatch(self) -> str | None:
        """Why this attempt's code does not replay the recorded history (None: it does). Asked when the
        workflow ended: a mismatch it caught, or recorded steps its code never reached."""
        if self.mismatch is None and self.recorded:
            last = max(self.recorded)
            if last >= self._next_step:
                self.mismatch = (f"workflow {self.workflow_name!r} ended after {self._next_step} steps, but the "
                                 f"recorded history has {last + 1} (step #{self._next_step} is "
                                 f"{self.recorded[self._next_step].step_name!r})"
                                 if self._next_step in self.recorded else
                                 f"workflow {self.workflow_name!r} ended after {self._next_step} steps, but the "
                                 f"recorded history has {last + 1}")
        return self.mismatch

    def replay(self, recorded: store.checkpoints.RecordedStep, return_hint: Any) -> Any:
        if recorded.error is not None:
            raise failures.rebuild(json.loads(recorded.error))
        return self.serializer.loads(recorded.output or "null", return_hint)

    # -- recording ----------------------------------------------------------------------------------------

    def require_workflow_thread(self, message: str) -> None:
        """Sync code of a workflow runs on the workflow's thread, never on the worker's event loop."""
        if self._on_loop_thread():
            raise ConfigurationError(message)

    def step_done(self, step_name: str, step_id: int, started_at: datetime, failed: bool, attempts: int) -> None:
        """Tell metrics and tracing that a step ran and its outcome is recorded."""
        if self.observers:
            self.observers.step_finished(self.telemetry, step_name, step_id, started_at, self.db_now(), failed,
                                         attempts)

    def check_recorded(self, recorded: bool, step_id: int, step_name: str) -> None:
        if not recorded:
            self.lost = True
            raise LeaseLost(f"execution {self.execution_id}: attempt {self.attempt} lost its lease "
                            f"before step #{step_id} ({step_name}) could be recorded")

    def _on_loop_thread(self) -> bool:
        return getattr(self.loop, "_thread_id", None) == threading.get_ident()

    # -- what the primitives need (see primitives.py) ----------------------------------------------------------

    def db_now(self) -> datetime:
        """The database's clock, estimated from the claim: never this machine's clock, which may be off."""
        return datetime.fromtimestamp(time.time() + self._clock_offset, UTC)

    def peek_step(self) -> tuple[int, store.checkpoints.RecordedStep | None]:
        """The next step ordinal and its record, without taking it."""
        return self._next_step, self.recorded.get(self._next_step)

    def step_write(self, step_id: int, step_name: str, output: str | None, error: str | None = None,
                   started_at: datetime | None = None) -> StepWrite:
        return StepWrite(self.execution_id, self.attempt, step_id, step_name, output, error, 1,
                         started_at or self.db_now())

    def perform_sync(self, effect: Any) -> Any:
        """Run one effect of a primitive from a sync workflow's thread: a StepWrite (True if recorded), a
        list of them (recorded or not, each), or a store.Call (its result), on the worker's writer."""
        if self._on_loop_thread():
            raise ConfigurationError(_SYNC_ON_LOOP)
        if isinstance(effect, Defer):
            return self.defer_step(effect.write)
        if isinstance(effect, list):
            return [w.result() for w in self._batcher.submit_all_threadsafe(effect)]
        waiter: ThreadWaiter
        if isinstance(effect, StepWrite):
            waiter = self._batcher.submit_threadsafe(effect)
        else:
            waiter = self._batcher.run_threadsafe(effect)
        return waiter.result()

    async def perform_async(self, effect: Any) -> Any:
        if isinstance(effect, Defer):
            return self.defer_step(effect.write)
        if isinstance(effect, list):
            return list(await asyncio.gather(*self._batcher.submit_all(effect)))
        if isinstance(effect, StepWrite):
            return await self._batcher.submit(effect)
        return await self._batcher.run(effect)

    # -- deferred step checkpoints -------------------------------------------------------------------------

    def defer_step(self, write: StepWrite) -> None:
        """Record a step's outcome without waiting for it: the writer takes it along with the execution's
        next write (its completion costs no round trip of its own then), or with any other batch, or writes
        it on its own after ``batcher.LINGER_SECONDS``. The workflow's next durable operation waits for it
        first (``settle_sync``/``settle_async``), so nothing that operation does can run before the step it
        follows is recorded."""
        self.unwritten.append(Unwritten(write, self._batcher.defer(write), self.db_now() if self.observers else None))

    def settle_sync(self) -> None:
        """From a sync workflow's thread: wait until the deferred checkpoints are written."""
        if not self.unwritten:
            return
        if self._on_loop_thread():
            raise ConfigurationError(_SYNC_ON_LOOP)
        taken, self.unwritten = self.unwritten, []
        if not all(u.waiter.done() for u in taken):  # else a batch now would carry only others' writes
            self._batcher.hurry_threadsafe()
        for u in taken:
            try:
                recorded, refused = self._result_sync(u.waiter), None
            except SerializationError as exc:
                recorded, refused = False, exc
            if refused is not None:
                self._record_refusal(u, refused, self.perform_sync(self._refusal_write(u, refused)))
            self._settled(u, recorded)

    async def settle_async(self) -> None:
        """From the event loop (an async workflow, or the executor finishing any workflow), as ``settle_sync``.
        A sync workflow's waiters are settled by then: its completion was written after them."""
        if not self.unwritten:
            return
        taken, self.unwritten = self.unwritten, []
        if not all(u.waiter.done() for u in taken):
            self._batcher.hurry()
        for u in taken:
            try:
                recorded, refused = await self._result_async(u.waiter), None
            except SerializationError as exc:
                recorded, refused = False, exc
            if refused is not None:
                self._record_refusal(u, refused, await self.perform_async(self._refusal_write(u, refused)))
            self._settled(u, recorded)

    def _result_sync(self, waiter: Waiter) -> Any:
        """A deferred write's outcome, from a thread: a future was made on the loop (an async workflow that runs
        a sync step through ``asyncio.to_thread``), so it is awaited there."""
        if isinstance(waiter, asyncio.Future):
            return asyncio.run_coroutine_threadsafe(_awaited(waiter), self.loop).result()
        return waiter.result()

    async def _result_async(self, waiter: Waiter) -> Any:
        """A deferred write's outcome, on the loop: a ThreadWaiter (a sync step's) is waited for off the loop
        unless settled already (as a sync workflow's are by the time its completion returns)."""
        if isinstance(waiter, asyncio.Future):
            return await waiter
        if waiter.done():
            return waiter.result()
        return await asyncio.to_thread(waiter.result)

    def _refusal_write(self, u: Unwritten, refused: SerializationError) -> StepWrite:
        failure = SerializationError(f"step {u.write.step_name!r} (#{u.write.step_id}) could not be recorded: "
                                     f"{refused}")
        return replace(u.write, output=None, error=failures.recordable(failure)[0])

    def _record_refusal(self, u: Unwritten, refused: SerializationError, recorded: bool) -> None:
        """The database refused a deferred checkpoint (which the serializer's checks let through): the step is
        recorded as having failed with that error, and this attempt, which went on with the step's value,
        gives up; the execution replays at once, and the step raises the error as a replay raises it."""
        self.lost = True
        self.replay_now = recorded
        raise LeaseLost(f"execution {self.execution_id}: step #{u.write.step_id} ({u.write.step_name}) could not "
                        f"be recorded ({refused}); the execution replays from its checkpoints, where the step "
                        "raises that error") from refused

    def _settled(self, u: Unwritten, recorded: bool) -> None:
        self.check_recorded(recorded, u.write.step_id, u.write.step_name)
        if self.observers:
            self.observers.step_finished(self.telemetry, u.write.step_name, u.write.step_id, u.write.started_at,
                                         u.ended_at or self.db_now(), u.write.error is not None, u.write.tries)

    def write_nowait(self, write: StepWrite) -> None:
        """Queue a write without waiting for it: the execution's next write commits after it (or fails)."""
        if self._on_loop_thread():
            self._batcher.submit(write)
        else:
            self._batcher.submit_all_threadsafe([write])

    def suspended(self, wake_at: datetime | None) -> None:
        """This attempt gave its slot up: it writes nothing more."""
        self.lost = True
        if self._on_suspend is not None:
            self._on_suspend(wake_at)

    def lease_lost(self, what: str) -> LeaseLost:
        self.lost = True
        return LeaseLost(f"execution {self.execution_id}: attempt {self.attempt} no longer owns it ({what})")

