"""Retention: pgdurable cleanup, App.cleanup and the workers' automatic retention, on a real PostgreSQL."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from typer.testing import CliRunner

import pgdurable
from pgdurable import retention
from pgdurable.cli import cli
from pgdurable.sqlfiles import query
from tests.harness import WAIT

from .harness import wait_for


def age(db: psycopg.Connection[Any], ids: list[str], days: float) -> None:
    """Move executions into the past: created, updated and (if finished) completed ``days`` ago. available_at
    stays, so a delayed execution is still not due (a worker would claim it)."""
    db.execute("UPDATE workflow_executions SET created_at = created_at - %(d)s, updated_at = updated_at - %(d)s,"
               " completed_at = completed_at - %(d)s WHERE id = ANY (%(ids)s)",
               {"d": timedelta(days=days), "ids": ids})


def finished_rows(db: psycopg.Connection[Any], prefix: str, n: int, status: str = "succeeded",
                  days: float = 40, steps: int = 1) -> list[str]:
    """n finished executions with ``steps`` step outputs each, finished ``days`` ago, written in SQL."""
    ids = [f"{prefix}-{i}" for i in range(n)]
    db.execute("INSERT INTO workflow_executions (id, name, status, created_at, updated_at, completed_at) "
               "SELECT id, 'old', %s, now() - %s, now() - %s, now() - %s FROM unnest(%s::text[]) AS id",
               (status, timedelta(days=days), timedelta(days=days), timedelta(days=days), ids))
    db.execute("INSERT INTO operation_outputs (execution_id, step_id, step_name, output, recorded_by_attempt,"
               " started_at) SELECT id, s, 'step', '1', 1, now() FROM unnest(%s::text[]) AS id,"
               " generate_series(0, %s - 1) AS s", (ids, steps))
    return ids


def count(db: psycopg.Connection[Any], table: str, prefix: str) -> int:
    column = "id" if table == "workflow_executions" else "execution_id"
    row = db.execute(sql.SQL("SELECT count(*) FROM {} WHERE starts_with({}, %s)").format(
        sql.Identifier(table), sql.Identifier(column)), (prefix,)).fetchone()
    return int(row[0]) if row else 0


def test_cleanup_deletes_old_finished_executions_and_their_steps_only(
        app: pgdurable.App, db: psycopg.Connection[Any], start_worker: Callable[..., Any]) -> None:
    gate = threading.Event()

    @app.step()
    def work(n: int) -> int:
        return n

    @app.step()
    def hold() -> None:
        gate.wait(30)

    @app.workflow()
    def job(n: int) -> int:
        work(n)
        if n < 0:
            raise ValueError("negative")
        return work(n + 1)

    @app.workflow()
    def long() -> None:
        work(0)
        hold()

    start_worker(app)
    done = [app.enqueue(job, n, workflow_id=f"ok-{n}") for n in range(4)]
    for handle in done:
        handle.result(timeout=WAIT)
    with pytest.raises(pgdurable.WorkflowFailed):
        app.enqueue(job, -1, workflow_id="bad-0").result(timeout=WAIT)
    app.enqueue(job, 5, workflow_id="cancelled-0", delay=3600)
    app.cancel("cancelled-0")
    app.enqueue(job, 6, workflow_id="waiting-0", delay=3600)  # waiting for its delayed start
    app.enqueue(job, 8, workflow_id="enqueued-0", queue="idle")  # enqueued where no worker serves
    running = app.enqueue(long, workflow_id="running-0")
    wait_for(lambda: running.status() == "running" and len(app.steps("running-0")) == 1, WAIT, "long to run")
    fresh = app.enqueue(job, 7, workflow_id="fresh-0")
    fresh.result(timeout=WAIT)
    everything_old = [f"ok-{n}" for n in range(4)] + ["bad-0", "cancelled-0", "waiting-0", "enqueued-0",
                                                      "running-0"]
    age(db, everything_old, days=40)

    try:
        assert retention.cleanup(app.db, timedelta(days=30), dry_run=True).executions == 6
        assert app.cleanup(timedelta(days=30)) == 6
        left = {row[0]: row[1] for row in db.execute("SELECT id, status FROM workflow_executions")}
        assert left == {"waiting-0": "waiting", "enqueued-0": "enqueued", "running-0": "running",
                        "fresh-0": "succeeded"}
        steps = {row[0] for row in db.execute("SELECT DISTINCT execution_id FROM operation_outputs")}
        assert steps == {"running-0", "fresh-0"}
        assert app.cleanup(timedelta(days=30)) == 0
    finally:
        gate.set()
    running.result(timeout=WAIT)  # the running one was untouched and finishes


def messages_and_events(db: psycopg.Connection[Any], ids: list[str], messages: int, events: int) -> None:
    """``messages`` messages sent to each execution (the first consumed) and ``events`` event values of each."""
    db.execute("INSERT INTO workflow_messages (destination_id, topic, message, consumed_at) SELECT id, 't', '1',"
               " CASE WHEN n = 1 THEN now() END FROM unnest(%s::text[]) AS id, generate_series(1, %s) AS n",
               (ids, messages))
    db.execute("INSERT INTO workflow_events (execution_id, key, step_id, value) SELECT id, 'k', s, '1'"
               " FROM unnest(%s::text[]) AS id, generate_series(0, %s - 1) AS s", (ids, events))


def streams(db: psycopg.Connection[Any], ids: list[str]) -> None:
    """Two values and the close of one stream of each execution."""
    db.execute("INSERT INTO workflow_streams (execution_id, key, step_id, value, closed) SELECT id, 's', n,"
               " CASE WHEN n < 2 THEN '1'::jsonb END, n = 2 FROM unnest(%s::text[]) AS id, generate_series(0, 2) AS n",
               (ids,))


def test_cleanup_deletes_streams_with_their_executions(app: pgdurable.App, db: psycopg.Connection[Any]) -> None:
    ids = finished_rows(db, "streamed", 3)
    streams(db, ids)
    assert app.cleanup(timedelta(days=30)) == 3
    assert owned(db, "workflow_streams", "streamed") == 0


def owned(db: psycopg.Connection[Any], table: str, prefix: str) -> int:
    column = "destination_id" if table == "workflow_messages" else "execution_id"
    row = db.execute(sql.SQL("SELECT count(*) FROM {} WHERE starts_with({}, %s)").format(
        sql.Identifier(table), sql.Identifier(column)), (prefix,)).fetchone()
    assert row is not None
    return int(row[0])


def test_messages_and_events_go_in_the_same_batch_as_their_execution(app: pgdurable.App,
                                                                     db: psycopg.Connection[Any]) -> None:
    old = finished_rows(db, "m", 3)
    recent = finished_rows(db, "recent", 1, days=1)
    messages_and_events(db, old + recent, messages=2, events=3)
    batches: list[retention.Deleted] = []
    total = retention.cleanup(app.db, timedelta(days=30), batch_size=2, on_batch=batches.append)
    assert batches == [retention.Deleted(2, 2, 4, 6), retention.Deleted(1, 1, 2, 3)]
    assert total == retention.Deleted(3, 3, 6, 9)
    for table in ("workflow_messages", "workflow_events"):
        assert owned(db, table, "m-") == 0
        assert owned(db, table, "recent-") > 0
    shown = _cli(app.db.conninfo, app.schema, "cleanup", "--older-than", "12h", "--json")
    assert json.loads(shown.output)["messages_deleted"] == 2 and json.loads(shown.output)["events_deleted"] == 3


def test_what_real_workflows_leave_is_deleted_and_waiting_ones_keep_theirs(
        app: pgdurable.App, db: psycopg.Connection[Any], start_worker: Callable[..., Any]) -> None:
    @app.workflow()
    def talker() -> Any:
        pgdurable.set_event("progress", 50)
        got = pgdurable.recv("in")
        pgdurable.set_event("progress", 100)
        return got

    start_worker(app)
    done, waiting = app.enqueue(talker, workflow_id="done-0"), app.enqueue(talker, workflow_id="waiting-1")
    wait_for(lambda: done.status() == waiting.status() == "waiting", WAIT, "both to wait for a message")
    app.send("done-0", {"hi": 1}, topic="in")
    app.send("done-0", "never read", topic="elsewhere")
    app.send("waiting-1", "not this topic", topic="elsewhere")
    assert done.result(timeout=WAIT) == {"hi": 1}
    age(db, ["done-0", "waiting-1"], days=40)
    assert owned(db, "workflow_messages", "done-0") == 2 and owned(db, "workflow_events", "done-0") == 2

    assert retention.cleanup(app.db, timedelta(days=30)) == retention.Deleted(1, 4, 2, 2)
    assert owned(db, "workflow_messages", "done-0") == owned(db, "workflow_events", "done-0") == 0
    assert app.get("waiting-1").status == "waiting"  # type: ignore[union-attr]
    assert [m.message for m in app.messages("waiting-1")] == ["not this topic"]
    assert [e.value for e in app.events("waiting-1")] == [50]
    app.send("waiting-1", "now", topic="in")
    assert waiting.result(timeout=WAIT) == "now"  # it carried on untouched


def test_unfinished_executions_and_children_of_unfinished_parents_are_kept(app: pgdurable.App,
                                                                          db: psycopg.Connection[Any]) -> None:
    for status in ("enqueued", "waiting", "running"):
        db.execute("INSERT INTO workflow_executions (id, name, status, created_at, updated_at, completed_at,"
                   " owner_id, lease_expires, wait_reason, parent_id) VALUES (%(s)s || '-parent', 'parent', %(s)s,"
                   " now() - interval '40 days', now() - interval '40 days', now() - interval '40 days',"
                   " CASE WHEN %(s)s = 'running' THEN 'w' END,"
                   " CASE WHEN %(s)s = 'running' THEN now() + interval '1 hour' END,"
                   " CASE WHEN %(s)s = 'waiting' THEN 'children' END, NULL)", {"s": status})
    children = finished_rows(db, "child", 4)
    db.execute("UPDATE workflow_executions SET parent_id = CASE id WHEN 'child-0' THEN 'enqueued-parent'"
               " WHEN 'child-1' THEN 'waiting-parent' WHEN 'child-2' THEN 'running-parent'"
               " ELSE 'gone-parent' END WHERE id = ANY (%s)", (children,))
    cutoff = app.db.run(retention.cutoff(timedelta(days=30)))
    # Even asked for directly (the statuses are checked before, and again in SQL), nothing unfinished goes.
    assert app.db.run(retention.batch(cutoff, ["enqueued", "waiting", "running"], 100)).executions == 0
    assert retention.cleanup(app.db, timedelta(days=30), dry_run=True).executions == 1
    assert app.cleanup(timedelta(days=30)) == 1  # child-3: its parent is gone
    left = {row[0] for row in db.execute("SELECT id FROM workflow_executions")}
    assert left == {"enqueued-parent", "waiting-parent", "running-parent", "child-0", "child-1", "child-2"}
    db.execute("UPDATE workflow_executions SET status = 'succeeded', owner_id = NULL, lease_expires = NULL"
               " WHERE id LIKE '%%-parent'")
    assert app.cleanup(timedelta(days=30)) == 6


def test_a_batch_follows_indexes_on_large_tables(app: pgdurable.App, db: psycopg.Connection[Any]) -> None:
    ids = finished_rows(db, "big", 20_000, steps=1)
    messages_and_events(db, ids, messages=1, events=1)
    streams(db, ids)
    db.execute("UPDATE workflow_executions SET parent_id = 'big-' || (random() * 100)::int WHERE random() < 0.5")
    db.execute("ANALYZE workflow_executions, workflow_messages, workflow_events, operation_outputs, workflow_streams")
    cutoff = app.db.run(retention.cutoff(timedelta(days=30)))
    # a batch: a small share of the rows
    call = retention.batch(cutoff, sorted(pgdurable.store.executions.TERMINAL), 50)
    plan = "\n".join(row[0] for row in db.execute("EXPLAIN " + query(call.name), call.params))
    assert "Seq Scan" not in plan, plan
    assert "workflow_messages_idempotency" in plan and "workflow_events_pkey" in plan, plan
    assert "workflow_streams_pkey" in plan, plan
    assert "workflow_executions_created_idx" in plan, plan


def test_cleanup_by_status_and_age(app: pgdurable.App, db: psycopg.Connection[Any]) -> None:
    finished_rows(db, "s", 3, "succeeded")
    finished_rows(db, "f", 2, "failed")
    finished_rows(db, "recent", 2, "failed", days=10)
    assert app.cleanup(timedelta(days=30), statuses=["failed"]) == 2
    assert count(db, "workflow_executions", "f-") == 0 and count(db, "workflow_executions", "s-") == 3
    assert app.cleanup(5 * 86400, statuses=["failed"]) == 2  # seconds work too
    assert count(db, "workflow_executions", "recent-") == 0
    with pytest.raises(ValueError, match="only finished executions"):
        app.cleanup(timedelta(days=1), statuses=["succeeded", "running"])
    with pytest.raises(ValueError, match="at least one status"):
        app.cleanup(timedelta(days=1), statuses=[])


def test_cleanup_works_in_batches(app: pgdurable.App, db: psycopg.Connection[Any]) -> None:
    finished_rows(db, "b", 25, steps=3)
    starts: list[int] = []
    batches: list[retention.Deleted] = []
    total = retention.cleanup(app.db, timedelta(days=30), batch_size=10, on_start=starts.append,
                              on_batch=batches.append)
    assert starts == [25]
    assert [b.executions for b in batches] == [10, 10, 5]
    assert [b.steps for b in batches] == [30, 30, 15]
    assert total == retention.Deleted(25, 75)
    assert count(db, "operation_outputs", "b-") == 0


def test_cleanup_skips_rows_locked_by_others_instead_of_waiting(app: pgdurable.App, db: psycopg.Connection[Any],
                                                                database_url: str, schema: str) -> None:
    finished_rows(db, "l", 5)
    with psycopg.connect(database_url) as other:  # a transaction holding one row, e.g. a resume in flight
        other.execute(sql.SQL("SELECT 1 FROM {}.workflow_executions WHERE id = 'l-0' FOR UPDATE").format(
            sql.Identifier(schema)))
        started = time.monotonic()
        assert app.cleanup(timedelta(days=30)) == 4
        # waiting for the lock would never end (it is released below): any bound only turns a hang into a failure
        assert time.monotonic() - started < WAIT
        other.rollback()
    assert app.cleanup(timedelta(days=30)) == 1


def test_workers_apply_automatic_retention(make_app: Callable[..., pgdurable.App], database_url: str,
                                           schema: str, start_worker: Callable[..., Any]) -> None:
    app = make_app(retention_seconds=7 * 86400, retention_batch_size=4)

    @app.workflow()
    def noop() -> None:
        return None

    app.migrate()
    with psycopg.connect(database_url, autocommit=True) as db:
        db.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        finished_rows(db, "auto", 10, days=8)
        finished_rows(db, "keep", 3, days=6)
        start_worker(app)
        wait_for(lambda: count(db, "workflow_executions", "auto-") == 0, WAIT, "the worker to delete old executions")
        assert count(db, "operation_outputs", "auto-") == 0
        assert count(db, "workflow_executions", "keep-") == 3


def test_settings_reject_bad_retention() -> None:
    with pytest.raises(pgdurable.ConfigurationError):
        pgdurable.Settings(retention_seconds=-1)
    with pytest.raises(pgdurable.ConfigurationError):
        pgdurable.Settings(retention_batch_size=0)


def test_durations() -> None:
    assert retention.parse_duration("30d") == timedelta(days=30)
    assert retention.parse_duration("1d12h") == timedelta(hours=36)
    assert retention.parse_duration("90m") == timedelta(minutes=90)
    assert retention.parse_duration("2w") == timedelta(weeks=2)
    assert retention.parse_duration("0.5h") == timedelta(minutes=30)
    for bad in ["", "30", "d", "30 days", "-1d", "1y"]:
        with pytest.raises(ValueError):
            retention.parse_duration(bad)


def _cli(database_url: str, schema: str, *args: str) -> Any:
    return CliRunner().invoke(cli, [*args, "--database-url", database_url, "--schema", schema])


def test_cli_cleanup(app: pgdurable.App, db: psycopg.Connection[Any], database_url: str, schema: str) -> None:
    finished_rows(db, "c", 7, "succeeded")
    finished_rows(db, "x", 2, "cancelled")
    dry = _cli(database_url, schema, "cleanup", "--older-than", "30d", "--dry-run", "--json")
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.output)["would_delete"] == 9
    assert count(db, "workflow_executions", "") == 9

    only = _cli(database_url, schema, "cleanup", "--older-than", "30d", "--status", "cancelled", "--json")
    assert json.loads(only.output) == {"deleted": 2, "steps_deleted": 2, "messages_deleted": 0,
                                       "events_deleted": 0, "dry_run": False, "older_than_seconds": 30 * 86400.0,
                                       "statuses": ["cancelled"]}
    shown = _cli(database_url, schema, "cleanup", "--older-than", "4w", "--batch-size", "3")
    assert shown.exit_code == 0, shown.output
    assert "deleted 7 executions and 7 step outputs" in shown.output
    assert count(db, "workflow_executions", "") == 0

    for args in (["--older-than", "soon"], ["--older-than", "1d", "--status", "running"]):
        refused = _cli(database_url, schema, "cleanup", *args)
        assert refused.exit_code == 2, refused.output
    assert "Exit codes" in CliRunner().invoke(cli, ["cleanup", "--help"]).output


def test_cli_cleanup_does_not_install_the_schema(database_url: str, schema: str) -> None:
    result = _cli(database_url, schema, "cleanup", "--older-than", "30d")
    assert result.exit_code == 2 and "not installed" in result.output
