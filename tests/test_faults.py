"""Regression tests for what the fault-injection suite (bench/chaos.py) found: lost connections, killed
backends and lost leases must cost a retry or a recovery, never a failed workflow, a dead claim loop or a
worker that cannot exit."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql

import pgdurable
from pgdurable import store
from tests.harness import WAIT, terminate, wait_for


def test_a_transactional_step_that_loses_its_connection_is_retried_not_failed(
        app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    tries: list[int] = []

    @app.transaction(max_attempts=1)  # a real failure would not be retried: the lost connection must be
    def cut(conn: psycopg.Connection[Any], n: int) -> int:
        tries.append(n)
        if len(tries) == 1:
            conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")  # the server ends this session
        return n * 2

    @app.workflow()
    def doubled(n: int) -> int:
        return int(cut(n))

    start_worker(app)
    assert app.enqueue(doubled, 21).result(timeout=WAIT) == 42
    assert len(tries) == 2


def test_result_waits_through_a_lost_connection(named_app: tuple[pgdurable.App, str], database_url: str,
                                                start_worker: Callable[..., Any]) -> None:
    app, name = named_app

    @app.workflow()
    def hello(who: str) -> str:
        return f"hello {who}"

    handle = app.enqueue(hello, "world")  # no worker yet: it waits in the queue
    assert terminate(database_url, name) >= 1  # the client's pooled connection is gone
    start_worker(app)
    assert handle.result(timeout=WAIT) == "hello world"


def test_a_worker_whose_connections_were_killed_still_stops(named_app: tuple[pgdurable.App, str],
                                                            database_url: str,
                                                            start_worker: Callable[..., Any]) -> None:
    app, name = named_app

    @app.workflow()
    def noop() -> None:
        return None

    runner = start_worker(app)
    wait_for(lambda: app.db.run(store.workers.list_workers()), WAIT, "the worker to register")
    assert terminate(database_url, name) >= 2
    runner.stop()  # fails if the thread is still alive after 30 s


def test_a_failure_to_load_checkpoints_does_not_stop_the_claim_loop(
        app: pgdurable.App, start_worker: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    @app.workflow()
    def echo(x: int) -> int:
        return x

    handle = app.enqueue(echo, 7)
    with app.db.pool.connection() as conn:  # as if an earlier attempt had died: the next claim is a resume
        conn.execute("UPDATE workflow_executions SET attempt = 1 WHERE id = %s", (handle.workflow_id,))
    real, failed = store.checkpoints.load_steps, threading.Event()

    def flaky(ids: list[str]) -> store.Call[Any]:
        call = real(ids)
        if failed.is_set():
            return call

        def lost(rows: Any) -> Any:
            failed.set()
            raise psycopg.OperationalError("connection lost (injected)")
        return dataclasses.replace(call, read=lost)

    monkeypatch.setattr(store.checkpoints, "load_steps", flaky)
    start_worker(app)
    assert handle.result(timeout=WAIT) == 7
    assert failed.is_set()


def test_a_lost_attempt_ending_late_leaves_the_new_attempt_of_the_same_worker_alone(
        app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    gates = [threading.Event(), threading.Event()]
    calls: list[int] = []

    @app.step()
    def wait_at_gate() -> int:
        calls.append(1)
        gates[min(len(calls), 2) - 1].wait(30)
        return len(calls)

    @app.workflow()
    def gated() -> int:
        return int(wait_at_gate())

    runner = start_worker(app)
    handle = app.enqueue(gated)
    wait_for(lambda: len(calls) == 1, WAIT, "the first attempt to reach its step")
    with app.db.pool.connection() as conn:  # what a sweeper does once the lease has expired
        conn.execute("UPDATE workflow_executions SET status = 'enqueued', owner_id = NULL, lease_expires = NULL "
                     "WHERE id = %s", (handle.workflow_id,))
    wait_for(lambda: len(calls) == 2, WAIT, "the same worker to claim it again")
    gates[0].set()  # the first attempt ends: its checkpoint is refused, it stops
    worker = runner.worker
    wait_for(lambda: worker.busy_threads == 1, WAIT, "the first attempt to stop")
    # The second attempt's lease must go on being renewed after the first attempt stopped: see it renewed
    # twice (a heartbeat, then another), so the first attempt's end did not stop its heartbeat.
    lease = handle.get().lease_expires
    assert lease is not None
    renewed = wait_for(lambda: (e := handle.get().lease_expires) is not None and e > lease and e, WAIT,
                       "the second attempt's lease to be renewed")
    wait_for(lambda: (e := handle.get().lease_expires) is not None and e > renewed, WAIT,
             "the second attempt's lease to be renewed again")
    assert handle.workflow_id in worker.running
    assert handle.get().attempt == 2 and handle.status() == "running"
    gates[1].set()
    assert handle.result(timeout=WAIT) == 2
    assert handle.get().attempt == 2


async def test_concurrent_first_use_makes_one_async_pool(app: pgdurable.App) -> None:
    pools = await asyncio.gather(*(app.db.app_async_pool() for _ in range(4)))
    assert all(pool is pools[0] for pool in pools)
    await app.db.aclose_loop_pool()


def _slow_first_suspend(conn: psycopg.Connection[Any], schema: str) -> None:
    """Make the first suspend (running -> waiting) of the schema sleep in the server, so that a test can
    cancel that very statement. A sequence counts suspends: it is not rolled back with the cancelled one."""
    s = psycopg.sql.Identifier(schema)
    conn.execute(psycopg.sql.SQL("CREATE SEQUENCE {}.suspends").format(s))
    conn.execute(psycopg.sql.SQL(
        "CREATE FUNCTION {s}.slow_first_suspend() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "  IF OLD.status = 'running' AND NEW.status = 'waiting' THEN "
        "    IF nextval({seq}::regclass) = 1 THEN PERFORM pg_sleep(30); END IF; "
        "  END IF; RETURN NEW; END $$").format(s=s, seq=psycopg.sql.Literal(f"{schema}.suspends")))
    conn.execute(psycopg.sql.SQL(
        "CREATE TRIGGER slow_first_suspend BEFORE UPDATE ON {s}.workflow_executions "
        "FOR EACH ROW EXECUTE FUNCTION {s}.slow_first_suspend()").format(s=s))


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_cancelled_statement_of_a_durable_sleep_costs_a_recovery_not_the_workflow(
        named_app: tuple[pgdurable.App, str], database_url: str, schema: str,
        start_worker: Callable[..., Any], asynchronous: bool) -> None:
    """What a statement_timeout or pg_cancel_backend (SQLSTATE 57014) does to a primitive's own statement:
    found by the chaos suite's cancelq scenario, where it failed a workflow between two of its effects."""
    app, name = named_app
    effects: list[str] = []

    @app.step()
    def before(n: int) -> int:
        effects.append("before")
        return n

    @app.step()
    async def abefore(n: int) -> int:
        effects.append("before")
        return n

    @app.workflow()
    def napper(n: int) -> int:
        before(n)
        pgdurable.sleep(0.1)
        return n + 1

    @app.workflow()
    async def anapper(n: int) -> int:
        await abefore(n)
        await pgdurable.sleep_async(0.1)
        return n + 1

    app.migrate()
    with psycopg.connect(database_url, autocommit=True) as conn:
        _slow_first_suspend(conn, schema)
    start_worker(app)
    handle = app.enqueue(anapper if asynchronous else napper, 41)

    def cancel_the_suspend() -> bool:
        with psycopg.connect(database_url, autocommit=True) as conn:
            row = conn.execute("SELECT count(pg_cancel_backend(pid)) FROM pg_stat_activity "
                               "WHERE application_name = %s AND wait_event = 'PgSleep'", (name,)).fetchone()
        return bool(row and row[0])

    wait_for(cancel_the_suspend, WAIT, "the suspend statement to be running, then cancelled")
    assert handle.result(timeout=WAIT) == 42  # resumed from its checkpoints once the attempt's lease ran out
    assert effects == ["before"]
    assert [s.step_name for s in app.steps(handle.workflow_id)] == ["before" if not asynchronous else "abefore",
                                                                    "pgdurable.sleep"]


