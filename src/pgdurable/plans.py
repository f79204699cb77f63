"""One implementation of each in-workflow operation, two drivers.

An operation (a step, a durable sleep, a receive, a child's start...) is written once, as a *plan*: a
generator that yields effects and receives their results (or has their exceptions thrown into it). An effect
is a statement for the worker's writer (a ``StepWrite``, a list of them, or a ``store.Call``), a call of the
user's code (``Invoke``: a step's body), or a pause (``Pause``: a retry's backoff). ``drive_sync`` runs a
plan from a sync workflow's thread, ``drive_async`` from an async workflow's task; nothing else differs
between sync and async, so the engine keeps no twin of any operation.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import inspect
import logging
import queue
import threading
import time
from collections.abc import Generator
from dataclasses import replace
from datetime import datetime
from typing import Any

import psycopg

from . import failures
from .batcher import StepWrite
from .context import ExecutionContext
from .effects import Invoke, Pause
from .errors import SerializationError, StepTimeout

Plan = Generator[Any, Any, Any]

log = logging.getLogger("pgdurable.steps")

# How long a cancelled coroutine (an async step past its timeout) is given to unwind before its attempt fails.
CANCEL_GRACE_SECONDS = 1.0


def _no_statements(effect: Any) -> RuntimeError:
    return RuntimeError(f"a plan run outside a workflow yielded {type(effect).__name__}: only calls and pauses "
                        "can run there")


def drive_sync(ctx: ExecutionContext | None, plan: Plan) -> Any:
    """Run a plan from a sync workflow's thread (``ctx`` None: outside a workflow, where a plan may only call
    and pause, as a transactional step called outside a workflow does)."""
    if ctx is not None:
        ctx.settle_sync()  # the step checkpoints this operation follows are written before it starts
    result: Any = None
    error: BaseException | None = None
    while True:
        try:
            effect = plan.throw(error) if error is not None else plan.send(result)
        except StopIteration as done:
            return done.value
        result, error = None, None
        if isinstance(effect, Invoke):
            try:
                result = call_sync(effect)
            except BaseException as exc:  # thrown in, so the plan's own cleanup runs here, in this context
                error = exc
        elif isinstance(effect, Pause):
            time.sleep(effect.seconds)
        elif ctx is None:
            error = _no_statements(effect)
        else:
            try:
                result = ctx.perform_sync(effect)
            except psycopg.OperationalError as exc:
                error = _gave_up(ctx, exc)
            except Exception as exc:
                error = exc


async def drive_async(ctx: ExecutionContext | None, plan: Plan) -> Any:
    """Run a plan from an async workflow's task (``ctx`` None: outside a workflow, as in ``drive_sync``)."""
    if ctx is not None:
        await ctx.settle_async()
    result: Any = None
    error: BaseException | None = None
    while True:
        try:
            effect = plan.throw(error) if error is not None else plan.send(result)
        except StopIteration as done:
            return done.value
        result, error = None, None
        if isinstance(effect, Invoke):
            try:
                result = await call_async(effect)
            except BaseException as exc:
                error = exc
        elif isinstance(effect, Pause):
            await asyncio.sleep(effect.seconds)
        elif ctx is None:
            error = _no_statements(effect)
        else:
            try:
                result = await ctx.perform_async(effect)
            except psycopg.OperationalError as exc:
                error = _gave_up(ctx, exc)
            except Exception as exc:
                error = exc


def call_sync(effect: Invoke) -> Any:
    """Call the user's code. With a timeout it runs on a thread of its own (in a copy of this context), which
    is abandoned at the timeout: Python cannot stop a thread, so what it does afterwards is ignored."""
    if effect.timeout is None:
        return effect.fn(*effect.args, **effect.kwargs)
    call = _TimedCall(effect, contextvars.copy_context())
    _runners.submit(call)
    if not call.finished.wait(effect.timeout):
        log.warning("%s ran past its timeout of %g s: its thread is abandoned and keeps running until it returns; "
                    "what it returns is ignored", effect.label, effect.timeout)
        raise StepTimeout(f"{effect.label} did not finish within its timeout of {effect.timeout:g} s")
    if call.error is not None:
        raise call.error
    return call.value


