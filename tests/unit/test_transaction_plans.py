"""Transactional steps as one plan (transactions.transaction_step_plan), driven sync and async, over a fake
transaction: what runs inside the transaction, when it commits or rolls back, retries and their budgets, and
what is recorded through the writer (only failures: a success is recorded by its own transaction)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import psycopg
import pytest

from pgdurable.effects import Invoke
from pgdurable.errors import LeaseLost
from pgdurable.plans import Plan, drive_async, drive_sync
from pgdurable.steps import RetryPolicy
from pgdurable.store.checkpoints import RecordedStep
from pgdurable.transactions import (
    TransactionRun,
    Transactions,
    async_transactions,
    in_transaction,
    sync_transactions,
    transaction_step_plan,
)

from .test_context import FakeWriter, make_ctx

CHECKPOINT = "checkpoint"
RETRY_AT_ONCE = RetryPolicy(max_attempts=3, interval=0)


class Writer(FakeWriter):
    """The fake writer, also as an async workflow's context awaits it."""

    async def submit(self, write: Any) -> Any:
        return self._write(write).result()


class FakeConnection:
    """Statements of one transaction; the checkpoint answers ``owned`` (False: fenced) or raises ``fail``."""

    def __init__(self, log: list[str], owned: bool, fail: BaseException | None) -> None:
        self.log, self.owned, self.fail, self.broken = log, owned, fail, False

    def run(self, statement: Any) -> tuple[bool] | None:
        self.log.append(str(statement))
        if statement == CHECKPOINT:
            if self.fail is not None:
                raise self.fail
            return (self.owned,)
        return None


class FakeDatabase:
    def __init__(self) -> None:
        self.log: list[str] = []
        self.owned = True
        self.checkpoint_failures: list[BaseException] = []  # raised by the next checkpoints, in order

    def connection(self) -> FakeConnection:
        fail = self.checkpoint_failures.pop(0) if self.checkpoint_failures else None
        return FakeConnection(self.log, self.owned, fail)

    def transactions(self, kind: str) -> Transactions:
        opening = (("SET idle timeout", None),)

        @contextlib.contextmanager
        def scope() -> Iterator[tuple[Any, Any]]:
            conn = self.connection()
            self.log.append("BEGIN")
            try:
                yield f"handle-{len(self.log)}", conn
            except BaseException:
                self.log.append("ROLLBACK")
                raise
            self.log.append("COMMIT")

        @contextlib.asynccontextmanager
        async def async_scope() -> AsyncIterator[tuple[Any, Any]]:
            with scope() as opened:
                yield opened

        tx = sync_transactions(scope, opening, CHECKPOINT) if kind == "sync" else \
            async_transactions(async_scope, opening, CHECKPOINT)
        # The fake connection's statements: plain calls (sync) or coroutines (async), as psycopg's are.
        if kind == "sync":
            execute: Callable[..., Any] = lambda conn, statement, params: conn.run(statement)  # noqa: E731
            fetch_one: Callable[..., Any] = execute
        else:
            async def execute(conn: FakeConnection, statement: Any, params: Any) -> Any:
                return conn.run(statement)
            fetch_one = execute
        return Transactions(tx.scope, tx.enter, tx.exit, execute, fetch_one, tx.opening, tx.checkpoint)