def test_a_cancelled_checkpoint_of_a_transactional_step_is_not_the_steps_failure(
        named_app: tuple[pgdurable.App, str], database_url: str, schema: str,
        start_worker: Callable[..., Any]) -> None:
    """The engine's own checkpoint statement inside a transactional step cancelled (statement_timeout,
    pg_cancel_backend): the step's transaction rolls back and runs again, without using up the step's own
    retry policy (here: a single attempt). Found by the chaos suite's cancelq scenario."""
    app, name = named_app
    s = psycopg.sql.Identifier(schema)

    @app.transaction(max_attempts=1)
    def pay(conn: psycopg.Connection[Any], order: int) -> int:
        conn.execute(psycopg.sql.SQL("INSERT INTO {}.payments VALUES (%s)").format(s), (order,))
        return order

    @app.workflow()
    def checkout(order: int) -> int:
        return pay(order)

    app.migrate()
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("CREATE TABLE {}.payments (order_id integer NOT NULL)").format(s))
        conn.execute(psycopg.sql.SQL("CREATE SEQUENCE {}.checkpoints").format(s))
        conn.execute(psycopg.sql.SQL(  # the first checkpoint sleeps in the server, to be cancelled there
            "CREATE FUNCTION {s}.slow_first_checkpoint() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "  IF nextval({seq}::regclass) = 1 THEN PERFORM pg_sleep(30); END IF; RETURN NEW; END $$"
        ).format(s=s, seq=psycopg.sql.Literal(f"{schema}.checkpoints")))
        conn.execute(psycopg.sql.SQL("CREATE TRIGGER slow_first_checkpoint BEFORE INSERT ON {s}.operation_outputs "
                                     "FOR EACH ROW EXECUTE FUNCTION {s}.slow_first_checkpoint()").format(s=s))
    start_worker(app)
    handle = app.enqueue(checkout, 7)

    def cancel_the_checkpoint() -> bool:
        with psycopg.connect(database_url, autocommit=True) as conn:
            row = conn.execute("SELECT count(pg_cancel_backend(pid)) FROM pg_stat_activity "
                               "WHERE application_name = %s AND wait_event = 'PgSleep'", (name,)).fetchone()
        return bool(row and row[0])

    wait_for(cancel_the_checkpoint, WAIT, "the checkpoint to be running, then cancelled")
    assert handle.result(timeout=WAIT) == 7
    with psycopg.connect(database_url) as conn:
        paid = conn.execute(psycopg.sql.SQL("SELECT order_id FROM {}.payments").format(s)).fetchall()
    assert paid == [(7,)]  # the cancelled try rolled back with its checkpoint; the retry committed once
    [step] = app.steps(handle.workflow_id)
    assert step.step_name == "pay" and step.error is None