class _TimedCall:
    def __init__(self, effect: Invoke, context: contextvars.Context) -> None:
        self.effect, self.context = effect, context
        self.finished = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.value = self.context.run(self.effect.fn, *self.effect.args, **self.effect.kwargs)
        except BaseException as exc:
            self.error = exc


class _Runners:
    """The threads timed sync calls run on, reused (starting a thread per call cost ~0.2 ms a step). A thread
    whose call was abandoned at its timeout stays busy until the call returns, so new ones are started while
    every thread is busy: there are as many as timed calls ever ran at once."""

    def __init__(self) -> None:
        # Idle threads' inboxes, the most recently idle last (taken first: its stack is warm). deque's append
        # and pop are atomic.
        self._idle: collections.deque[queue.SimpleQueue[_TimedCall]] = collections.deque()

    def submit(self, call: _TimedCall) -> None:
        try:
            inbox = self._idle.pop()
        except IndexError:
            inbox = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(inbox,), name="pgdurable-timed-call", daemon=True).start()
        inbox.put(call)

    def _serve(self, inbox: queue.SimpleQueue[_TimedCall]) -> None:
        while True:
            call = inbox.get()
            call.run()
            self._idle.append(inbox)  # idle again before the caller wakes, so its next call can reuse it
            call.finished.set()
            del call  # hold nothing of a finished call while idle


_runners = _Runners()


async def call_async(effect: Invoke) -> Any:
    """Call the user's code and await what it returns; with a timeout, a coroutine still running at the timeout
    is cancelled (and given CANCEL_GRACE_SECONDS to unwind)."""
    result = effect.fn(*effect.args, **effect.kwargs)
    if not inspect.isawaitable(result):
        return result
    if effect.timeout is None:
        return await result
    task = asyncio.ensure_future(result)
    try:
        done, _ = await asyncio.wait({task}, timeout=effect.timeout)
    except asyncio.CancelledError:
        task.cancel()  # the workflow itself is being cancelled: so is its step
        raise
    if task in done:
        return task.result()
    task.cancel()
    task.add_done_callback(_retrieve)  # whatever it ends with is ignored, without "never retrieved" noise
    await asyncio.wait({task}, timeout=CANCEL_GRACE_SECONDS)
    if not task.done():
        log.warning("%s was cancelled at its timeout of %g s but has not stopped after %g s more", effect.label,
                    effect.timeout, CANCEL_GRACE_SECONDS)
    raise StepTimeout(f"{effect.label} did not finish within its timeout of {effect.timeout:g} s; it was cancelled")


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _gave_up(ctx: ExecutionContext, exc: psycopg.OperationalError) -> BaseException:
    """A statement failed for the database's reasons, not the workflow's: a lost connection, a cancelled
    statement (pg_cancel_backend, statement_timeout), a server shutting down. It did not commit (a cancel), or
    nobody knows (a lost connection); each statement records its effect and its step together, so either way
    this attempt is given up without raising into the workflow: its lease runs out and the execution resumes
    from its checkpoints, where the replay finds whatever did commit."""
    lost = ctx.lease_lost(f"a statement of a durable primitive failed: {type(exc).__name__}: {exc}".strip())
    lost.__cause__ = exc
    return lost


def record_step(ctx: ExecutionContext, step_id: int, step_name: str, output: str | None, error: str | None,
                attempts: int, started_at: datetime) -> Plan:
    """Record a step's outcome through the worker's writer. An outcome the database refuses is recorded as the
    step's own ``SerializationError`` instead, which is then raised (as a replay will raise it)."""
    write = StepWrite(ctx.execution_id, ctx.attempt, step_id, step_name, output, error, attempts, started_at)
    try:
        recorded = yield write
    except SerializationError as refused:
        failure = SerializationError(f"step {step_name!r} (#{step_id}) could not be recorded: {refused}")
        text, raised = failures.recordable(failure)
        ctx.check_recorded((yield replace(write, output=None, error=text)), step_id, step_name)
        ctx.step_done(step_name, step_id, started_at, True, attempts)
        raise raised from None
    ctx.check_recorded(recorded, step_id, step_name)
    ctx.step_done(step_name, step_id, started_at, error is not None, attempts)
