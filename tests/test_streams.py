"""Streams: a workflow writes values under a key (each exactly once, a step), readers anywhere get them in
order as they arrive (woken by NOTIFY), sync or async, until the stream is closed or the workflow ends. The
workflow's dashboard page lists them. (Killing a worker mid-stream: test_prims_processes.)"""

from __future__ import annotations

import asyncio
import threading
import warnings
from collections.abc import Callable
from typing import Any

import pytest

import pgdurable
from pgdurable.dashboard import create_app
from tests.harness import WAIT, wait_for

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient


def test_reader_sees_values_in_order_while_the_workflow_runs_and_ends_at_close(
        app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    @app.workflow()
    def producer() -> str:
        pgdurable.write_stream("tokens", "a")
        pgdurable.write_stream("tokens", {"n": 2})
        pgdurable.recv("go")  # the reader must see the first two values while this waits
        pgdurable.write_stream("tokens", "c")
        pgdurable.close_stream("tokens")
        pgdurable.write_stream("log", "after close of tokens")
        pgdurable.recv("finish")
        return "done"

    start_worker(app)
    handle = app.enqueue(producer, workflow_id="p-1")
    reader = app.read_stream("p-1", "tokens")
    assert next(reader) == "a"
    assert next(reader) == {"n": 2}
    assert handle.status() in ("running", "waiting")
    got: list[Any] = []
    finished = threading.Event()

    def read_rest() -> None:
        got.extend(reader)
        finished.set()

    threading.Thread(target=read_rest, daemon=True).start()
    app.send("p-1", None, topic="go")
    assert finished.wait(WAIT), "the reader did not end at the stream's close"
    assert got == ["c"]
    wait_for(lambda: handle.status() == "waiting", WAIT, "the workflow to wait for 'finish'")  # still running

    log = app.read_stream("p-1", "log")
    assert next(log) == "after close of tokens"
    app.send("p-1", None, topic="finish")
    assert list(log) == []  # ends with the workflow, though never closed
    assert handle.result(timeout=WAIT) == "done"
    assert list(app.read_stream("p-1", "tokens")) == ["a", {"n": 2}, "c"]  # a late reader gets all of it
    assert list(app.read_stream("p-1", "nothing")) == []
    assert [(s.key, s.values, s.closed) for s in app.streams("p-1")] == [("log", 1, False), ("tokens", 3, True)]
    with pytest.raises(pgdurable.WorkflowNotFound):
        next(app.read_stream("nope", "tokens"))


def test_async_writer_and_async_reader(app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    @app.workflow()
    async def counter(n: int) -> int:
        for i in range(n):
            await pgdurable.write_stream_async("count", i)
        await pgdurable.close_stream_async("count")
        return n

    start_worker(app)
    handle = app.enqueue(counter, 50, workflow_id="c-1")

    async def read_all() -> list[Any]:
        return [value async for value in app.read_stream_async("c-1", "count")]

    assert asyncio.run(read_all()) == list(range(50))
    assert handle.result(timeout=WAIT) == 50


def test_stream_writes_are_steps_replayed_not_repeated(app: pgdurable.App,
                                                       start_worker: Callable[..., Any]) -> None:
    @app.workflow()
    def writer() -> str:
        for i in range(3):
            pgdurable.write_stream("s", i)
        pgdurable.close_stream("s")
        return "ok"

    start_worker(app)
    handle = app.enqueue(writer, workflow_id="w-1")
    assert handle.result(timeout=WAIT) == "ok"
    names = [s.step_name for s in app.steps("w-1")]
    assert names == ["pgdurable.write_stream"] * 3 + ["pgdurable.close_stream"]
    # A fork from step 2 replays the first two writes (copied with their steps) and writes the third again.
    fork = app.fork("w-1", 2)
    assert fork.result(timeout=WAIT) == "ok"
    assert list(app.read_stream(fork.workflow_id, "s")) == [0, 1, 2]
    with pytest.raises(ValueError, match="stream key must be 1 to 200"):
        app.read_stream("w-1", "")  # checked at the call, before any iteration
    with pytest.raises(TypeError, match="stream key must be a string"):
        app.read_stream_async("w-1", 7)  # type: ignore[arg-type]


def test_dashboard_shows_a_workflows_streams(app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    @app.workflow()
    def chatty() -> None:
        for i in range(25):
            pgdurable.write_stream("progress", {"pct": i * 4})
        pgdurable.close_stream("progress")
        pgdurable.write_stream("<b>odd key</b>", "<script>x</script>")

    start_worker(app)
    app.enqueue(chatty, workflow_id="d-1").result(timeout=WAIT)
    page = TestClient(create_app(app)).get("/workflow", params={"id": "d-1"}).text
    assert "<h2>Streams</h2>" in page and "2 keys" in page
    assert "the newest 20 of 25" in page and ">closed<" in page and ">open<" in page
    assert "<b>odd key</b>" not in page and "&lt;b&gt;odd key&lt;/b&gt;" in page
    assert "<script>x</script>" not in page
