"""Debounced enqueues: within a burst (same workflow and key, before the execution starts) each enqueue
replaces the arguments and pushes the start back, never past the burst's first enqueue plus its maximum
wait (on the database clock, moved by pgdurable.fake_now, not by sleeping); one execution per burst, even
with a thousand racing enqueuers or a claim landing in the middle of an enqueue."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

import pgdurable
from pgdurable import store
from tests.harness import WAIT, execution, wait_for


@pytest.fixture
def clock(db: psycopg.Connection[Any]) -> Iterator[Callable[[datetime | None], None]]:
    def move_to(when: datetime | None) -> None:
        db.execute("SELECT set_config('pgdurable.fake_now', %s, false)", (when.isoformat() if when else "",))
    yield move_to
    move_to(None)


def _debounced(db: psycopg.Connection[Any], n: int, seconds: float = 5, longest: float | None = 60) -> str:
    row = db.execute("SELECT enqueue_workflow('w', jsonb_build_object('n', %s::int), debounce_key => 'k', "
                     "debounce_seconds => %s, debounce_max_seconds => %s)", (n, seconds, longest)).fetchone()
    assert row is not None
    return str(row[0])


def _row(db: psycopg.Connection[Any], workflow_id: str) -> dict[str, Any]:
    cur = db.execute("SELECT status, available_at, debounce_deadline, input::text FROM workflow_executions "
                     "WHERE id = %s", (workflow_id,))
    row = cur.fetchone()
    assert row is not None and cur.description is not None
    return {c.name: v for c, v in zip(cur.description, row, strict=True)}


def test_a_burst_pushes_the_start_back_but_never_past_the_max_wait(db: psycopg.Connection[Any],
                                                                    clock: Any) -> None:
    t0 = datetime.fromisoformat("2031-01-01T00:00:00+00:00")
    clock(t0)
    first = _debounced(db, 0)
    row = _row(db, first)
    assert (row["status"], row["available_at"], row["debounce_deadline"]) == (
        "waiting", t0 + timedelta(seconds=5), t0 + timedelta(seconds=60))
    for n, at in enumerate((4, 8, 30, 54, 57), start=1):  # every enqueue within 5 s of the previous one
        clock(t0 + timedelta(seconds=at))
        assert _debounced(db, n) == first
        row = _row(db, first)
        assert row["available_at"] == min(t0 + timedelta(seconds=at + 5), t0 + timedelta(seconds=60))
        assert json.loads(row["input"]) == {"n": n} and row["status"] == "waiting"
    # the timer wakes it at the max wait, however the burst goes on
    clock(t0 + timedelta(seconds=60))
    assert store.run(db, store.claims.wake_due())[0] == 1
    # enqueued, not yet claimed: still the burst's; past its deadline, the start stays at the deadline
    clock(t0 + timedelta(seconds=61))
    assert _debounced(db, 99) == first
    row = _row(db, first)
    assert (row["status"], row["available_at"], json.loads(row["input"])) == (
        "enqueued", t0 + timedelta(seconds=60), {"n": 99})
    [claimed] = store.run(db, store.claims.claim(queue="default", names=["w"], owner="me", lease=30, limit=10,
                                                 version="v"))
    assert claimed.id == first and claimed.input == {"n": 99}  # this connection decodes jsonb
    # started: the next enqueue begins a new burst, with its own deadline
    second = _debounced(db, 100)
    assert second != first
    assert _row(db, second)["debounce_deadline"] == t0 + timedelta(seconds=61 + 60)
    # without a max wait, the start only follows the latest enqueue
    third = db.execute("SELECT enqueue_workflow('other', '{}', debounce_key => 'k', debounce_seconds => 2)").fetchone()
    assert third is not None and _row(db, str(third[0]))["available_at"] == t0 + timedelta(seconds=63)


def test_sql_api_refuses_bad_debounce_options(db: psycopg.Connection[Any]) -> None:
    for call in ("debounce_key => 'k'",  # no seconds
                 "debounce_key => 'k', debounce_seconds => -1",
                 "debounce_key => 'k', debounce_seconds => 'NaN'",
                 "debounce_key => 'k', debounce_seconds => 1, debounce_max_seconds => 'Infinity'",
                 "debounce_key => 'k', debounce_seconds => 1, workflow_id => 'x'",
                 "debounce_key => 'k', debounce_seconds => 1, dedup_key => 'x'",
                 "debounce_key => '', debounce_seconds => 1",
                 "debounce_seconds => 1"):
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="enqueue_workflow: "):
            db.execute("SELECT enqueue_workflow('w', '{}', " + call + ")")
    assert db.execute("SELECT count(*) FROM workflow_executions").fetchone() == (0,)


def test_an_enqueue_racing_a_claim_starts_the_next_burst(database_url: str, db: psycopg.Connection[Any]) -> None:
    pending = _debounced(db, 1, seconds=0)  # due at once
    schema = db.execute("SELECT current_schema()").fetchone()[0]  # type: ignore[index]
    with psycopg.connect(database_url) as claimer:
        claimer.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        [claimed] = store.run(claimer, store.claims.claim(queue="default", names=["w"], owner="me", lease=30, limit=1,
                                                          version="v"))  # claimed, not committed: the row is locked
        assert claimed.id == pending
        result: list[str] = []
        racer = threading.Thread(target=lambda: result.append(_racing_enqueue(database_url, schema)))
        racer.start()
        wait_for(lambda: db.execute("SELECT count(*) FROM pg_locks WHERE NOT granted").fetchone() != (0,),
                 WAIT, "the enqueue to wait for the claim's lock")
        claimer.commit()
        racer.join(WAIT)
    assert result and result[0] != pending  # the claim won: the enqueue made the next burst's execution
    assert json.loads(_row(db, pending)["input"]) == {"n": 1}
    assert _row(db, result[0])["status"] == "waiting"


def _racing_enqueue(database_url: str, schema: str) -> str:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        return _debounced(conn, 2)


def test_a_burst_of_1000_racing_enqueues_runs_once_with_the_last_arguments(
        app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    runs: list[int] = []

    @app.workflow()
    def summarize(n: int) -> int:
        runs.append(n)
        return n

    start_worker(app)
    with ThreadPoolExecutor(16) as pool:
        handles = list(pool.map(lambda n: app.enqueue(summarize, n, debounce_key="doc-1", debounce_seconds=60),
                                range(1000)))
    assert len({h.workflow_id for h in handles}) == 1
    final = app.enqueue(summarize, -1, debounce_key="doc-1", debounce_seconds=0.2, tags={"doc": "1"})
    assert final.workflow_id == handles[0].workflow_id
    assert final.result(timeout=WAIT) == -1
    assert runs == [-1]
    assert [e.id for e in app.list_workflows(name=summarize.name)] == [final.workflow_id]
    row = execution(app, final.workflow_id)
    assert row.debounce_key == "doc-1" and row.tags == {"doc": "1"} and row.attempt == 1
    # the next enqueue after the start is a new burst
    after = app.enqueue(summarize, 5, debounce_key="doc-1", debounce_seconds=0)
    assert after.workflow_id != final.workflow_id and after.result(timeout=WAIT) == 5


def test_async_debounce_and_bad_options(app: pgdurable.App) -> None:
    @app.workflow()
    def job(n: int) -> int:
        return n

    async def burst() -> set[str]:
        handles = [await app.enqueue_async(job, n, debounce_key="a", debounce_seconds=30) for n in range(5)]
        return {h.workflow_id for h in handles}

    assert len(asyncio.run(burst())) == 1
    for options, match in (({"debounce_key": "a"}, "needs debounce_seconds"),
                           ({"debounce_seconds": 1}, "need a debounce_key"),
                           ({"debounce_key": "a", "debounce_seconds": -1}, "debounce_seconds must be"),
                           ({"debounce_key": "a", "debounce_seconds": 1, "debounce_max_seconds": float("inf")},
                            "debounce_max_seconds must be"),
                           ({"debounce_key": "a", "debounce_seconds": 1, "workflow_id": "x"}, "takes no workflow_id"),
                           ({"debounce_key": "a", "debounce_seconds": 1, "delay": 3}, "takes no workflow_id"),
                           ({"debounce_key": "", "debounce_seconds": 1}, "debounce_key must be")):
        with pytest.raises(ValueError, match=match):
            app.enqueue(job, 1, **options)
    assert len(app.list_workflows()) == 1


def test_debounce_in_the_callers_transaction(app: pgdurable.App, database_url: str,
                                             db: psycopg.Connection[Any]) -> None:
    @app.workflow()
    def job(n: int) -> int:
        return n

    with psycopg.connect(database_url) as conn:
        first = app.enqueue(job, 1, debounce_key="tx", debounce_seconds=30, tags={"via": "conn"}, conn=conn)
        second = app.enqueue(job, 2, debounce_key="tx", debounce_seconds=30, conn=conn)
        assert first.workflow_id == second.workflow_id
        assert app.get(first.workflow_id) is None  # not committed yet
    row = execution(app, first.workflow_id)
    assert json.loads(row.input) == {"n": 2} and row.status == "waiting" and row.tags is None