@pytest.fixture(params=["sync", "async"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def drive(kind: str, ctx: Any, plan: Plan) -> Any:
    return drive_sync(ctx, plan) if kind == "sync" else asyncio.run(drive_async(ctx, plan))


def body_of(kind: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    if kind == "sync":
        return fn

    async def async_fn(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)
    return async_fn


def run_step(kind: str, db: FakeDatabase, fn: Callable[..., Any], *args: Any,
             policy: RetryPolicy = RETRY_AT_ONCE,
             recorded: dict[int, RecordedStep] | None = None) -> tuple[FakeWriter, Any]:
    writer = Writer()
    ctx = make_ctx(writer, recorded)
    run = TransactionRun(ctx, "pay", policy, Any)
    run.reconnect_seconds = 30
    plan = transaction_step_plan(run, db.transactions(kind), Invoke(body_of(kind, fn), args, {}))
    try:
        return writer, drive(kind, ctx, plan)
    except BaseException as exc:
        return writer, exc


def test_the_body_and_its_checkpoint_commit_in_one_transaction(kind: str) -> None:
    db = FakeDatabase()
    seen: list[Any] = []

    def pay(handle: Any, amount: int) -> int:
        seen.append(handle)
        db.log.append(f"pay {amount}")
        return amount * 2

    writer, result = run_step(kind, db, pay, 21)
    assert result == 42
    assert db.log == ["BEGIN", "SET idle timeout", "pay 21", CHECKPOINT, "COMMIT"]
    assert seen and str(seen[0]).startswith("handle-")
    assert writer.writes == []  # recorded by its own transaction, not by the writer


def test_a_fenced_checkpoint_rolls_everything_back(kind: str) -> None:
    db = FakeDatabase()
    db.owned = False
    writer, result = run_step(kind, db, lambda handle: db.log.append("write"))
    assert isinstance(result, LeaseLost)
    assert db.log == ["BEGIN", "SET idle timeout", "write", CHECKPOINT, "ROLLBACK"]
    assert writer.writes == []


def test_a_failing_body_is_rolled_back_and_retried_by_the_policy(kind: str) -> None:
    db = FakeDatabase()
    tries: list[int] = []

    def flaky(handle: Any) -> str:
        tries.append(1)
        db.log.append(f"try {len(tries)}")
        if len(tries) < 2:
            raise ValueError("not yet")
        return "ok"

    writer, result = run_step(kind, db, flaky)
    assert result == "ok"
    assert db.log == ["BEGIN", "SET idle timeout", "try 1", "ROLLBACK",
                      "BEGIN", "SET idle timeout", "try 2", CHECKPOINT, "COMMIT"]
    assert writer.writes == []


def test_a_step_that_keeps_failing_records_only_its_error(kind: str) -> None:
    db = FakeDatabase()

    def broken(handle: Any) -> None:
        raise KeyError("missing")

    writer, result = run_step(kind, db, broken, policy=RetryPolicy(max_attempts=2, interval=0))
    assert isinstance(result, KeyError)
    assert db.log.count("ROLLBACK") == 2 and CHECKPOINT not in db.log
    [write] = writer.writes
    assert write.output is None and write.error is not None and "missing" in write.error
    assert write.tries == 2


def test_conflicts_retry_on_their_own_budget(kind: str) -> None:
    db = FakeDatabase()
    tries: list[int] = []

    def contended(handle: Any) -> str:
        tries.append(1)
        if len(tries) < 3:
            raise psycopg.errors.SerializationFailure("could not serialize access")
        return "done"

    _, result = run_step(kind, db, contended, policy=RetryPolicy(max_attempts=1))
    assert result == "done" and len(tries) == 3


def test_a_cancelled_checkpoint_is_not_the_steps_failure(kind: str) -> None:
    db = FakeDatabase()
    db.checkpoint_failures = [psycopg.errors.QueryCanceled("canceling statement due to statement timeout")]
    _, result = run_step(kind, db, lambda handle: "paid", policy=RetryPolicy(max_attempts=1))
    assert result == "paid"
    assert db.log.count(CHECKPOINT) == 2 and db.log.count("ROLLBACK") == 1 and db.log[-1] == "COMMIT"


def test_a_recorded_step_opens_no_transaction(kind: str) -> None:
    db = FakeDatabase()
    writer, result = run_step(kind, db, lambda handle: pytest.fail("ran again"),
                              recorded={0: RecordedStep("pay", "7", None)})
    assert result == 7
    assert db.log == [] and writer.writes == []


def test_outside_a_workflow_it_is_a_plain_transaction(kind: str) -> None:
    db = FakeDatabase()
    plan = in_transaction(db.transactions(kind), Invoke(body_of(kind, lambda handle, x: x + 1), (1,), {}), None)
    assert drive(kind, None, plan) == 2
    assert db.log == ["BEGIN", "SET idle timeout", "COMMIT"]


def test_a_plan_outside_a_workflow_cannot_write(kind: str) -> None:
    def plan() -> Plan:
        yield "a statement for the writer"

    with pytest.raises(RuntimeError, match="outside a workflow"):
        drive(kind, None, plan())
