"""batcher.py's pure parts: a group commit's outcomes keyed by (execution, attempt, step), and a batch refused
for one write's data split into single writes, against a fake connection (no server)."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from psycopg import errors

from pgdurable import batch_plan, batcher, store
from pgdurable.batcher import Completion, Statement, StepWrite, ThreadWaiter, WriteBatcher, _Plan
from pgdurable.errors import LeaseLost, SerializationError

from .fakes import AsyncFakeConnection, FakeConnection, FakeDatabase

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def step(eid: str, attempt: int, step_id: int, output: str | None = "1", error: str | None = None,
         deferred: bool = False) -> StepWrite:
    return StepWrite(eid, attempt, step_id, f"s{step_id}", output, error, 1, T0, deferred)


def done(eid: str, attempt: int, output: str | None = '"ok"', status: str = "succeeded") -> Completion:
    return Completion(eid, attempt, status, output, None)


def run_plan(db: FakeDatabase, items: list[Any], citus: bool = False) -> list[tuple[Any, BaseException | None]]:
    """Execute one batch on the fake, settle it, and return each item's (result, error). ``citus``: as on a
    schema with the Citus layout (each kind of write its own statement, in one transaction)."""
    waiters = [ThreadWaiter() for _ in items]
    plan = _Plan(list(zip(items, waiters, strict=True)))
    conn = FakeConnection(db)
    if citus:
        store.calls.remember_schema(conn, "s", citus=True)
    try:
        plan.execute(conn)  # type: ignore[arg-type]
    except Exception as exc:
        plan.failed(exc, 1)
    plan.settle(None)
    outcomes: list[tuple[Any, BaseException | None]] = []
    for waiter in waiters:
        try:
            outcomes.append((waiter.result(), None))
        except BaseException as exc:
            outcomes.append((None, exc))
    return outcomes


def results(outcomes: list[tuple[Any, BaseException | None]]) -> list[Any]:
    assert all(error is None for _, error in outcomes), outcomes
    return [result for result, _ in outcomes]


# ---- keying -----------------------------------------------------------------------------------------------

def test_two_attempts_of_one_execution_never_take_each_others_outcome() -> None:
    db = FakeDatabase(owned={("e1", 2)})
    assert results(run_plan(db, [step("e1", 1, 0), step("e1", 2, 0)])) == [False, True]
    assert db.steps[("e1", 0)][1] == 2


def test_steps_are_keyed_by_step_id() -> None:
    db = FakeDatabase(owned={("e1", 1), ("e2", 1)})
    db.steps[("e1", 1)] = ("already", 1, 1)  # step 1 recorded before: ON CONFLICT DO NOTHING
    assert results(run_plan(db, [step("e1", 1, 0), step("e1", 1, 1), step("e1", 1, 2), step("e2", 1, 1)])) == [
        True, False, True, True]


def test_a_completion_and_a_step_of_the_same_attempt() -> None:
    db = FakeDatabase(owned={("e1", 1), ("e2", 3)})
    outcome = results(run_plan(db, [step("e1", 1, 0), done("e1", 1), done("e2", 2), step("e2", 3, 0)]))
    assert outcome == [True, True, False, True]
    assert len(db.statements) == 1  # both kinds in one statement (write_checkpoints)
    assert db.completions["e1"][2] == "succeeded"


def test_on_citus_each_kind_is_a_statement_of_one_transaction() -> None:
    db = FakeDatabase(owned={("e1", 1), ("e2", 3)})
    outcome = results(run_plan(db, [step("e1", 1, 0), done("e1", 1), done("e2", 2), step("e2", 3, 0)], citus=True))
    assert outcome == [True, True, False, True]
    assert [len(rows) for rows in db.statements] == [2, 2]  # steps, then completions


def test_outputs_are_spliced_as_json() -> None:
    db = FakeDatabase(owned={("e1", 1)})
    run_plan(db, [step("e1", 1, 0, output='{"a": [1, "x"]}'), step("e1", 1, 1, output=None, error='{"type": "E"}')])
    assert db.steps[("e1", 0)][6:] == ({"a": [1, "x"]}, None)
    assert db.steps[("e1", 1)][6:] == (None, {"type": "E"})


def test_a_step_alone_is_written_from_scalar_parameters() -> None:
    """One step and nothing else (steps in sequence) goes to write_step; a few writes to the array statements
    planned for a few (write_steps_few and its siblings), more, or a Citus schema, to the others."""
    def names(items: list[Any], citus: bool = False) -> list[str]:
        return [call.name for call in batch_plan._write_calls([(i, ThreadWaiter()) for i in items], citus)]

    assert names([step("e1", 1, 0)]) == ["write_step"]
    assert names([step("e1", 1, 0)], citus=True) == ["write_steps"]
    assert names([step("e1", 1, 0), step("e2", 1, 0)]) == ["write_steps_few"]
    assert names([step("e1", 1, 0), done("e1", 1)]) == ["write_checkpoints_few"]
    assert names([done("e1", 1)]) == ["write_completions_few"]
    assert names([done("e1", 1)], citus=True) == ["write_completions"]
    # More than a few: the statements that hash-join the running executions.
    many = [step(f"e{i}", 1, 0) for i in range(batch_plan.FEW_ROWS)]
    assert names([*many, done("e0", 1)]) == ["write_checkpoints"]
    assert names([*many, step("ex", 1, 0)]) == ["write_steps"]
    assert names([done(f"e{i}", 1) for i in range(batch_plan.FEW_ROWS + 1)]) == ["write_completions"]
    db = FakeDatabase(owned={("e1", 1)})
    assert results(run_plan(db, [step("e1", 1, 0, output=None, error='{"type": "E"}')])) == [True]
    assert db.steps[("e1", 0)][6:] == (None, {"type": "E"})


# ---- refused for its data: split into single writes --------------------------------------------------------

def bad_output(row: list[Any]) -> bool:
    return (len(row) == 8 and row[6] == "BAD") or (len(row) == 5 and row[3] == "BAD")


def test_one_bad_write_does_not_charge_the_batch() -> None:
    db = FakeDatabase(owned={("e1", 1), ("e2", 1), ("e3", 1)})
    db.refuse = bad_output
    outcomes = run_plan(db, [step("e1", 1, 0), step("e2", 1, 0, output='"BAD"'), step("e3", 1, 0)])
    assert outcomes[0] == (True, None) and outcomes[2] == (True, None)
    result, error = outcomes[1]
    assert result is None
    assert isinstance(error, SerializationError) and "refused to store it" in str(error)
    assert len(db.statements) == 4  # the batch, then each write alone
    assert set(db.steps) == {("e1", 0), ("e3", 0)}


def test_a_single_refused_write_is_not_retried() -> None:
    db = FakeDatabase(owned={("e1", 1)})
    db.refuse = bad_output
    [(result, error)] = run_plan(db, [done("e1", 1, output='"BAD"')])
    assert result is None
    assert isinstance(error, SerializationError)
    assert len(db.statements) == 1


def test_refused_completion_rolls_back_the_steps_of_its_transaction() -> None:
    db = FakeDatabase(owned={("e1", 1), ("e2", 1)})
    db.refuse = bad_output
    outcomes = run_plan(db, [step("e1", 1, 0), done("e2", 1, output='"BAD"'), done("e1", 1)])
    assert outcomes[0] == (True, None) and outcomes[2] == (True, None)
    assert isinstance(outcomes[1][1], SerializationError)
    assert set(db.steps) == {("e1", 0)} and set(db.completions) == {"e1"}


@pytest.mark.parametrize("error", [errors.InvalidTextRepresentation, errors.UntranslatableCharacter,
                                   errors.CheckViolation, errors.UniqueViolation, errors.ProgramLimitExceeded,
                                   ValueError, UnicodeEncodeError])
def test_data_errors_split_the_batch(error: type[Exception]) -> None:
    db = FakeDatabase(owned={("e1", 1), ("e2", 1)})
    db.refuse = bad_output
    if error is UnicodeEncodeError:
        db.error = lambda message: UnicodeEncodeError("utf-8", "\udc80", 0, 1, message)  # type: ignore[assignment]
    else:
        db.error = error  # type: ignore[assignment]
    outcomes = run_plan(db, [step("e1", 1, 0), step("e2", 1, 0, output='"BAD"')])
    assert outcomes[0] == (True, None)
    assert isinstance(outcomes[1][1], SerializationError)


@pytest.mark.parametrize("error", [errors.QueryCanceled, errors.AdminShutdown, psycopg.OperationalError,
                                   errors.SerializationFailure, errors.DeadlockDetected, RuntimeError])
def test_other_errors_fail_the_whole_batch(error: type[Exception]) -> None:
    """Not the data's fault: nothing is reported written (the lease runs out, another attempt resumes)."""
    db = FakeDatabase(owned={("e1", 1), ("e2", 1)})
    db.refuse = bad_output
    db.error = error  # type: ignore[assignment]
    outcomes = run_plan(db, [step("e1", 1, 0), step("e2", 1, 0, output='"BAD"'), done("e1", 1)])
    assert outcomes == [(False, None), (False, None), (False, None)]
    assert len(db.statements) == 1


