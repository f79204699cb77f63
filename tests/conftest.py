"""Fixtures: a real PostgreSQL (PGDURABLE_TEST_DATABASE_URL, else the embedded server), a fresh schema per
test, apps with short timings, and in-process or subprocess workers."""

from __future__ import annotations

import asyncio
import inspect
import io
import os
import subprocess
import sys
import tempfile
import threading
import traceback
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import pytest_asyncio
from psycopg import sql
from psycopg.conninfo import make_conninfo

import pgdurable
from pgdurable.worker import Worker

REPO = Path(__file__).resolve().parent.parent
# Child processes import this checkout's package (a git worktree's too), then the tests' own modules.
CHILD_PYTHONPATH = f"{REPO / 'src'}{os.pathsep}{REPO}"

FAST = {"lease_seconds": 2.0, "poll_seconds": 0.5, "sweep_seconds": 0.3, "shutdown_grace_seconds": 2.0}


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    configured = os.environ.get("PGDURABLE_TEST_DATABASE_URL")
    if configured:
        yield configured
        return
    from pgdurable.embedded import embedded_database_url, release_embedded

    with tempfile.TemporaryDirectory(prefix="pgdurable-test-pg") as data_dir:
        yield embedded_database_url(Path(data_dir) / "pgdata")
        release_embedded(Path(data_dir) / "pgdata")  # stopped before its files are removed


@pytest.fixture
def schema(database_url: str) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture
def made_apps() -> list[pgdurable.App]:
    """The apps make_app made in this test."""
    return []


@pytest.fixture
def make_app(database_url: str, schema: str, made_apps: list[pgdurable.App]) -> Iterator[Callable[..., pgdurable.App]]:
    apps = made_apps

    def make(**overrides: Any) -> pgdurable.App:
        app = pgdurable.App(database_url, schema=schema, **{**FAST, **overrides})
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.close()


@pytest_asyncio.fixture
async def close_loop_pools(made_apps: list[pgdurable.App]) -> AsyncIterator[None]:
    """After an async test, close the pools its calls opened on its event loop, while the loop still runs
    (as pgdurable.testing does for users' tests), rather than leaving their tasks to the loop's shutdown."""
    yield
    for made in made_apps:
        await made.db.aclose_loop_pool()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if inspect.iscoroutinefunction(getattr(item, "function", None)) and isinstance(item, pytest.Function):
            item.fixturenames.append("close_loop_pools")


@pytest.fixture
def named_app(database_url: str, schema: str) -> Iterator[tuple[pgdurable.App, str]]:
    """An App whose every connection carries its own application_name, so a test can kill exactly those
    (tests.harness.terminate)."""
    name = f"pgdurable-test-{uuid.uuid4().hex[:8]}"
    app = pgdurable.App(make_conninfo(database_url, application_name=name), schema=schema, **FAST)
    yield app, name
    app.close()


@pytest.fixture
def app(make_app: Callable[..., pgdurable.App]) -> pgdurable.App:
    return make_app()


@pytest.fixture
def db(database_url: str, schema: str, app: pgdurable.App) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection on the test's schema (created by the app's migration)."""
    app.migrate()
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        yield conn


class ThreadWorker:
    """A Worker running on its own event loop in a thread of the test process."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.thread = threading.Thread(target=lambda: asyncio.run(worker.run()), daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.worker.stop_threadsafe()
        self.thread.join(timeout=60)  # generous: a loaded machine (see WAIT in tests/harness.py)
        assert not self.thread.is_alive(), f"worker did not stop:\n{self._where_it_hangs()}"

    def _where_it_hangs(self) -> str:
        """The worker thread's stack and its event loop's unfinished tasks: what a hang report needs."""
        lines: list[str] = []
        frame = sys._current_frames().get(self.thread.ident or -1)
        if frame is not None:
            lines += ["thread:", *traceback.format_stack(frame)]
        loop = self.worker.loop
        if loop is not None:
            for task in asyncio.all_tasks(loop):
                stack = io.StringIO()
                task.print_stack(file=stack)
                lines += [f"task {task.get_name()}:", stack.getvalue()]
        return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


@pytest.fixture
def start_worker() -> Iterator[Callable[..., ThreadWorker]]:
    started: list[ThreadWorker] = []

    def start(app: pgdurable.App, **options: Any) -> ThreadWorker:
        runner = ThreadWorker(app.worker(**options))
        started.append(runner)
        return runner

    yield start
    for runner in started:
        if runner.thread.is_alive():
            runner.stop()


@pytest.fixture
def spawn_worker(database_url: str, schema: str,
                 tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start ``pgdurable worker TARGET`` as a real process on this test's schema."""
    procs: list[subprocess.Popen[bytes]] = []

    def spawn(target: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = open(tmp_path / f"worker-{len(procs)}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, "-m", "pgdurable", "worker", target, *args],
            env={**os.environ, "PGDURABLE_DATABASE_URL": database_url, "PGDURABLE_SCHEMA": schema,
                 "PYTHONPATH": CHILD_PYTHONPATH, **(env or {})},
            stdout=log, stderr=subprocess.STDOUT)
        procs.append(proc)
        return proc

    yield spawn
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
