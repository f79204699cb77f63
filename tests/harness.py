"""What the real-process tests share: polling with a deadline, and a harness that starts `pgdurable worker`
processes on the test's schema and queries that schema."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from psycopg import sql

import pgdurable

# How long a test waits for something that must happen. Generous on purpose: every wait returns as soon as its
# condition holds, so only a failing test waits this long, and a loaded machine (CI beside other work) must not
# turn a slow success into a failure.
WAIT = 60.0


def terminate(database_url: str, application_name: str) -> int:
    """pg_terminate_backend every connection with this application_name (as a restart or an idle timeout
    would end them); how many there were."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                           "WHERE application_name = %s", (application_name,)).fetchone()
    return int(row[0]) if row else 0


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.02) -> Any:
    """Poll until ``predicate()`` is truthy; return its value, or fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.1f}s waiting for {what}")
        time.sleep(interval)


def wait_listening(app: pgdurable.App, workers: int = 1) -> None:
    """Wait until ``workers`` workers of ``app``'s schema have committed their LISTEN: a test that proves a
    NOTIFY wakes a worker (with hourly polls) enqueues only then, so that what wakes the worker is that NOTIFY,
    not the one look it takes when it starts listening."""
    statement = f'LISTEN "{app.schema}_work";%'
    with psycopg.connect(app.db.conninfo, autocommit=True) as conn:
        wait_for(lambda: conn.execute("SELECT count(*) FROM pg_stat_activity WHERE query LIKE %s AND state = 'idle'",
                                      (statement,)).fetchone() == (workers,),
                 WAIT, f"{workers} worker(s) to listen")


def execute(app: pgdurable.App, statement: str, *params: Any) -> list[tuple[Any, ...]]:
    """Run SQL on the app's schema (tests simulate crashes and inspect state this way)."""
    app.db.ensure_schema()
    with psycopg.connect(app.db.conninfo, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(app.schema)))
        cur = conn.execute(statement.encode(), params)
        return cur.fetchall() if cur.description else []


def execution(app: pgdurable.App, workflow_id: str) -> Any:
    """The execution's row (store.executions.Execution); fails the test if there is none."""
    found = app.get(workflow_id)
    assert found is not None, f"no execution {workflow_id}"
    return found


class WorkerHarness:
    """Starts workers serving ``target`` (via the ``spawn_worker`` fixture) and queries the engine schema
    (``db`` has it on its search_path)."""

    def __init__(self, spawn_worker: Callable[..., subprocess.Popen[bytes]], target: str, tmp_path: Path,
                 db: psycopg.Connection[Any], client: pgdurable.App, wf: SimpleNamespace) -> None:
        self._spawn = spawn_worker
        self.target = target
        self.tmp_path = tmp_path
        self.db = db
        self.client = client
        self.wf = wf
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, args: tuple[str, ...], env: dict[str, str], wait: bool) -> subprocess.Popen[bytes]:
        proc = self._spawn(self.target, *(args or ("-c", "4")), env=env)
        self.procs.append(proc)
        if wait:
            self.wait_registered(proc)
        return proc

    def wait_registered(self, proc: subprocess.Popen[bytes], timeout: float = WAIT) -> None:
        def registered() -> bool:
            if proc.poll() is not None:
                pytest.fail(f"worker {proc.pid} exited with {proc.returncode} before registering:\n"
                            + self.log(proc))
            return bool(self.scalar("SELECT count(*) FROM workers WHERE pid = %s", (proc.pid,)))
        wait_for(registered, timeout, f"worker {proc.pid} to register")

    def log(self, proc: subprocess.Popen[bytes]) -> str:
        # the spawn_worker fixture names each worker's log by its order of start
        return (self.tmp_path / f"worker-{self.procs.index(proc)}.log").read_text(errors="replace")

    def rows(self, query: str | sql.Composable, params: Any = ()) -> list[tuple[Any, ...]]:
        return self.db.execute(query, params).fetchall()

    def scalar(self, query: str | sql.Composable, params: Any = ()) -> Any:
        row = self.db.execute(query, params).fetchone()
        return row[0] if row else None

    def execution(self, workflow_id: str) -> dict[str, Any]:
        cur = self.db.execute("SELECT * FROM workflow_executions WHERE id = %s", (workflow_id,))
        row = cur.fetchone()
        assert row is not None, f"no execution {workflow_id}"
        assert cur.description is not None
        return {column.name: value for column, value in zip(cur.description, row, strict=True)}

    def status(self, workflow_id: str) -> str:
        return str(self.scalar("SELECT status FROM workflow_executions WHERE id = %s", (workflow_id,)))

    def wait_status(self, workflow_id: str, statuses: set[str], timeout: float) -> str:
        return str(wait_for(lambda: (s := self.status(workflow_id)) in statuses and s, timeout,
                            f"{workflow_id} to reach {sorted(statuses)} (is {self.status(workflow_id)})"))
