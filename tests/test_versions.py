"""Deploys strand nothing: a worker adopts the executions of a version none of whose workers is live any more
(after adopt_after_seconds), replays their history against its own code, and parks the ones whose history it
does not replay (nothing written) until a worker of their version starts or they are migrated.

Strict per-version mode (adopt_after_seconds=None) is tests/test_control.py; the crash of a real worker
process is tests/test_versions_processes.py."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql
from typer.testing import CliRunner

import pgdurable
from pgdurable import monitoring
from pgdurable.cli import cli
from pgdurable.sqlfiles import query
from tests.harness import WAIT, execution, wait_for

# More than the FAST heartbeat (lease 2 s: every 0.67 s), short enough for tests.
ADOPT = 1.5
# The grace of a test that a live worker's executions are not adopted: on loaded cores (the full suite in two
# processes beside two busy loops) a live worker's heartbeats came more than ADOPT apart, and its execution
# was adopted. Long enough that only a dead worker misses it.
LIVE_GRACE = 6.0


def _query(app: pgdurable.App, statement: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(app.db.conninfo, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(app.schema)))
        return conn.execute(statement, params).fetchall()


def _define(app: pgdurable.App, calls: list[str], *, policy: bool = False) -> Any:
    """v1's workflow: a step, then a wait for a message, then another step."""
    if policy:
        app.queue("limited", concurrency=3)

    @app.step()
    def reserve(order: int) -> str:
        calls.append(f"reserve-{order}")
        return f"reserved {order}"

    @app.step()
    def ship(order: int) -> str:
        calls.append(f"ship-{order}")
        return f"shipped {order}"

    @app.workflow(name="order", queue="limited" if policy else "default")
    def order(order: int) -> list[str]:
        first = reserve(order)
        note = pgdurable.recv(timeout=120)
        return [first, str(note), ship(order)]

    return order


def _started_on_v1(make_app: Callable[..., pgdurable.App], start_worker: Callable[..., Any], workflow_id: str,
                   *, policy: bool = False) -> tuple[pgdurable.App, list[str]]:
    """An execution that v1 started, recorded "reserve" for and suspended in its recv; no v1 worker is left,
    and its message has come since (so it is enqueued: runnable)."""
    v1, calls = make_app(app_version="v1"), list[str]()
    workflow = _define(v1, calls, policy=policy)
    runner = start_worker(v1)
    v1.enqueue(workflow, 1, workflow_id=workflow_id)
    wait_for(lambda: execution(v1, workflow_id).status == "waiting", WAIT, "it to wait for its message")
    runner.stop()
    assert execution(v1, workflow_id).app_version == "v1" and calls == ["reserve-1"]
    v1.send(workflow_id, "m")
    assert execution(v1, workflow_id).status == "enqueued"
    return v1, calls


@pytest.mark.parametrize("policy", [False, True], ids=["plain-claim", "policy-claim"])
def test_a_new_version_adopts_once_no_worker_of_the_old_one_is_live(
        make_app: Callable[..., pgdurable.App], start_worker: Callable[..., Any], policy: bool) -> None:
    _, _ = _started_on_v1(make_app, start_worker, "adopted", policy=policy)
    v2, calls = make_app(app_version="v2", adopt_after_seconds=ADOPT), list[str]()
    _define(v2, calls, policy=policy)  # the same code, another version (a deploy of unrelated changes)
    start_worker(v2)
    assert v2.handle("adopted").result(timeout=WAIT) == ["reserved 1", "m", "shipped 1"]
    assert calls == ["ship-1"]  # reserve came from its record
    assert execution(v2, "adopted").app_version == "v2"  # the adopting claim stamps its own version


def test_no_adoption_while_a_worker_of_the_old_version_is_live(
        make_app: Callable[..., pgdurable.App], start_worker: Callable[..., Any]) -> None:
    v1, _ = _started_on_v1(make_app, start_worker, "kept")
    # A live v1 worker, serving another queue: v1 is not gone, so nobody adopts its executions.
    start_worker(v1, queues=["elsewhere"])
    v2, calls = make_app(app_version="v2", adopt_after_seconds=LIVE_GRACE), list[str]()
    _define(v2, calls)

    @v2.workflow()
    def later() -> str:
        return "later"

    start_worker(v2)
    # Enqueued after it with the same priority, and the grace passed many times over by the time this one
    # (a poll after another) is done: a v2 worker that adopted would have taken "kept" first.
    for _ in range(3):
        assert v2.enqueue(later).result(timeout=WAIT) == "later"
    wait_for(lambda: _query(v2, "SELECT clock_timestamp() - min(started_at) > make_interval(secs => %s) "
                                "FROM workers WHERE app_version = 'v2'", 2 * LIVE_GRACE)[0][0], WAIT,
             "the v2 worker to have run for two graces")
    assert v2.enqueue(later).result(timeout=WAIT) == "later"
    row = execution(v2, "kept")
    assert row.status == "enqueued" and row.app_version == "v1" and calls == []


