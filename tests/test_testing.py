"""pgdurable.testing: the harness (a private schema, an in-process worker, sync and async) and its
time-skipping clock. Durable time (sleeps, delayed starts, deadlines, cron ticks, the recorded times) follows
the skipped clock; leases do not. Assertions are on the recorded durable times, never on wall time."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

import pgdurable
from pgdurable import store
from pgdurable.db import configure
from pgdurable.testing import clock, harness
from tests.harness import WAIT, wait_for

DAY = 86400.0


@pytest.fixture
def app(database_url: str) -> Iterator[pgdurable.App]:
    # The harness moves the app to a private schema of the test database; this URL is never used.
    application = pgdurable.App("postgresql://nobody@127.0.0.1:1/none")
    yield application
    application.close()


def _execution(app: pgdurable.App, workflow_id: str) -> Any:
    found = app.get(workflow_id)
    assert found is not None
    return found


def _lease_ends(app: pgdurable.App) -> list[Any]:
    with psycopg.connect(app.db.conninfo, autocommit=True) as conn:
        return [row[0] for row in conn.execute(
            f'SELECT lease_expires - now() FROM "{app.schema}".workflow_executions WHERE status = %s',
            ("running",)).fetchall()]


def test_a_three_day_sleep_ends_on_the_skipped_clock(app: pgdurable.App, database_url: str) -> None:
    @app.workflow
    def remind(name: str) -> str:
        pgdurable.sleep(3 * DAY)
        return f"reminded {name}"

    own = app.schema
    with harness(app, database_url=database_url) as h:
        assert app.schema == h.schema  # the app works on the harness's private schema meanwhile
        before = h.now()
        handle = app.enqueue(remind, "ann")
        assert handle.result(timeout=WAIT) == "reminded ann"
        row = _execution(app, handle.workflow_id)
        [sleep] = [s for s in app.steps(handle.workflow_id) if s.step_name == "pgdurable.sleep"]
        woke_at = datetime.fromisoformat(str(sleep.output).strip('"'))
        assert woke_at - row.started_at >= timedelta(days=3)
        assert row.completed_at >= woke_at  # the recorded times follow the skipped clock
        assert h.now() - before >= timedelta(days=3)
        assert h.skips >= 1
    assert app.schema == own  # given back


def test_a_deadline_fires_on_the_skipped_clock(app: pgdurable.App, database_url: str) -> None:
    @app.workflow(timeout_seconds=3600)
    def slow() -> str:
        pgdurable.sleep(2 * 3600)
        return "too late"

    with harness(app, database_url=database_url) as h:
        handle = app.enqueue(slow)
        with pytest.raises(pgdurable.WorkflowTimeout):
            handle.result(timeout=WAIT)
        row = _execution(app, handle.workflow_id)
        assert row.deadline - row.started_at == timedelta(seconds=3600)
        assert row.completed_at > row.deadline
        assert row.completed_at - row.started_at < timedelta(seconds=2 * 3600)  # not the sleep's end
        assert h.now() >= row.deadline


def test_a_cron_schedule_ticks_on_the_skipped_clock(app: pgdurable.App, database_url: str) -> None:
    @app.scheduled("0 * * * *")
    @app.workflow
    def hourly(scheduled_at: datetime) -> str:
        return scheduled_at.isoformat()

    with harness(app, database_url=database_url) as h:
        start = h.now()

        def two_ticks() -> list[Any]:
            done = [row for row in app.list_workflows(name=hourly.name, limit=100) if row.status == "succeeded"]
            return done if len(done) >= 2 else []

        done = sorted(wait_for(two_ticks, WAIT, "two hourly ticks"), key=lambda row: row.id)
        ticks = [datetime.fromisoformat(str(row.output).strip('"')) for row in done]
        assert all(b - a == timedelta(hours=1) for a, b in itertools.pairwise(ticks))
        assert ticks[0] > start and ticks[0].minute == 0
        assert all(row.created_at >= tick for row, tick in zip(done, ticks, strict=True))  # fired at the tick


def test_a_delayed_start_and_a_policy_queue_follow_the_skipped_clock(app: pgdurable.App,
                                                                     database_url: str) -> None:
    app.queue("limited", concurrency=2)

    @app.workflow(queue="limited")
    def nap(days: float) -> float:
        pgdurable.sleep(days * DAY)
        return days

    with harness(app, database_url=database_url) as h:
        start = h.now()
        delayed = app.enqueue(nap, 1.0, delay=DAY)  # starts tomorrow, then sleeps a day: claimed by policy
        assert delayed.result(timeout=WAIT) == 1.0
        row = _execution(app, delayed.workflow_id)
        assert row.started_at - start >= timedelta(days=1)
        assert row.completed_at - row.started_at >= timedelta(days=1)


def test_a_debounced_burst_starts_on_the_skipped_clock(app: pgdurable.App, database_url: str) -> None:
    @app.workflow
    def digest(count: int) -> int:
        return count

    with harness(app, database_url=database_url) as h:
        h.pause_skipping()  # the burst first: all three enqueues before the clock may move
        handles = [app.enqueue(digest, n, debounce_key="inbox", debounce_seconds=3600) for n in (1, 2, 3)]
        assert len({handle.workflow_id for handle in handles}) == 1  # one execution, the last arguments
        start = h.now()
        h.resume_skipping()
        assert handles[-1].result(timeout=WAIT) == 3
        assert _execution(app, handles[-1].workflow_id).started_at - start >= timedelta(seconds=3599)


def test_without_time_skipping_time_moves_only_when_told(app: pgdurable.App, database_url: str) -> None:
    @app.workflow
    def wait_an_hour() -> str:
        pgdurable.sleep(3600)
        return "done"

    with harness(app, database_url=database_url, time_skipping=False) as h:
        handle = app.enqueue(wait_an_hour)
        wait_for(lambda: _execution(app, handle.workflow_id).wait_reason == "sleep", WAIT, "the sleep")
        assert handle.status() == "waiting"
        before = h.now()
        after = h.skip(3600)
        assert after - before >= timedelta(seconds=3600)
        assert handle.result(timeout=WAIT) == "done"
        assert h.skips == 0


def test_skipping_leaves_leases_on_real_time(app: pgdurable.App, database_url: str) -> None:
    @app.workflow
    def busy() -> str:
        wait_for(lambda: bool(released), WAIT, "the test to release the workflow")
        return "done"

    released: list[bool] = []
    with harness(app, database_url=database_url) as h:
        handle = app.enqueue(busy)
        wait_for(lambda: handle.status() == "running", WAIT, "the workflow to run")
        h.skip(30 * DAY)  # a jump while an execution runs: its lease is not expired by it
        [remaining] = _lease_ends(app)
        assert timedelta(0) < remaining <= timedelta(seconds=app.settings.lease_seconds)
        released.append(True)
        assert handle.result(timeout=WAIT) == "done"
        assert _execution(app, handle.workflow_id).attempt == 1


def test_a_failing_step_is_retried_in_the_harness(app: pgdurable.App, database_url: str) -> None:
    # Retry backoffs are in-memory waits of the running attempt (not durable timers): they take their real,
    # short time, and the clock does not jump meanwhile (an execution is running).
    calls: list[int] = []

    @app.step(max_attempts=3, interval=0.01)
    def flaky() -> int:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("try again")
        return len(calls)

    @app.workflow
    def uses_flaky() -> int:
        return flaky()

    with harness(app, database_url=database_url) as h:
        assert h.run(uses_flaky) == 3
        [step] = app.steps(app.list_workflows(name=uses_flaky.name)[0].id)
        assert step.attempts == 3


async def test_the_harness_is_an_async_context_manager(app: pgdurable.App, database_url: str) -> None:
    @app.workflow
    async def later(n: int) -> int:
        await pgdurable.sleep_async(7 * DAY)
        return n + 1

    own = app.schema
    async with harness(app, database_url=database_url) as h:
        before = h.now()
        assert await h.run_async(later, 41) == 42
        assert h.now() - before >= timedelta(days=7)
    assert app.schema == own


def test_the_schema_is_dropped_at_exit(app: pgdurable.App, database_url: str) -> None:
    with harness(app, database_url=database_url) as h:
        schema = h.schema
    with psycopg.connect(database_url, autocommit=True) as conn:
        assert conn.execute("SELECT to_regnamespace(%s)", (schema,)).fetchone() == (None,)


def test_a_receive_times_out_on_the_skipped_clock_unless_sent_to_first(app: pgdurable.App,
                                                                       database_url: str) -> None:
    @app.workflow
    def inbox() -> Any:
        return pgdurable.recv("orders", timeout=3600)

    with harness(app, database_url=database_url) as h:
        start = h.now()
        assert h.run(inbox) is None  # nobody sent anything: an hour passed, in no time
        assert h.now() - start >= timedelta(hours=1)

        h.pause_skipping()  # to act while it waits: the clock stays
        handle = app.enqueue(inbox)
        wait_for(lambda: _execution(app, handle.workflow_id).wait_reason == "recv:orders", WAIT, "the receive")
        app.send(handle.workflow_id, {"order": 7}, topic="orders")
        h.resume_skipping()
        assert handle.result(timeout=WAIT) == {"order": 7}


@pytest.fixture
def engine_db(make_app: Callable[..., pgdurable.App], database_url: str, schema: str
              ) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection on a migrated test schema configured as pgdurable's own connections are."""
    make_app().migrate()
    with psycopg.connect(database_url, autocommit=True) as conn:
        configure(conn, schema)
        yield conn


