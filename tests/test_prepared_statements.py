"""Named queries run through libpq (store/prepared.py) by pgdurable's own connections: the same rows and the
same errors as through a cursor, prepared once per connection and again after a DEALLOCATE, never inside a
transaction; a wait Ctrl-C interrupts, as psycopg's can."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any, TypeVar

import psycopg
import pytest
from psycopg import sql

import pgdurable
from pgdurable import monitoring, schedules, store
from pgdurable.sqlfiles import queries
from pgdurable.store.prepared import converted

T = TypeVar("T")
_T = datetime(2026, 1, 1, tzinfo=UTC)


def off_main(fn: Callable[[], T]) -> T:
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(fn).result(timeout=60)


@pytest.fixture
def own(database_url: str, schema: str, app: pgdurable.App) -> Iterator[store.calls.OwnConnection]:
    app.migrate()
    with store.calls.OwnConnection.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        yield conn


def in_transaction(conn: psycopg.Connection[Any], call: store.Call[T]) -> T:
    """The call through a cursor: inside a transaction, pgdurable's connections keep psycopg's."""
    with conn.transaction():
        return store.run(conn, call)


def _prepared_names(conn: psycopg.Connection[Any]) -> list[str]:
    return [row[0] for row in conn.execute("SELECT name FROM pg_prepared_statements WHERE name LIKE 'pgdurable_%' "
                                           "ORDER BY prepare_time, name")]


def test_reads_give_the_same_rows_through_libpq_as_through_a_cursor(
        app: pgdurable.App, own: store.calls.OwnConnection, start_worker: Callable[..., Any]) -> None:
    @app.step()
    def add(a: int, b: int) -> int:
        return a + b

    @app.workflow(name="sums")
    def sums(n: int) -> dict[str, Any]:
        return {"total": add(n, 1), "text": "é\u202e", "none": None}

    start_worker(app)
    handles = [app.enqueue(sums, i, tags={"k": str(i)}, timeout_seconds=60.0) for i in range(3)]
    assert [h.result(timeout=30)["total"] for h in handles] == [1, 2, 3]
    app.enqueue(sums, 9, delay=3600.0, dedup_key="later")
    some = handles[0].workflow_id
    calls: list[store.Call[Any]] = [
        store.executions.get_execution(some), store.executions.get_execution("nobody"),
        store.executions.list_executions(status=None, name=None, queue=None, limit=10),
        store.checkpoints.list_steps(some), store.queues.queue_depths(), store.queues.queue_policies(None),
        monitoring.list_page(monitoring.ListFilter()), monitoring.list_page(monitoring.ListFilter(),
                                                                            older_than=(_T, "x")),
        monitoring.execution(some), monitoring.steps(some), monitoring.queues(), monitoring.outcomes(),
        monitoring.workers(), schedules.list_schedules(), store.executions.names_of([some, "nobody"]),
        store.Call("database_now", {}, lambda rows: type(rows[0][0])),
    ]
    for call in calls:
        by_cursor = in_transaction(own, call)
        by_libpq = store.run(own, call)
        if call.name in ("queues", "workers"):  # ages and heartbeats move between the two reads
            assert type(by_cursor) is type(by_libpq) and len(by_cursor) == len(by_libpq), call.name
            continue
        assert by_libpq == by_cursor, call.name
    assert {name.split("_", 2)[2] for name in _prepared_names(own)} == {call.name for call in calls}


def test_writes_and_their_refusals_through_libpq(own: store.calls.OwnConnection) -> None:
    """A step checkpoint written from a thread (as a workflow thread leads its batch): the rows it returns,
    a large output, and the server's refusal of a value raised as the same psycopg error a cursor raises."""
    off_main(lambda: store.run(own, store.executions.enqueue(id="w1", name="w", queue="q", priority=0,
                                                             input="{}", max_recoveries=1, delay=0.0)))
    own.execute("UPDATE workflow_executions SET status = 'running', owner_id = 'me', attempt = 1, "
                "lease_expires = now() + interval '1 hour' WHERE id = 'w1'")
    big = json.dumps({"blob": "x" * 6_000_000})

    def step(step_id: int, output: str | None) -> Any:
        return store.checkpoints.write_step("w1", 1, step_id, "s", 1, _T, output, None)

    assert off_main(lambda: store.run(own, step(0, big))) == {("w1", 1, 0)}
    assert off_main(lambda: store.run(own, step(0, '"again"'))) == set()  # recorded once
    assert off_main(lambda: store.run(own, step(1, None))) == {("w1", 1, 1)}
    assert own.execute("SELECT length(output::text) FROM operation_outputs WHERE step_id = 0").fetchone() == (
        len(big),)
    errors = []
    for run in (lambda c: in_transaction(own, c), lambda c: off_main(lambda: store.run(own, c))):
        with pytest.raises(psycopg.Error) as raised:
            run(step(2, "not json"))
        errors.append((type(raised.value), raised.value.sqlstate))
        with pytest.raises(psycopg.errors.CheckViolation) as refused:
            run(store.executions.enqueue(id="w2", name="w", queue="no spaces", priority=0, input="{}",
                                         max_recoveries=1, delay=0.0))
        assert refused.value.diag.constraint_name == "workflow_executions_queue_check"
    assert errors[0] == errors[1] == (psycopg.errors.InvalidTextRepresentation, "22P02")
    # The connection goes on after the errors.
    assert off_main(lambda: store.run(own, step(2, "2"))) == {("w1", 1, 2)}


