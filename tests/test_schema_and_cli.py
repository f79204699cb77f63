"""Migrations, the SQL-visible state, and the command line."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql
from typer.testing import CliRunner

import pgdurable
from pgdurable.cli import cli
from pgdurable.migrations import latest_version, migrate
from pgdurable.sqlfiles import migrations
from tests.harness import WAIT


def test_concurrent_migrations_apply_each_version_once(database_url: str, schema: str) -> None:
    errors: list[BaseException] = []
    applied: list[list[int]] = []

    def run() -> None:
        try:
            applied.append(migrate(database_url, schema))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    known = [version for version, _, _ in migrations()]
    assert known[-1] == latest_version()
    assert sorted(v for versions in applied for v in versions) == known
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(sql.SQL("SELECT version FROM {}.schema_migrations").format(
            sql.Identifier(schema))).fetchall()
    assert rows == [(v,) for v in known]
    assert migrate(database_url, schema) == []


def test_auto_migrate_can_be_turned_off(database_url: str, schema: str) -> None:
    app = pgdurable.App(database_url, schema=schema, auto_migrate=False)
    try:
        with pytest.raises(pgdurable.SchemaNotInstalled, match=f"run `pgdurable migrate --schema {schema}`") as raised:
            app.list_workflows()
        assert isinstance(raised.value.__cause__, psycopg.errors.UndefinedTable)
        assert app.migrate() == [version for version, _, _ in migrations()]
        assert app.list_workflows() == []
    finally:
        app.close()


def test_invalid_schema_name_is_rejected() -> None:
    with pytest.raises(pgdurable.ConfigurationError, match="schema name"):
        pgdurable.App("postgresql://unused", schema="Robert'); DROP TABLE students;--")


def _cli(database_url: str, schema: str, *args: str) -> Any:
    result = CliRunner().invoke(cli, [*args, "--database-url", database_url, "--schema", schema])
    return result


def test_cli_lists_shows_cancels_and_resumes(app: pgdurable.App, database_url: str, schema: str,
                                             start_worker: Callable[..., Any]) -> None:
    @app.step()
    def greet(name: str) -> str:
        return f"hello {name}"

    @app.workflow()
    def hello(name: str) -> str:
        return greet(name)

    start_worker(app)
    app.enqueue(hello, "ada", workflow_id="cli-1").result(timeout=WAIT)
    app.enqueue(hello, "bob", workflow_id="cli-2", delay=3600)

    listed = _cli(database_url, schema, "workflows", "list", "--json")
    assert listed.exit_code == 0, listed.output
    rows = {row["id"]: row for row in json.loads(listed.output)}
    assert rows["cli-1"]["status"] == "succeeded" and rows["cli-1"]["output"] == "hello ada"
    assert rows["cli-2"]["status"] == "waiting" and rows["cli-2"]["wait_reason"] == "delay"
    assert rows["cli-2"]["input"] == {"name": "bob"}

    only_done = json.loads(_cli(database_url, schema, "workflows", "list", "--status", "succeeded",
                                "--json").output)
    assert [row["id"] for row in only_done] == ["cli-1"]

    shown = _cli(database_url, schema, "workflows", "show", "cli-1", "--json")
    detail = json.loads(shown.output)
    assert detail["steps"][0]["step_name"] == "greet" and detail["steps"][0]["output"] == "hello ada"
    assert detail["steps"][0]["duration_ms"] >= 0

    human = _cli(database_url, schema, "workflows", "show", "cli-1")
    assert human.exit_code == 0 and "greet" in human.output and "succeeded" in human.output
    table = _cli(database_url, schema, "workflows", "list")
    assert table.exit_code == 0 and "cli-1" in table.output

    cancelled = _cli(database_url, schema, "workflows", "cancel", "cli-2", "--json")
    assert json.loads(cancelled.output) == {"id": "cli-2", "cancelled": True}
    assert app.get("cli-2").status == "cancelled"  # type: ignore[union-attr]
    again = _cli(database_url, schema, "workflows", "cancel", "cli-2")
    assert again.exit_code == 1

    resumed = _cli(database_url, schema, "workflows", "resume", "cli-2", "--json")
    assert json.loads(resumed.output) == {"id": "cli-2", "resumed": True}
    assert app.handle("cli-2").result(timeout=WAIT) == "hello bob"  # resume also clears the delay

    missing = _cli(database_url, schema, "workflows", "show", "nope")
    assert missing.exit_code == 1


def test_cli_workers_lists_live_workers_and_unrunnable_work(app: pgdurable.App, database_url: str,
                                                            schema: str,
                                                            start_worker: Callable[..., Any]) -> None:
    @app.workflow()
    def known() -> None:
        pass

    runner = start_worker(app)
    app.enqueue(known).result(timeout=WAIT)
    app.enqueue("typo_workflow", workflow_id="lost-1")
    shown = json.loads(_cli(database_url, schema, "workers", "--json").output)
    assert [w["id"] for w in shown["workers"]] == [runner.worker.id]
    assert shown["workers"][0]["workflows"] == ["known"] and shown["workers"][0]["alive"] is True
    assert shown["unrunnable"] == [{"id": "lost-1", "name": "typo_workflow", "queue": "default",
                                    "reason": "no live worker on queue default knows workflow typo_workflow"}]


def test_cli_migrate(database_url: str, schema: str) -> None:
    first = _cli(database_url, schema, "migrate")
    assert first.exit_code == 0 and "applied" in first.output
    second = _cli(database_url, schema, "migrate")
    assert "already up to date" in second.output


def test_a_schema_newer_than_the_code_is_refused(database_url: str, schema: str) -> None:
    migrate(database_url, schema)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("INSERT INTO {}.schema_migrations (version, name) VALUES (9999, 'from_the_future')")
                     .format(sql.Identifier(schema)))
    with pytest.raises(pgdurable.ConfigurationError, match=r"version 9999.*Upgrade pgdurable"):
        migrate(database_url, schema)
    app = pgdurable.App(database_url, schema=schema)
    try:
        with pytest.raises(pgdurable.ConfigurationError, match="newer pgdurable"):
            app.list_workflows()
    finally:
        app.close()
