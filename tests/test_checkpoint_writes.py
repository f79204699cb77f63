"""The group commit's statements against PostgreSQL: write_checkpoints (a batch's step checkpoints and
completions in one statement) fences each write by its attempt exactly as write_steps and write_completions
do when they run one after the other."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from pgdurable import store
from pgdurable.sqlfiles import query

T0 = datetime(2026, 1, 1, tzinfo=UTC).isoformat()


def claimed(db: psycopg.Connection[Any], n: int) -> list[store.claims.Claimed]:
    for _ in range(n):
        db.execute("SELECT enqueue_workflow('w', '{}', 'q')")
    found = store.run(db, store.claims.claim(queue="q", names=["w"], owner="w1", lease=30, limit=n, version="v"))
    assert len(found) == n
    return sorted(found, key=lambda c: c.id)


def step_row(c: store.claims.Claimed, step_id: int, attempt: int | None = None) -> list[Any]:
    return [c.id, c.attempt if attempt is None else attempt, step_id, f"s{step_id}", 1, T0, {"v": step_id}, None]


def done_row(c: store.claims.Claimed, attempt: int | None = None) -> list[Any]:
    return [c.id, c.attempt if attempt is None else attempt, "succeeded", "out", None]


def checkpoints(steps: list[list[Any]], done: list[list[Any]], few: bool = False
                ) -> store.Call[set[store.checkpoints.WriteKey]]:
    return store.checkpoints.write_checkpoints(json.dumps(steps), json.dumps(done), few=few)


# The batch statements come in two plans of the same rules: for a few rows (by primary key) and for more.
both_plans = pytest.mark.parametrize("few", [False, True], ids=["many", "few"])


def steps_of(db: psycopg.Connection[Any], id: str) -> list[tuple[int, Any, int]]:
    return db.execute("SELECT step_id, output, recorded_by_attempt FROM operation_outputs WHERE execution_id = %s "
                      "ORDER BY step_id", (id,)).fetchall()


def status_of(db: psycopg.Connection[Any], id: str) -> tuple[str, Any, Any]:
    return db.execute("SELECT status, output, owner_id FROM workflow_executions WHERE id = %s", (id,)).fetchone()


@both_plans
def test_steps_and_completions_in_one_statement(db: psycopg.Connection[Any], few: bool) -> None:
    finishing, running = claimed(db, 2)
    steps = [step_row(finishing, 0), step_row(finishing, 1), step_row(running, 0)]
    written = store.run(db, checkpoints(steps, [done_row(finishing)], few))
    assert written == {(finishing.id, finishing.attempt, 0), (finishing.id, finishing.attempt, 1),
                       (finishing.id, finishing.attempt, None), (running.id, running.attempt, 0)}
    assert steps_of(db, finishing.id) == [(0, {"v": 0}, finishing.attempt), (1, {"v": 1}, finishing.attempt)]
    assert status_of(db, finishing.id) == ("succeeded", "out", None)
    assert steps_of(db, running.id) == [(0, {"v": 0}, running.attempt)]
    assert status_of(db, running.id)[0] == "running"
    # Written again (a retried batch): nothing new, the first record stays.
    again = store.run(db, checkpoints([step_row(running, 0), step_row(running, 1)], [done_row(running)], few))
    assert again == {(running.id, running.attempt, 1), (running.id, running.attempt, None)}


@both_plans
def test_a_fenced_completion_takes_its_attempts_steps_with_it(db: psycopg.Connection[Any], few: bool) -> None:
    """The steps of an attempt that no longer owns its execution are not written, whether its completion is in
    the same statement or not; a later attempt's steps in the same statement are."""
    lost, expired, other = claimed(db, 3)
    db.execute("UPDATE workflow_executions SET attempt = attempt + 1 WHERE id = %s", (lost.id,))  # taken over
    db.execute("UPDATE workflow_executions SET lease_expires = now() - interval '1 second' WHERE id = %s",
               (expired.id,))
    steps = [step_row(lost, 0), step_row(lost, 1, attempt=lost.attempt + 1), step_row(expired, 0),
             step_row(other, 0, attempt=other.attempt + 1)]
    written = store.run(db, checkpoints(
        steps, [done_row(lost), done_row(expired), done_row(other, attempt=other.attempt + 1)], few))
    assert written == {(lost.id, lost.attempt + 1, 1)}
    assert steps_of(db, lost.id) == [(1, {"v": 1}, lost.attempt + 1)]
    assert steps_of(db, expired.id) == [] and steps_of(db, other.id) == []
    assert [status_of(db, c.id)[0] for c in (lost, expired, other)] == ["running"] * 3


@both_plans
def test_the_same_outcome_as_the_two_statements(db: psycopg.Connection[Any], few: bool) -> None:
    """The same batch written by write_checkpoints and by write_steps then write_completions (in one
    transaction, as on Citus) leaves the same rows and reports the same keys."""
    a = claimed(db, 3)
    b = claimed(db, 3)
    db.execute("UPDATE workflow_executions SET attempt = attempt + 1 WHERE id = ANY(%s)", ([a[2].id, b[2].id],))

    def batch(cs: list[store.claims.Claimed]) -> tuple[list[Any], list[Any]]:
        steps = [step_row(cs[0], 0), step_row(cs[0], 1), step_row(cs[1], 0), step_row(cs[2], 0)]
        return steps, [done_row(cs[0]), done_row(cs[2])]

    steps, done = batch(a)
    one = store.run(db, checkpoints(steps, done, few))
    steps, done = batch(b)
    with db.transaction():
        two = store.run(db, store.checkpoints.write_steps(json.dumps(steps), few=few))
        two |= store.run(db, store.checkpoints.write_completions(json.dumps(done), few=few))

    def relative(keys: set[Any], cs: list[store.claims.Claimed]) -> set[Any]:
        index = {c.id: i for i, c in enumerate(cs)}
        return {(index[id], step) for id, _, step in keys}

    assert relative(one, a) == relative(two, b) == {(0, 0), (0, 1), (0, None), (1, 0)}
    for x, y in zip(a, b, strict=True):
        assert steps_of(db, x.id) == steps_of(db, y.id)
        assert status_of(db, x.id) == status_of(db, y.id)


