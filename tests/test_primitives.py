"""Durable sleep, messages, events, child workflows: each waits without holding a worker slot, and each
resumes correctly on another worker (in-process workers here; real processes in test_primitives_processes)."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

import pgdurable
from pgdurable import store
from tests.harness import WAIT, execution, wait_for, wait_listening


def test_durable_sleep_releases_the_slot_and_wakes_on_time(app: pgdurable.App,
                                                          start_worker: Callable[..., Any]) -> None:
    @app.workflow()
    def napper(seconds: float) -> str:
        pgdurable.sleep(seconds)
        return "slept"

    @app.workflow()
    def quick() -> str:
        return "done"

    start_worker(app, concurrency=1)  # one slot: the sleeper must give it up for quick() to run
    begun = time.monotonic()
    sleeper = app.enqueue(napper, 1.5, workflow_id="nap-1")
    wait_for(lambda: execution(app, "nap-1").status == "waiting", WAIT, "the sleeper to wait")
    row = execution(app, "nap-1")
    assert row.wait_reason == "sleep" and row.owner_id is None
    quick_handle = app.enqueue(quick)
    assert quick_handle.result(timeout=WAIT) == "done"
    assert sleeper.result(timeout=WAIT) == "slept"
    assert time.monotonic() - begun >= 1.5  # never early
    # With one slot, quick() (enqueued while the sleeper waited) could only finish first if the slot was given up.
    done = execution(app, "nap-1")
    assert execution(app, quick_handle.workflow_id).completed_at < done.completed_at, \
        "quick() did not run while the sleeper slept"
    # On time: woken at the recorded wake time (1.5 s after the sleep began, on the database's clock), not earlier.
    [step] = app.steps("nap-1")
    assert step.step_name == "pgdurable.sleep"
    wake = datetime.fromisoformat(json.loads(step.output))
    assert row.available_at == wake
    assert row.started_at + timedelta(seconds=1.5) <= wake <= step.completed_at + timedelta(seconds=1.5)
    assert done.completed_at >= wake
    assert done.attempt == 2  # claimed again after waking


def test_async_sleep_and_sleep_until(app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    @app.workflow()
    async def two_naps() -> str:
        await pgdurable.sleep_async(0.3)
        await pgdurable.sleep_until_async(datetime.now(UTC) + timedelta(seconds=0.3))
        return "rested"

    start_worker(app)
    begun = time.monotonic()
    assert app.enqueue(two_naps).result(timeout=WAIT) == "rested"
    assert time.monotonic() - begun >= 0.55


def test_sleep_outlives_the_worker_that_started_it(app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    @app.workflow()
    def long_nap() -> str:
        pgdurable.sleep(1.0)
        return "woke"

    first = start_worker(app)
    handle = app.enqueue(long_nap, workflow_id="nap-restart")
    wait_for(lambda: execution(app, "nap-restart").status == "waiting", WAIT, "the sleeper to wait")
    first.stop()
    wake = execution(app, "nap-restart").available_at
    assert wake is not None
    wait_for(lambda: datetime.now(UTC) > wake, WAIT, "the sleep to be due")  # it is due while no worker runs
    assert execution(app, "nap-restart").status == "waiting"
    start_worker(app)
    assert handle.result(timeout=WAIT) == "woke"


def test_messages_are_received_once_in_order_and_wake_the_receiver(
        make_app: Callable[..., pgdurable.App], start_worker: Callable[..., Any]) -> None:
    # The worker polls only hourly here: a receiver that gets its message at all was woken by the send.
    app = make_app(poll_seconds=3600.0)

    @app.workflow()
    def inbox(count: int) -> list[Any]:
        return [pgdurable.recv("orders") for _ in range(count)]

    handle = app.enqueue(inbox, 3, workflow_id="inbox-1")
    # Before the first recv runs (here: before any worker runs; sent while a worker claims it, it could delay the
    # claim: see the test below).
    assert app.send("inbox-1", {"n": 1}, topic="orders")
    start_worker(app)
    wait_for(lambda: execution(app, "inbox-1").wait_reason == "recv:orders", WAIT, "the receiver to wait")
    assert app.send("inbox-1", "other topic", topic="billing")  # not what it waits for
    app.send("inbox-1", {"n": 2}, topic="orders")
    wait_for(lambda: len([s for s in app.steps("inbox-1") if s.step_name == "pgdurable.recv"]) == 2, WAIT,
             "the second message to be received (woken by the send, not a poll)")
    assert [m.message for m in app.messages("inbox-1") if m.consumed_at] == [{"n": 1}, {"n": 2}]
    app.send("inbox-1", {"n": 3}, topic="orders")
    assert handle.result(timeout=WAIT) == [{"n": 1}, {"n": 2}, {"n": 3}]
    messages = app.messages("inbox-1")
    assert [m.message for m in messages if m.consumed_at] == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert [m.message for m in messages if not m.consumed_at] == ["other topic"]


def test_an_execution_locked_by_a_send_while_the_worker_claims_is_still_claimed_without_a_poll(
        make_app: Callable[..., pgdurable.App], start_worker: Callable[..., Any], database_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    app = make_app(poll_seconds=3600.0)  # only a NOTIFY (or the worker's first looks) can get it claimed

    @app.workflow()
    def receiver() -> Any:
        return pgdurable.recv("orders")

    claims: list[int] = []
    real = store.claims.claim

    def counted(**params: Any) -> Any:
        call = real(**params)
        return dataclasses.replace(call, read=lambda rows: claims.append(len(rows)) or call.read(rows))

    monkeypatch.setattr(store.claims, "claim", counted)
    handle = app.enqueue(receiver, workflow_id="locked-1")
    with psycopg.connect(database_url) as conn:
        app.send("locked-1", "hello", topic="orders", conn=conn)  # in flight: it holds the execution's row
        start_worker(app)
        wait_listening(app)
        # its first look and the one after it started listening have both passed the locked row
        wait_for(lambda: len(claims) >= 2, WAIT, "the worker to look twice")
        assert sum(claims) == 0
        conn.commit()
    assert handle.result(timeout=WAIT) == "hello"  # woken by the send's commit, not a poll


def test_recv_times_out_with_none_and_idempotent_sends_are_stored_once(
        app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    @app.workflow()
    def waits_briefly() -> list[Any]:
        first = pgdurable.recv(timeout=0.5)
        second = pgdurable.recv(timeout=30)
        return [first, second]

    start_worker(app)
    handle = app.enqueue(waits_briefly, workflow_id="brief")
    wait_for(lambda: any(s.step_name == "pgdurable.recv" for s in app.steps("brief")), WAIT, "the first timeout")
    assert app.send("brief", "hello", idempotency_key="k-1") is True
    assert app.send("brief", "hello again", idempotency_key="k-1") is False  # a retried send
    assert handle.result(timeout=WAIT) == [None, "hello"]
    assert [m.message for m in app.messages("brief")] == ["hello"]


def test_send_errors_and_the_sql_function_in_a_transaction(app: pgdurable.App, database_url: str,
                                                           start_worker: Callable[..., Any]) -> None:
    @app.workflow()
    def listener() -> Any:
        return pgdurable.recv(timeout=30)

    with pytest.raises(pgdurable.WorkflowNotFound):
        app.send("nobody", "hi")
    with pytest.raises(pgdurable.SerializationError):
        app.send("nobody", object())
    start_worker(app)
    handle = app.enqueue(listener, workflow_id="sql-listener")
    schema = sql.Identifier(app.schema)
    with psycopg.connect(database_url) as conn:  # rolled back: never delivered
        conn.execute(sql.SQL("SELECT {}.send_message('sql-listener', '\"lost\"')").format(schema))
        conn.rollback()
        with pytest.raises(psycopg.errors.NoDataFound):
            conn.execute(sql.SQL("SELECT {}.send_message('no-such-id', '1')").format(schema))
        conn.rollback()
        conn.execute(sql.SQL("SELECT {}.send_message('sql-listener', '{{\"from\": \"sql\"}}')").format(schema))
        conn.commit()
    assert handle.result(timeout=WAIT) == {"from": "sql"}
    with psycopg.connect(database_url) as conn:  # a send inside the caller's own transaction, from Python
        app.send("sql-listener", "late", conn=conn)
        conn.commit()
    assert [m.message for m in app.messages("sql-listener")] == [{"from": "sql"}, "late"]


def test_events_last_value_wins_history_kept_and_get_event_waits(
        app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    @app.workflow()
    def progress() -> str:
        pgdurable.set_event("stage", "started")
        pgdurable.recv("go", timeout=30)
        pgdurable.set_event("stage", "finished")
        pgdurable.set_event("detail", {"items": 3})
        return "ok"

    start_worker(app)
    assert app.get_event("nope", "stage") is None
    handle = app.enqueue(progress, workflow_id="ev-1")
    assert app.get_event("ev-1", "stage", timeout=WAIT) == "started"
    assert app.get_event("ev-1", "detail", timeout=0.3) is None  # not yet
    app.send("ev-1", None, topic="go")
    assert handle.result(timeout=WAIT) == "ok"
    assert app.get_event("ev-1", "stage") == "finished"
    assert app.get_event("ev-1", "detail") == {"items": 3}
    assert [(e.key, e.value) for e in app.events("ev-1")] == [
        ("detail", {"items": 3}), ("stage", "started"), ("stage", "finished")]


async def test_get_event_async_is_woken_by_notify(app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    @app.workflow()
    async def publisher() -> None:
        await pgdurable.sleep_async(0.3)
        await pgdurable.set_event_async("ready", True)

    start_worker(app)
    await app.enqueue_async(publisher, workflow_id="ev-async")
    assert await app.get_event_async("ev-async", "ready", timeout=WAIT) is True


def test_child_workflows_run_and_the_parent_waits_without_a_slot(
        app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    @app.workflow()
    def square(x: int) -> int:
        return x * x

    @app.workflow()
    def fails() -> None:
        raise ValueError("child broke")

    @app.workflow()
    def parent(n: int) -> dict[str, Any]:
        handles = [app.enqueue(square, i) for i in range(n)]
        results = pgdurable.gather(handles)
        try:
            app.enqueue(fails).result()
            failure = None
        except pgdurable.WorkflowFailed as exc:
            failure = exc.remote_message
        return {"ids": [h.workflow_id for h in handles], "results": results, "failure": failure}

    start_worker(app, concurrency=1)  # the parent must release its only slot for its children to run
    out = app.enqueue(parent, 4, workflow_id="p-1").result(timeout=WAIT)
    assert out["results"] == [0, 1, 4, 9] and out["failure"] == "child broke"
    assert out["ids"] == [f"p-1:{i}" for i in range(4)]  # deterministic: the parent's step numbers
    children = app.children("p-1")
    assert len(children) == 5 and {c[2] for c in children} == {"succeeded", "failed"}
    assert all(execution(app, c[0]).parent_id == "p-1" for c in children)


async def test_async_parent_awaits_children(app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    @app.workflow()
    async def double(x: int) -> int:
        return 2 * x

    @app.workflow()
    async def async_parent() -> list[int]:
        first = await app.enqueue_async(double, 1)
        one = await first.result_async()
        rest = [await app.enqueue_async(double, i) for i in (2, 3)]
        return [one, *await pgdurable.gather_async(rest)]

    start_worker(app)
    handle = await app.enqueue_async(async_parent)
    assert await handle.result_async(timeout=WAIT) == [2, 4, 6]


def test_fan_out_of_a_thousand_children(make_app: Callable[..., pgdurable.App],
                                        start_worker: Callable[..., Any]) -> None:
    app = make_app()

    @app.workflow()
    def leaf(i: int) -> int:
        if i == 999:
            # The last child waits for the test, which sends once the parent has suspended: on a loaded
            # machine, enqueueing the thousand can outlast any sleep, and the parent would find them all done.
            pgdurable.recv("go")
        else:
            pgdurable.sleep(0.5)  # the children sleep durably as well
        return i

    @app.workflow()
    def fan_out(n: int) -> int:
        return sum(pgdurable.gather([app.enqueue(leaf, i) for i in range(n)]))

    start_worker(app, concurrency=64)
    begun = time.monotonic()
    handle = app.enqueue(fan_out, 1000, workflow_id="fan")
    wait_for(lambda: execution(app, "fan").status == "waiting", 2 * WAIT, "the parent to suspend on its children")
    [last] = [child_id for child_id, _, status, *_ in app.children("fan")
              if status != "succeeded" and execution(app, child_id).input == '{"i": 999}']
    app.send(last, "go", topic="go")
    assert handle.result(timeout=2 * WAIT) == sum(range(1000))
    print(f"fan-out of 1,000 children: {time.monotonic() - begun:.2f} s, parent attempts "
          f"{execution(app, 'fan').attempt}")
    assert execution(app, "fan").attempt > 1  # it suspended while its children slept
    assert len(app.children("fan")) == 1000


def test_waiting_for_a_workflow_that_is_not_a_child(app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    @app.workflow()
    def slow() -> str:
        pgdurable.sleep(0.5)
        return "slow done"

    @app.workflow()
    def watcher(other: str) -> str:
        return str(app.handle(other).result(timeout=WAIT))

    start_worker(app)
    app.enqueue(slow, workflow_id="other")
    assert app.enqueue(watcher, "other").result(timeout=WAIT) == "slow done"
