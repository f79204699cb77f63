"""``harness(app)``: run an application's workflows for real in a test, on a private schema, with a worker in
this process and (by default) a clock that skips the time nobody would spend waiting.

    with harness(app) as h:              # or: async with harness(app) as h:
        assert h.run(remind, "ann") == "reminded ann"  # sleeps three days, returns at once
        h.skip(3600)                                   # durable time moves an hour on

While the harness is open the application works on the private schema (every call of ``app``: enqueue,
handles, schedules, App.start), which is migrated first and dropped at exit with everything in it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from types import TracebackType
from typing import Any, TypeVar

import psycopg
from psycopg import sql

from ..app import App
from ..client import WorkflowHandle
from ..db import Database, configure
from ..embedded import embedded_database_url
from ..migrations import migrate
from ..redaction import check_database_url
from ..worker import Worker
from ..workflows import Workflow
from . import clock

R = TypeVar("R")

ENV_URL = "PGDURABLE_TEST_DATABASE_URL"
# How long h.run waits for a result, and the harness for its worker, before failing (a loaded CI machine
# must not turn a slow success into a failure).
DEFAULT_TIMEOUT = 60.0
# The worker's polls and the leader's sweeps: tests should not wait for the production intervals.
_QUICK = {"poll_seconds": 0.25, "sweep_seconds": 0.25}


def database_url_for_tests(database_url: str | None = None) -> str:
    """The database tests run on: the argument, else ``PGDURABLE_TEST_DATABASE_URL``, else the embedded
    PostgreSQL (started on first use)."""
    return database_url or os.environ.get(ENV_URL) or embedded_database_url()


class Harness:
    """An application running on a private test schema, with an in-process worker. Use ``harness(app)``."""

    def __init__(self, app: App, *, time_skipping: bool = True, database_url: str | None = None,
                 queues: list[str] | None = None, concurrency: int = 16, quick: bool = True) -> None:
        self.app = app
        self.time_skipping = time_skipping
        self.database_url = database_url
        self.queues = queues
        self.concurrency = concurrency
        self.quick = quick
        self.schema = f"pgdurable_test_{uuid.uuid4().hex[:12]}"
        self.worker: Worker | None = None
        self._conninfo = ""
        self._conn: psycopg.Connection[Any] | None = None  # the harness's own, for now() and skip()
        self._conn_lock = threading.Lock()
        self._db: Database | None = None
        self._restore: Callable[[], None] | None = None
        self._thread: threading.Thread | None = None
        self._skipper: clock.Skipper | None = None

    # -- what tests use -----------------------------------------------------------------------------------

    def now(self) -> datetime:
        """Durable time on the test schema (the time sleeps, deadlines and schedules follow)."""
        with self._conn_lock:
            return clock.now(self._own_conn())

    def skip(self, seconds: float) -> datetime:
        """Move durable time forward by ``seconds`` (never back) and wake what became due; returns the new
        time. Works with ``time_skipping`` off too. Leases are not moved: a running execution goes on."""
        with self._conn_lock:
            return clock.advance(self._own_conn(), seconds)

    def run(self, workflow: Workflow[..., R], *args: Any, timeout: float = DEFAULT_TIMEOUT, **kwargs: Any) -> R:
        """Enqueue ``workflow`` and return its result (or raise its failure)."""
        return self.app.enqueue(workflow, *args, **kwargs).result(timeout=timeout)

    async def run_async(self, workflow: Workflow[..., R], *args: Any, timeout: float = DEFAULT_TIMEOUT,
                        **kwargs: Any) -> R:
        handle: WorkflowHandle[R] = await self.app.enqueue_async(workflow, *args, **kwargs)
        return await handle.result_async(timeout=timeout)

    def pause_skipping(self) -> None:
        """Stop the automatic skips (until ``resume_skipping``), to act on a workflow while it waits."""
        if self._skipper is not None:
            self._skipper.paused.set()

    def resume_skipping(self) -> None:
        if self._skipper is not None:
            self._skipper.paused.clear()

    @property
    def skips(self) -> int:
        """How many times the clock jumped by itself."""
        return self._skipper.skips if self._skipper is not None else 0

    # -- life cycle ---------------------------------------------------------------------------------------

    def open(self) -> Harness:
        self._conninfo = check_database_url(database_url_for_tests(self.database_url))
        migrate(self._conninfo, self.schema)
        try:
            self._conn = psycopg.connect(self._conninfo, autocommit=True)
            configure(self._conn, self.schema)
            clock.enable(self._conn)
            conninfo = self._conninfo
            self._db = Database(lambda: conninfo, self.schema)
            settings = self.app.settings
            if self.quick:
                settings = dataclasses.replace(settings, **{name: min(getattr(settings, name), value)
                                                            for name, value in _QUICK.items()})
            self._restore = self.app.runtime.use_database(self._db, settings)
            self.worker = Worker(self.app.runtime, queues=self.queues, concurrency=self.concurrency)
            self._start_worker(self.worker)
            if self.time_skipping:
                self._skipper = clock.Skipper(self._conninfo, self.schema)
                self._skipper.start()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Stop the worker and the skipper, give the application its own database back, drop the schema."""
        try:
            if self._skipper is not None:
                self._skipper.stop()
                self._skipper = None
            if self.worker is not None and self._thread is not None:
                self.worker.stop_threadsafe()
                self._thread.join(timeout=self.app.settings.shutdown_grace_seconds + DEFAULT_TIMEOUT)
            self.worker = self._thread = None
            if self._restore is not None:
                self.app.close()  # App.start's runtime and the test database's pools
                self._restore()
                self._restore = None
        finally:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            if self._conninfo:
                with psycopg.connect(self._conninfo, autocommit=True) as conn:
                    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(self.schema)))

    def __enter__(self) -> Harness:
        return self.open()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    async def __aenter__(self) -> Harness:
        return await asyncio.to_thread(self.open)

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self._db is not None:
            await self._db.aclose_loop_pool()  # this event loop's pools, opened by the test's async calls
        await asyncio.to_thread(self.close)

    # -- inside -------------------------------------------------------------------------------------------

    def _start_worker(self, worker: Worker) -> None:
        """Run the worker on its own event loop in a thread; return once it has registered."""
        failure: list[BaseException] = []

        def thread_main() -> None:
            try:
                asyncio.run(worker.run())
            except BaseException as exc:
                failure.append(exc)

        self._thread = threading.Thread(target=thread_main, name=f"pgdurable-harness:{self.schema}", daemon=True)
        self._thread.start()
        conn = self._own_conn()
        deadline = time.monotonic() + DEFAULT_TIMEOUT
        while not conn.execute("SELECT count(*) FROM workers WHERE id = %s", (worker.id,)).fetchall()[0][0]:
            if not self._thread.is_alive():
                cause = failure[0] if failure else None
                raise RuntimeError(f"the harness's worker failed to start: {cause}") from cause
            if time.monotonic() > deadline:
                raise TimeoutError(f"the harness's worker did not start within {DEFAULT_TIMEOUT:.0f} s")
            time.sleep(0.01)

    def _own_conn(self) -> psycopg.Connection[Any]:
        if self._conn is None:
            raise RuntimeError("the harness is not open: use `with harness(app) as h:`")
        return self._conn


def harness(app: App, *, time_skipping: bool = True, database_url: str | None = None,
            queues: list[str] | None = None, concurrency: int = 16, quick: bool = True) -> Harness:
    """Run ``app`` on a private schema of the test database with a worker in this process, as a context
    manager, sync (``with``) or async (``async with``).

    ``time_skipping``: whenever every unfinished execution waits on a timer (a durable sleep, a delayed
    start, a schedule's next tick, a deadline), durable time jumps to the earliest one. ``database_url``:
    else ``PGDURABLE_TEST_DATABASE_URL``, else the embedded PostgreSQL. ``queues``/``concurrency``: the
    worker's. ``quick``: poll and sweep every 0.25 s at most, not at the application's production pace.
    """
    return Harness(app, time_skipping=time_skipping, database_url=database_url, queues=queues,
                   concurrency=concurrency, quick=quick)