def test_a_history_that_does_not_replay_is_parked_with_nothing_written(
        make_app: Callable[..., pgdurable.App], start_worker: Callable[..., Any], database_url: str) -> None:
    v1, _ = _started_on_v1(make_app, start_worker, "diverged")
    steps_before = _query(v1, "SELECT * FROM operation_outputs WHERE execution_id = 'diverged' ORDER BY step_id")
    v2 = make_app(app_version="v2", adopt_after_seconds=ADOPT)

    @v2.step()
    def charge(order: int) -> str:
        raise AssertionError("a step of a parked execution ran")

    @v2.workflow(name="order")
    def order_v2(order: int) -> str:
        try:
            return charge(order)  # step #0 is "reserve" in the history
        except Exception:  # user code catching everything does not swallow the mismatch
            return "swallowed"

    start_worker(v2)
    wait_for(lambda: execution(v2, "diverged").wait_reason == "parked", WAIT, "it to be parked")
    row = execution(v2, "diverged")
    assert row.status == "waiting" and row.available_at is None and row.owner_id is None
    assert row.output is None and row.error is None and row.completed_at is None
    assert row.app_version == "v1"  # given back to the version that recorded it
    assert row.parked_reason is not None and "'charge'" in row.parked_reason and "'reserve'" in row.parked_reason
    steps_after = _query(v2, "SELECT * FROM operation_outputs WHERE execution_id = 'diverged' ORDER BY step_id")
    assert steps_after == steps_before
    # Visible: unrunnable_executions, pgdurable versions, App.versions, workflows show.
    reason = _query(v2, "SELECT reason FROM unrunnable_executions WHERE id = 'diverged'")
    assert reason and reason[0][0].startswith("parked: ") and "'charge'" in reason[0][0]
    assert [u.id for u in v2.db.run(monitoring.unrunnable())] == ["diverged"]  # the dashboard's list
    assert {q.queue: q.waiting_for for q in v2.db.run(monitoring.queues())}["default"] == {"parked": 1}
    counts = {v.app_version: v for v in v2.versions()}
    assert counts["v1"].parked == 1 and counts["v1"].waiting == 0 and counts["v1"].live_workers == 0
    assert counts["v2"].live_workers == 1
    listed = CliRunner().invoke(cli, ["versions", "--json", "--database-url", database_url, "--schema", v2.schema])
    assert listed.exit_code == 0, listed.output
    assert {"app_version": "v1", "enqueued": 0, "waiting": 0, "running": 0, "parked": 1,
            "live_workers": 0} in json.loads(listed.output)
    shown = CliRunner().invoke(cli, ["workflows", "show", "diverged", "--database-url", database_url,
                                     "--schema", v2.schema])
    assert shown.exit_code == 0 and "parked" in shown.output and "charge" in shown.output, shown.output


def test_finishing_before_the_recorded_steps_parks_too(
        make_app: Callable[..., pgdurable.App], start_worker: Callable[..., Any]) -> None:
    v1, _ = _started_on_v1(make_app, start_worker, "short")
    steps_before = _query(v1, "SELECT * FROM operation_outputs WHERE execution_id = 'short' ORDER BY step_id")
    v2 = make_app(app_version="v2", adopt_after_seconds=ADOPT)

    @v2.step(name="reserve")
    def reserve(order: int) -> str:
        return "never run: replayed"

    @v2.workflow(name="order")
    def order_v2(order: int) -> str:
        reserve(order)
        return "done early"  # v2 returns without visiting the recv's steps that v1 recorded

    start_worker(v2)
    wait_for(lambda: execution(v2, "short").wait_reason == "parked", WAIT, "it to be parked")
    row = execution(v2, "short")
    assert row.output is None and row.parked_reason is not None and "ended after 1 steps" in row.parked_reason
    assert _query(v2, "SELECT * FROM operation_outputs WHERE execution_id = 'short' ORDER BY step_id") == steps_before


