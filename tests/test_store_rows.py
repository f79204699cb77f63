"""store/ maps rows to objects by column name: every query read into a dataclass returns exactly columns
named after its fields, so a column added to or moved in a query cannot silently shift the fields."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any, TypeVar

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import class_row, dict_row

from pgdurable import monitoring, schedules, store

T = TypeVar("T")


def _calls() -> list[tuple[store.Call[Any], type[Any]]]:
    return [
        (store.executions.enqueue(id="rows-1", name="w", queue="default", priority=0, input="{}", max_recoveries=5,
                                  delay=0.0), store.executions.Enqueued),
        (store.executions.fork(source="nobody", id="rows-fork", from_step=0), store.executions.Forked),
        (store.executions.find_enqueued(id="x", queue="default", dedup_key="k"), store.executions.Enqueued),
        (store.claims.claim(queue="none", names=["w"], owner="o", lease=5, limit=1, version="v"), store.claims.Claimed),
        (store.claims.claim_with_policy(queue="none", names=["w"], owner="o", lease=5, limit=1, version="v"),
         store.claims.Claimed),
        (store.executions.get_execution("rows-1"), store.executions.Execution),
        (store.executions.list_executions(status=None, name=None, queue=None, limit=1), store.executions.Execution),
        (store.checkpoints.list_steps("rows-1"), store.checkpoints.Step),
        (store.queues.queue_policies(None), store.queues.QueuePolicy),
        (store.messaging.list_messages("rows-1"), store.messaging.Message),
        (store.messaging.list_events("rows-1"), store.messaging.Event),
        # The dashboard's and status's read models, and the schedules.
        (store.queues.queue_depths(), store.queues.QueueDepth),
        (store.claims.sweep_expired(), store.claims.Swept),
        (store.claims.fail_unrunnable(3600), store.claims.Named),
        (monitoring.workers(), monitoring.WorkerInfo),
        (monitoring.unrunnable(), monitoring.Unrunnable),
        (monitoring.list_page(monitoring.ListFilter()), monitoring.ListedExecution),
        (monitoring.list_page(monitoring.ListFilter(), older_than=(_T, "x")), monitoring.ListedExecution),
        (monitoring.list_page(monitoring.ListFilter(), newer_than=(_T, "x")), monitoring.ListedExecution),
        (monitoring.execution_input("rows-1"), monitoring.Payload),
        (monitoring.children("rows-1"), monitoring.Child),
        (monitoring.schedules(), monitoring.ScheduleInfo),
        (monitoring.tables("public"), monitoring.TableStats),
        (monitoring.server(), monitoring.ServerInfo),
        (schedules.get_schedule("s"), schedules.Schedule),
        (schedules.list_schedules(), schedules.Schedule),
        (schedules.lock_schedule("s"), schedules.LockedSchedule),
        (schedules.lock_due_schedules(1), schedules.DueSchedule),
        (schedules.squatted_ticks("[]"), schedules.SquattedTick),
    ]


def _dict_calls() -> list[tuple[store.Call[Any], set[str]]]:
    """Calls read as dicts, with the columns their readers use."""
    return [
        (store.claims.wake_due(), {"woken", "next_due", "now"}),
        (store.messaging.receive(id="rows-1", attempt=1, topic="t", step_id=1, step_name="recv", started_at=_T),
         {"owned", "wakeups", "found", "message"}),
        (store.children.awaited_status(id="rows-1", attempt=1, ids=["rows-1"]),
         {"wakeups", "id", "status", "output", "error", "is_child"}),
        (monitoring.queues(), {"queue", "ready", "delayed", "running", "stale", "oldest_ready_seconds",
                               "live_workers", "waiting", "overdue", *monitoring.WAIT_KINDS}),
        (monitoring.outcomes(), {"ago", "status", "n"}),
        (monitoring.execution("rows-1"), {"fields", "output", "output_size", "error", "parent_name",
                                          "parent_status"}),
        (monitoring.steps("rows-1"), {"fields", "output", "output_size", "error"}),
        (monitoring.children_counts("rows-1"), {"status", "n"}),
        (monitoring.message_counts("rows-1"), {"total", "pending"}),
        (monitoring.messages("rows-1"), {"id", "topic", "text", "size", "idempotency_key", "created_at",
                                         "consumed_at", "consumed_by_step"}),
        (monitoring.events_latest("rows-1"), {"key", "step_id", "text", "size", "created_at", "versions"}),
        (monitoring.events_history("rows-1"), {"key", "step_id", "text", "size", "created_at"}),
    ]


_T = datetime(2026, 1, 1, tzinfo=UTC)


def test_rows_read_as_dicts_have_the_columns_their_readers_use(db: psycopg.Connection[Any]) -> None:
    for call, used in _dict_calls():
        assert call.row_factory is dict_row, call.name
        with db.cursor() as cur:
            cur.execute(store.calls._statement(call), call.params)
            assert cur.description is not None
            columns = [column.name for column in cur.description]
        assert len(columns) == len(set(columns)), (call.name, columns)
        assert used <= set(columns), f"{call.name}: columns {sorted(used - set(columns))} missing from {columns}"


def test_named_rows_match_their_dataclasses(db: psycopg.Connection[Any]) -> None:
    for call, cls in _calls():
        with db.cursor() as cur:
            cur.execute(store.calls._statement(call), call.params)
            assert cur.description is not None
            columns = [column.name for column in cur.description]
        fields = [field.name for field in dataclasses.fields(cls)]
        required = [field.name for field in dataclasses.fields(cls)
                    if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING]
        assert len(columns) == len(set(columns)), (call.name, columns)
        assert set(columns) <= set(fields), f"{call.name}: columns {columns} that {cls.__name__} has no field for"
        assert set(required) <= set(columns), f"{call.name}: {cls.__name__} fields missing from {columns}"


def test_rows_are_read_by_name(db: psycopg.Connection[Any]) -> None:
    store.run(db, store.executions.enqueue(id="rows-2", name="w", queue="q", priority=3, input='{"a": 1}',
                                           max_recoveries=2, delay=0.0))
    execution = store.run(db, store.executions.get_execution("rows-2"))
    assert execution is not None
    assert (execution.id, execution.name, execution.queue, execution.status, execution.priority,
            execution.max_recoveries, execution.attempt) == ("rows-2", "w", "q", "enqueued", 3, 2, 0)
    # A column the dataclass does not know is an error, not a shifted field.
    with db.cursor(row_factory=class_row(store.executions.Enqueued)) as cur, pytest.raises(TypeError):
        cur.execute("SELECT 'x' AS id, 'w' AS name, true AS created, 1 AS surprise")
        cur.fetchall()


def test_an_own_connection_runs_every_call_on_one_cursor_and_reads_each_as_it_asks(
        database_url: str, schema: str, db: psycopg.Connection[Any]) -> None:
    """pgdurable's own connections run all their statements on one cursor (store.calls.OwnConnection): each
    call still gets its rows as it asks, by name or as tuples, whatever the call before it asked; a failed
    statement leaves the cursor usable; a result read is freed, not kept until the next statement. (Inside a
    transaction: outside one, a named query goes through libpq, tests/test_prepared_statements.py.)"""
    with store.calls.OwnConnection.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        cursor = conn.statements()

        def run(call: store.Call[T]) -> T:
            with conn.transaction():
                return store.run(conn, call)

        run(store.executions.enqueue(id="rows-3", name="w", queue="q", priority=1, input="{}", max_recoveries=2,
                                     delay=0.0))
        named = run(store.executions.get_execution("rows-3"))
        assert named is not None and (named.id, named.priority) == ("rows-3", 1)
        now = run(store.Call("database_now", {}, lambda rows: rows))
        assert isinstance(now[0], tuple) and isinstance(now[0][0], datetime)
        woken, _, clock = run(store.claims.wake_due())  # read from dict rows, by key
        assert isinstance(woken, int) and isinstance(clock, datetime)
        with pytest.raises(psycopg.Error):  # an id that is not text: the server refuses the statement
            run(store.executions.get_execution(123))  # type: ignore[arg-type]
        again = run(store.executions.get_execution("rows-3"))
        assert again is not None and again.id == "rows-3"
        assert conn.statements() is cursor
        assert cursor.pgresult is not None and cursor.pgresult.pgresult_ptr is None  # freed once read
