"""pgdurable status: what it reports and the exit codes scripts rely on (0 healthy, 1 attention, 2 unreachable)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql
from typer.testing import CliRunner

import pgdurable
from pgdurable.cli import cli
from pgdurable.migrations import latest_version
from tests.harness import WAIT


def _status(database_url: str, schema: str, *args: str) -> Any:
    return CliRunner().invoke(cli, ["status", *args, "--database-url", database_url, "--schema", schema])


def test_healthy_status_shows_queues_workers_and_tables(app: pgdurable.App, database_url: str, schema: str,
                                                        start_worker: Callable[..., Any]) -> None:
    @app.workflow(queue="mail")
    def send(to: str) -> str:
        return to

    runner = start_worker(app)
    app.enqueue(send, "ada@example.com").result(timeout=WAIT)
    app.enqueue(send, "bob@example.com", delay=3600)  # waits for its delayed start

    result = _status(database_url, schema, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["healthy"] is True and report["exit_code"] == 0 and report["attention"] == []
    assert report["schema_version"] == report["latest_version"] == latest_version()
    assert [(q["queue"], q["ready"], q["delayed"], q["waiting"], q["running"], q["live_workers"], q["overdue"])
            for q in report["queues"]] == [("default", 0, 0, 0, 0, 1, 0), ("mail", 0, 0, 1, 0, 1, 0)]
    assert report["queues"][1]["waiting_for"] == {"delay": 1}
    assert [w["id"] for w in report["workers"] if w["alive"]] == [runner.worker.id]
    tables = {t["name"] for t in report["tables"]}
    assert {"workflow_executions", "operation_outputs", "workers", "schema_migrations"} <= tables
    assert report["server"]["version"]

    shown = _status(database_url, schema)
    assert shown.exit_code == 0, shown.output
    assert "healthy" in shown.output and "mail" in shown.output and "workflow_executions" in shown.output
    assert "1 (1 delay)" in shown.output  # the waiting column, by wait reason


def test_work_nobody_can_run_needs_attention(app: pgdurable.App, database_url: str, schema: str) -> None:
    app.enqueue("orphan", workflow_id="o-1", queue="forgotten")
    result = _status(database_url, schema, "--json")
    assert result.exit_code == 1, result.output
    report = json.loads(result.output)
    assert report["unrunnable_count"] == 1 and report["unrunnable"][0]["id"] == "o-1"
    assert report["attention"] == ["1 enqueued execution(s) that no live worker can run"]
    shown = _status(database_url, schema)
    assert shown.exit_code == 1 and "needs attention" in shown.output


def test_expired_leases_nobody_sweeps_need_attention(app: pgdurable.App, database_url: str, schema: str) -> None:
    app.enqueue("stuck", workflow_id="s-1")
    with psycopg.connect(database_url, autocommit=True) as db:
        db.execute(sql.SQL("UPDATE {}.workflow_executions SET status = 'running', owner_id = 'gone', "
                           "lease_expires = now() - interval '5 minutes' WHERE id = 's-1'").format(
            sql.Identifier(schema)))
    report = json.loads(_status(database_url, schema, "--json").output)
    assert any("leases expired" in line for line in report["attention"]), report["attention"]


def test_waiting_work_and_its_overdue_wake_ups(app: pgdurable.App, database_url: str, schema: str) -> None:
    app.enqueue("sleeper", workflow_id="z-1", queue="naps", delay=3600)
    app.enqueue("listener", workflow_id="z-2", queue="naps", delay=3600)
    with psycopg.connect(database_url, autocommit=True) as db:
        db.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        db.execute("UPDATE workflow_executions SET wait_reason = 'recv:approval', available_at = NULL "
                   "WHERE id = 'z-2'")  # as a receive without a timeout leaves it
        healthy = json.loads(_status(database_url, schema, "--json").output)
        assert healthy["exit_code"] == 0 and healthy["attention"] == []
        assert [(q["queue"], q["waiting"], q["waiting_for"]) for q in healthy["queues"]] == [
            ("naps", 2, {"delay": 1, "recv": 1})]
        # The wake-up time passed minutes ago and no worker's timer moved it: no worker is running.
        db.execute("UPDATE workflow_executions SET available_at = now() - interval '5 minutes' WHERE id = 'z-1'")
    result = _status(database_url, schema, "--json")
    assert result.exit_code == 1, result.output
    report = json.loads(result.output)
    assert report["queues"][0]["overdue"] == 1
    assert report["attention"] == ["queue naps: 1 waiting execution(s) due over a minute ago (is any worker "
                                   "running? its timer wakes them)"]
    shown = _status(database_url, schema)
    assert shown.exit_code == 1 and "2 (1 delay, 1 recv)" in shown.output


def test_missing_schema_and_unreachable_database(database_url: str, schema: str) -> None:
    missing = _status(database_url, schema, "--json")
    assert missing.exit_code == 1, missing.output
    assert "not installed" in json.loads(missing.output)["attention"][0]
    with psycopg.connect(database_url) as conn:  # status only reads: it did not create the schema
        found = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()
    assert found is None

    down = CliRunner().invoke(cli, ["status", "--json", "--database-url",
                                    "postgresql://postgres@127.0.0.1:1/nothing?connect_timeout=2"])
    assert down.exit_code == 2, down.output
    assert json.loads(down.output)["healthy"] is False
    shown = CliRunner().invoke(cli, ["status", "--database-url", "postgresql://postgres@127.0.0.1:1/nothing"])
    assert shown.exit_code == 2 and "database unreachable" in shown.output


def test_help_documents_exit_codes() -> None:
    text = CliRunner().invoke(cli, ["status", "--help"]).output
    assert "Exit codes: 0 healthy; 1 something needs attention" in " ".join(text.split())
