"""Reading events that workflows publish (``pgdurable.set_event``), waiting for the first one if need be.

Outside workflows the wait is woken by NOTIFY (through the App's listener thread). Inside a workflow the
answer is recorded as a step, so a replay returns the same value without reading again.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import TYPE_CHECKING, Any

from . import store
from .completions import event_key
from .context import current
from .plans import drive_async, drive_sync, record_step

if TYPE_CHECKING:
    from .runtime import Runtime

# Re-read even without a notification this often: a safety net, not the latency.
_RECHECK_SECONDS = 5.0


def get_event(runtime: Runtime, workflow_id: str, key: str, timeout: float | None) -> Any:
    ctx = current()
    if ctx is None:
        return _read(runtime, _wait(runtime, workflow_id, key, timeout))
    step_id, recorded = ctx.begin_step("pgdurable.get_event")
    if recorded is not None:
        return ctx.replay(recorded, Any)
    text = _wait(runtime, workflow_id, key, timeout)
    drive_sync(ctx, record_step(ctx, step_id, "pgdurable.get_event", text or "null", None, 1, ctx.db_now()))
    return _read(runtime, text)


async def get_event_async(runtime: Runtime, workflow_id: str, key: str, timeout: float | None) -> Any:
    ctx = current()
    if ctx is None:
        return _read(runtime, await _wait_async(runtime, workflow_id, key, timeout))
    step_id, recorded = ctx.begin_step("pgdurable.get_event")
    if recorded is not None:
        return ctx.replay(recorded, Any)
    text = await _wait_async(runtime, workflow_id, key, timeout)
    await drive_async(ctx, record_step(ctx, step_id, "pgdurable.get_event", text or "null", None, 1,
                                      ctx.db_now()))
    return _read(runtime, text)


def _read(runtime: Runtime, text: str | None) -> Any:
    return None if text is None else runtime.serializer.loads(text, Any)


def _wait(runtime: Runtime, workflow_id: str, key: str, timeout: float | None) -> str | None:
    deadline = None if timeout is None else time.monotonic() + timeout
    call = store.get_event(id=workflow_id, key=key)
    found = runtime.db.run(call)
    if found is not None or not timeout:
        return found
    published = threading.Event()
    unsubscribe = runtime.completions.subscribe(event_key(workflow_id), published.set)
    try:
        while True:
            found = runtime.db.run(call)  # after subscribing: an event published in between is seen
            remaining = _remaining(deadline)
            if found is not None or remaining <= 0:
                return found
            published.wait(min(remaining, _RECHECK_SECONDS))
            published.clear()
    finally:
        unsubscribe()


async def _wait_async(runtime: Runtime, workflow_id: str, key: str, timeout: float | None) -> str | None:
    deadline = None if timeout is None else time.monotonic() + timeout
    call = store.get_event(id=workflow_id, key=key)
    found = await runtime.db.arun(call)
    if found is not None or not timeout:
        return found
    loop = asyncio.get_running_loop()
    published = asyncio.Event()

    def wake() -> None:
        loop.call_soon_threadsafe(published.set)

    unsubscribe = await asyncio.to_thread(runtime.completions.subscribe, event_key(workflow_id), wake)
    try:
        while True:
            found = await runtime.db.arun(call)
            remaining = _remaining(deadline)
            if found is not None or remaining <= 0:
                return found
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(published.wait(), min(remaining, _RECHECK_SECONDS))
            published.clear()
    finally:
        unsubscribe()


def _remaining(deadline: float | None) -> float:
    return float("inf") if deadline is None else deadline - time.monotonic()