def test_a_timed_out_sync_workflow_stuck_in_a_step_gives_its_slot_back(
        app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    """Python cannot stop a thread: a sync step that hangs keeps running after its workflow timed out, but the
    worker no longer counts it against its concurrency. Found by the chaos suite's hang scenario."""
    release = threading.Event()

    @app.step()
    def hang() -> None:
        release.wait(60)

    @app.workflow(timeout_seconds=1.0)
    def stuck() -> None:
        hang()

    @app.workflow()
    def quick() -> str:
        return "ran"

    runner = start_worker(app, concurrency=1)
    try:
        with pytest.raises(pgdurable.WorkflowTimeout):
            app.enqueue(stuck).result(timeout=WAIT)
        assert app.enqueue(quick).result(timeout=WAIT) == "ran"  # the only slot was given back
        assert runner.worker.busy_threads == 1  # the hung step is still in its thread
    finally:
        release.set()


def test_a_worker_whose_start_up_statements_are_cancelled_starts_all_the_same(
        named_app: tuple[pgdurable.App, str], database_url: str, schema: str,
        start_worker: Callable[..., Any]) -> None:
    """A statement_timeout or pg_cancel_backend hitting a worker's start-up statements (registering itself,
    reading its queues' policies) is tried again, not the end of the worker process. Found by the chaos
    suite's cancelq scenario on a Citus cluster, where such a cancel made workers exit at start."""
    app, name = named_app

    @app.workflow()
    def hello() -> str:
        return "hello"

    app.migrate()
    cancelled: list[int] = []
    with psycopg.connect(database_url, autocommit=True) as locker, \
            psycopg.connect(database_url, autocommit=True) as canceller, locker.transaction():
        # The worker registers itself in `workers`: held here, its INSERT waits on the lock.
        locker.execute(sql.SQL("LOCK TABLE {}.workers IN ACCESS EXCLUSIVE MODE").format(sql.Identifier(schema)))
        runner = start_worker(app)

        def cancel_the_waiting_insert() -> bool:
            row = canceller.execute(
                "SELECT count(pg_cancel_backend(pid)) FROM pg_stat_activity WHERE application_name = %s "
                "AND wait_event_type = 'Lock' AND query LIKE 'INSERT INTO workers%%'", (name,)).fetchone()
            if row and row[0]:
                cancelled.append(int(row[0]))
            return len(cancelled) == 2

        wait_for(cancel_the_waiting_insert, WAIT, "the worker's registration to wait on the lock, twice")
    # the lock is released as the block ends: the third try registers the worker
    assert app.enqueue(hello).result(timeout=WAIT) == "hello"
    assert runner.thread.is_alive()
    with psycopg.connect(database_url, autocommit=True) as conn:
        query = sql.SQL("SELECT count(*) FROM {}.workers WHERE id = %s").format(sql.Identifier(schema))
        registered = conn.execute(query, (runner.worker.id,)).fetchone()
    assert registered == (1,)