def test_a_worker_of_the_parked_version_unparks_it_at_start(
        make_app: Callable[..., pgdurable.App], start_worker: Callable[..., Any]) -> None:
    _started_on_v1(make_app, start_worker, "rolled-back")
    v2 = make_app(app_version="v2", adopt_after_seconds=ADOPT)

    @v2.workflow(name="order")
    def order_v2(order: int) -> str:
        pgdurable.sleep(0)
        return "v2"

    v2_worker = start_worker(v2)
    wait_for(lambda: execution(v2, "rolled-back").wait_reason == "parked", WAIT, "it to be parked")
    v2_worker.stop()
    # The deploy is rolled back: a v1 worker starts, re-enqueues it and finishes it on v1's code.
    v1, calls = make_app(app_version="v1"), list[str]()
    _define(v1, calls)
    start_worker(v1)
    assert v1.handle("rolled-back").result(timeout=WAIT) == ["reserved 1", "m", "shipped 1"]
    assert calls == ["ship-1"] and execution(v1, "rolled-back").parked_reason is None


def test_versions_migrate_moves_and_unparks(make_app: Callable[..., pgdurable.App],
                                            start_worker: Callable[..., Any], database_url: str) -> None:
    _started_on_v1(make_app, start_worker, "migrated")
    v2 = make_app(app_version="v2", adopt_after_seconds=ADOPT)

    @v2.workflow(name="order")
    def order_v2(order: int) -> str:
        pgdurable.sleep(0)
        return "v2"

    v2_worker = start_worker(v2)
    wait_for(lambda: execution(v2, "migrated").wait_reason == "parked", WAIT, "it to be parked")
    v2_worker.stop()
    # v3 replays v1's histories (the v1 code, with a patched() change after the recorded steps), in strict
    # mode: only the explicit migration hands it the v1 execution.
    v3, calls = make_app(app_version="v3", adopt_after_seconds=None), list[str]()
    _define(v3, calls)
    start_worker(v3)
    with pytest.raises(ValueError, match="two non-empty"):
        v3.migrate_version("v1", "")
    moved = CliRunner().invoke(cli, ["versions", "migrate", "v1", "v3", "--json", "--database-url", database_url,
                                     "--schema", v3.schema])
    assert moved.exit_code == 0, moved.output
    assert json.loads(moved.output) == {"from": "v1", "to": "v3", "moved": 1}
    assert v3.handle("migrated").result(timeout=WAIT) == ["reserved 1", "m", "shipped 1"]
    again = CliRunner().invoke(cli, ["versions", "migrate", "v1", "v3", "--database-url", database_url,
                                     "--schema", v3.schema])
    assert again.exit_code == 1  # nothing left to move
    assert v3.migrate_version("v1", "v3") == 0


def test_patched_changes_are_adopted_not_parked(make_app: Callable[..., pgdurable.App],
                                                start_worker: Callable[..., Any]) -> None:
    _started_on_v1(make_app, start_worker, "old-path")  # recorded: reserve, then the recv
    v2, log = make_app(app_version="v2", adopt_after_seconds=ADOPT), list[str]()

    @v2.step()
    def reserve(order: int) -> str:
        log.append("reserve")
        return f"reserved {order}"

    @v2.step()
    def check_fraud(order: int) -> str:
        log.append("check_fraud")
        return "ok"

    @v2.step()
    def ship(order: int) -> str:
        log.append("ship")
        return f"shipped {order}"

    @v2.workflow(name="order")
    def order_v2(order: int) -> list[str]:
        if pgdurable.patched("fraud-check"):  # new: a step before reserve
            check_fraud(order)
        first = reserve(order)
        note = pgdurable.recv(timeout=120)
        return [first, str(note), ship(order)]

    start_worker(v2)
    assert v2.handle("old-path").result(timeout=WAIT) == ["reserved 1", "m", "shipped 1"]
    assert log == ["ship"]  # the old path replayed: no fraud check, reserve from its record
    fresh = v2.enqueue(order_v2, 2)
    v2.send(fresh.workflow_id, "n")
    assert fresh.result(timeout=WAIT) == ["reserved 2", "n", "shipped 2"]
    assert log == ["ship", "check_fraud", "reserve", "ship"]


def test_a_parked_execution_still_times_out(make_app: Callable[..., pgdurable.App],
                                            start_worker: Callable[..., Any]) -> None:
    _started_on_v1(make_app, start_worker, "late")
    v2 = make_app(app_version="v2", adopt_after_seconds=ADOPT)

    @v2.workflow(name="order")
    def order_v2(order: int) -> str:
        pgdurable.sleep(0)
        return "v2"

    start_worker(v2)
    wait_for(lambda: execution(v2, "late").wait_reason == "parked", WAIT, "it to be parked")
    _query(v2, "UPDATE workflow_executions SET timeout_seconds = 1, deadline = now() - interval '1 second' "
               "WHERE id = 'late' RETURNING id")
    wait_for(lambda: execution(v2, "late").status == "failed", WAIT, "the deadline to fail it")
    assert execution(v2, "late").error_info["type"] == "pgdurable.WorkflowTimeout"