def test_one_step_alone_is_written_and_fenced_as_write_steps_writes_it(db: psycopg.Connection[Any]) -> None:
    """write_step (a batch of one step, from scalar parameters) against write_steps with the same row, for an
    owner, a replaced attempt, an expired lease, a finished execution, a step already recorded, an output
    with an error, and an output that is JSON null: the same rows written and the same keys returned."""
    cases = claimed(db, 6)
    twins = claimed(db, 6)
    for group in (cases, twins):
        db.execute("UPDATE workflow_executions SET attempt = attempt + 1 WHERE id = %s", (group[1].id,))
        db.execute("UPDATE workflow_executions SET lease_expires = now() - interval '1 second' WHERE id = %s",
                   (group[2].id,))
        db.execute("UPDATE workflow_executions SET status = 'succeeded', owner_id = NULL, lease_expires = NULL"
                   " WHERE id = %s", (group[3].id,))
    started = datetime(2026, 1, 1, tzinfo=UTC)
    # (claimed index, step id, output, error): each written twice, the second time finding the first.
    rows = [(0, 0, '{"v": 0}', None), (1, 0, '{"v": 0}', None), (2, 0, '{"v": 0}', None), (3, 0, '{"v": 0}', None),
            (4, 0, '{"v": 0}', '{"type": "E", "message": "m"}'), (5, 0, None, None), (0, 0, '{"v": 9}', None)]
    for index, step_id, output, error in rows:
        one, twin = cases[index], twins[index]
        alone = store.run(db, store.checkpoints.write_step(one.id, one.attempt, step_id, "s", 2, started, output,
                                                            error))
        as_array = [twin.id, twin.attempt, step_id, "s", 2, started.isoformat(),
                    json.loads(output or "null"), None if error is None else json.loads(error)]
        batched = store.run(db, store.checkpoints.write_steps(json.dumps([as_array])))
        assert {(i.replace(one.id, "x"), a, s) for i, a, s in alone} == {
            (i.replace(twin.id, "x"), a, s) for i, a, s in batched}
    for one, twin in zip(cases, twins, strict=True):
        columns = ("SELECT step_id, step_name, output, error, attempts, recorded_by_attempt, started_at"
                   " FROM operation_outputs WHERE execution_id = %s ORDER BY step_id")
        assert db.execute(columns, (one.id,)).fetchall() == db.execute(columns, (twin.id,)).fetchall()
    assert [len(steps_of(db, c.id)) for c in cases] == [1, 0, 0, 0, 1, 1]
    assert steps_of(db, cases[0].id) == [(0, {"v": 0}, cases[0].attempt)]  # the first record stays
    assert db.execute("SELECT output, error->>'type' FROM operation_outputs WHERE execution_id = %s",
                      (cases[4].id,)).fetchone() == (None, "E")  # an error keeps no output


def test_fenced_writes_find_their_executions_by_primary_key_however_many_run(db: psycopg.Connection[Any]) -> None:
    """write_step, the waits' statements and the batch statements for a few rows look their executions up by
    primary key in the generic plans a worker's prepared statements settle on. Their lease test once was an
    index condition, which PostgreSQL, its statistics of lease_expires always stale, took for a handful of
    rows: a statement on one execution read every running execution through the lease index, and a small
    batch (a JSON array, planned for 100 rows) hash-joined them all (docs/benchmarks.md, "Batches beside many
    running executions")."""
    running = claimed(db, 1500)
    # Statistics as a live worker leaves them: analyzed, then every lease renewed past what they show.
    db.execute("UPDATE workflow_executions SET lease_expires = now() - interval '1 minute'")
    db.execute("ANALYZE workflow_executions")
    db.execute("UPDATE workflow_executions SET lease_expires = now() + interval '1 hour'")
    target = running[0]
    fenced = {"write_step": {"execution_id": target.id, "attempt": target.attempt, "step_id": 0, "step_name": "s0",
                             "tries": 1, "started_at": T0, "output": "1", "error": None},
              "suspend": {"reason": "delay", "wake_at": T0, "id": target.id, "attempt": target.attempt,
                          "wakeups": None},
              "write_steps_few": {"rows": json.dumps([step_row(c, 0) for c in running[:2]])},
              "write_completions_few": {"rows": json.dumps([done_row(running[2])]), "bells": "[]"},
              "write_checkpoints_few": {"steps": json.dumps([step_row(running[3], 0)]),
                                        "completions": json.dumps([done_row(running[3])]), "bells": "[]"}}
    for name, params in fenced.items():
        text = query(name)
        order = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", text)))
        assert set(order) == set(params), name
        for i, key in enumerate(order):
            text = text.replace(f"%({key})s", f"${i + 1}")
        with db.transaction(force_rollback=True):
            db.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            db.execute(f"PREPARE fenced AS {text}")  # (the parameters' types from the statement)
            with psycopg.ClientCursor(db) as cursor:
                plan = [line for (line,) in cursor.execute(
                    f"EXPLAIN (COSTS OFF) EXECUTE fenced ({', '.join(['%s'] * len(order))})",
                    [params[key] for key in order])]
            db.execute("DEALLOCATE fenced")
        scans = [line for line in plan if "Scan" in line and " on workflow_executions" in line]
        assert scans and all("workflow_executions_pkey" in line for line in scans), (name, plan)