def test_the_clock_jumps_only_when_nothing_can_happen_before_the_next_timer(
        engine_db: psycopg.Connection[Any]) -> None:
    db = engine_db
    clock.enable(db)

    def enqueue(ident: str, delay: float = 0.0, timeout: float | None = None) -> None:
        store.run(db, store.executions.enqueue(id=ident, name="w", queue="q", priority=0, input="{}", max_recoveries=5,
                                               delay=delay, timeout=timeout))

    def claim() -> list[Any]:
        return store.run(db, store.claims.claim(queue="q", names=["w"], owner="me", lease=30, limit=10, version="v"))

    assert clock.skip_if_idle(db) is None  # no timer at all
    enqueue("later", delay=DAY)
    enqueue("now", timeout=3600.0)
    store.run(db, store.workers.register_worker(id="me", hostname="h", pid=1, queues=["q"], workflows=["w"],
                                                concurrency=1, version="v"))
    assert clock.skip_if_idle(db) is None  # "now" is due, and a live worker can run it
    [running] = claim()
    assert clock.skip_if_idle(db) is None  # it runs
    store.run(db, store.claims.suspend(id=running.id, attempt=running.attempt, wake_at=None, reason="recv:x",
                                       wakeups=None))
    # "now" waits for a message, with its deadline in an hour; "later" starts in a day: the deadline is next
    deadline = _execution_row(db, "now").deadline
    moved = clock.skip_if_idle(db)
    assert moved is not None and moved - (deadline + timedelta(microseconds=1)) < timedelta(milliseconds=1)
    assert _execution_row(db, "now").status == "failed"  # expired by the skip's own deadline check
    assert clock.skip_if_idle(db) == _execution_row(db, "later").available_at
    assert _execution_row(db, "later").status == "enqueued"  # woken by the skip
    [later] = claim()
    assert clock.skip_if_idle(db) is None  # "later" runs
    wake_at = clock.now(db) + timedelta(days=2)
    store.run(db, store.claims.suspend(id=later.id, attempt=later.attempt, wake_at=wake_at, reason="sleep",
                                       wakeups=None))
    # Due, but no live worker knows its workflow: it does not hold time back (nothing would ever run it).
    store.run(db, store.executions.enqueue(id="unknown", name="nobody", queue="q", priority=0, input="{}",
                                           max_recoveries=5, delay=0.0, timeout=None))
    assert clock.skip_if_idle(db) == wake_at


def _execution_row(db: psycopg.Connection[Any], ident: str) -> Any:
    found = store.run(db, store.executions.get_execution(ident))
    assert found is not None
    return found