@pytest.mark.parametrize("citus", [False, True])
def test_keys_of_a_rolled_back_transaction_are_not_reported_written(citus: bool) -> None:
    """The batch's first statement (or, on Citus, its first transaction: the steps' statement committed with
    it, then the completions' refused) is refused; e1 is lost before the writes are made one at a time."""
    db = FakeDatabase(owned={("e1", 1), ("e2", 1)})
    db.refuse = bad_output
    statements_of_the_batch = 2 if citus else 1

    def lose_e1_after_the_first_transaction() -> None:
        if len(db.statements) == statements_of_the_batch:
            db.owned.discard(("e1", 1))
    db.after_statement = lose_e1_after_the_first_transaction
    outcomes = run_plan(db, [step("e1", 1, 0), done("e2", 1, output='"BAD"')], citus=citus)
    assert ("e1", 0) not in db.steps  # fenced: not stored
    assert outcomes[0] == (False, None)


# ---- statements on the worker's own rows ------------------------------------------------------------------

def test_statements_run_after_the_writes_and_keep_their_own_outcome() -> None:
    db = FakeDatabase(owned={("e1", 1), ("e2", 1)})
    beat = Statement(store.claims.heartbeat(owner="w", lease=30.0, ids=["e1", "e2"]))
    outcomes = run_plan(db, [beat, done("e1", 1)])
    assert outcomes[0] == ({"e2": 1}, None)  # e1 completed by the writes first
    assert outcomes[1] == (True, None)


