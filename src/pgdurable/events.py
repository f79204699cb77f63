"""Reading events that workflows publish (``pgdurable.set_event``), waiting for the first one if need be.

Outside workflows the wait is woken by NOTIFY (through the App's listener thread). Inside a workflow the
answer is recorded as a step, so a replay returns the same value without reading again.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from . import store
from .completions import Listen, Nap, event_key, wait_async, wait_sync
from .context import current
from .plans import drive_async, drive_sync, record_step

if TYPE_CHECKING:
    from .runtime import Runtime

# Re-read even without a notification this often: a safety net, not the latency.
_RECHECK_SECONDS = 5.0


def get_event(runtime: Runtime, execution_id: str, key: str, timeout: float | None) -> Any:
    ctx = current()
    if ctx is None:
        return _read(runtime, _wait(runtime, execution_id, key, timeout))
    step_id, recorded = ctx.begin_step("pgdurable.get_event")
    if recorded is not None:
        return ctx.replay(recorded, Any)
    text = _wait(runtime, execution_id, key, timeout)
    drive_sync(ctx, record_step(ctx, step_id, "pgdurable.get_event", text or "null", None, 1, ctx.db_now()))
    return _read(runtime, text)


async def get_event_async(runtime: Runtime, execution_id: str, key: str, timeout: float | None) -> Any:
    ctx = current()
    if ctx is None:
        return _read(runtime, await _wait_async(runtime, execution_id, key, timeout))
    step_id, recorded = ctx.begin_step("pgdurable.get_event")
    if recorded is not None:
        return ctx.replay(recorded, Any)
    text = await _wait_async(runtime, execution_id, key, timeout)
    await drive_async(ctx, record_step(ctx, step_id, "pgdurable.get_event", text or "null", None, 1,
                                      ctx.db_now()))
    return _read(runtime, text)


def _read(runtime: Runtime, text: str | None) -> Any:
    return None if text is None else runtime.serializer.loads(text, Any)


def _wait(runtime: Runtime, execution_id: str, key: str, timeout: float | None) -> str | None:
    return wait_sync(runtime.db, runtime.completions, _published(execution_id, key, timeout))


async def _wait_async(runtime: Runtime, execution_id: str, key: str, timeout: float | None) -> str | None:
    return await wait_async(runtime.db, runtime.completions, _published(execution_id, key, timeout))


def _published(execution_id: str, key: str, timeout: float | None) -> Generator[Any, Any, str | None]:
    """The event's latest value, waiting up to ``timeout`` for a first one (one plan, both drivers)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    call = store.messaging.get_event(id=execution_id, key=key)
    found: str | None = yield call
    if found is not None or not timeout:
        return found
    yield Listen(event_key(execution_id))
    while True:
        found = yield call  # after subscribing: an event published in between is seen
        remaining = _remaining(deadline)
        if found is not None or remaining <= 0:
            return found
        yield Nap(min(remaining, _RECHECK_SECONDS))


def _remaining(deadline: float | None) -> float:
    return float("inf") if deadline is None else deadline - time.monotonic()
