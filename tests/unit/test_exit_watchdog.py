"""worker/watchdog.py: a worker process's stop that does not end is reported, with every stack, then forced."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from pgdurable.worker.watchdog import EXIT_STATUS, ExitWatchdog


def test_a_blocked_event_loop_is_reported_with_the_call_that_blocks_it(caplog: pytest.LogCaptureFixture) -> None:
    loop = asyncio.new_event_loop()
    release = threading.Event()

    def a_call_that_blocks_the_loop() -> None:
        release.wait(60)

    async def main() -> None:
        a_call_that_blocks_the_loop()

    runner = threading.Thread(target=loop.run_until_complete, args=(main(),))
    runner.start()
    exited: list[int] = []
    forced = threading.Event()

    def exit(status: int) -> None:
        exited.append(status)
        forced.set()

    try:
        with caplog.at_level(logging.ERROR, logger="pgdurable.worker"):
            ExitWatchdog(loop, grace=0.0, patience=0.1, exit=exit).arm()
            assert forced.wait(30), "the watchdog never ended the stop"
    finally:
        release.set()
        runner.join(30)
        loop.close()
    assert exited == [EXIT_STATUS]
    report = caplog.text
    assert "did not finish stopping within 0.1 s of the stop" in report
    assert "in a_call_that_blocks_the_loop" in report  # the threads' stacks show the blocking call
    assert "the event loop did not run for 2 s" in report


def test_the_tasks_of_a_running_loop_are_reported_with_what_they_await(caplog: pytest.LogCaptureFixture) -> None:
    loop = asyncio.new_event_loop()
    exited = threading.Event()

    async def awaits_forever() -> None:
        await asyncio.Event().wait()

    async def main() -> None:
        task = asyncio.create_task(awaits_forever(), name="held")
        with caplog.at_level(logging.ERROR, logger="pgdurable.worker"):
            ExitWatchdog(loop, grace=0.0, patience=0.1, exit=lambda status: loop.call_soon_threadsafe(
                exited.set)).arm()
            while not exited.is_set():
                await asyncio.sleep(0.01)
        task.cancel()

    loop.run_until_complete(main())
    loop.close()
    report = caplog.text
    assert "Task 'held' awaits:" in report
    assert "in awaits_forever\n" in report and "in wait\n" in report  # down to the Event it waits on