def test_a_failing_statement_fails_only_its_own_waiter() -> None:
    db = FakeDatabase(owned={("e1", 1)})
    bad = Statement(store.claims.heartbeat(owner="w", lease=1.0, ids=["e1"]))
    original = db.execute

    def execute(params: Any) -> Any:
        if "owner" in dict(params):
            raise errors.LockNotAvailable("could not obtain lock")
        return original(params)
    db.execute = execute  # type: ignore[method-assign]
    outcomes = run_plan(db, [step("e1", 1, 0), bad])
    assert outcomes[0] == (True, None)
    assert isinstance(outcomes[1][1], errors.LockNotAvailable)


def test_a_failed_batch_gives_statements_the_failure() -> None:
    db = FakeDatabase(owned={("e1", 1)})
    db.fail = psycopg.OperationalError("connection lost")
    outcomes = run_plan(db, [Statement(store.claims.heartbeat(owner="w", lease=1.0, ids=["e1"])), step("e1", 1, 0)])
    assert isinstance(outcomes[0][1], psycopg.OperationalError)
    assert outcomes[1] == (False, None)


# ---- the async flavour --------------------------------------------------------------------------------------

def test_aexecute_keys_and_splits_like_execute() -> None:
    async def go() -> list[Any]:
        db = FakeDatabase(owned={("e1", 2), ("e2", 1)})
        db.refuse = bad_output
        loop = asyncio.get_running_loop()
        items: list[Any] = [step("e1", 1, 0), step("e1", 2, 0), done("e2", 1, output='"BAD"'), done("e1", 2)]
        futures = [loop.create_future() for _ in items]
        plan = _Plan(list(zip(items, futures, strict=True)))
        await plan.aexecute(AsyncFakeConnection(db))  # type: ignore[arg-type]
        plan.settle(None)
        return list(await asyncio.gather(*futures, return_exceptions=True))
    outcome = asyncio.run(go())
    assert outcome[0] is False and outcome[1] is True and outcome[3] is True
    assert isinstance(outcome[2], SerializationError)


