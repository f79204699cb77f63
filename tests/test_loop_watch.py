"""A worker says when an async workflow blocks its event loop, and where (worker/loop_watch.py)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import pytest

import pgdurable
from pgdurable.worker import loop_watch
from tests.harness import WAIT, wait_for


def test_a_blocked_event_loop_is_reported_with_the_line_that_blocks_it(
        app: pgdurable.App, start_worker: Callable[..., Any], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(loop_watch, "STALL_SECONDS", 0.5)

    @app.workflow()
    async def blocks_its_loop() -> str:
        time.sleep(1.5)  # the mistake this test is about: a blocking call on the loop
        return "done"

    with caplog.at_level(logging.WARNING, logger="pgdurable.worker"):
        start_worker(app)
        handle = app.enqueue(blocks_its_loop)
        assert handle.result(timeout=WAIT) == "done"
        wait_for(lambda: any("runs again" in r.getMessage() for r in caplog.records), WAIT, "the loop's recovery")
    messages = [r.getMessage() for r in caplog.records]
    # (A loaded machine may starve the loop at other moments too: those reports are not this test's.)
    blocked = [m for m in messages if "has not run for" in m and "in blocks_its_loop" in m]
    assert len(blocked) == 1 and "time.sleep(1.5)" in blocked[0], messages
    assert f"The loop runs task 'pgdurable:{handle.workflow_id}'" in blocked[0]  # the execution to look at
    again = [float(m.rsplit("after ", 1)[1].split(" s")[0]) for m in messages if "runs again" in m]
    assert max(again) >= 1.0


def test_the_watch_ends_with_the_worker(app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    """A stopped worker's loop beats no more: its watch must end with it, not take the silence for a block."""
    worker = start_worker(app)
    wait_for(lambda: worker.worker.loop_watch is not None, WAIT, "the worker to start")
    watching = worker.worker.loop_watch._thread
    assert watching.is_alive()
    worker.stop()
    watching.join(WAIT)
    assert not watching.is_alive()