def test_the_claim_stays_an_index_walk_with_adoption(app: pgdurable.App, db: psycopg.Connection[Any]) -> None:
    db.execute("INSERT INTO workflow_executions (name, id, app_version) "
               "SELECT 'job', 'e' || i, 'v' || (i % 3) FROM generate_series(1, 2000) AS i")
    db.execute("INSERT INTO workers (id, hostname, pid, queues, workflows, concurrency, app_version) "
               "VALUES ('w', 'h', 1, '{default}', '{job}', 1, 'v1')")
    db.execute("ANALYZE workflow_executions")
    params = {"queue": "default", "names": ["job"], "owner": "w", "lease": 30.0, "limit": 10, "version": "v0",
              "adopt": 60.0, "arm": True}  # as a producer about to sleep sends it (a short claim arms its bell)
    with db.transaction(force_rollback=True):
        plan = json.dumps(db.execute(sql.SQL("EXPLAIN (FORMAT JSON) ") + sql.SQL(query("claim")),  # type: ignore[operator]
                                     params).fetchone())
    assert "workflow_executions_claim_idx" in plan and '"Sort"' not in plan
    assert "hashed SubPlan" in plan or "Hashed SubPlan" in plan or '"Parent Relationship": "SubPlan"' in plan
    with db.transaction(force_rollback=True):  # v0 and v2 are adoptable, v1 has a live worker
        claimed = db.execute(sql.SQL(query("claim")), params).fetchall()  # type: ignore[arg-type]
        assert len(claimed) == 10 and all(previous in ("v0", "v2") for *_, previous in claimed)


def test_under_a_pinned_version_migrating_to_itself_unparks(
        make_app: Callable[..., pgdurable.App], start_worker: Callable[..., Any]) -> None:
    old = make_app(app_version="stable")
    _define(old, [])
    runner = start_worker(old)
    old.enqueue("order", 1, workflow_id="pinned")
    wait_for(lambda: execution(old, "pinned").status == "waiting", WAIT, "it to wait for its message")
    runner.stop()
    old.send("pinned", "m")
    broken = make_app(app_version="stable")  # the same pinned version, with a change that was not guarded

    @broken.workflow(name="order")
    def order_broken(order: int) -> str:
        pgdurable.sleep(0)
        return "broken"

    broken_worker = start_worker(broken)
    wait_for(lambda: execution(broken, "pinned").wait_reason == "parked", WAIT, "it to be parked")
    broken_worker.stop()
    assert execution(broken, "pinned").app_version == "stable"
    assert broken.migrate_version("stable", "stable") == 1  # re-enqueues the parked only
    assert execution(broken, "pinned").status == "enqueued"
    assert broken.migrate_version("stable", "stable") == 0
    fixed, calls = make_app(app_version="stable"), list[str]()
    _define(fixed, calls)
    start_worker(fixed)
    assert fixed.handle("pinned").result(timeout=WAIT) == ["reserved 1", "m", "shipped 1"]


def test_the_previous_releases_policy_claim_is_v2_in_strict_mode(app: pgdurable.App,
                                                                  db: psycopg.Connection[Any]) -> None:
    """A worker of the previous release still calls claim_with_policy: it claims executions of its own
    version and never-started ones, and never adopts another version's, however long that one is gone."""
    app.queue("limited", concurrency=5)

    @app.workflow(queue="limited")
    def job() -> None:
        return None

    app.apply_queue_policies()
    mine, fresh, theirs = (app.enqueue(job).workflow_id for _ in range(3))
    db.execute("UPDATE workflow_executions SET app_version = 'v1', attempt = 1 WHERE id = %s", (mine,))
    db.execute("UPDATE workflow_executions SET app_version = 'gone', attempt = 1 WHERE id = %s", (theirs,))
    claimed = db.execute("SELECT id, attempt FROM claim_with_policy('limited', ARRAY['job'], 'old-worker', 30, 10, "
                         "'v1')").fetchall()
    assert sorted(claimed) == sorted([(mine, 2), (fresh, 1)])
    assert db.execute("SELECT status FROM workflow_executions WHERE id = %s", (theirs,)).fetchone() == ("enqueued",)
