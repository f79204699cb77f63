"""wait_event: the event-or-timeout wait every worker loop sleeps in must never swallow a cancellation."""

from __future__ import annotations

import asyncio
import contextlib
import sys

import pytest

from pgdurable.waiting import cancel_and_wait, wait_event


async def _loop_until_cancelled(event: asyncio.Event, passes: list[bool]) -> None:
    while True:  # the shape of the producer's, timer's and scheduler's loops
        event.clear()
        passes.append(await wait_event(event, 5.0))


def test_a_cancellation_arriving_with_the_wake_up_ends_the_loop() -> None:
    async def main() -> list[bool]:
        event, passes = asyncio.Event(), []  # type: ignore[var-annotated]
        task = asyncio.create_task(_loop_until_cancelled(event, passes))
        await asyncio.sleep(0.01)
        event.set()
        await asyncio.sleep(0)  # the inner wait has completed; the loop has not run on yet
        task.cancel()  # (asyncio.wait_for on Python 3.11 returned here and the loop went on forever)
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(task), 10.0)
        return passes

    assert asyncio.run(main()) == [True]  # the wake-up was seen, then the cancellation


def test_reports_whether_the_event_was_set() -> None:
    async def main() -> tuple[bool, bool, bool]:
        event = asyncio.Event()
        timed_out = await wait_event(event, 0.01)
        asyncio.get_running_loop().call_later(0.01, event.set)
        woken = await wait_event(event, 10.0)
        return timed_out, woken, await wait_event(event, -1.0)  # already set: True even with no time left

    assert asyncio.run(main()) == (False, True, True)


async def _takes_a_connection_then_loops(handed: asyncio.Future[str], passes: list[str]) -> None:
    # The shape of a worker loop whose query waits for a pooled connection: psycopg_pool waits for one with
    # asyncio.wait_for, which on Python 3.11 returns the connection when it arrives with the cancellation.
    passes.append(await asyncio.wait_for(handed, 10.0))
    while True:
        await asyncio.sleep(0.01)


def test_a_task_that_swallowed_its_cancellation_is_cancelled_again() -> None:
    async def main() -> tuple[bool, bool, list[str]]:
        handed: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        passes: list[str] = []
        task = asyncio.create_task(_takes_a_connection_then_loops(handed, passes))
        await asyncio.sleep(0.01)
        handed.set_result("conn")  # another cancelled task returned its connection to the pool...
        task.cancel()  # ...in the iteration this one is cancelled
        await asyncio.wait({task}, timeout=0.2)
        swallowed = not task.done()  # one cancel was not enough (on 3.11; later Pythons may not lose it)
        still_running = await cancel_and_wait([task], every=0.05, patience=10.0)
        return swallowed, task.cancelled() and not still_running, passes

    swallowed, ended, passes = asyncio.run(main())
    assert ended
    if sys.version_info < (3, 12):
        assert swallowed  # the bug cancel_and_wait exists for is really there
        assert passes == ["conn"]


def test_cancel_and_wait_gives_up_after_its_patience() -> None:
    async def main() -> tuple[bool, bool]:
        released = asyncio.Event()

        async def stubborn() -> None:
            while not released.is_set():
                with contextlib.suppress(asyncio.CancelledError):  # ignores cancellation until released
                    await asyncio.sleep(1.0)

        task = asyncio.create_task(stubborn())
        await asyncio.sleep(0)
        left = await cancel_and_wait([task], every=0.02, patience=0.1)
        gave_up = left == {task} and not task.done()
        released.set()
        return gave_up, not await cancel_and_wait([task], every=0.02, patience=10.0)

    assert asyncio.run(main()) == (True, True)
