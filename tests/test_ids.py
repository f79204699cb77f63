"""The ids the engine chooses (migration 23, pgdurable.ids): time-ordered UUIDv7s from every path that creates an
execution without a caller's id, so that new executions share the right edge of the primary key instead of
landing on random pages of a long history."""

from __future__ import annotations

import time
import uuid
from typing import Any

import psycopg

import pgdurable


def millis_of(text: str) -> int:
    return uuid.UUID(text).int >> 80


def assert_v7(text: str) -> None:
    parsed = uuid.UUID(text)
    assert (str(parsed), parsed.version, parsed.variant) == (text, 7, uuid.RFC_4122)


def test_the_database_makes_version_7_ids_of_its_own_clock(db: psycopg.Connection[Any]) -> None:
    row = db.execute("SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint, new_execution_id(), "
                     "floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint").fetchone()
    assert row is not None
    before, made, after = row
    assert_v7(made)
    assert before <= millis_of(made) <= after
    many = [r[0] for r in db.execute("SELECT new_execution_id() FROM generate_series(1, 5000)")]
    assert len(set(many)) == 5000
    for made in many[:50]:
        assert_v7(made)


def test_every_path_without_a_given_id_creates_a_version_7_id(app: pgdurable.App,
                                                               db: psycopg.Connection[Any]) -> None:
    @app.workflow(name="ids_job")
    def job(x: int) -> int:
        return x

    made = [app.enqueue(job, 1).workflow_id]
    made += [h.workflow_id for h in app.enqueue_many(job, [(2,), (3,)])]
    started = app.start(job, 4)
    made.append(started.workflow_id)
    assert started.result(timeout=60) == 4
    made.append(app.fork(started.workflow_id, 0).workflow_id)
    row = db.execute("SELECT enqueue_workflow('ids_job', '{\"x\": 5}')").fetchone()
    assert row is not None
    made.append(row[0])
    for workflow_id in made:
        assert_v7(workflow_id)
    stored = {r[0] for r in db.execute("SELECT id FROM workflow_executions")}
    assert set(made) <= stored


def test_later_executions_sort_after_earlier_ones_in_the_primary_key(app: pgdurable.App,
                                                                      db: psycopg.Connection[Any]) -> None:
    @app.workflow(name="ids_order")
    def job(x: int) -> int:
        return x

    made = []
    for x in range(6):
        if x % 2:
            made.append(app.enqueue(job, x).workflow_id)
        else:
            row = db.execute("SELECT enqueue_workflow('ids_order', jsonb_build_object('x', %s::int))", (x,)).fetchone()
            assert row is not None
            made.append(row[0])
        # Into the next millisecond (ids of one millisecond are in random order). Python's clock and the
        # server's are the same machine's here.
        start = time.time_ns() // 1_000_000
        while time.time_ns() // 1_000_000 <= start + 1:
            time.sleep(0.001)
    in_index_order = [r[0] for r in db.execute(
        "SELECT id FROM workflow_executions WHERE name = 'ids_order' ORDER BY id")]
    assert in_index_order == made
