"""The primitives' plans (primitives.py), driven by drive_sync and drive_async with a fake context and a fake
effect runner: sleep, recv, send, set_event, child enqueue, awaiting results; replay; lease lost."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from pgdurable import plans, primitives, store
from pgdurable.batcher import StepWrite
from pgdurable.errors import (
    ConfigurationError,
    LeaseLost,
    ResultTimeout,
    WorkflowCancelled,
    WorkflowFailed,
    WorkflowIdConflict,
    WorkflowNotFound,
)
from pgdurable.primitives import Suspended
from pgdurable.store.checkpoints import RecordedStep
from pgdurable.store.children import Awaited
from pgdurable.store.messaging import Received

from .fakes import FakeContext, FakeRunner, recorded_from

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
Drive = Callable[[FakeContext, plans.Plan], Any]


@pytest.fixture(params=["sync", "async"])
def drive(request: pytest.FixtureRequest) -> Drive:
    """Every test runs through both drivers: they must not differ."""
    if request.param == "sync":
        return lambda ctx, plan: plans.drive_sync(ctx, plan)  # type: ignore[arg-type]
    return lambda ctx, plan: asyncio.run(plans.drive_async(ctx, plan))  # type: ignore[arg-type]


def names(runner: FakeRunner) -> list[str]:
    out = []
    for effect in runner.effects:
        for e in effect if isinstance(effect, list) else [effect]:
            out.append(f"write:{e.step_name}" if isinstance(e, StepWrite) else e.name)
    return out


# ---- sleep ------------------------------------------------------------------------------------------------

def test_sleep_records_its_wake_up_then_suspends(drive: Drive) -> None:
    runner = FakeRunner(suspend=True)
    ctx = FakeContext(runner)
    with pytest.raises(Suspended):
        drive(ctx, primitives.sleep_plan(ctx, 90, None))
    wake = NOW + timedelta(seconds=90)
    [write] = runner.writes()
    assert (write.step_id, write.step_name, json.loads(write.output)) == (0, "pgdurable.sleep", wake.isoformat())
    [suspend] = runner.calls("suspend")
    assert suspend.params == {"id": "wf-1", "attempt": 1, "wake_at": wake, "reason": "sleep", "wakeups": None}
    assert ctx.suspensions == [wake] and ctx.lost


def test_sleep_replayed_after_its_time_does_nothing(drive: Drive) -> None:
    first = FakeRunner(suspend=True)
    ctx = FakeContext(first)
    with pytest.raises(Suspended):
        drive(ctx, primitives.sleep_plan(ctx, 90, None))
    again = FakeRunner()
    ctx = FakeContext(again, recorded_from(first), now=NOW + timedelta(seconds=91))
    assert drive(ctx, primitives.sleep_plan(ctx, 90, None)) is None
    assert again.effects == []


def test_sleep_replayed_early_suspends_again_until_the_recorded_time(drive: Drive) -> None:
    """The recorded wake-up wins over a new computation: a replay does not restart the timer."""
    recorded = {0: RecordedStep("pgdurable.sleep", json.dumps((NOW + timedelta(seconds=30)).isoformat()), None)}
    runner = FakeRunner(suspend=True)
    ctx = FakeContext(runner, recorded, now=NOW + timedelta(seconds=10))
    with pytest.raises(Suspended):
        drive(ctx, primitives.sleep_plan(ctx, 3600, None))
    assert runner.writes() == []
    assert runner.calls("suspend")[0].params["wake_at"] == NOW + timedelta(seconds=30)


def test_sleep_until(drive: Drive) -> None:
    runner = FakeRunner(suspend=True)
    ctx = FakeContext(runner)
    when = datetime(2027, 1, 1, tzinfo=UTC)
    with pytest.raises(Suspended):
        drive(ctx, primitives.sleep_plan(ctx, None, when))
    assert runner.calls("suspend")[0].params["wake_at"] == when


def test_sleep_until_needs_an_aware_datetime(drive: Drive) -> None:
    ctx = FakeContext(FakeRunner())
    with pytest.raises(ValueError, match="timezone-aware"):
        drive(ctx, primitives.sleep_plan(ctx, None, datetime(2027, 1, 1)))


@pytest.mark.parametrize("seconds", [0, -5])
def test_sleep_of_zero_or_less_does_not_suspend(drive: Drive, seconds: float) -> None:
    runner = FakeRunner()
    ctx = FakeContext(runner)
    drive(ctx, primitives.sleep_plan(ctx, seconds, None))
    assert names(runner) == ["write:pgdurable.sleep"]


def test_sleep_lease_lost_when_recording(drive: Drive) -> None:
    runner = FakeRunner()
    runner.fenced.add("pgdurable.sleep")
    ctx = FakeContext(runner)
    with pytest.raises(LeaseLost, match="recording step #0"):
        drive(ctx, primitives.sleep_plan(ctx, 5, None))
    assert ctx.lost and runner.calls() == []


def test_sleep_lease_lost_when_suspending(drive: Drive) -> None:
    ctx = FakeContext(FakeRunner(suspend=False))
    with pytest.raises(LeaseLost, match="suspending for sleep"):
        drive(ctx, primitives.sleep_plan(ctx, 5, None))
    assert ctx.lost and ctx.suspensions == []


@pytest.mark.parametrize("error", [psycopg.OperationalError("server closed the connection"),
                                   psycopg.errors.QueryCanceled("canceling statement"),
                                   psycopg.errors.AdminShutdown("terminating connection")])
def test_a_failed_statement_gives_the_attempt_up(drive: Drive, error: Exception) -> None:
    ctx = FakeContext(FakeRunner(suspend=error))
    with pytest.raises(LeaseLost, match="a statement of a durable primitive failed") as caught:
        drive(ctx, primitives.sleep_plan(ctx, 5, None))
    assert caught.value.__cause__ is error
    assert ctx.lost


def test_other_errors_of_a_statement_reach_the_workflow(drive: Drive) -> None:
    boom = psycopg.errors.UniqueViolation("duplicate")
    ctx = FakeContext(FakeRunner(suspend=boom))
    with pytest.raises(psycopg.errors.UniqueViolation):
        drive(ctx, primitives.sleep_plan(ctx, 5, None))
    assert not ctx.lost


# ---- recv -------------------------------------------------------------------------------------------------

def received(found: bool, message: Any = None, *, owned: bool = True, wakeups: int | None = 4) -> Received:
    return Received(owned, wakeups, found, json.dumps(message) if found else None)


def test_recv_returns_a_waiting_message(drive: Drive) -> None:
    runner = FakeRunner(receive=received(True, {"n": 1}))
    ctx = FakeContext(runner)
    assert drive(ctx, primitives.recv_plan(ctx, "orders", None)) == {"n": 1}
    assert names(runner) == ["write:pgdurable.recv.deadline", "receive"]
    assert runner.writes()[0].output == "null"  # no timeout
    params = runner.calls("receive")[0].params
    assert (params["topic"], params["step_id"], params["step_name"]) == ("orders", 1, "pgdurable.recv")


def test_recv_suspends_with_the_wake_up_count_it_saw(drive: Drive) -> None:
    runner = FakeRunner(receive=received(False, wakeups=7), suspend=True)
    ctx = FakeContext(runner)
    with pytest.raises(Suspended):
        drive(ctx, primitives.recv_plan(ctx, "t", 60))
    suspend = runner.calls("suspend")[0].params
    assert suspend["reason"] == "recv:t" and suspend["wakeups"] == 7
    assert suspend["wake_at"] == NOW + timedelta(seconds=60)


def test_recv_looks_again_when_woken_while_suspending(drive: Drive) -> None:
    answers = iter([received(False), received(True, "hello")])
    runner = FakeRunner(receive=lambda params: next(answers), suspend=False)
    ctx = FakeContext(runner)
    assert drive(ctx, primitives.recv_plan(ctx, "t", None)) == "hello"
    assert names(runner) == ["write:pgdurable.recv.deadline", "receive", "suspend", "receive"]


def test_recv_times_out_with_none_and_records_it(drive: Drive) -> None:
    recorded = {0: RecordedStep("pgdurable.recv.deadline", json.dumps(NOW.isoformat()), None)}
    runner = FakeRunner(receive=received(False))
    ctx = FakeContext(runner, recorded, now=NOW + timedelta(seconds=1))
    assert drive(ctx, primitives.recv_plan(ctx, "t", 5)) is None
    [write] = runner.writes()
    assert (write.step_id, write.step_name, write.output) == (1, "pgdurable.recv", "null")


def test_recv_lease_lost(drive: Drive) -> None:
    ctx = FakeContext(FakeRunner(receive=received(False, owned=False)))
    with pytest.raises(LeaseLost, match="receiving a message"):
        drive(ctx, primitives.recv_plan(ctx, "t", None))


def test_recv_replays_the_recorded_message(drive: Drive) -> None:
    recorded = {0: RecordedStep("pgdurable.recv.deadline", "null", None),
                1: RecordedStep("pgdurable.recv", '[1, "two"]', None)}
    runner = FakeRunner()
    ctx = FakeContext(runner, recorded)
    assert drive(ctx, primitives.recv_plan(ctx, "t", None)) == [1, "two"]
    assert runner.effects == []


# ---- send and set_event -----------------------------------------------------------------------------------

def test_send_derives_its_idempotency_key_from_the_step(drive: Drive) -> None:
    runner = FakeRunner(send_message=True)
    ctx = FakeContext(runner)
    call = store.messaging.send_message(destination="other", message='"hi"', topic="t", key=None)
    drive(ctx, primitives.send_plan(ctx, call))
    [sent] = runner.calls("send_message")
    assert sent.params == {"destination": "other", "message": '"hi"', "topic": "t", "key": "wf-1:0"}
    assert names(runner) == ["send_message", "write:pgdurable.send"]


def test_send_keeps_a_callers_key_and_is_not_sent_again_on_replay(drive: Drive) -> None:
    runner = FakeRunner(send_message=True)
    ctx = FakeContext(runner)
    drive(ctx, primitives.send_plan(ctx, store.messaging.send_message(destination="d", message="1", topic="",
                                                                      key="mine")))
    assert runner.calls("send_message")[0].params["key"] == "mine"
    again = FakeRunner()
    ctx = FakeContext(again, recorded_from(runner))
    drive(ctx, primitives.send_plan(ctx, store.messaging.send_message(destination="d", message="1", topic="",
                                                                      key="mine")))
    assert again.effects == []


def test_set_event(drive: Drive) -> None:
    runner = FakeRunner(set_event=True)
    ctx = FakeContext(runner)
    drive(ctx, primitives.set_event_plan(ctx, "progress", {"pct": 50}))
    params = runner.calls("set_event")[0].params
    assert (params["key"], json.loads(params["value"]), params["step_id"]) == ("progress", {"pct": 50}, 0)
    lost = FakeContext(FakeRunner(set_event=False))
    with pytest.raises(LeaseLost, match="publishing event 'progress'"):
        drive(lost, primitives.set_event_plan(lost, "progress", 1))
    replay = FakeRunner()
    ctx = FakeContext(replay, {0: RecordedStep("pgdurable.set_event", None, None)})
    drive(ctx, primitives.set_event_plan(ctx, "progress", 1))
    assert replay.effects == []


# ---- child workflows --------------------------------------------------------------------------------------

CHILD = {"queue": "default", "priority": 0, "input": "{}", "max_recoveries": 5, "delay": 0.0, "timeout": None}


def test_enqueue_child_with_a_deterministic_id(drive: Drive) -> None:
    runner = FakeRunner(enqueue_child=(True, "child", None))
    ctx = FakeContext(runner)
    assert drive(ctx, primitives.enqueue_child_plan(ctx, "child", None, CHILD)) == "wf-1:0"
    params = runner.calls("enqueue_child")[0].params
    assert (params["parent"], params["id"], params["step_name"]) == ("wf-1", "wf-1:0", "pgdurable.enqueue:child")


def test_enqueue_child_replay_returns_the_recorded_id(drive: Drive) -> None:
    runner = FakeRunner()
    ctx = FakeContext(runner, {0: RecordedStep("pgdurable.enqueue:child", '"given-id"', None)})
    assert drive(ctx, primitives.enqueue_child_plan(ctx, "child", None, CHILD)) == "given-id"
    assert runner.effects == []


def test_enqueue_child_id_owned_by_another_workflow(drive: Drive) -> None:
    ctx = FakeContext(FakeRunner(enqueue_child=(True, "someone_else", None)))
    with pytest.raises(WorkflowIdConflict, match="someone_else"):
        drive(ctx, primitives.enqueue_child_plan(ctx, "child", "taken", CHILD))


def test_enqueue_child_conflict_raises_what_a_replay_raises(drive: Drive) -> None:
    conflict = json.dumps({"type": "pgdurable.errors.WorkflowIdConflict", "message": "taken",
                           "args": ["taken"]})
    ctx = FakeContext(FakeRunner(enqueue_child=(True, "other", conflict)))
    with pytest.raises(WorkflowIdConflict, match="taken") as first:
        drive(ctx, primitives.enqueue_child_plan(ctx, "child", "taken", CHILD))
    ctx = FakeContext(FakeRunner(), {0: RecordedStep("pgdurable.enqueue:child", None, conflict)})
    with pytest.raises(WorkflowIdConflict) as replayed:
        drive(ctx, primitives.enqueue_child_plan(ctx, "child", "taken", CHILD))
    assert replayed.value.args == first.value.args


def test_enqueue_child_lease_lost(drive: Drive) -> None:
    ctx = FakeContext(FakeRunner(enqueue_child=(False, None, None)))
    with pytest.raises(LeaseLost, match="starting child workflow 'child'"):
        drive(ctx, primitives.enqueue_child_plan(ctx, "child", None, CHILD))


def test_child_ids_stay_within_the_id_limit() -> None:
    short = FakeContext(FakeRunner(), execution_id="p")
    assert primitives.child_id(short, 3) == "p:3"  # type: ignore[arg-type]
    long = FakeContext(FakeRunner(), execution_id="x" * 199)
    first = primitives.child_id(long, 12)  # type: ignore[arg-type]
    assert len(first) <= 200 and first == primitives.child_id(long, 12)  # type: ignore[arg-type]
    assert first != primitives.child_id(long, 13)  # type: ignore[arg-type]


# ---- awaiting other executions ----------------------------------------------------------------------------

def awaited(i: str, status: str | None, output: str | None = None, error: str | None = None,
            child: bool = True) -> Awaited:
    return Awaited(i, status, output, error, child)


def test_await_records_each_outcome_as_soon_as_it_is_known(drive: Drive) -> None:
    answers = iter([(3, [awaited("a", "succeeded", "1"), awaited("b", "running")]),
                    (3, [awaited("b", "failed", None, '{"type": "ValueError", "message": "bad"}')])])
    runner = FakeRunner(awaited_status=lambda params: next(answers))
    ctx = FakeContext(runner)
    outcomes = drive(ctx, primitives.await_plan(ctx, ["a", "b"], None))
    assert [json.loads(o)["status"] for o in outcomes] == ["succeeded", "failed"]
    assert [c.params["ids"] for c in runner.calls("awaited_status")] == [["a", "b"], ["b"]]
    assert [(w.step_id, w.step_name) for w in runner.writes()] == [
        (0, "pgdurable.wait.deadline"), (1, "pgdurable.result"), (2, "pgdurable.result")]
    assert primitives.outcome(ctx, outcomes[0], int) == 1  # type: ignore[arg-type]
    with pytest.raises(WorkflowFailed, match="ValueError: bad") as failed:
        primitives.outcome(ctx, outcomes[1], int)  # type: ignore[arg-type]
    assert failed.value.workflow_id == "b"
    again = FakeRunner()
    ctx = FakeContext(again, recorded_from(runner))
    assert drive(ctx, primitives.await_plan(ctx, ["a", "b"], None)) == outcomes
    assert again.effects == []


def test_await_suspends_until_a_child_wakes_it(drive: Drive) -> None:
    runner = FakeRunner(awaited_status=(9, [awaited("a", "running")]), suspend=True)
    ctx = FakeContext(runner)
    with pytest.raises(Suspended):
        drive(ctx, primitives.await_plan(ctx, ["a"], None))
    suspend = runner.calls("suspend")[0].params
    assert (suspend["wake_at"], suspend["reason"], suspend["wakeups"]) == (None, "children", 9)


def test_await_polls_an_execution_that_is_not_its_child(drive: Drive) -> None:
    runner = FakeRunner(awaited_status=(1, [awaited("a", "enqueued", child=False)]), suspend=True)
    ctx = FakeContext(runner)
    with pytest.raises(Suspended):
        drive(ctx, primitives.await_plan(ctx, ["a"], 3600))
    assert runner.calls("suspend")[0].params["wake_at"] == NOW + timedelta(seconds=1)


def test_await_times_out_on_the_first_unfinished(drive: Drive) -> None:
    recorded = {0: RecordedStep("pgdurable.wait.deadline", json.dumps(NOW.isoformat()), None)}
    runner = FakeRunner(awaited_status=(1, [awaited("a", "running"), awaited("b", "running")]))
    ctx = FakeContext(runner, recorded, now=NOW + timedelta(seconds=1))
    outcomes = drive(ctx, primitives.await_plan(ctx, ["a", "b"], 10))
    assert json.loads(outcomes[0]) == {"id": "a", "status": "timeout"} and outcomes[1] is None
    with pytest.raises(ResultTimeout, match="did not finish in time"):
        primitives.outcome(ctx, outcomes[0], int)  # type: ignore[arg-type]
    with pytest.raises(ResultTimeout, match="earlier awaited workflow timed out"):
        primitives.outcome(ctx, outcomes[1], int)  # type: ignore[arg-type]
    again = FakeRunner()
    ctx = FakeContext(again, recorded_from(runner) | recorded)
    assert drive(ctx, primitives.await_plan(ctx, ["a", "b"], 10)) == outcomes
    assert again.effects == []


def test_await_unknown_execution(drive: Drive) -> None:
    ctx = FakeContext(FakeRunner(awaited_status=(1, [awaited("nope", None)])))
    with pytest.raises(WorkflowNotFound):
        drive(ctx, primitives.await_plan(ctx, ["nope"], None))


def test_await_lease_lost(drive: Drive) -> None:
    ctx = FakeContext(FakeRunner(awaited_status=(None, [])))
    with pytest.raises(LeaseLost, match="waiting for other workflows"):
        drive(ctx, primitives.await_plan(ctx, ["a"], None))
    runner = FakeRunner(awaited_status=(1, [awaited("a", "succeeded", "1")]))
    runner.fenced.add("pgdurable.result")
    ctx = FakeContext(runner)
    with pytest.raises(LeaseLost, match="recording results"):
        drive(ctx, primitives.await_plan(ctx, ["a"], None))


def test_outcome_of_a_cancelled_execution() -> None:
    ctx = FakeContext(FakeRunner())
    text = json.dumps({"id": "c", "status": "cancelled", "output": None, "error": None})
    with pytest.raises(WorkflowCancelled):
        primitives.outcome(ctx, text, int)  # type: ignore[arg-type]


# ---- outside a workflow -----------------------------------------------------------------------------------

@pytest.mark.parametrize("call", [lambda: primitives.sleep(1), lambda: primitives.recv("t"),
                                  lambda: primitives.set_event("k", 1), lambda: primitives.gather([])])
def test_primitives_outside_a_workflow(call: Callable[[], Any]) -> None:
    with pytest.raises(ConfigurationError, match="inside a workflow"):
        call()


def test_patched_outside_a_workflow_is_the_new_code() -> None:
    assert primitives.patched("anything") is True
