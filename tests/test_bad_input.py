"""Bad input gets a clear error, loses nothing, and never stops a worker."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql

import pgdurable
from tests.harness import WAIT

HOSTILE = ["'; DROP TABLE workflow_executions; --", "Robert'); DELETE FROM operation_outputs;--", "\\x00\u202e",
           "💥" * 50, "a\nb\tc"]


def count(app: pgdurable.App) -> int:
    with psycopg.connect(app.db.conninfo) as conn:
        row = conn.execute(sql.SQL("SELECT count(*) FROM {}.workflow_executions").format(
            sql.Identifier(app.schema))).fetchone()
    return int(row[0]) if row else -1


def test_oversized_payloads_fail_clearly_and_the_worker_goes_on(
        make_app: Callable[..., pgdurable.App], start_worker: Callable[..., Any]) -> None:
    app = make_app(max_payload_bytes=64 * 1024)

    @app.workflow()
    def takes(blob: str) -> int:
        return len(blob)

    @app.step()
    def huge_output() -> str:
        return "x" * 100_000

    @app.workflow()
    def makes_a_huge_step_output() -> str:
        return huge_output()

    @app.workflow()
    def returns_a_huge_result() -> str:
        return "y" * 100_000

    app.db.ensure_schema()
    with pytest.raises(pgdurable.SerializationError, match=r"argument .blob.*exceeds the limit"):
        app.enqueue(takes, "z" * 100_000)
    with pytest.raises(pgdurable.SerializationError, match="exceeds the limit"):
        app.enqueue_many(takes, [("ok",), ("z" * 100_000,)])
    assert count(app) == 0  # nothing stored

    start_worker(app)
    with pytest.raises(pgdurable.WorkflowFailed, match="exceeds the limit"):
        app.enqueue(makes_a_huge_step_output, workflow_id="big-step").result(timeout=WAIT)
    assert app.steps("big-step")[0].error is not None  # recorded as the step's error: replay agrees
    with pytest.raises(pgdurable.WorkflowFailed, match="exceeds the limit"):
        app.enqueue(returns_a_huge_result).result(timeout=WAIT)
    assert app.enqueue(takes, "fine").result(timeout=WAIT) == 4  # the worker goes on
    # A bulk enqueue whose statement is bigger than the limit is fine when each payload is within it.
    handles = app.enqueue_many(takes, [("w" * 1000,) for _ in range(200)])
    assert handles[-1].result(timeout=WAIT) == 1000


def test_a_50_mb_argument_is_refused_at_enqueue(app: pgdurable.App) -> None:
    @app.workflow()
    def upload(data: bytes) -> int:
        return len(data)

    with pytest.raises(pgdurable.SerializationError, match=r"exceeds the limit of 8\.0 MiB"):
        app.enqueue(upload, b"\x00" * (50 * 1024 * 1024))


def test_hostile_strings_are_data_not_sql(app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    @app.workflow()
    def echo(text: str) -> str:
        return text

    start_worker(app)
    for i, text in enumerate(HOSTILE):
        workflow_id = f"{text}-{i}"
        assert app.enqueue(echo, text, workflow_id=workflow_id).result(timeout=WAIT) == text
        assert app.get(workflow_id) is not None
    schema = sql.Identifier(app.schema)
    tables_sql = "SELECT array_agg(tablename ORDER BY tablename) FROM pg_tables WHERE schemaname = %s"
    with psycopg.connect(app.db.conninfo, autocommit=True) as conn:
        before = conn.execute(tables_sql, (app.schema,)).fetchone()
        for text in HOSTILE:
            with pytest.raises(psycopg.Error):  # not a valid queue name, whatever it tries
                conn.execute(sql.SQL("SELECT {}.enqueue_workflow('echo', '{{}}', queue => %s)").format(schema), (text,))
            # as a workflow name it is just a name: enqueued, visible as unrunnable, harmless
            conn.execute(sql.SQL("SELECT {}.enqueue_workflow(%s, '{{}}')").format(schema), (text,))
        for call, error in [("NULL, '{{}}'", "workflow_name must be"), ("'echo', NULL", "input must be a JSON object"),
                            ("'echo', '{{}}', queue => NULL", "not a valid queue name"),
                            ("'echo', '{{}}', priority => NULL", "priority must be given"),
                            ("'echo', '\"text\"'", "not string"), ("'echo', 'null'", "not null")]:
            with pytest.raises(psycopg.Error, match=error):
                conn.execute(sql.SQL("SELECT {}.enqueue_workflow(" + call + ")").format(schema))
        assert conn.execute(sql.SQL("SELECT * FROM {}.workflow_status(NULL)").format(schema)).fetchall() == []
        assert conn.execute(sql.SQL("SELECT {}.cancel_workflow(NULL)").format(schema)).fetchone() == (False,)
        tables = conn.execute(tables_sql, (app.schema,)).fetchone()
    assert before is not None and "workflow_executions" in before[0]
    assert tables == before  # every table of the engine's schema still there


def test_an_unreachable_database_gives_a_clear_error() -> None:
    app = pgdurable.App("postgresql://postgres@127.0.0.1:1/nowhere?connect_timeout=2", schema="t_unreachable")
    try:
        with pytest.raises(psycopg.OperationalError, match=r"127\.0\.0\.1"):
            app.enqueue("anything", x=1)
    finally:
        app.close()


def _run_worker(url: str, *args: str) -> Any:
    import os
    import subprocess
    import sys

    from tests.conftest import CHILD_PYTHONPATH

    return subprocess.run([sys.executable, "-m", "pgdurable", "worker", "tests.apps.crashy:app", *args],
                          env={**os.environ, "PGDURABLE_DATABASE_URL": url, "PYTHONPATH": CHILD_PYTHONPATH},
                          capture_output=True, text=True, timeout=2 * WAIT)


def test_a_worker_waits_for_a_database_that_is_down_then_says_so() -> None:
    import time

    started = time.monotonic()
    done = _run_worker("postgresql://postgres@127.0.0.1:1/nowhere?connect_timeout=1", "--wait-for-db", "3")
    assert done.returncode == 2
    assert "retrying in" in done.stderr  # it retried with backoff
    assert "did not answer within 3 s" in done.stderr and "127.0.0.1:1" in done.stderr  # names the server
    assert time.monotonic() - started < 2 * WAIT  # it gave up (after 3 s of retries), it did not wait forever


def test_a_worker_refuses_bad_credentials_at_once(database_url: str) -> None:
    from psycopg.conninfo import make_conninfo

    done = _run_worker(make_conninfo(database_url, user="no_such_role_pgdurable"), "--wait-for-db", "60")
    assert done.returncode == 2
    assert "refused these credentials" in done.stderr and "no_such_role_pgdurable" in done.stderr
    assert "retrying in" not in done.stderr
