"""Workflows and steps end to end against a real PostgreSQL, with a worker on a thread of this process."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import decimal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel

import pgdurable
from pgdurable import client
from tests.harness import WAIT, execute, wait_for, wait_listening


def simulate_crash(app: pgdurable.App, workflow_id: str) -> None:
    """Put a finished execution back on the queue, as if its worker died before completing it."""
    execute(app, "UPDATE workflow_executions SET status = 'enqueued', output = NULL, error = NULL, "
                 "completed_at = NULL WHERE id = %s", workflow_id)


def test_enqueue_runs_steps_and_returns_result(app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    @app.step()
    def add_one(x: int) -> int:
        return x + 1

    @app.workflow()
    def three_steps(x: int) -> int:
        return add_one(add_one(add_one(x)))

    start_worker(app)
    handle = app.enqueue(three_steps, 1, workflow_id="order-1")
    assert handle.result(timeout=WAIT) == 4
    assert handle.status() == "succeeded"
    steps = app.steps("order-1")
    assert [(s.step_id, s.step_name, s.output) for s in steps] == [
        (0, "add_one", "2"), (1, "add_one", "3"), (2, "add_one", "4")]
    row = app.get("order-1")
    assert row is not None and row.input == '{"x": 1}' and row.attempt == 1


async def test_async_workflow_and_async_client(app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    @app.step()
    async def double(x: int) -> int:
        return x * 2

    @app.workflow(queue="async-q")
    async def doubled_twice(x: int) -> int:
        return await double(await double(x))

    start_worker(app)
    handle = await app.enqueue_async(doubled_twice, 5)
    assert await handle.result_async(timeout=WAIT) == 20
    assert await handle.status_async() == "succeeded"


def test_workflow_id_is_an_idempotency_key(app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    runs = Counter[str]()

    @app.step()
    def effect(key: str) -> str:
        runs[key] += 1
        return key

    @app.workflow()
    def once(key: str) -> str:
        return effect(key)

    first = app.enqueue(once, "a", workflow_id="same-id")
    second = app.enqueue(once, "a", workflow_id="same-id")
    start_worker(app)
    assert first.result(timeout=WAIT) == second.result(timeout=WAIT) == "a"
    third = app.enqueue(once, "a", workflow_id="same-id")  # after completion, still the same execution
    assert third.result(timeout=WAIT) == "a"
    assert runs == {"a": 1}
    assert execute(app, "SELECT count(*) FROM workflow_executions")[0][0] == 1

    @app.workflow()
    def other(key: str) -> str:
        return key

    with pytest.raises(pgdurable.WorkflowIdConflict, match="same-id"):
        app.enqueue(other, "b", workflow_id="same-id")


def test_replay_returns_recorded_outputs_and_errors_without_running(
        app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    runs = Counter[str]()

    @app.step()
    def fetch(x: int) -> int:
        runs["fetch"] += 1
        return x * 10

    @app.step(max_attempts=1)
    def explode(x: int) -> int:
        runs["explode"] += 1
        raise ValueError(f"bad input {x}")

    @app.workflow()
    def flow(x: int) -> str:
        value = fetch(x)
        try:
            explode(x)
        except ValueError as exc:
            return f"{value} / caught {exc}"
        return "unreachable"

    start_worker(app)
    handle = app.enqueue(flow, 4, workflow_id="replay-1")
    assert handle.result(timeout=WAIT) == "40 / caught bad input 4"
    simulate_crash(app, "replay-1")
    assert handle.result(timeout=WAIT) == "40 / caught bad input 4"
    assert runs == {"fetch": 1, "explode": 1}
    assert app.get("replay-1").attempt == 2  # type: ignore[union-attr]
    error_step = app.steps("replay-1")[1]
    assert error_step.output is None and error_step.error is not None and "bad input 4" in error_step.error


def test_changed_step_order_parks_the_execution_with_a_clear_reason(
        make_app: Callable[..., pgdurable.App], start_worker: Callable[..., Any]) -> None:
    # One pinned application version: the new code claims the old execution (with default versions,
    # the changed code would be a new version and leave it to workers of the old one).
    old = make_app(app_version="v1")

    @old.step()
    def reserve() -> str:
        return "reserved"

    @old.workflow(name="checkout")
    def checkout_v1() -> str:
        return reserve()

    runner = start_worker(old)
    assert old.enqueue(checkout_v1, workflow_id="nd-1").result(timeout=WAIT) == "reserved"
    runner.stop()

    new = make_app(app_version="v1")

    @new.step()
    def charge() -> str:
        return "charged"

    @new.workflow(name="checkout")
    def checkout_v2() -> str:
        return charge()

    simulate_crash(new, "nd-1")
    start_worker(new)
    # Not failed: parked, with the reason, for code that replays its history (tests/test_versions.py).
    wait_for(lambda: (row := new.get("nd-1")) is not None and row.wait_reason == "parked", WAIT, "it to park")
    row = new.get("nd-1")
    assert row is not None and row.status == "waiting" and row.error is None
    assert row.parked_reason is not None
    assert "'charge'" in row.parked_reason and "'reserve'" in row.parked_reason


def test_steps_retry_with_backoff_then_succeed(app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    calls: list[float] = []

    @app.step(max_attempts=4, interval=0.05, backoff=2.0)
    def flaky() -> str:
        calls.append(time.monotonic())
        if len(calls) < 3:
            raise ConnectionError("try again")
        return "ok"

    @app.workflow()
    def uses_flaky() -> str:
        return flaky()

    start_worker(app)
    assert app.enqueue(uses_flaky, workflow_id="flaky").result(timeout=WAIT) == "ok"
    assert len(calls) == 3
    assert calls[1] - calls[0] >= 0.05 and calls[2] - calls[1] >= 0.1  # exponential backoff
    assert app.steps("flaky")[0].attempts == 3


class PaymentDeclined(Exception):
    """At module level: replays rebuild exceptions by their importable name."""


def test_spent_retries_and_non_retryable_errors_fail_the_workflow(
        app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    attempts = Counter[str]()

    @app.step(max_attempts=3, interval=0.01, no_retry=(PaymentDeclined,))
    def charge(kind: str) -> str:
        attempts[kind] += 1
        if kind == "declined":
            raise PaymentDeclined("card declined")
        raise TimeoutError("gateway timeout")

    @app.workflow()
    def pay(kind: str) -> str:
        return charge(kind)

    start_worker(app)
    with pytest.raises(pgdurable.WorkflowFailed) as declined:
        app.enqueue(pay, "declined").result(timeout=WAIT)
    with pytest.raises(pgdurable.WorkflowFailed) as timed_out:
        app.enqueue(pay, "timeout").result(timeout=WAIT)
    assert attempts == {"declined": 1, "timeout": 3}
    assert declined.value.type.endswith("PaymentDeclined")
    assert declined.value.remote_message == "card declined"
    assert "Traceback" in declined.value.remote_traceback and "raise PaymentDeclined" in \
        declined.value.remote_traceback
    assert timed_out.value.type == "TimeoutError" and timed_out.value.status == "failed"


@dataclasses.dataclass
class Item:
    sku: str
    price: decimal.Decimal


class Customer(BaseModel):
    id: uuid.UUID
    since: datetime.date


def test_typed_arguments_and_results_round_trip(app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    @app.step()
    def total(items: list[Item]) -> decimal.Decimal:
        return sum((i.price for i in items), decimal.Decimal(0))

    @app.workflow()
    def invoice(customer: Customer, items: list[Item], at: datetime.datetime, blob: bytes,
                pair: tuple[int, str]) -> tuple[Customer, decimal.Decimal, datetime.datetime, bytes, tuple[int, str]]:
        assert isinstance(customer, Customer) and isinstance(items[0], Item) and isinstance(at, datetime.datetime)
        return customer, total(items), at, blob, pair

    start_worker(app)
    customer = Customer(id=uuid.uuid4(), since=datetime.date(2020, 1, 2))
    at = datetime.datetime(2026, 1, 1, 12, 30, tzinfo=datetime.UTC)
    items = [Item("a", decimal.Decimal("1.10")), Item("b", decimal.Decimal("2.05"))]
    result = app.enqueue(invoice, customer, items, at, b"\x00\xffbin", (7, "x")).result(timeout=WAIT)
    assert result == (customer, decimal.Decimal("3.15"), at, b"\x00\xffbin", (7, "x"))
    # and the stored input is plain, readable JSON
    stored = execute(app, "SELECT input->'items'->0->>'sku', input->'customer'->>'since' FROM workflow_executions")
    assert stored == [("a", "2020-01-02")]


def test_bad_arguments_fail_at_enqueue_and_store_nothing(app: pgdurable.App) -> None:
    @app.workflow()
    def takes_one(x: int) -> int:
        return x

    with pytest.raises(pgdurable.SerializationError, match="argument 'x' of workflow 'takes_one'"):
        app.enqueue(takes_one, object())
    with pytest.raises(TypeError, match="do not fit workflow 'takes_one'"):
        app.enqueue(takes_one, 1, 2)
    with pytest.raises(TypeError, match="keyword"):
        app.enqueue("not.registered.here", 1)
    assert execute(app, "SELECT count(*) FROM workflow_executions")[0][0] == 0


def test_reserved_parameter_names_are_rejected_at_decoration(app: pgdurable.App) -> None:
    with pytest.raises(pgdurable.ConfigurationError, match="queue"):
        @app.workflow()
        def bad(queue: str) -> None:
            pass


def test_result_waits_are_woken_by_notify(make_app: Callable[..., pgdurable.App],
                                          start_worker: Callable[..., Any],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # Workers poll and result waiters re-check only hourly here: a result at all proves both the worker and the
    # waiter were woken by NOTIFY (however loaded the machine, without a wall-clock threshold).
    monkeypatch.setattr(client, "_RECHECK_SECONDS", 3600.0)
    app = make_app(poll_seconds=3600.0)

    @app.workflow()
    def quick() -> str:
        return "done"

    start_worker(app)
    wait_listening(app)
    assert app.enqueue(quick).result(timeout=WAIT) == "done"


def test_result_timeout(app: pgdurable.App) -> None:
    @app.workflow()
    def never_run() -> None:
        pass

    handle = app.enqueue(never_run)
    with pytest.raises(pgdurable.ResultTimeout):
        handle.result(timeout=0.3)
    with pytest.raises(pgdurable.WorkflowNotFound):
        app.handle("no-such-id").result(timeout=WAIT)


def test_cancel_enqueued_and_running(app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    gate = threading.Event()
    ran_after_cancel = threading.Event()

    @app.step()
    def wait_for_gate() -> None:
        gate.wait(WAIT)

    @app.step()
    def after() -> None:
        ran_after_cancel.set()

    @app.workflow()
    def long_one() -> None:
        wait_for_gate()
        after()

    queued = app.enqueue(long_one, workflow_id="queued", delay=60)
    assert queued.cancel() is True
    with pytest.raises(pgdurable.WorkflowCancelled):
        queued.result(timeout=WAIT)

    runner = start_worker(app)
    running = app.enqueue(long_one, workflow_id="running")
    wait_for(lambda: running.status() == "running", WAIT, "the workflow to run")
    assert app.cancel("running") is True
    gate.set()
    with pytest.raises(pgdurable.WorkflowCancelled):
        running.result(timeout=WAIT)
    # once the worker has let go of the attempt (and its step thread), nothing more of it can run
    wait_for(lambda: "running" not in runner.worker.running and runner.worker.busy_threads == 0, WAIT,
             "the worker to drop the cancelled attempt")
    assert not ran_after_cancel.is_set()  # its first step could not be recorded, so it stopped there
    assert app.steps("running") == []
    assert app.cancel("running") is False  # already terminal


def test_resume_reruns_the_failed_step_only(app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    runs = Counter[str]()
    broken = {"yes": True}

    @app.step()
    def first() -> str:
        runs["first"] += 1
        return "one"

    @app.step(max_attempts=1)
    def second() -> str:
        runs["second"] += 1
        if broken["yes"]:
            raise RuntimeError("downstream is down")
        return "two"

    @app.workflow()
    def two_steps() -> list[str]:
        return [first(), second()]

    start_worker(app)
    handle = app.enqueue(two_steps, workflow_id="resume-me")
    with pytest.raises(pgdurable.WorkflowFailed, match="downstream is down"):
        handle.result(timeout=WAIT)
    broken["yes"] = False
    assert app.resume("resume-me") is True
    assert handle.result(timeout=WAIT) == ["one", "two"]
    assert runs == {"first": 1, "second": 2}
    assert app.resume("resume-me") is False  # only failed or cancelled executions resume


def test_priority_then_age_orders_claims(app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    order: list[str] = []

    @app.workflow()
    def record(label: str) -> None:
        order.append(label)

    app.enqueue(record, "low-old", priority=5)
    app.enqueue(record, "high", priority=-1)
    app.enqueue(record, "low-new", priority=5)
    last = app.enqueue(record, "default", priority=0)
    start_worker(app, concurrency=1)
    last.result(timeout=WAIT)
    wait_for(lambda: len(order) == 4, WAIT, "all four to run")
    assert order == ["high", "default", "low-old", "low-new"]


def test_delay_holds_an_execution_back(app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    @app.workflow()
    def later() -> float:
        return time.time()

    start_worker(app)
    enqueued_at = time.time()
    handle = app.enqueue(later, delay=1.0)
    assert handle.result(timeout=WAIT) - enqueued_at >= 1.0


def test_start_runs_in_process(app: pgdurable.App) -> None:
    @app.step()
    def square(x: int) -> int:
        return x * x

    @app.workflow()
    def squares(n: int) -> list[int]:
        return [square(i) for i in range(n)]

    handle = app.start(squares, 4, workflow_id="local")
    assert handle.result(timeout=WAIT) == [0, 1, 4, 9]
    assert len(app.steps("local")) == 4
    again = app.start(squares, 4, workflow_id="local")  # idempotent: returns the finished execution
    assert again.result(timeout=WAIT) == [0, 1, 4, 9]


def test_direct_call_runs_the_plain_function(app: pgdurable.App) -> None:
    @app.step()
    def inc(x: int) -> int:
        return x + 1

    @app.workflow()
    def plain(x: int) -> int:
        return inc(x)

    assert plain(1) == 2
    assert pgdurable.current_workflow_id() is None


def test_workflow_id_visible_inside_workflow_and_nested_steps_are_plain(
        app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    @app.step()
    def inner() -> str | None:
        return pgdurable.current_workflow_id()

    @app.step()
    def outer() -> str | None:
        return inner()  # a step inside a step is a plain call

    @app.workflow()
    def who() -> list[str | None]:
        return [outer(), pgdurable.current_workflow_id()]

    start_worker(app)
    assert app.enqueue(who, workflow_id="me").result(timeout=WAIT) == ["me", "me"]
    assert [s.step_name for s in app.steps("me")] == ["outer"]


class UpperCaseSerializer:
    """A custom serializer: JSON whose strings are stored upper-cased (a visible, reversible change)."""

    def __init__(self) -> None:
        self.inner = pgdurable.JsonSerializer()
        self.calls = Counter[str]()

    def dumps(self, value: Any) -> str:
        self.calls["dumps"] += 1
        return self.inner.dumps(value.upper() if isinstance(value, str) else value)

    def loads(self, text: str, type_hint: Any = Any) -> Any:
        self.calls["loads"] += 1
        value = self.inner.loads(text, type_hint)
        return value.lower() if isinstance(value, str) else value


def test_pluggable_serializer(make_app: Callable[..., pgdurable.App], start_worker: Callable[..., Any]) -> None:
    serializer = UpperCaseSerializer()
    app = make_app(serializer=serializer)

    @app.step()
    def echo(text: str) -> str:
        return text

    @app.workflow()
    def shout(text: str) -> str:
        return echo(text)

    start_worker(app)
    assert app.enqueue(shout, "hi", workflow_id="ser").result(timeout=WAIT) == "hi"
    assert app.steps("ser")[0].output == '"HI"'
    assert execute(app, "SELECT output FROM workflow_executions WHERE id = 'ser'") == [("HI",)]
    assert serializer.calls["dumps"] >= 2 and serializer.calls["loads"] >= 1


def test_sync_step_in_async_workflow_fails_with_guidance(app: pgdurable.App,
                                                         start_worker: Callable[..., Any]) -> None:
    @app.step()
    def blocking() -> int:
        return 1

    @app.workflow()
    async def mixed() -> int:
        return blocking()

    start_worker(app)
    with pytest.raises(pgdurable.WorkflowFailed, match="async def"):
        app.enqueue(mixed).result(timeout=WAIT)


def test_enqueue_many_is_atomic_and_idempotent(app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    @app.workflow()
    def add(a: int, b: int = 0) -> int:
        return a + b

    @app.workflow()
    def other() -> None:
        pass

    handles = app.enqueue_many(add, [(1, 2), {"a": 5}, (3,)], workflow_ids=["m1", "m2", "m3"])
    again = app.enqueue_many(add, [(1, 2)], workflow_ids=["m1"])  # same id: the same execution
    app.enqueue(other, workflow_id="taken")
    with pytest.raises(pgdurable.WorkflowIdConflict, match="taken"):
        app.enqueue_many(add, [(1,), (2,)], workflow_ids=["m4", "taken"])
    assert app.get("m4") is None  # all or nothing
    with pytest.raises(pgdurable.SerializationError):
        app.enqueue_many(add, [(1,), (object(),)])
    many = app.enqueue_many(add, [(i, i) for i in range(12000)])  # several statements, one transaction
    start_worker(app, concurrency=64)
    assert [h.result(timeout=WAIT) for h in handles] == [3, 5, 3]
    assert again[0].result(timeout=WAIT) == 3
    assert many[-1].result(timeout=WAIT) == 2 * 11999
    counts = execute(app, "SELECT status, count(*) FROM workflow_executions WHERE name = 'add' GROUP BY 1")
    assert len(many) == 12000
    assert dict(counts)["succeeded"] + dict(counts).get("running", 0) + dict(counts).get("enqueued", 0) == 12003


async def test_enqueue_many_async(app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    @app.workflow()
    async def square(x: int) -> int:
        return x * x

    handles = await app.enqueue_many_async(square, [(i,) for i in range(5)])
    start_worker(app)
    assert [await h.result_async(timeout=WAIT) for h in handles] == [0, 1, 4, 9, 16]


def test_async_steps_gathered_side_by_side_replay_to_their_own_records(
        app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    """docs/concepts.md: steps gathered in an async workflow are numbered as they start, in gather's order,
    whatever order they finish in; a replay (after the durable sleep) reads each one's own record."""
    runs: list[int] = []

    @app.step()
    async def fetch(i: int) -> int:
        runs.append(i)
        await asyncio.sleep(0.02 * (4 - i))  # finish in the reverse order
        return i * 10

    @app.workflow()
    async def fan_out() -> list[int]:
        values = await asyncio.gather(*(fetch(i) for i in range(4)))
        await pgdurable.sleep_async(0.2)
        return list(values)

    start_worker(app)
    handle = app.enqueue(fan_out)
    assert handle.result(timeout=WAIT) == [0, 10, 20, 30]
    steps = app.steps(handle.workflow_id)
    assert [(s.step_id, s.step_name, s.output) for s in steps[:4]] == [(i, "fetch", str(i * 10)) for i in range(4)]
    assert sorted(runs) == [0, 1, 2, 3]  # each ran once: the replay read them all back
