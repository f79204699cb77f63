"""The first hour of a newcomer (issue #15, items 1-7), against a real PostgreSQL and real processes: each test
is what the newcomer did, and what must happen instead of what did."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from typer.testing import CliRunner

import pgdurable
from pgdurable import store
from pgdurable.cli import cli

from .conftest import CHILD_PYTHONPATH, REPO
from .harness import WAIT, wait_for

SECRET = "S3cretPw"


def _pgdurable(*args: str, env: dict[str, str] | None = None, timeout: float = 2 * WAIT) -> Any:
    """``python -m pgdurable ARGS`` as a real process, from the repository (tests.apps importable)."""
    base = {k: v for k, v in os.environ.items() if k not in ("PGDURABLE_DATABASE_URL", "DATABASE_URL")}
    return subprocess.run([sys.executable, "-m", "pgdurable", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**base, "PYTHONPATH": CHILD_PYTHONPATH, "COLUMNS": "200",
                                                **(env or {})})


# ---- 1. enqueue on the caller's connection, on a fresh database --------------------------------------------

def test_enqueue_on_the_callers_connection_migrates_a_fresh_schema_first(
        make_app: Callable[..., pgdurable.App], database_url: str, start_worker: Callable[..., Any]) -> None:
    app = make_app()

    @app.workflow()
    def double(n: int) -> int:
        return 2 * n

    with psycopg.connect(database_url) as conn:
        conn.execute("SELECT 1")  # the caller's transaction is open
        handle = app.enqueue(double, 21, conn=conn)
        sent = app.send(handle.workflow_id, "hello", conn=conn)
        conn.commit()
    assert sent
    start_worker(app)
    assert handle.result(timeout=WAIT) == 42


async def test_enqueue_async_on_the_callers_connection_migrates_a_fresh_schema_first(
        make_app: Callable[..., pgdurable.App], database_url: str) -> None:
    app = make_app()

    @app.workflow()
    def double(n: int) -> int:
        return 2 * n

    try:
        async with await psycopg.AsyncConnection.connect(database_url) as conn:
            await conn.execute("SELECT 1")
            handle = await app.enqueue_async(double, 4, conn=conn)
            await conn.commit()
        execution = await app.get_async(handle.workflow_id)
        assert execution is not None and execution.status == "enqueued"
    finally:
        await app.db.aclose_loop_pool()  # this loop's pool, before the loop ends


def test_a_schema_that_was_never_migrated_says_what_to_run(database_url: str, schema: str) -> None:
    app = pgdurable.App(database_url, schema=schema, auto_migrate=False)
    hint = f"run `pgdurable migrate --schema {schema}`"
    try:
        with pytest.raises(pgdurable.SchemaNotInstalled, match=hint):
            app.get("anything")
        with psycopg.connect(database_url) as conn, pytest.raises(pgdurable.SchemaNotInstalled, match=hint):
            app.enqueue("anything", conn=conn, x=1)
    finally:
        app.close()
    done = _pgdurable("cleanup", "--older-than", "1d", "--database-url", database_url, "--schema", schema)
    assert done.returncode == 2, done
    assert hint in done.stderr and "Traceback" not in done.stderr + done.stdout, done


def test_a_worker_that_does_not_migrate_says_what_to_run(database_url: str, schema: str) -> None:
    done = _pgdurable("worker", "tests.apps.no_migrate:app", "--wait-for-db", "5",
                      env={"PGDURABLE_DATABASE_URL": database_url, "PGDURABLE_SCHEMA": schema})
    assert done.returncode == 2, done
    assert f"pgdurable migrate --schema {schema}" in done.stderr and "Traceback" not in done.stderr, done


# ---- 2. the database URL -------------------------------------------------------------------------------------

def test_the_cli_prints_the_database_url(database_url: str, schema: str) -> None:
    url = make_conninfo(database_url)
    done = _pgdurable("database-url", "--database-url", url)
    assert done.returncode == 0 and done.stdout.strip() == url, done
    done = _pgdurable("database-url", "tests.apps.tenants:app", "--json",
                      env={"PGDURABLE_DATABASE_URL": url, "PGDURABLE_SCHEMA": schema})
    assert done.returncode == 0, done
    assert json.loads(done.stdout) == {"database_url": url, "schema": schema, "embedded": False}


# ---- 3. queues a worker serves, and waiting on work nobody serves ------------------------------------------

def test_a_worker_without_queue_serves_every_queue_its_app_declares(
        make_app: Callable[..., pgdurable.App], spawn_worker: Callable[..., Any]) -> None:
    client = make_app()
    client.migrate()
    spawn_worker("tests.apps.tenants:app")  # no --queue
    tenants = client.enqueue("greet", queue="tenants", name="acme")  # app.queue("tenants", ...)
    reports = client.enqueue("report", queue="reports", n=21)  # @app.workflow(queue="reports")
    plain = client.enqueue("greet", name="default")
    assert tenants.result(timeout=WAIT) == "hello acme"
    assert reports.result(timeout=WAIT) == 42
    assert plain.result(timeout=WAIT) == "hello default"


def test_waiting_on_work_no_live_worker_serves_says_so(
        make_app: Callable[..., pgdurable.App], start_worker: Callable[..., Any]) -> None:
    app = make_app()

    @app.workflow()
    def noop() -> None:
        return None

    handle = app.enqueue(noop, queue="tenants")
    with pytest.raises(pgdurable.ResultTimeout, match="no live worker serves queue 'tenants'"):
        handle.result(timeout=0.5)
    other = make_app()  # a worker of another app on the queue, which does not know the workflow
    other.queue("tenants")

    @other.workflow()
    def unrelated() -> None:
        return None

    runner = start_worker(other)
    wait_for(lambda: runner.worker._started.is_set(), WAIT, "the other app's worker to start")
    with pytest.raises(pgdurable.ResultTimeout, match="no live worker on queue 'tenants' knows workflow 'noop'"):
        handle.result(timeout=0.5)


# ---- 4. every client call has an async form ------------------------------------------------------------------

async def test_every_client_call_works_in_its_async_form(
        make_app: Callable[..., pgdurable.App], start_worker: Callable[..., Any]) -> None:
    app = make_app()

    @app.step()
    def add(a: int, b: int) -> int:
        return a + b

    @app.workflow()
    def leaf(n: int) -> int:
        return n * 10

    @app.workflow()
    def flow(n: int) -> int:
        first = add(n, 1)
        pgdurable.set_event("first", first)
        child = app.enqueue(leaf, first)
        message = pgdurable.recv("go", timeout=WAIT)
        return int(child.result()) + int(message)

    start_worker(app)
    try:
        await _every_call_async(app, flow, leaf)
    finally:
        await app.db.aclose_loop_pool()  # this loop's pool, before the loop ends


async def _every_call_async(app: pgdurable.App, flow: Any, leaf: Any) -> None:
    handle = await app.enqueue_async(flow, 1)
    assert await app.send_async(handle.workflow_id, 5, topic="go")
    assert await handle.result_async(timeout=WAIT) == 25
    workflow_id = handle.workflow_id

    execution = await app.get_async(workflow_id)
    assert execution is not None and execution.status == "succeeded"
    assert await app.steps_async(workflow_id) == app.steps(workflow_id) != []
    assert [e.id for e in await app.list_workflows_async(name="flow")] == [workflow_id]
    assert [c[1] for c in await app.children_async(workflow_id)] == ["leaf"]
    assert [(e.key, e.value) for e in await app.events_async(workflow_id)] == [("first", 2)]
    assert [m.message for m in await app.messages_async(workflow_id)] == [5]

    forked = await app.fork_async(workflow_id, 1)
    await app.send_async(forked.workflow_id, 7, topic="go")
    assert await forked.result_async(timeout=WAIT) == 27
    with pytest.raises(ValueError, match="recorded steps"):
        await app.fork_async(workflow_id, 99)

    parked = await app.enqueue_async(leaf, 1, queue="parked")  # no worker serves it
    assert await parked.cancel_async()
    assert await app.resume_async(parked.workflow_id)
    assert await parked.status_async() == "enqueued"

    started = await app.start_async(leaf, 4)
    assert await started.result_async(timeout=WAIT) == 40

    app.queue("limited", concurrency=1)
    await app.apply_queue_policies_async()
    assert "limited" in await app.db.arun(store.queues.queue_policies(None))

    schedule = await app.schedule_async("nightly", leaf, "@daily", args={"n": 1})
    assert schedule.name == "nightly"
    assert (await app.get_schedule_async("nightly")) is not None
    assert [s.name for s in await app.list_schedules_async()] == ["nightly"]
    assert await app.pause_schedule_async("nightly")
    assert await app.resume_schedule_async("nightly")
    assert await app.unschedule_async("nightly")
    assert await app.get_schedule_async("nightly") is None

    assert await app.cleanup_async(3600) == 0
    assert await app.migrate_async() == []
    assert [v.app_version for v in await app.versions_async()] == [app.version]
    assert await app.migrate_version_async("no-such-version", app.version) == 0
    assert await app.bindings_async() == [] and await app.restore_bindings_async() == []
    assert await app.unbind_table_async("no-such-binding") is False


# ---- 5. arguments are checked at enqueue ---------------------------------------------------------------------

def test_wrong_argument_types_are_refused_at_enqueue_and_nothing_is_inserted(app: pgdurable.App) -> None:
    @app.workflow()
    def add(x: int, y: int) -> int:
        return x + y

    with pytest.raises(TypeError, match=r"workflow 'add': argument 'x' must be int, got str 'abc'"):
        app.enqueue(add, "abc", 1)
    with pytest.raises(TypeError, match=r"enqueue_many item 1: workflow 'add': argument 'y' must be int"):
        app.enqueue_many(add, [(1, 2), (1, "x"), (3, 4)])
    with pytest.raises(TypeError, match=r"argument 'y' must be int, got set"):
        app.start(add, 1, {2})
    assert app.list_workflows() == []
    assert app.enqueue(add, 1, 2).workflow_id  # and the right types go in


# ---- 6. one line, exit 2, for what the command line cannot use -----------------------------------------------

def _unreachable() -> str:
    return f"postgresql://postgres:{SECRET}@127.0.0.1:1/shop?connect_timeout=3"


@pytest.mark.parametrize(("args", "url", "says"), [
    (["worker", "nosuchmod:app"], None, "no module named 'nosuchmod'"),
    (["worker", "tests.apps.tenants:greet"], None, "is not a pgdurable.App (found a Workflow)"),
    (["workflows", "list"], f"mysql://root:{SECRET}@db/shop", "its scheme is 'mysql'"),
    (["worker", "tests.apps.tenants:app"], f"mysql://root:{SECRET}@db/shop", "its scheme is 'mysql'"),
    (["worker", "tests.apps.tenants:app"], f"app:{SECRET}@localhost/shop", "it has no scheme"),
    (["migrate"], f"localhost:5432/shop?password={SECRET}", "it has no scheme"),
    (["workflows", "list"], "missing-database", 'database "pgdurable_no_such_db" does not exist'),
    (["worker", "tests.apps.tenants:app", "--wait-for-db", "30"], "missing-database", "createdb"),
    (["workflows", "list"], "unreachable", "cannot reach a PostgreSQL server at 127.0.0.1:1"),
    (["migrate"], "unreachable", "cannot reach a PostgreSQL server at 127.0.0.1:1"),
    (["worker", "tests.apps.tenants:app", "--wait-for-db", "1"], "unreachable", "at 127.0.0.1:1"),
])
def test_command_line_errors_are_one_line_on_stderr_with_exit_code_2(
        args: list[str], url: str | None, says: str, database_url: str, schema: str) -> None:
    if url == "missing-database":
        url = make_conninfo(database_url, dbname="pgdurable_no_such_db", password=SECRET)
    elif url == "unreachable":
        url = _unreachable()
    env = {"PGDURABLE_SCHEMA": schema, **({"PGDURABLE_DATABASE_URL": url} if url else {})}
    done = _pgdurable(*args, env=env)
    errors = [line for line in done.stderr.splitlines() if not line.startswith("20")]  # not the retry logs
    assert done.returncode == 2, done
    assert len(errors) == 1 and errors[0].startswith("pgdurable: ") and says in errors[0], done
    assert "Traceback" not in done.stdout + done.stderr and SECRET not in done.stdout + done.stderr, done


# ---- 7. small things -----------------------------------------------------------------------------------------

def test_help_shows_the_metrics_extra_and_no_bool_on_flags() -> None:
    done = _pgdurable("worker", "--help")
    assert "pgdurable[metrics]" in done.stdout, done.stdout
    runner = CliRunner()
    commands = [["worker"], ["migrate"], ["database-url"], ["workers"], ["status"], ["cleanup"], ["dashboard"],
                ["demo"], ["workflows", "list"], ["workflows", "show"], ["workflows", "fork"], ["workflows", "send"],
                ["workflows", "cancel"], ["workflows", "resume"], ["queues", "list"], ["queues", "set"],
                ["schedules", "list"], ["versions"], ["bindings", "list"], ["workflows"], []]
    for command in commands:
        shown = runner.invoke(cli, [*command, "--help"], terminal_width=200)
        assert shown.exit_code == 0, (command, shown.output)
        assert "<bool>" not in shown.output, (command, shown.output)


def test_optional_submodules_load_on_first_use() -> None:
    done = subprocess.run([sys.executable, "-c", (
        "import sys, pgdurable\n"
        "assert 'prometheus_client' not in sys.modules, 'import pgdurable imported prometheus'\n"
        "print(pgdurable.metrics.PrometheusMetrics.__name__)")],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": CHILD_PYTHONPATH}, timeout=WAIT)
    assert done.returncode == 0 and done.stdout.strip() == "PrometheusMetrics", done


def test_a_finished_execution_shows_no_wait_reason(
        app: pgdurable.App, start_worker: Callable[..., Any], database_url: str, schema: str) -> None:
    @app.workflow()
    def waits() -> str:
        return str(pgdurable.recv("go", timeout=WAIT))

    start_worker(app)
    handle = app.enqueue(waits)
    wait_for(lambda: (e := app.get(handle.workflow_id)) is not None and e.wait_reason == "recv:go", WAIT,
             "the workflow to wait for its message")
    app.send(handle.workflow_id, "now", topic="go")
    assert handle.result(timeout=WAIT) == "now"
    execution = app.get(handle.workflow_id)
    assert execution is not None and execution.status == "succeeded" and execution.wait_reason is None
    shown = CliRunner().invoke(cli, ["workflows", "show", handle.workflow_id, "--database-url", database_url,
                                     "--schema", schema], terminal_width=200)
    assert "succeeded" in shown.output and "recv:go" not in shown.output, shown.output


def test_workers_whose_heartbeats_stopped_are_listed_dead(
        app: pgdurable.App, db: psycopg.Connection[Any], database_url: str, schema: str,
        spawn_worker: Callable[..., Any]) -> None:
    for worker_id, lease in (("short-lease", 1.0), ("long-lease", 30.0), ("older-version", None)):
        app.db.run(store.workers.register_worker(id=worker_id, hostname="h", pid=1, queues=["default"], workflows=[],
                                                 concurrency=1, version="v", lease=lease))
    db.execute("UPDATE workers SET heartbeat_at = now() - interval '5 seconds' WHERE id <> 'older-version'")
    db.execute("UPDATE workers SET heartbeat_at = now() - interval '90 seconds' WHERE id = 'older-version'")

    def alive() -> dict[str, bool]:
        shown = CliRunner().invoke(cli, ["workers", "--json", "--database-url", database_url, "--schema", schema])
        assert shown.exit_code == 0, shown.output
        return {w["id"]: w["alive"] for w in json.loads(shown.stdout)["workers"]}

    assert alive() == {"short-lease": False, "long-lease": True, "older-version": True}
    # A real worker, SIGKILLed: listed live while it heartbeats, dead within two leases of its last heartbeat.
    worker = spawn_worker("tests.apps.crashy:app", env={"CRASHY_LEASE": "1.0"})
    live = wait_for(lambda: [i for i, a in alive().items() if a and i.split(":")[1:2] == [str(worker.pid)]], WAIT,
                    "the worker to register")
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    wait_for(lambda: alive()[live[0]] is False, WAIT, "the killed worker to be listed dead")


def test_fork_refuses_a_step_past_the_recorded_ones(
        app: pgdurable.App, start_worker: Callable[..., Any], database_url: str, schema: str) -> None:
    @app.step()
    def one(n: int) -> int:
        return n + 1

    @app.workflow()
    def three_steps(n: int) -> int:
        return one(one(one(n)))

    start_worker(app)
    handle = app.enqueue(three_steps, 0)
    assert handle.result(timeout=WAIT) == 3
    with pytest.raises(ValueError, match="it has 3 recorded steps"):
        app.fork(handle.workflow_id, 9)
    assert app.fork(handle.workflow_id, 3).result(timeout=WAIT) == 3  # every step reused
    with pytest.raises(pgdurable.WorkflowNotFound):
        app.fork("no-such-execution", 0)
    done = _pgdurable("workflows", "fork", handle.workflow_id, "--from-step", "9", "--database-url", database_url,
                      "--schema", schema)
    assert done.returncode == 2 and "it has 3 recorded steps" in done.stderr, done


@pytest.mark.skipif(sys.platform == "win32", reason="the embedded server's unix socket")
def test_the_embedded_server_stops_when_its_only_user_is_sigkilled() -> None:
    """A worker on the embedded server starts quietly (one line says where the data is), and the server it
    started does not outlive it when it is SIGKILLed: the watchdog stops it."""
    # Not under pytest's tmp_path: run as root, the embedded server runs as another user, and every pytest
    # process that starts (CI runs several side by side) makes /tmp/pytest-of-root private again, so that
    # user could lose its way to the data directory mid-test (pg_ctl: "Permission denied", once in CI).
    with tempfile.TemporaryDirectory(prefix="pgdurable-test-watch") as scratch:
        _embedded_server_stops_when_its_only_user_is_sigkilled(Path(scratch))


def _embedded_server_stops_when_its_only_user_is_sigkilled(tmp_path: Path) -> None:
    data = tmp_path / "pgdata"
    env = {k: v for k, v in os.environ.items() if k not in ("PGDURABLE_DATABASE_URL", "DATABASE_URL")}
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "pgdurable", "worker", "tests.apps.tenants:app"], cwd=REPO, stdout=out,
            stderr=subprocess.STDOUT,
            env={**env, "PGDURABLE_DATA_DIR": str(data), "PYTHONPATH": CHILD_PYTHONPATH,
                 "PGDURABLE_EMBEDDED_WATCH_SECONDS": "0.5"})
    try:
        try:
            wait_for(lambda: "worker " in log.read_text() and "queues" in log.read_text(), 3 * WAIT,
                     "the worker on the embedded server to start")
        except pytest.fail.Exception as exc:  # once in CI (embedded lane): say what the worker got to
            pytest.fail(f"{exc}; worker exit code {worker.poll()}, its log:\n{log.read_text(errors='replace')}")
        lines = log.read_text().splitlines()
        assert len(lines) <= 4, lines  # the data directory, the migration, the worker: not ~15 lines
        assert any(f"data in {data}" in line for line in lines), lines
        postmaster = int((data / "postmaster.pid").read_text().split()[0])
        worker.send_signal(signal.SIGKILL)
        worker.wait()

        def stopped() -> bool:
            try:
                os.kill(postmaster, 0)
            except ProcessLookupError:
                return True
            return False

        wait_for(stopped, 2 * WAIT, "the embedded server to stop after its only user was killed", interval=0.2)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        pidfile = data / "postmaster.pid"
        if pidfile.exists():  # leave no server behind, whatever happened (its own pid, from its pid file)
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pidfile.read_text().split()[0]), signal.SIGKILL)