@pytest.mark.parametrize("how", ["terminated", "cut"])
def test_a_lost_connection_raises_an_operational_error(database_url: str, schema: str, app: pgdurable.App,
                                                       how: str) -> None:
    """As a cursor's: the writer and the pools take it for a connection to replace. Terminated by the server
    (an error with a SQLSTATE), or cut (none: libpq only sees the socket closed)."""
    app.migrate()
    call = store.executions.get_execution("nobody")
    with store.calls.OwnConnection.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        assert off_main(lambda: store.run(conn, call)) is None
        if how == "terminated":
            with psycopg.connect(database_url, autocommit=True) as other:
                other.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
        else:
            socket.socket(fileno=os.dup(conn.pgconn.socket)).shutdown(socket.SHUT_RDWR)
        with pytest.raises(psycopg.OperationalError):
            off_main(lambda: store.run(conn, call))
        assert conn.broken


def test_a_deallocated_statement_is_prepared_again(own: store.calls.OwnConnection) -> None:
    call = store.executions.get_execution("nobody")
    assert off_main(lambda: store.run(own, call)) is None
    first = _prepared_names(own)
    own.execute("DEALLOCATE ALL")
    assert off_main(lambda: store.run(own, call)) is None
    again = _prepared_names(own)
    assert len(first) == len(again) == 1 and first != again  # a new name: names are never reused


def test_a_statement_whose_result_a_migration_changed_is_prepared_again(own: store.calls.OwnConnection) -> None:
    """A migration that changes the type of a column a prepared statement returns makes the server refuse the
    statement at every execution ("cached plan must not change result type"), before running it: pgdurable's
    own connections prepare it again instead of failing until restarted."""
    call = store.executions.get_execution("nobody")
    assert off_main(lambda: store.run(own, call)) is None
    own.execute("ALTER TABLE workflow_executions ALTER COLUMN forked_from TYPE varchar(200)")
    assert off_main(lambda: store.run(own, call)) is None
    assert len(_prepared_names(own)) == 1


def test_rows_are_made_by_name_again_after_a_statement_is_prepared_again(own: store.calls.OwnConnection) -> None:
    """A connection keeps the row maker of each prepared statement and row factory (it reads the column names
    once): rows stay right from call to call, after the statement is prepared again because a migration changed
    its result, for a row factory made anew at each call, and for one factory used by two statements."""
    own.execute("SELECT enqueue_workflow('job', '{\"i\": 1}', 'q', workflow_id => 'made-by-name')")
    calls = [store.executions.get_execution("made-by-name") for _ in range(3)]
    first = [off_main(lambda c=c: store.run(own, c)) for c in calls[:2]]
    assert [(e.id, e.name, e.queue, e.status) for e in first if e is not None] == \
        [("made-by-name", "job", "q", "enqueued")] * 2
    own.execute("ALTER TABLE workflow_executions ALTER COLUMN forked_from TYPE varchar(200)")
    again = off_main(lambda: store.run(own, calls[2]))
    assert again is not None and (again.id, again.name, again.queue) == ("made-by-name", "job", "q")
    assert len(_prepared_names(own)) == 1
    fresh = store.Call("get_execution", {"id": "made-by-name"}, store.calls.first,
                       row_factory=psycopg.rows.class_row(store.executions.Execution))
    assert [off_main(lambda: store.run(own, fresh)).status for _ in range(2)] == ["enqueued", "enqueued"]
    # One row factory on two statements: each statement's own columns.
    status, execution = (off_main(lambda n=n: store.run(own, store.Call(n, {"id": "made-by-name"}, store.calls.first,
                                                                            row_factory=psycopg.rows.dict_row)))
                         for n in ("get_status", "get_execution"))
    assert status == {"status": "enqueued", "output": None, "error": None}
    assert execution is not None and (execution["id"], execution["queue"]) == ("made-by-name", "q")


