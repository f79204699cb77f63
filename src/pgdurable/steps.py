"""The @step decorator: run once, record the outcome, return the recorded outcome on replay.

``StepRun`` holds the state of one call of a step inside a workflow (replay, attempts with backoff, what to
record) and ``step_plan`` its logic, written once; the sync and async wrappers only pick the driver.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar, cast

from . import failures
from .batcher import StepWrite
from .context import ExecutionContext, _in_step, current
from .effects import Defer, Invoke, Pause
from .errors import LeaseLost, NonDeterminismError, SerializationError
from .plans import Plan, drive_async, drive_sync, record_step
from .serialization import Signature
from .workflows import refuse_generator

P = ParamSpec("P")
R = TypeVar("R")

# Types whose values a replay reads back as they are when nothing else is asked for (StepRun.as_replayed).
_READ_BACK_AS_IS = frozenset({type(None), bool, int, float, str})

# Engine errors are never retried: they describe the execution, not the step's work.
_NEVER_RETRY: tuple[type[BaseException], ...] = (LeaseLost, NonDeterminismError, SerializationError)


@dataclass(frozen=True)
class RetryPolicy:
    """How a failing step is retried: ``max_attempts`` runs in all, waiting ``interval * backoff**n``."""

    max_attempts: int = 3
    interval: float = 0.5
    backoff: float = 2.0
    max_interval: float = 60.0
    # Exception types that fail the step at once, without another attempt.
    no_retry: tuple[type[BaseException], ...] = ()

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if not (0 <= self.interval < math.inf and 1 <= self.backoff < math.inf and 0 <= self.max_interval < math.inf):
            raise ValueError("interval and max_interval must be finite and >= 0, and backoff finite and >= 1")

    def retries(self, exc: BaseException, attempt: int) -> float | None:
        """Seconds to wait before the next attempt, or None when the step should not be retried."""
        if isinstance(exc, _NEVER_RETRY + self.no_retry) or attempt >= self.max_attempts:
            return None
        return float(min(self.interval * self.backoff ** (attempt - 1), self.max_interval))


class StepRun:
    """One call of a step inside a running workflow."""

    def __init__(self, ctx: ExecutionContext, name: str, policy: RetryPolicy, return_hint: Any) -> None:
        self.ctx, self.name, self.policy, self.return_hint = ctx, name, policy, return_hint
        self.step_id, self.recorded = ctx.begin_step(name)
        self.started = ctx.db_now()  # recorded: durable time, like the step's completed_at
        self.tries = 0
        self.value: Any = None
        self.output: str | None = None  # the value as recorded
        self.failure: BaseException | None = None
        self._finished = False

    def replay(self) -> Any:
        assert self.recorded is not None
        return self.ctx.replay(self.recorded, self.return_hint)

    def attempts(self) -> Iterator[int]:
        """Attempt numbers, until one succeeded or the policy gives up."""
        while not self._finished:
            if self.tries and self.ctx.lost:
                # Another worker owns the execution now and runs this step: do not run the body again here.
                raise LeaseLost(f"execution {self.ctx.execution_id}: attempt {self.ctx.attempt} lost its lease; "
                                f"step #{self.step_id} ({self.name}) is not retried")
            self.tries += 1
            yield self.tries

    def succeeded(self, value: Any) -> None:
        self.value, self._finished = value, True

    def failed(self, exc: BaseException) -> float | None:
        """Seconds to wait before retrying, or None: then the step has failed with ``exc``."""
        delay = self.retry_delay(exc)
        if delay is None:
            self.failure, self._finished = exc, True
        return delay

    def retry_delay(self, exc: BaseException) -> float | None:
        return self.policy.retries(exc, self.tries)

    def checkpoint(self) -> tuple[int, str, str | None, str | None, int, Any]:
        """Its ``StepWrite``'s fields after the execution's. A result that cannot be stored becomes the step's
        own error, and an error is raised as a replay will raise it, so a replay always takes the first run's
        path."""
        output: str | None = None
        if self.failure is None:
            try:
                output = self.output = self.ctx.serializer.dumps(self.value)
            except SerializationError as exc:
                self.failure = SerializationError(
                    f"step {self.name!r} (#{self.step_id}) returned a value that cannot be stored: {exc}")
        error: str | None = None
        if self.failure is not None:
            error, self.failure = failures.recordable(self.failure)
        return self.step_id, self.name, output, error, self.tries, self.started

    def result(self) -> Any:
        if self.failure is not None:
            raise self.failure
        return self.as_replayed()

    def as_replayed(self) -> Any:
        """The value as a replay will read it back from its record, which the first run must see too, or it
        could take another path: JSON makes a tuple a list and a dict's int keys strings, unless the step's
        return annotation says otherwise (``-> dict[int, str]``)."""
        value = self.value
        if type(value) in _READ_BACK_AS_IS and self.return_hint in (Any, type(value)):
            return value  # no need to decode what reads back as itself
        return self.ctx.serializer.loads(self.output or "null", self.return_hint)


class running_step:  # lower-case: used as `with running_step():`
    """While a step body runs, steps it calls are plain calls. (A class, not a generator: entered on every
    step, where contextlib's machinery cost a few microseconds.)"""

    __slots__ = ("_token",)

    def __enter__(self) -> None:
        self._token = _in_step.set(True)

    def __exit__(self, *exc: object) -> None:
        _in_step.reset(self._token)


def step_plan(run: StepRun, body: Invoke) -> Plan:
    """One call of a step inside a workflow: replay its record, or run the body with retries and record it."""
    if run.recorded is not None:
        return run.replay()
    with running_step():
        for _ in run.attempts():
            try:
                run.succeeded((yield body))
            except Exception as exc:
                if (delay := run.failed(exc)) is not None:
                    yield Pause(delay)
    if run.ctx.defer_checkpoints:
        # Not waited for: written with the execution's next write, before its next durable operation starts.
        yield Defer(StepWrite(run.ctx.execution_id, run.ctx.attempt, *run.checkpoint(), deferred=True))
    else:
        yield from record_step(run.ctx, *run.checkpoint())
    return run.result()


def make_step(fn: Callable[P, R], name: str, policy: RetryPolicy, timeout: float | None = None) -> Callable[P, R]:
    """``timeout``: seconds an attempt may take (see ``effects.Invoke``); past it the attempt fails with
    ``StepTimeout`` and the policy decides whether to retry."""
    refuse_generator(fn, "step", name)
    return_hint = Signature(fn).return_hint
    label = f"step {name!r}"

    if inspect.iscoroutinefunction(fn):
        async_fn = cast(Callable[..., Any], fn)

        @functools.wraps(fn)
        async def async_step(*args: Any, **kwargs: Any) -> Any:
            ctx = current()
            if ctx is None:
                return await async_fn(*args, **kwargs)
            return await drive_async(ctx, step_plan(StepRun(ctx, name, policy, return_hint),
                                                    Invoke(async_fn, args, kwargs, timeout, label)))

        step: Callable[..., Any] = async_step
    else:
        @functools.wraps(fn)
        def sync_step(*args: Any, **kwargs: Any) -> Any:
            ctx = current()
            if ctx is None:
                return fn(*args, **kwargs)
            ctx.require_workflow_thread(f"step {name!r} is a plain (sync) function called from an async workflow; "
                                        "make the step `async def`, or call it through `await asyncio.to_thread(...)`")
            return drive_sync(ctx, step_plan(StepRun(ctx, name, policy, return_hint),
                                             Invoke(fn, args, kwargs, timeout, label)))

        step = sync_step
    step.__pgdurable_step__ = name  # type: ignore[attr-defined]
    return cast(Callable[P, R], step)
