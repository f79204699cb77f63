"""pgdurable.testing: the harness (a private schema, an in-process worker, sync and async) and its
time-skipping clock. Durable time (sleeps, delayed starts, deadlines, cron ticks, the recorded times) follows
the skipped clock; leases do not. Assertions are on the recorded durable times, never on wall time."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

import pgdurable
from pgdurable.testing import harness
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