def test_transactions_keep_the_cursor(own: store.calls.OwnConnection) -> None:
    call = store.executions.get_execution("nobody")
    in_transaction(own, call)
    off_main(lambda: in_transaction(own, call))
    assert _prepared_names(own) == []
    store.run(own, call)  # on the main thread as on any other
    assert len(_prepared_names(own)) == 1


class Interrupted(Exception):
    """What the test's signal handler raises, as Python's raises KeyboardInterrupt on Ctrl-C."""


@pytest.fixture
def interrupt_soon() -> Iterator[Callable[[float], None]]:
    """interrupt(seconds): the main thread gets a signal whose handler raises Interrupted, as Ctrl-C would."""
    assert threading.current_thread() is threading.main_thread()  # pytest and xdist run tests there

    def raise_interrupted(*_: Any) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGUSR1, raise_interrupted)
    timers: list[threading.Timer] = []

    def interrupt(seconds: float) -> None:
        timer = threading.Timer(seconds, signal.pthread_kill, (threading.main_thread().ident, signal.SIGUSR1))
        timers.append(timer)
        timer.start()

    try:
        yield interrupt
    finally:
        for timer in timers:
            timer.cancel()
            timer.join()
        signal.signal(signal.SIGUSR1, previous)


def _lock_waits(conn: psycopg.Connection[Any], pid: int) -> bool:
    row = conn.execute("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
    return bool(row and row[0])


@pytest.mark.parametrize("prepared_before", [False, True], ids=["preparing", "prepared"])
def test_an_interrupted_wait_cancels_the_statement(database_url: str, schema: str, own: store.calls.OwnConnection,
                                                   interrupt_soon: Callable[[float], None],
                                                   prepared_before: bool) -> None:
    """A statement that waits on a lock, on the main thread, ends when the thread is interrupted: the
    exception goes on up, the server cancelled the statement (the lock is no longer waited for), and the
    connection serves the next statement. Whether the wait is the statement's preparation or, prepared
    before, its execution."""
    own.execute("INSERT INTO workflow_executions (id, name, input) VALUES ('held', 'w', '{}')")
    call = store.executions.cancel("held")
    if prepared_before:
        assert store.run(own, store.executions.cancel("nobody")) is False
    with psycopg.connect(database_url) as holder:
        holder.execute(sql.SQL("LOCK TABLE {}.workflow_executions IN ACCESS EXCLUSIVE MODE").format(
            sql.Identifier(schema)))
        with psycopg.connect(database_url, autocommit=True) as watcher:
            interrupt_soon(0.5)
            started = time.monotonic()
            with pytest.raises(Interrupted):
                store.run(own, call)
            assert time.monotonic() - started < 60  # interrupted, not ended by the lock's release
            assert not _lock_waits(watcher, own.info.backend_pid)
        holder.rollback()
    assert not own.closed and own.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert store.run(own, call) is True  # the statement never ran; now it does


def test_every_named_query_of_a_single_node_schema_prepares_untyped(own: store.calls.OwnConnection) -> None:
    """The server types every parameter from its cast or its place (none is left to psycopg's types), so no
    named query falls back to a cursor. The exceptions: the Citus layout's queries (their functions and
    columns exist on a Citus schema only) and those run on the application's connection ({schema})."""
    refused = []
    for i, name in enumerate(sorted(queries())):
        result = own.pgconn.prepare(f"untyped_{i}".encode(), converted(name, False).text)
        if result.status == psycopg.pq.ExecStatus.FATAL_ERROR:
            refused.append(name)
    assert refused == ["citus_buckets_of", "citus_cleanup_bucket", "citus_expire_bucket",
                       "citus_fail_unrunnable_bucket", "citus_sweep_bucket", "citus_wake_bucket", "claimable_buckets",
                       "enqueue_in_transaction", "send_message_in_transaction"]


def test_placeholders_become_numbered_parameters() -> None:
    form = converted("write_step", False)
    assert form.names == ("step_id", "step_name", "error", "output", "tries", "started_at", "execution_id", "attempt")
    assert b"%(" not in form.text and b"$8::int" in form.text and form.text.count(b"$3::jsonb") == 2
    fail_lost = converted("sweep_expired", False)
    assert b"%%" not in fail_lost.text and b"lost %s times" in fail_lost.text


async def test_the_event_loop_gets_the_same_rows_and_errors(database_url: str, schema: str,
                                                            own: store.calls.OwnConnection) -> None:
    """The worker's connections (async) run the same exchange on the event loop: the same rows as a cursor's,
    the same refusal, a large output, a statement deallocated behind its back prepared again."""
    off_main(lambda: store.run(own, store.executions.enqueue(id="a1", name="w", queue="q", priority=3,
                                                             input="{}", max_recoveries=1, delay=0.0)))
    own.execute("UPDATE workflow_executions SET status = 'running', owner_id = 'me', attempt = 1, "
                "lease_expires = now() + interval '1 hour' WHERE id = 'a1'")
    big = json.dumps({"blob": "y" * 6_000_000})
    calls: list[store.Call[Any]] = [store.executions.get_execution("a1"), store.executions.get_execution("none"),
                                    store.checkpoints.write_step("a1", 1, 0, "s", 1, _T, big, None),
                                    store.checkpoints.list_steps("a1"), store.queues.queue_depths()]
    async with await store.calls.AsyncOwnConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        found = [await store.arun(conn, call) for call in calls]
        assert found == [in_transaction(own, call) if call.name != "write_step" else {("a1", 1, 0)}
                         for call in calls]
        with pytest.raises(psycopg.errors.CheckViolation) as refused:
            await store.arun(conn, store.executions.enqueue(id="a2", name="w", queue="no spaces", priority=0,
                                                            input="{}", max_recoveries=1, delay=0.0))
        assert refused.value.diag.constraint_name == "workflow_executions_queue_check"
        await conn.execute("DEALLOCATE ALL")
        assert await store.arun(conn, store.executions.get_execution("none")) is None
        prepared = await (await conn.execute("SELECT count(*) FROM pg_prepared_statements")).fetchone()
        assert prepared == (1,)


async def test_a_cancelled_task_cancels_its_statement(database_url: str, schema: str,
                                                      own: store.calls.OwnConnection) -> None:
    """A statement waiting on a lock, in a task that is cancelled (a worker stopping, a timeout): the server
    cancels it, and the connection serves the next statement."""
    own.execute("INSERT INTO workflow_executions (id, name, input) VALUES ('held', 'w', '{}')")
    call = store.executions.cancel("held")
    async with await store.calls.AsyncOwnConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        with psycopg.connect(database_url) as holder:
            holder.execute(sql.SQL("LOCK TABLE {}.workflow_executions IN ACCESS EXCLUSIVE MODE").format(
                sql.Identifier(schema)))
            task = asyncio.create_task(store.arun(conn, call))
            with psycopg.connect(database_url, autocommit=True) as watcher:
                deadline = time.monotonic() + 60
                while not _lock_waits(watcher, conn.info.backend_pid):
                    assert time.monotonic() < deadline, "the statement never waited on the lock"
                    await asyncio.sleep(0.01)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                assert not _lock_waits(watcher, conn.info.backend_pid)
            holder.rollback()
        assert not conn.closed and conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert await store.arun(conn, call) is True


async def test_a_lost_connection_raises_an_operational_error_on_the_event_loop(database_url: str, schema: str,
                                                                               own: store.calls.OwnConnection,
                                                                               ) -> None:
    call = store.executions.get_execution("nobody")
    async with await store.calls.AsyncOwnConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        assert await store.arun(conn, call) is None
        own.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
        with pytest.raises(psycopg.OperationalError):
            await store.arun(conn, call)
        assert conn.broken


def _fail_at_commit(own: store.calls.OwnConnection, workflow_id: str) -> None:
    """A deferred constraint trigger that refuses, at commit, the execution of this id: the statement has sent
    its rows by then, and the error comes after them."""
    own.execute("""
        CREATE FUNCTION refuse_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'refused at commit: %', NEW.id USING ERRCODE = 'check_violation';
        END $$""")
    own.execute(sql.SQL("""
        CREATE CONSTRAINT TRIGGER refuse_at_commit AFTER INSERT ON workflow_executions
        DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.id = {})
        EXECUTE FUNCTION refuse_at_commit()""").format(sql.Literal(workflow_id)))


def test_a_commit_that_fails_after_the_rows_raises(app: pgdurable.App, own: store.calls.OwnConnection) -> None:
    """Outside a transaction a statement commits after sending its rows; a failed commit rolls them back, and
    the caller must hear the error, not the rows (libpq hands both over, rows first)."""
    @app.workflow()
    def job() -> None:
        return None

    _fail_at_commit(own, "doomed-at-commit")
    app.enqueue(job, workflow_id="fine")  # the connection has its statement prepared: the libpq path
    with pytest.raises(psycopg.errors.CheckViolation, match="refused at commit"):
        app.enqueue(job, workflow_id="doomed-at-commit")
    rows = own.execute("SELECT id FROM workflow_executions ORDER BY id").fetchall()
    assert rows == [("fine",)]
    # The same on the event loop (the worker's claims, checkpoints and completions).
    with pytest.raises(psycopg.errors.CheckViolation, match="refused at commit"):
        asyncio.run(app.enqueue_async(job, workflow_id="doomed-at-commit"))
    assert own.execute("SELECT count(*) FROM workflow_executions WHERE id = 'doomed-at-commit'").fetchone() == (0,)