# ---- the writer, run from a workflow thread ----------------------------------------------------------------

def test_writer_runs_the_batch_in_the_calling_thread() -> None:
    db = FakeDatabase(owned={("e1", 1)})
    writer = WriteBatcher(aconnect=None, connect=lambda: FakeConnection(db))  # type: ignore[arg-type,return-value]
    waiters = writer.submit_all_threadsafe([step("e1", 1, 0), done("e1", 1)])
    assert [w.result() for w in waiters] == [True, True]
    assert writer.submit_threadsafe(step("e1", 1, 1)).result() is False  # completed: no longer owned


def test_writer_reconnects_and_retries_a_failed_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batcher.time, "sleep", lambda seconds: None)
    db = FakeDatabase(owned={("e1", 1)})
    connects: list[int] = []

    def connect() -> FakeConnection:
        connects.append(1)
        if len(connects) < 3:
            raise psycopg.OperationalError("server closed the connection")
        return FakeConnection(db)
    writer = WriteBatcher(aconnect=None, connect=connect)  # type: ignore[arg-type]
    assert writer.submit_threadsafe(step("e1", 1, 0)).result() is True
    assert len(connects) == 3


def test_writer_gives_up_after_three_attempts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batcher.time, "sleep", lambda seconds: None)
    attempts: list[int] = []

    def connect() -> FakeConnection:
        attempts.append(1)
        raise psycopg.OperationalError("no server")
    writer = WriteBatcher(aconnect=None, connect=connect)  # type: ignore[arg-type]
    write, beat = writer.submit_all_threadsafe([step("e1", 1, 0),
                                                Statement(store.claims.heartbeat(owner="w", lease=1.0, ids=["e1"]))])
    assert write.result() is False
    with pytest.raises(psycopg.OperationalError):
        beat.result()
    assert len(attempts) == 3


