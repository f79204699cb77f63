"""SQL tests on the overridable database clock (Absurd's fake_now): clock_now() is now() unless
pgdurable.fake_now is set, and the timer, the claim's availability check, deadlines and schedules read it.
Time moves by a setting, not by sleeping."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from pgdurable import store


def _db_now(db: psycopg.Connection[Any]) -> datetime:
    row = db.execute("SELECT now()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


@pytest.fixture
def clock(db: psycopg.Connection[Any]) -> Iterator[Any]:
    def move_to(when: datetime | None) -> None:
        db.execute("SELECT set_config('pgdurable.fake_now', %s, false)", (when.isoformat() if when else "",))
    yield move_to
    move_to(None)


def test_clock_now_is_now_unless_faked(db: psycopg.Connection[Any], clock: Any) -> None:
    row = db.execute("SELECT clock_now() = now()").fetchone()
    assert row == (True,)
    later = _db_now(db) + timedelta(days=400)
    clock(later)
    assert db.execute("SELECT clock_now()").fetchone() == (later,)
    clock(None)
    assert db.execute("SELECT clock_now() = now()").fetchone() == (True,)


def test_delayed_enqueue_becomes_claimable_when_the_clock_passes_it(db: psycopg.Connection[Any],
                                                                     clock: Any) -> None:
    store.run(db, store.executions.enqueue(id="later", name="w", queue="q", priority=0, input="{}", max_recoveries=5,
                                           delay=3600.0))
    execution = store.run(db, store.executions.get_execution("later"))
    assert execution is not None and execution.status == "waiting" and execution.wait_reason == "delay"
    claim = store.claims.claim(queue="q", names=["w"], owner="me", lease=30, limit=10, version="v")
    assert store.run(db, store.claims.wake_due())[0] == 0
    assert store.run(db, claim) == []

    almost = execution.available_at - timedelta(seconds=1)  # type: ignore[operator]
    clock(almost)
    woken, next_due, now = store.run(db, store.claims.wake_due())
    assert (woken, next_due, now) == (0, execution.available_at, almost)

    after = execution.available_at + timedelta(seconds=1)  # type: ignore[operator]
    clock(after)
    assert store.run(db, store.claims.wake_due())[0] == 1
    [claimed] = store.run(db, claim)
    assert (claimed.id, claimed.attempt, claimed.db_now) == ("later", 1, after)


def test_a_deadline_expires_when_the_clock_passes_it(db: psycopg.Connection[Any], clock: Any) -> None:
    store.run(db, store.executions.enqueue(id="budget", name="w", queue="q", priority=0, input="{}", max_recoveries=5,
                                           delay=0.0, timeout=60.0))
    [claimed] = store.run(db, store.claims.claim(queue="q", names=["w"], owner="me", lease=30, limit=1, version="v"))
    execution = store.run(db, store.executions.get_execution("budget"))
    assert execution is not None and execution.deadline is not None
    assert execution.deadline - claimed.db_now == timedelta(seconds=60)  # type: ignore[operator]
    assert store.run(db, store.claims.expire_deadlines()) == []

    clock(execution.deadline + timedelta(milliseconds=1))
    assert store.run(db, store.claims.expire_deadlines()) == ["budget"]
    execution = store.run(db, store.executions.get_execution("budget"))
    assert execution is not None and execution.status == "failed"
    assert "pgdurable.WorkflowTimeout" in str(execution.error)  # (this connection loads jsonb as objects)


def test_a_deadline_counts_from_the_faked_claim_time(db: psycopg.Connection[Any], clock: Any) -> None:
    start = _db_now(db) + timedelta(days=30)
    clock(start)
    store.run(db, store.executions.enqueue(id="moved", name="w", queue="q", priority=0, input="{}", max_recoveries=5,
                                           delay=0.0, timeout=10.0))
    [claimed] = store.run(db, store.claims.claim(queue="q", names=["w"], owner="me", lease=30, limit=1, version="v"))
    assert claimed.db_now == start
    execution = store.run(db, store.executions.get_execution("moved"))
    assert execution is not None and execution.deadline == start + timedelta(seconds=10)


def test_the_policy_claim_is_on_the_clock(db: psycopg.Connection[Any], clock: Any) -> None:
    store.run(db, store.queues.set_queue_policy(store.queues.QueuePolicy("limited", concurrency=5)))
    store.run(db, store.executions.enqueue(id="tomorrow", name="w", queue="limited", priority=0, input="{}",
                                           max_recoveries=5, delay=86400.0, timeout=60.0))
    claim = store.claims.claim_with_policy(queue="limited", names=["w"], owner="me", lease=30, limit=5, version="v")
    execution = store.run(db, store.executions.get_execution("tomorrow"))
    assert execution is not None and execution.available_at is not None
    later = execution.available_at + timedelta(seconds=5)
    clock(later)
    assert store.run(db, store.claims.wake_due())[0] == 1
    [claimed] = store.run(db, claim)
    assert claimed.db_now == later  # the start of the execution's durable timers
    execution = store.run(db, store.executions.get_execution("tomorrow"))
    assert execution is not None and execution.deadline == later + timedelta(seconds=60)
    assert execution.started_at is not None and execution.started_at - later < timedelta(minutes=5)
    lease_left = execution.lease_expires - _db_now(db)  # type: ignore[operator]
    assert timedelta(0) < lease_left <= timedelta(seconds=30)  # the lease is on now(), not on the clock


def test_the_test_clock_is_read_only_where_the_harness_enabled_it(db: psycopg.Connection[Any], clock: Any,
                                                                 database_url: str) -> None:
    db.execute("UPDATE test_clock SET ahead = interval '2 days'")
    assert db.execute("SELECT clock_now() = now()").fetchone() == (True,)  # not enabled: ignored

    schema = db.execute("SELECT current_schema()").fetchone()[0]  # type: ignore[index]
    db.execute("ALTER FUNCTION clock_now() SET pgdurable.test_clock = 'on'")
    with psycopg.connect(database_url, autocommit=True) as other:  # another session sees it too
        other.execute(f'SET search_path TO "{schema}"')
        assert other.execute("SELECT clock_now() - now()").fetchone() == (timedelta(days=2),)
        assert other.execute(f'SELECT "{schema}".clock_now() - now()').fetchone() == (timedelta(days=2),)
    assert db.execute("SELECT clock_now() - now()").fetchone() == (timedelta(days=2),)
    fixed = _db_now(db) + timedelta(days=400)
    clock(fixed)  # a session's fake_now still wins
    assert db.execute("SELECT clock_now()").fetchone() == (fixed,)
