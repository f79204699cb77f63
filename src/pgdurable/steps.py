"""The @step decorator: run once, record the outcome, return the recorded outcome on replay."""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar, cast

from .context import _in_step, current, utcnow
from .errors import LeaseLost, NonDeterminismError, SerializationError
from .serialization import Signature

P = ParamSpec("P")
R = TypeVar("R")

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
        if self.interval < 0 or self.backoff < 1:
            raise ValueError("interval must be >= 0 and backoff >= 1")

    def delay_after(self, attempt: int) -> float | None:
        """Seconds to wait before the next attempt, or None when the step should not be retried."""
        if attempt >= self.max_attempts:
            return None
        return float(min(self.interval * self.backoff ** (attempt - 1), self.max_interval))

    def retries(self, exc: BaseException, attempt: int) -> float | None:
        if isinstance(exc, _NEVER_RETRY + self.no_retry):
            return None
        return self.delay_after(attempt)


def make_step(fn: Callable[P, R], name: str, policy: RetryPolicy) -> Callable[P, R]:
    return_hint = Signature(fn).return_hint

    if inspect.iscoroutinefunction(fn):
        async_fn = cast(Callable[..., Any], fn)

        @functools.wraps(fn)
        async def async_step(*args: Any, **kwargs: Any) -> Any:
            ctx = current()
            if ctx is None:
                return await async_fn(*args, **kwargs)
            step_id, recorded = ctx.begin_step(name)
            if recorded is not None:
                return ctx.replay(recorded, return_hint)
            started, attempt = utcnow(), 0
            failure: BaseException | None
            token = _in_step.set(True)
            try:
                while True:
                    attempt += 1
                    try:
                        value, failure = await async_fn(*args, **kwargs), None
                        break
                    except Exception as exc:
                        delay = policy.retries(exc, attempt)
                        if delay is None:
                            value, failure = None, exc
                            break
                        await asyncio.sleep(delay)
            finally:
                _in_step.reset(token)
            output, error, failure = _encode(ctx, value, failure)
            await ctx.record(step_id, name, output, error, attempt, started)
            if failure is not None:
                raise failure
            return value

        step: Callable[..., Any] = async_step
    else:
        @functools.wraps(fn)
        def sync_step(*args: Any, **kwargs: Any) -> Any:
            ctx = current()
            if ctx is None:
                return fn(*args, **kwargs)
            step_id, recorded = ctx.begin_step(name)
            if recorded is not None:
                return ctx.replay(recorded, return_hint)
            started, attempt = utcnow(), 0
            failure: BaseException | None
            token = _in_step.set(True)
            try:
                while True:
                    attempt += 1
                    try:
                        value, failure = fn(*args, **kwargs), None
                        break
                    except Exception as exc:
                        delay = policy.retries(exc, attempt)
                        if delay is None:
                            value, failure = None, exc
                            break
                        time.sleep(delay)
            finally:
                _in_step.reset(token)
            output, error, failure = _encode(ctx, value, failure)
            ctx.record_sync(step_id, name, output, error, attempt, started)
            if failure is not None:
                raise failure
            return value

        step = sync_step
    step.__pgdurable_step__ = name  # type: ignore[attr-defined]
    return cast(Callable[P, R], step)


def _encode(ctx: Any, value: Any,
            failure: BaseException | None) -> tuple[str | None, str | None, BaseException | None]:
    """The outcome as stored text. An unencodable result becomes the step's error, so replay agrees."""
    try:
        output, error = ctx.encode_outcome(value, failure)
    except SerializationError as exc:
        output, error = ctx.encode_outcome(None, exc)
        failure = exc
    return output, error, failure
