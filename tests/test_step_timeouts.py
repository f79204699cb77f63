"""Step timeouts (@app.step(timeout=...), @app.transaction(timeout=...)) on a real PostgreSQL, with in-process
workers and a worker process killed while a timed step runs."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

import pgdurable
from pgdurable import StepTimeout
from tests.harness import WAIT, wait_for


def test_a_sync_step_past_its_timeout_is_abandoned_and_retried(app: pgdurable.App,
                                                               start_worker: Callable[..., Any]) -> None:
    release = threading.Event()
    late: list[str] = []
    calls: list[int] = []

    @app.step(timeout=0.5, max_attempts=3, interval=0)
    def fetch(n: int) -> int:
        calls.append(n)
        if len(calls) == 1:
            release.wait(WAIT)  # hangs past its timeout; released only at the end of the test
            late.append("returned")
            return -1
        return n + 1

    @app.workflow()
    def flow(n: int) -> int:
        return int(fetch(n))

    start_worker(app)
    handle = app.enqueue(flow, 41)
    try:
        assert handle.result(timeout=WAIT) == 42
        [step] = app.steps(handle.workflow_id)
        assert step.attempts == 2 and step.error is None
    finally:
        release.set()
    wait_for(lambda: late == ["returned"], WAIT, "the abandoned attempt to return")
    [step] = app.steps(handle.workflow_id)
    assert step.output == "42"  # the abandoned attempt's late result changed nothing


def test_a_step_that_always_times_out_fails_the_workflow_with_step_timeout(
        app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    release = threading.Event()

    @app.step(timeout=0.3, max_attempts=2, interval=0)
    def stuck() -> None:
        release.wait(WAIT)

    @app.workflow()
    def flow() -> str:
        try:
            stuck()
        except StepTimeout as exc:
            return f"caught {type(exc).__name__}"
        return "finished"

    start_worker(app)
    try:
        handle = app.enqueue(flow)
        assert handle.result(timeout=WAIT) == "caught StepTimeout"
        [step] = app.steps(handle.workflow_id)
        assert step.attempts == 2 and step.error is not None and "StepTimeout" in step.error
    finally:
        release.set()


def test_an_async_step_is_cancelled_at_its_timeout(app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    seen: list[str] = []

    @app.step(timeout=0.3, max_attempts=1)
    async def waits_forever() -> None:
        try:
            await asyncio.sleep(WAIT * 2)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    @app.workflow()
    async def flow() -> str:
        try:
            await waits_forever()
        except StepTimeout:
            return "timed out"
        return "finished"

    start_worker(app)
    handle = app.enqueue(flow)
    assert handle.result(timeout=WAIT) == "timed out"
    assert seen == ["cancelled"]
    # The replay of a recorded timeout raises it again: the workflow takes the same path.
    [step] = app.steps(handle.workflow_id)
    assert step.error is not None and "StepTimeout" in step.error


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_transactional_step_past_its_timeout_is_stopped_by_the_server_and_rolled_back(
        app: pgdurable.App, start_worker: Callable[..., Any], database_url: str, schema: str, kind: str) -> None:
    table = f'"{schema}".timeout_effects'
    app.migrate()
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (note text)")
    statements = [f"INSERT INTO {table} VALUES ('written')", "SELECT pg_sleep(60)"]

    if kind == "sync":
        @app.transaction(timeout=0.5, max_attempts=1)
        def write(conn: psycopg.Connection[Any]) -> None:
            for statement in statements:
                conn.execute(statement)

        @app.workflow()
        def flow() -> str:
            try:
                write()
            except StepTimeout as exc:
                return str(exc)
            return "finished"
    else:
        @app.transaction(timeout=0.5, max_attempts=1)
        async def write(conn: psycopg.AsyncConnection[Any]) -> None:
            for statement in statements:
                await conn.execute(statement)

        @app.workflow()
        async def flow() -> str:
            try:
                await write()
            except StepTimeout as exc:
                return str(exc)
            return "finished"

    start_worker(app)
    message = app.enqueue(flow).result(timeout=WAIT)
    assert "timeout of 0.5 s" in message and "rolled back" in message
    with psycopg.connect(database_url) as conn:
        assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)


def test_timeouts_are_checked_when_the_step_is_declared(app: pgdurable.App) -> None:
    for bad in (0, -1, float("nan"), float("inf"), "soon"):
        with pytest.raises((ValueError, TypeError), match="step timeout"):
            app.step(timeout=bad)  # type: ignore[arg-type]
        with pytest.raises((ValueError, TypeError), match="step timeout"):
            app.transaction(timeout=bad)  # type: ignore[arg-type]


def test_a_worker_killed_while_a_timed_step_runs_is_replaced_and_the_step_runs_again(
        database_url: str, schema: str, tmp_path: Path, spawn_worker: Callable[..., Any]) -> None:
    effects, hang = tmp_path / "effects", tmp_path / "hang"
    hang.touch()
    env = {"TIMEOUTS_EFFECTS": str(effects), "TIMEOUTS_HANG": str(hang)}
    os.environ.update(env)  # the in-process App below only enqueues; the variables are for the workers
    client = pgdurable.App(database_url, schema=schema)
    try:
        client.migrate()
        first = spawn_worker("tests.apps.timeouts:app", env=env)
        handle = client.enqueue("timed", n=20)
        wait_for(lambda: effects.exists() and f"{first.pid} begin" in effects.read_text(), WAIT,
                 "the first worker to start the step")
        first.send_signal(signal.SIGKILL)
        first.wait()
        hang.unlink()
        second = spawn_worker("tests.apps.timeouts:app", env=env)
        assert handle.result(timeout=WAIT) == 42
        lines = effects.read_text().split("\n")
        assert f"{first.pid} begin" in lines and f"{second.pid} begin" in lines and f"{second.pid} end" in lines
        assert f"{first.pid} end" not in lines
        [step] = client.steps(handle.workflow_id)
        assert step.output == "21" and step.error is None
    finally:
        for key in env:
            os.environ.pop(key, None)
        client.close()
