"""A step's checkpoint is handed to the worker's writer without waiting (ExecutionContext.defer_step): it is
written with the execution's next write (the completion, in the same transaction), before the workflow's next
durable operation starts, or on its own shortly after if neither comes. Against PostgreSQL, sync and async."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest

import pgdurable
from pgdurable.errors import SerializationError
from tests.harness import WAIT, execute, wait_for


def recorded_steps(app: pgdurable.App, id: str) -> list[int]:
    return [r[0] for r in execute(app, "SELECT step_id FROM operation_outputs WHERE execution_id = %s ORDER BY 1", id)]


def writers(app: pgdurable.App, id: str) -> tuple[list[str], str]:
    """The transaction ids (xmin) that wrote each step row, and the one that wrote the finished execution row."""
    steps = execute(app, "SELECT xmin::text FROM operation_outputs WHERE execution_id = %s ORDER BY step_id", id)
    [(completion,)] = execute(app, "SELECT xmin::text FROM workflow_executions WHERE id = %s", id)
    return [x for (x,) in steps], completion


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_the_last_step_commits_with_the_completion(app: pgdurable.App, start_worker: Callable[..., Any],
                                                   kind: str) -> None:
    seen: list[list[int]] = []

    if kind == "sync":
        @app.step(name="add")
        def add(x: int) -> int:
            seen.append(recorded_steps(app, pgdurable.current_workflow_id() or ""))
            return x + 1

        @app.workflow(name="three")
        def three(x: int) -> int:
            return add(add(add(x)))
    else:
        @app.step(name="add")
        async def add(x: int) -> int:  # type: ignore[misc]
            seen.append(await asyncio.to_thread(recorded_steps, app, pgdurable.current_workflow_id() or ""))
            return x + 1

        @app.workflow(name="three")
        async def three(x: int) -> int:  # type: ignore[misc]
            return await add(await add(await add(x)))

    start_worker(app)
    handle = app.enqueue("three", 1)
    assert handle.result(timeout=WAIT) == 4
    # Each step's body ran once its predecessors were recorded (committed, seen from another connection).
    assert seen == [[], [0], [0, 1]]
    steps, completion = writers(app, handle.workflow_id)
    assert len(steps) == 3 and len(set(steps)) == 3
    assert steps[2] == completion  # the last step in the completion's transaction
    assert completion not in steps[:2]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_step_followed_by_a_long_computation_is_recorded_meanwhile(
        make_app: Callable[..., pgdurable.App], start_worker: Callable[..., Any], kind: str) -> None:
    """With no next write to ride with, the checkpoint goes out on its own (batcher.LINGER_SECONDS): a crash
    during the plain code after a step would not run the step again. (The lease is long, so no heartbeat,
    every 40 s, carries it out within the 30 s this waits.)"""
    app = make_app(lease_seconds=120.0)
    release = threading.Event()

    if kind == "sync":
        @app.step(name="once")
        def once() -> str:
            return "done"

        @app.workflow(name="then_think")
        def then_think() -> str:
            value = once()
            assert release.wait(WAIT)  # plain code, no durable operation
            return value
    else:
        @app.step(name="once")
        async def once() -> str:  # type: ignore[misc]
            return "done"

        @app.workflow(name="then_think")
        async def then_think() -> str:  # type: ignore[misc]
            value = await once()
            assert await asyncio.to_thread(release.wait, WAIT)
            return value

    start_worker(app)
    handle = app.enqueue("then_think")
    try:
        wait_for(lambda: recorded_steps(app, handle.workflow_id) == [0], 30.0, "the step recorded on its own")
        assert handle.status() == "running"
    finally:
        release.set()
    assert handle.result(timeout=WAIT) == "done"
    steps, completion = writers(app, handle.workflow_id)
    assert steps[0] != completion


@pytest.mark.parametrize("last", [True, False])
def test_a_checkpoint_the_database_refuses_after_the_workflow_went_on_replays_it(
        make_app: Callable[..., pgdurable.App], start_worker: Callable[..., Any], last: bool) -> None:
    """A deferred checkpoint refused for its data (past the serializer's checks: here a constraint of the
    test's own) is found when the workflow's next write or completion waits for it. The step is recorded as
    failed with the refusal, and the execution is handed back at once (its lease is long): the replay raises
    the error at the step, as it would have been raised had the write been waited for, and the workflow
    decides again from there. The first run's later code, which saw the value, leaves no trace."""
    app = make_app(lease_seconds=120.0)
    app.migrate()
    execute(app, "ALTER TABLE operation_outputs ADD CONSTRAINT no_poison "
               "CHECK (output IS NULL OR output::text NOT LIKE '%%poison%%') NOT VALID")
    ran: list[str] = []

    @app.step(name="poisoned")
    def poisoned() -> str:
        ran.append("poisoned")
        return "poison"

    @app.step(name="after")
    def after(value: str) -> str:
        ran.append("after")
        return value + "!"

    @app.workflow(name="flow")
    def flow() -> str:
        try:
            value = poisoned()
        except SerializationError as exc:
            return f"caught: {exc}"
        return value if last else after(value)

    start_worker(app)
    handle = app.enqueue("flow")
    result = handle.result(timeout=WAIT)
    assert result.startswith("caught: ") and "could not be recorded" in result, result
    assert ran == ["poisoned"]  # the step's body ran once; "after" never ran
    [step] = app.steps(handle.workflow_id)
    assert step.step_name == "poisoned" and step.output is None and "no_poison" in (step.error or "")
    row = app.get(handle.workflow_id)
    assert row is not None and row.attempt == 2


def test_an_async_workflow_mixing_sync_steps_through_threads(app: pgdurable.App,
                                                              start_worker: Callable[..., Any]) -> None:
    """An async workflow may run a sync step through asyncio.to_thread: a checkpoint deferred on the loop is
    waited for from that thread, and one deferred in the thread from the loop."""
    @app.step(name="sync_add")
    def sync_add(x: int) -> int:
        return x + 1

    @app.step(name="async_add")
    async def async_add(x: int) -> int:
        return x + 10

    @app.workflow(name="mixed")
    async def mixed(x: int) -> int:
        x = await async_add(x)
        x = await asyncio.to_thread(sync_add, x)
        x = await asyncio.to_thread(sync_add, x)
        return await async_add(x)

    start_worker(app)
    handle = app.enqueue("mixed", 0)
    assert handle.result(timeout=WAIT) == 22
    assert [(s.step_name, s.output) for s in app.steps(handle.workflow_id)] == [
        ("async_add", "10"), ("sync_add", "11"), ("sync_add", "12"), ("async_add", "22")]
