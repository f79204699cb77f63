"""context.py and the @step wrapper: replay by step ordinal, fencing, recording a step's outcome, with a fake
writer in place of the worker's group-commit batcher (no database)."""

from __future__ import annotations

import contextvars
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pgdurable import store
from pgdurable.batcher import StepWrite
from pgdurable.context import ExecutionContext, current, current_workflow_id
from pgdurable.errors import ConfigurationError, LeaseLost, NonDeterminismError, SerializationError
from pgdurable.serialization import JsonSerializer, SizeLimit
from pgdurable.steps import RetryPolicy, make_step
from pgdurable.store.checkpoints import RecordedStep


class Done:
    def __init__(self, value: Any = None, error: BaseException | None = None) -> None:
        self.value, self.error = value, error

    def result(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value

    def done(self) -> bool:
        return True


class Deferred(Done):
    """A deferred write's waiter: settled when the writer is hurried."""

    def __init__(self, write: StepWrite) -> None:
        super().__init__()
        self.write, self.settled = write, False

    def done(self) -> bool:
        return self.settled


class FakeWriter:
    """The worker's writer as the context uses it from a workflow thread: each write is recorded (True) unless
    ``fenced``; outputs listed in ``refuse`` are refused for their data (SerializationError)."""

    def __init__(self) -> None:
        self.writes: list[StepWrite] = []
        self.calls: list[store.Call[Any]] = []
        self.fenced = False
        self.refuse: set[str] = set()
        self.deferred: list[Deferred] = []

    def _write(self, write: StepWrite) -> Done:
        if write.output in self.refuse:
            return Done(error=SerializationError("the database refused to store it: bad"))
        self.writes.append(write)
        return Done(not self.fenced)

    def submit_threadsafe(self, write: StepWrite) -> Done:
        return self._write(write)

    def submit_all_threadsafe(self, items: list[Any]) -> list[Done]:
        return [self._write(item) for item in items]

    def run_threadsafe(self, call: store.Call[Any]) -> Done:
        self.calls.append(call)
        return Done(f"ran {call.name}")

    def defer(self, write: StepWrite) -> Deferred:
        self.deferred.append(Deferred(write))
        return self.deferred[-1]

    def hurry_threadsafe(self) -> None:
        for waiter in self.deferred:
            done = self._write(waiter.write)
            waiter.value, waiter.error, waiter.settled = done.value, done.error, True
        self.deferred = []


def make_ctx(writer: FakeWriter, recorded: dict[int, RecordedStep] | None = None, **kwargs: Any) -> ExecutionContext:
    return ExecutionContext(execution_id="wf-9", workflow_name="flow", attempt=2, recorded=recorded or {},
                            serializer=SizeLimit(JsonSerializer(), 4096), batcher=writer,  # type: ignore[arg-type]
                            loop=None, **kwargs)  # type: ignore[arg-type]


def in_workflow(ctx: ExecutionContext, fn: Callable[[], Any]) -> Any:
    def run() -> Any:
        ctx.activate()
        return fn()
    return contextvars.copy_context().run(run)


def then_settled(ctx: ExecutionContext, fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn``, then what the workflow's next durable operation does first: wait for the deferred checkpoints
    (also when ``fn`` raised, as a workflow that catches the step's error goes on)."""
    def run() -> Any:
        try:
            return fn()
        finally:
            ctx.settle_sync()
    return run


# ---- the step counter and replay --------------------------------------------------------------------------

def test_steps_are_numbered_in_call_order_and_replayed_by_number() -> None:
    ctx = make_ctx(FakeWriter(), {1: RecordedStep("b", "42", None)})
    assert ctx.begin_step("a") == (0, None)
    assert ctx.begin_step("b") == (1, RecordedStep("b", "42", None))
    assert ctx.peek_step() == (2, None)
    assert ctx.begin_step("c") == (2, None)


def test_a_different_step_at_a_recorded_number_is_non_determinism() -> None:
    ctx = make_ctx(FakeWriter(), {0: RecordedStep("charge", "1", None)})
    with pytest.raises(NonDeterminismError, match=r"called step 'refund' as step #0.*'charge'"):
        ctx.begin_step("refund")


def test_a_mismatch_cannot_be_swallowed_by_except_exception() -> None:
    ctx = make_ctx(FakeWriter(), {0: RecordedStep("charge", "1", None)})
    assert not issubclass(NonDeterminismError, Exception)
    try:
        ctx.begin_step("refund")
    except Exception:  # what a workflow might write: it does not catch the mismatch
        pytest.fail("a replay mismatch was caught by `except Exception`")
    except NonDeterminismError:
        pass
    # Even if the workflow caught it (except BaseException), every later step raises it again, and the
    # engine asks at the end.
    with pytest.raises(NonDeterminismError):
        ctx.begin_step("charge")
    assert ctx.replay_mismatch() is not None and "'refund'" in ctx.replay_mismatch()  # type: ignore[operator]


def test_ending_before_the_recorded_steps_is_a_mismatch() -> None:
    recorded = {0: RecordedStep("a", "1", None), 1: RecordedStep("b", "2", None)}
    ctx = make_ctx(FakeWriter(), recorded)
    ctx.begin_step("a")
    reason = ctx.replay_mismatch()
    assert reason is not None and "ended after 1 steps" in reason and "'b'" in reason
    whole = make_ctx(FakeWriter(), recorded)
    whole.begin_step("a")
    whole.begin_step("b")
    whole.begin_step("c")  # past the history: new work
    assert whole.replay_mismatch() is None
    assert make_ctx(FakeWriter()).replay_mismatch() is None


def test_no_step_after_the_lease_is_lost() -> None:
    ctx = make_ctx(FakeWriter())
    error = ctx.lease_lost("testing")
    assert isinstance(error, LeaseLost) and ctx.lost
    with pytest.raises(LeaseLost):
        ctx.begin_step("a")


def test_replay_decodes_with_the_hint_or_raises_the_recorded_error() -> None:
    ctx = make_ctx(FakeWriter())
    assert ctx.replay(RecordedStep("s", '"2026-01-01T00:00:00+00:00"', None), datetime) == datetime(2026, 1, 1,
                                                                                                     tzinfo=UTC)
    assert ctx.replay(RecordedStep("s", None, None), Any) is None
    with pytest.raises(KeyError):
        ctx.replay(RecordedStep("s", None, json.dumps({"type": "KeyError", "args": ["k"]})), Any)


def test_db_now_follows_the_database_clock_from_the_claim() -> None:
    ahead = datetime.fromtimestamp(time.time() + 3600, UTC)
    ctx = make_ctx(FakeWriter(), db_now=ahead)
    assert abs(ctx.db_now() - ahead) < timedelta(seconds=5)


def test_perform_sync_dispatches_effects() -> None:
    writer = FakeWriter()
    ctx = make_ctx(writer)
    write = ctx.step_write(0, "s", "1")
    assert ctx.perform_sync(write) is True
    assert ctx.perform_sync([ctx.step_write(1, "s", "2"), ctx.step_write(2, "s", "3")]) == [True, True]
    assert ctx.perform_sync(store.claims.wake_due()) == "ran wake_due"
    assert [w.step_id for w in writer.writes] == [0, 1, 2]
    assert all((w.execution_id, w.attempt) == ("wf-9", 2) for w in writer.writes)


def test_suspended_calls_back_and_stops_writing() -> None:
    seen: list[Any] = []
    ctx = make_ctx(FakeWriter(), on_suspend=seen.append)
    when = datetime(2027, 1, 1, tzinfo=UTC)
    ctx.suspended(when)
    assert seen == [when] and ctx.lost


def test_current_outside_and_inside() -> None:
    assert current() is None and current_workflow_id() is None
    ctx = make_ctx(FakeWriter())
    assert in_workflow(ctx, lambda: (current() is ctx, current_workflow_id())) == (True, "wf-9")


# ---- @step ------------------------------------------------------------------------------------------------

def test_step_runs_once_and_records_its_output() -> None:
    calls: list[int] = []

    def add(x: int) -> int:
        calls.append(x)
        return x + 1
    step = make_step(add, "add", RetryPolicy())
    writer = FakeWriter()
    ctx = make_ctx(writer)
    assert in_workflow(ctx, lambda: step(1)) == 2
    assert writer.writes == [] and len(ctx.unwritten) == 1  # deferred: nothing waited for it
    in_workflow(ctx, ctx.settle_sync)
    assert ctx.unwritten == []
    [write] = writer.writes
    assert (write.step_id, write.step_name, write.output, write.error, write.tries) == (0, "add", "2", None, 1)
    replay = make_ctx(FakeWriter(), {0: RecordedStep("add", "2", None)})
    assert in_workflow(replay, lambda: step(1)) == 2
    assert calls == [1]  # not run again on replay


def test_on_citus_a_step_waits_for_its_checkpoint() -> None:
    writer = FakeWriter()
    ctx = make_ctx(writer, defer_checkpoints=False)
    assert in_workflow(ctx, lambda: make_step(lambda: 5, "five", RetryPolicy())()) == 5
    assert [w.output for w in writer.writes] == ["5"] and ctx.unwritten == []


def test_step_outside_a_workflow_is_a_plain_call() -> None:
    step = make_step(lambda: "plain", "plain", RetryPolicy())
    assert step() == "plain"


def test_step_retries_then_records_the_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    import pgdurable.plans as plans_module
    slept: list[float] = []
    monkeypatch.setattr(plans_module.time, "sleep", slept.append)
    attempts: list[int] = []

    def flaky() -> None:
        attempts.append(1)
        raise ValueError(f"try {len(attempts)}")
    step = make_step(flaky, "flaky", RetryPolicy(max_attempts=3, interval=1, backoff=3))
    writer = FakeWriter()
    ctx = make_ctx(writer)
    with pytest.raises(ValueError, match="try 3"):
        in_workflow(ctx, then_settled(ctx, step))
    assert len(attempts) == 3 and slept == [1.0, 3.0]
    [write] = writer.writes
    assert write.output is None and write.tries == 3
    assert json.loads(write.error or "")["type"] == "ValueError"
    with pytest.raises(ValueError, match="try 3"):
        in_workflow(make_ctx(FakeWriter(), {0: RecordedStep("flaky", None, write.error)}), step)


def test_step_result_that_cannot_be_stored_becomes_its_error() -> None:
    step = make_step(lambda: float("nan"), "nan", RetryPolicy())
    writer = FakeWriter()
    ctx = make_ctx(writer)
    with pytest.raises(SerializationError, match="cannot be stored") as caught:
        in_workflow(ctx, then_settled(ctx, step))
    [write] = writer.writes
    assert write.output is None
    replayed = make_ctx(FakeWriter(), {0: RecordedStep("nan", None, write.error)})
    with pytest.raises(SerializationError) as again:
        in_workflow(replayed, step)
    assert str(again.value) == str(caught.value)


def test_step_output_refused_by_the_database_is_recorded_as_its_error() -> None:
    """The checkpoint was deferred, so the workflow went on with the value: the step is recorded as having
    failed with the refusal, and the attempt gives up so that the execution replays at once (and the step
    raises the error there, as a replay does)."""
    step = make_step(lambda: "odd", "odd", RetryPolicy())
    writer = FakeWriter()
    writer.refuse.add('"odd"')
    ctx = make_ctx(writer)
    assert in_workflow(ctx, step) == "odd"
    with pytest.raises(LeaseLost, match=r"could not be recorded.*replays"):
        in_workflow(ctx, ctx.settle_sync)
    assert ctx.lost and ctx.replay_now
    [write] = writer.writes  # the refusal, recorded in the output's place
    assert write.output is None and "could not be recorded" in json.loads(write.error or "")["message"]
    replayed = make_ctx(FakeWriter(), {0: RecordedStep("odd", None, write.error)})
    with pytest.raises(SerializationError, match="could not be recorded"):
        in_workflow(replayed, step)


def test_step_fenced_raises_lease_lost() -> None:
    step = make_step(lambda: 1, "one", RetryPolicy())
    writer = FakeWriter()
    writer.fenced = True
    ctx = make_ctx(writer)
    with pytest.raises(LeaseLost, match="lost its lease before step #0"):
        in_workflow(ctx, then_settled(ctx, step))
    assert ctx.lost and not ctx.replay_now


def test_the_next_step_starts_after_the_previous_one_is_recorded() -> None:
    writer = FakeWriter()
    seen: list[list[int]] = []
    first = make_step(lambda: 1, "first", RetryPolicy())
    second = make_step(lambda: seen.append([w.step_id for w in writer.writes]), "second", RetryPolicy())
    ctx = make_ctx(writer)
    in_workflow(ctx, lambda: (first(), second()))
    assert seen == [[0]]  # the first step's checkpoint was written before the second's body ran
    assert [u.write.step_name for u in ctx.unwritten] == ["second"]


def test_metrics_hear_of_a_deferred_step_once_it_is_recorded() -> None:
    heard: list[tuple[str, bool, int]] = []

    class Observers:
        def step_finished(self, token: Any, name: str, step_id: int, started_at: datetime, ended_at: datetime,
                          failed: bool, attempts: int) -> None:
            assert ended_at >= started_at
            heard.append((name, failed, attempts))
    ctx = make_ctx(FakeWriter(), observers=Observers())
    in_workflow(ctx, make_step(lambda: 1, "one", RetryPolicy()))
    assert heard == []
    in_workflow(ctx, ctx.settle_sync)
    assert heard == [("one", False, 1)]


def test_steps_inside_a_step_are_plain_calls() -> None:
    inner = make_step(lambda: "inner", "inner", RetryPolicy())
    outer = make_step(lambda: inner() + "+outer", "outer", RetryPolicy())
    writer = FakeWriter()
    ctx = make_ctx(writer)
    assert in_workflow(ctx, then_settled(ctx, outer)) == "inner+outer"
    assert [w.step_name for w in writer.writes] == ["outer"]


def test_sync_step_from_the_event_loop_thread_is_refused() -> None:
    import asyncio

    async def main() -> None:
        ctx = ExecutionContext(execution_id="x", workflow_name="f", attempt=1, recorded={},
                               serializer=JsonSerializer(), batcher=FakeWriter(),  # type: ignore[arg-type]
                               loop=asyncio.get_running_loop())
        ran: list[int] = []
        sync_step = make_step(lambda: ran.append(1), "s", RetryPolicy())
        with pytest.raises(ConfigurationError, match="make the step `async def`"):
            in_workflow(ctx, sync_step)
        assert ran == []  # refused before its body runs
        with pytest.raises(ConfigurationError, match="_async form"):
            ctx.perform_sync(ctx.step_write(0, "s", "1"))
    asyncio.run(main())
