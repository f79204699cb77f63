"""A worker says when an async workflow blocks its event loop, and where (worker/loop_watch.py)."""

from __future__ import annotations

import asyncio
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
        assert app.enqueue(blocks_its_loop).result(timeout=WAIT) == "done"
        wait_for(lambda: any("runs again" in r.getMessage() for r in caplog.records), WAIT, "the loop's recovery")
    messages = [r.getMessage() for r in caplog.records]
    blocked = [m for m in messages if "has not run for" in m]
    assert len(blocked) == 1, messages
    assert "in blocks_its_loop" in blocked[0] and "time.sleep(1.5)" in blocked[0]
    again = [m for m in messages if "runs again" in m]
    assert len(again) == 1
    seconds = float(again[0].rsplit("after ", 1)[1].split(" s")[0])
    assert seconds >= 1.0


def test_a_loop_that_is_not_blocked_is_not_reported(
        app: pgdurable.App, start_worker: Callable[..., Any], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(loop_watch, "STALL_SECONDS", 0.5)

    @app.workflow()
    async def waits_politely() -> str:
        await asyncio.sleep(1.5)
        return "done"

    with caplog.at_level(logging.WARNING, logger="pgdurable.worker"):
        worker = start_worker(app)
        assert app.enqueue(waits_politely).result(timeout=WAIT) == "done"
        worker.stop()  # and a stopped worker's silent loop is not taken for a blocked one
        time.sleep(1.0)
    assert not [r.getMessage() for r in caplog.records if "event loop" in r.getMessage()]
