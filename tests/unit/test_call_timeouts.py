"""plans.call_sync / call_async: a user call with a timeout (a step's), without a database."""

from __future__ import annotations

import asyncio
import contextvars
import threading

import pytest

from pgdurable.effects import Invoke
from pgdurable.errors import StepTimeout
from pgdurable.plans import call_async, call_sync

WAIT = 30.0
who = contextvars.ContextVar("who", default="nobody")


def test_a_sync_call_within_its_timeout_returns_or_raises_as_it_would() -> None:
    assert call_sync(Invoke(lambda x: x + 1, (1,), timeout=WAIT)) == 2
    with pytest.raises(KeyError, match="k"):
        call_sync(Invoke(lambda: {}["k"], timeout=WAIT))


def test_a_sync_call_sees_the_callers_context() -> None:
    who.set("workflow")
    assert call_sync(Invoke(who.get, timeout=WAIT)) == "workflow"


def test_a_sync_call_past_its_timeout_is_abandoned_and_its_late_result_ignored() -> None:
    release, returned = threading.Event(), threading.Event()

    def hangs() -> str:
        release.wait(WAIT)
        returned.set()
        return "late"

    with pytest.raises(StepTimeout, match=r"step 'x' did not finish within its timeout of 0\.05 s"):
        call_sync(Invoke(hangs, timeout=0.05, label="step 'x'"))
    release.set()
    assert returned.wait(WAIT)  # it ran to its end on its own thread; nobody received its result


def test_an_async_call_within_its_timeout_returns_or_raises_as_it_would() -> None:
    async def add(x: int) -> int:
        return x + 1

    async def fails() -> None:
        raise KeyError("k")

    assert asyncio.run(call_async(Invoke(add, (1,), timeout=WAIT))) == 2
    with pytest.raises(KeyError):
        asyncio.run(call_async(Invoke(fails, timeout=WAIT)))


def test_an_async_call_past_its_timeout_is_cancelled() -> None:
    seen: list[str] = []

    async def waits() -> None:
        try:
            await asyncio.sleep(WAIT)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    with pytest.raises(StepTimeout, match="it was cancelled"):
        asyncio.run(call_async(Invoke(waits, timeout=0.05, label="step 'y'")))
    assert seen == ["cancelled"]


def test_cancelling_the_caller_cancels_the_timed_call() -> None:
    seen: list[str] = []

    async def waits() -> None:
        try:
            await asyncio.sleep(WAIT)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    async def main() -> None:
        outer = asyncio.ensure_future(call_async(Invoke(waits, timeout=WAIT)))
        await asyncio.sleep(0.01)
        outer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await outer
        await asyncio.sleep(0.01)

    asyncio.run(main())
    assert seen == ["cancelled"]


def test_without_a_timeout_nothing_changes() -> None:
    assert call_sync(Invoke(threading.current_thread)) is threading.current_thread()


def test_timed_calls_reuse_threads_but_never_one_still_running_an_abandoned_call() -> None:
    release = threading.Event()
    first = call_sync(Invoke(threading.get_ident, timeout=WAIT))
    assert call_sync(Invoke(threading.get_ident, timeout=WAIT)) == first  # reused once idle

    def hangs() -> int:
        release.wait(WAIT)
        return threading.get_ident()

    with pytest.raises(StepTimeout):
        call_sync(Invoke(hangs, timeout=0.05))
    busy = {first}  # the abandoned call holds the thread it ran on (the idle one: the first)
    other = call_sync(Invoke(threading.get_ident, timeout=WAIT))
    assert other not in busy
    release.set()