def test_a_thread_leading_a_batch_waits_for_the_other_running_executions_to_join(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Three executions run, two of them with no write queued: the leader waits (here: up to a generous
    deadline) until both have queued theirs, and the three go out in one commit."""
    monkeypatch.setattr(batcher, "GATHER_SECONDS", 30.0)
    db = FakeDatabase(owned={("e1", 1), ("e2", 1), ("e3", 1)})
    writer = WriteBatcher(aconnect=None, connect=lambda: FakeConnection(db),  # type: ignore[arg-type,return-value]
                          running=lambda: 3)
    others: list[ThreadWaiter] = []
    leading = threading.Thread(target=lambda: others.append(writer.submit_threadsafe(step("e1", 1, 0))))
    leading.start()
    deadline = time.monotonic() + 20
    while not writer._gathering:  # the leader is waiting for the others
        assert time.monotonic() < deadline, "the leader never gathered"
        time.sleep(0.001)
    others.append(writer.submit_threadsafe(step("e2", 1, 0)))  # the writer is busy: queued only
    others.append(writer.submit_threadsafe(step("e3", 1, 0)))
    leading.join(timeout=20)
    assert not leading.is_alive()
    assert [w.result() for w in others] == [True, True, True]
    assert len(db.statements) == 1


class _RecordingEvent(threading.Event):
    """An Event that records each wait (a gathering leader waits on the writer's)."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        return super().wait(timeout)


def test_a_batch_goes_at_once_when_no_other_execution_could_join() -> None:
    db = FakeDatabase(owned={("e1", 1), ("e2", 1)})
    for running in (1, 2):  # alone; or one other execution, fewer than GATHER_JOINERS
        writer = WriteBatcher(aconnect=None, connect=lambda: FakeConnection(db),  # type: ignore[arg-type,return-value]
                              running=lambda running=running: running)  # type: ignore[misc]
        joined = writer._joined = _RecordingEvent()
        assert writer.submit_threadsafe(step("e1", 1, running)).result() is True
        assert joined.waits == [] and not writer._gathering  # never waited for anyone
    assert batcher.GATHER_JOINERS == 2


def test_gathering_ends_at_its_deadline_when_nobody_joins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batcher, "GATHER_SECONDS", 0.01)
    db = FakeDatabase(owned={("e1", 1)})
    writer = WriteBatcher(aconnect=None, connect=lambda: FakeConnection(db),  # type: ignore[arg-type,return-value]
                          running=lambda: 5)  # four others run long steps: none of them writes
    assert writer.submit_threadsafe(step("e1", 1, 0)).result() is True
    assert len(db.statements) == 1 and not writer._gathering


# ---- deferred writes (a step's checkpoint not waited for) ----------------------------------------------------

def test_a_deferred_write_goes_out_with_the_next_batch() -> None:
    db = FakeDatabase(owned={("e1", 1)})
    writer = WriteBatcher(aconnect=None, connect=lambda: FakeConnection(db))  # type: ignore[arg-type,return-value]
    deferred = writer.defer(step("e1", 1, 0))
    assert isinstance(deferred, ThreadWaiter) and not deferred.done() and db.statements == []
    assert writer.submit_threadsafe(done("e1", 1)).result() is True
    assert deferred.done() and deferred.result() is True
    assert len(db.statements) == 1  # the step and the completion in one statement


def test_hurry_writes_deferred_writes_now() -> None:
    db = FakeDatabase(owned={("e1", 1)})
    writer = WriteBatcher(aconnect=None, connect=lambda: FakeConnection(db))  # type: ignore[arg-type,return-value]
    writer.hurry_threadsafe()  # nothing pending: no statement
    first, second = writer.defer(step("e1", 1, 0)), writer.defer(step("e1", 1, 1))
    writer.hurry_threadsafe()
    assert isinstance(first, ThreadWaiter) and isinstance(second, ThreadWaiter)
    assert first.result() is True and second.result() is True
    assert len(db.statements) == 1


def test_the_ticker_writes_a_deferred_write_nobody_takes_along() -> None:
    """On the event loop: a deferred write with no batch after it is written by the ticker after
    LINGER_SECONDS, and the ticker stops once nothing has been deferred for a while."""
    db = FakeDatabase(owned={("e1", 1)})

    async def scenario() -> tuple[Any, float]:
        async def aconnect() -> AsyncFakeConnection:
            return AsyncFakeConnection(db)
        writer = WriteBatcher(aconnect, connect=None)  # type: ignore[arg-type]
        await writer.start()
        began = time.monotonic()
        deferred = writer.defer(step("e1", 1, 0))
        assert isinstance(deferred, asyncio.Future)
        result = await asyncio.wait_for(deferred, 30)
        waited = time.monotonic() - began
        await writer.close()
        return result, waited

    result, waited = asyncio.run(scenario())
    assert result is True and len(db.statements) == 1
    assert waited >= batcher.LINGER_SECONDS  # not before: a completion coming right after would have taken it


def test_a_completion_is_not_written_when_a_deferred_step_of_its_attempt_was_refused() -> None:
    """The batch is split for a refused write: the step is refused alone, and the completion that followed
    it (its result computed from that step's value) is refused with it, not written."""
    db = FakeDatabase(owned={("e1", 1), ("e2", 1)})
    db.refuse = bad_output
    outcomes = run_plan(db, [step("e1", 1, 0, output='"BAD"', deferred=True), step("e2", 1, 0), done("e1", 1),
                             done("e2", 1)])
    assert isinstance(outcomes[0][1], SerializationError) and isinstance(outcomes[2][1], SerializationError)
    assert outcomes[1] == (True, None) and outcomes[3] == (True, None)
    assert set(db.completions) == {"e2"} and set(db.steps) == {("e2", 0)}
    assert ("e1", 1) in db.owned  # e1 is still running: its attempt replays from there


def test_a_completion_is_not_written_when_its_deferred_step_was_refused_in_an_earlier_batch() -> None:
    db = FakeDatabase(owned={("e1", 1), ("e2", 1), ("e3", 1)})
    db.refuse = bad_output
    writer = WriteBatcher(aconnect=None, connect=lambda: FakeConnection(db))  # type: ignore[arg-type,return-value]
    refused = writer.defer(step("e1", 1, 0, output='"BAD"', deferred=True))
    writer.hurry_threadsafe()
    with pytest.raises(SerializationError):
        refused.result()  # type: ignore[union-attr]
    completion = writer.submit_threadsafe(done("e1", 1))
    with pytest.raises(SerializationError, match="refused"):
        completion.result()
    assert "e1" not in db.completions and ("e1", 1) in db.owned
    # A step that was waited for and refused does not stop its completion (the workflow heard of the refusal
    # as the step's error); nor does another attempt's refusal.
    assert _outcome(writer.submit_threadsafe(step("e2", 1, 0, output='"BAD"')))[1] is not None
    assert writer.submit_threadsafe(done("e2", 1)).result() is True
    assert writer.submit_threadsafe(done("e3", 1)).result() is True


def test_on_citus_a_completion_waits_for_its_deferred_steps_in_the_same_transaction() -> None:
    """Found by the chaos test on Citus (a node restarted): the steps' statement leaves out a bucket whose node
    cannot be reached, and the node was back for the completions' statement in the same transaction, which
    committed a completion without its last step. A completion whose deferred steps were not written is left
    out of the completions' statement; a step that was waited for does not hold its completion back."""
    db = FakeDatabase(owned={("e1", 1), ("e2", 1), ("e3", 1)})
    db.unreachable_steps = {"e1", "e3"}
    outcomes = run_plan(db, [step("e1", 1, 0, deferred=True), step("e2", 1, 0, deferred=True), step("e3", 1, 0),
                             done("e1", 1), done("e2", 1), done("e3", 1)], citus=True)
    assert results(outcomes) == [False, True, False, False, True, True]
    assert set(db.completions) == {"e2", "e3"} and ("e1", 1) in db.owned
    assert [len(rows) for rows in db.statements] == [3, 2]


def test_a_completion_is_not_written_when_its_deferred_step_was_lost_with_a_failed_batch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by the chaos test on Citus (a node restarted): a deferred checkpoint went out in a batch that
    failed outright, and the completion, in a later batch, committed without it. Now that completion is
    reported not written (its execution replays, the step runs again); other executions' are written."""
    monkeypatch.setattr(batcher.time, "sleep", lambda seconds: None)
    db = FakeDatabase(owned={("e1", 1), ("e2", 1)})
    down = [True]

    def connect() -> FakeConnection:
        if down[0]:
            raise psycopg.OperationalError("the database system is starting up")
        return FakeConnection(db)
    writer = WriteBatcher(aconnect=None, connect=connect)  # type: ignore[arg-type]
    lost = writer.defer(step("e1", 1, 0, deferred=True))
    waited = writer.defer(step("e2", 1, 0))  # not deferred by a workflow that went on: its workflow waits
    writer.hurry_threadsafe()  # three attempts, all failed
    assert lost.result() is False and waited.result() is False  # type: ignore[union-attr]
    down[0] = False
    assert writer.submit_threadsafe(done("e1", 1)).result() is False
    assert writer.submit_threadsafe(done("e2", 1)).result() is True
    assert set(db.completions) == {"e2"} and ("e1", 1) in db.owned


# ---- closing ----------------------------------------------------------------------------------------------

def test_closing_the_writer_settles_what_it_will_never_write() -> None:
    """A stopping worker must leave no workflow thread waiting on a write forever: found in CI, where a sync
    workflow's thread waited on its durable sleep's statement after its worker had stopped, and pytest could not
    exit. Writes the writer never ran come back as not written; statements raise LeaseLost."""
    def go() -> tuple[list[Any], list[Any]]:
        async def scenario() -> tuple[list[Any], list[Any]]:
            connecting = asyncio.Event()

            async def server_never_answers() -> psycopg.AsyncConnection[Any]:
                connecting.set()
                await asyncio.Event().wait()
                raise AssertionError("unreachable")

            def no_thread_connects() -> psycopg.Connection[Any]:
                raise AssertionError("the loop's flusher is busy: no workflow thread should lead a batch")

            writer = WriteBatcher(server_never_answers, no_thread_connects)
            await writer.start()
            in_flight = writer.submit(step("e1", 1, 0))  # the flusher takes it and waits for a connection
            await connecting.wait()
            beat = Statement(store.claims.heartbeat(owner="w", lease=1.0, ids=["e2"]))
            # From workflow threads, while the flusher is busy: queued behind it.
            waiters = [await asyncio.to_thread(writer.submit_threadsafe, step("e2", 1, 0)),
                       await asyncio.to_thread(lambda: writer.submit_all_threadsafe([beat])[0])]
            await writer.close()
            late = [await asyncio.to_thread(writer.submit_threadsafe, step("e3", 1, 0)), writer.submit(done("e3", 1))]
            threads = [*waiters, late[0]]
            assert all(w.done() for w in threads), "a workflow thread would wait forever"
            assert in_flight.done() and late[1].done()
            return [_outcome(w) for w in threads], [in_flight.result(), late[1].result()]
        return asyncio.run(asyncio.wait_for(scenario(), 30))

    threads, futures = go()
    assert threads[0] == (False, None)  # the queued write: not written
    assert threads[1][0] is None and isinstance(threads[1][1], LeaseLost)  # the queued statement
    assert threads[2] == (False, None)  # submitted after the close, from a thread
    assert futures == [False, False]  # the one in flight when the flusher stopped, and one submitted after


def _outcome(waiter: ThreadWaiter) -> tuple[Any, BaseException | None]:
    try:
        return waiter.result(), None
    except BaseException as exc:
        return None, exc


# ---- doorbells armed with completions -------------------------------------------------------------------------

def test_a_completion_arms_its_doorbell_in_the_completions_statement_once() -> None:
    """The bells of a batch's completions go with the statement that writes them (one transaction), each
    once; a batch whose completions arm nothing passes an empty list."""
    db = FakeDatabase(owned={("e1", 1), ("e2", 1), ("e3", 1)})
    first, second = done("e1", 1), done("e2", 1)
    first.bell = second.bell = ("w1", "q")
    assert results(run_plan(db, [step("e3", 1, 0), first, second])) == [True, True, True]
    assert db.bells == [[["w1", "q"]]]
    assert results(run_plan(db, [done("e3", 1)])) == [True]
    assert db.bells == [[["w1", "q"]], []]


def test_a_bell_follows_its_completion_when_a_refused_batch_is_split() -> None:
    db = FakeDatabase(owned={("e1", 1), ("e2", 1)})
    db.refuse = lambda row: row[0] == "e2"
    armed = done("e1", 1)
    armed.bell = ("w1", "q")
    outcomes = run_plan(db, [armed, done("e2", 1)])
    assert outcomes[0] == (True, None) and isinstance(outcomes[1][1], SerializationError)
    assert db.bells == [[["w1", "q"]], [["w1", "q"]], []]  # the batch, then each completion alone
