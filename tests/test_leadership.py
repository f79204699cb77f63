"""Leadership: of the workers on one schema, exactly one (elected with a session advisory lock) runs the
leader-only maintenance duties; when it stops, dies or loses its session another takes over, and expired
leases are still swept."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

import pgdurable
from tests.apps import crashy
from tests.conftest import ThreadWorker
from tests.harness import WorkerHarness, wait_for

LEADER_LOCK = """
SELECT pid FROM pg_locks
WHERE locktype = 'advisory' AND objsubid = 1 AND granted
  AND ((classid::bigint << 32) | objid::bigint) = hashtextextended('pgdurable leader ' || %s, 0)"""


def lock_holders(db: psycopg.Connection[Any], schema: str) -> list[int]:
    """Server process ids of the sessions holding the schema's leader lock."""
    return [row[0] for row in db.execute(LEADER_LOCK, (schema,)).fetchall()]


def leader_duty_passes(runner: ThreadWorker) -> int:
    return sum(duty.passes for duty in runner.worker.leadership.duties)


def test_one_leader_runs_the_leader_duties(app: pgdurable.App, start_worker: Callable[..., ThreadWorker],
                                           db: psycopg.Connection[Any], schema: str) -> None:
    @app.workflow()
    def noop() -> None:
        return None

    workers = [start_worker(app), start_worker(app)]
    wait_for(lambda: any(w.worker.is_leader for w in workers), 10, "a leader")
    leader = next(w for w in workers if w.worker.is_leader)
    follower = next(w for w in workers if w is not leader)
    # Several sweep intervals (0.3 s) and poll intervals (0.5 s): the leader sweeps, the other never does.
    enabled = [duty for duty in leader.worker.leadership.duties if duty.enabled]
    wait_for(lambda: leader_duty_passes(leader) >= 5 * len(enabled), 10,
             "the leader to run its duties")
    for _ in range(20):
        assert [w.worker.is_leader for w in workers].count(True) == 1
        assert len(lock_holders(db, schema)) == 1
        time.sleep(0.05)
    assert leader.worker.leadership.elections == 1
    assert follower.worker.leadership.elections == 0 and leader_duty_passes(follower) == 0
    # Every worker still runs its own timer and policy refresh.
    wait_for(lambda: follower.worker.policy_refresh.passes >= 2, 10, "the follower's policy refresh")

    # A graceful stop releases the lock: the other takes over within a poll interval or so.
    leader.stop()
    wait_for(lambda: follower.worker.is_leader, 5, "the follower to become the leader")
    wait_for(lambda: leader_duty_passes(follower) >= 1, 5, "the new leader to run its duties")
    assert len(lock_holders(db, schema)) == 1


def test_leader_that_loses_its_session_resigns_and_leadership_comes_back(
        app: pgdurable.App, start_worker: Callable[..., ThreadWorker], db: psycopg.Connection[Any],
        schema: str) -> None:
    runner = start_worker(app)
    wait_for(lambda: runner.worker.is_leader, 10, "the only worker to lead")
    [backend] = lock_holders(db, schema)
    db.execute("SELECT pg_terminate_backend(%s)", (backend,))
    # It notices at its next check (resigning), then campaigns again on a new session and wins.
    wait_for(lambda: runner.worker.leadership.elections == 2 and runner.worker.is_leader, 10,
             "the worker to be elected again")
    assert lock_holders(db, schema) not in ([], [backend])


# -- real processes ------------------------------------------------------------------------------------------

@pytest.fixture
def h(spawn_worker: Callable[..., subprocess.Popen[bytes]], make_app: Callable[..., pgdurable.App],
      database_url: str, schema: str, tmp_path: Path) -> Iterator[WorkerHarness]:
    client = make_app()
    wf = crashy.define(client)
    client.migrate()
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        yield WorkerHarness(spawn_worker, "tests.apps.crashy:app", tmp_path, conn, client, wf)


def test_killed_leader_hands_over_and_its_expired_lease_is_swept(h: WorkerHarness, schema: str,
                                                                 tmp_path: Path) -> None:
    effects = str(tmp_path / "effects.log")
    # The first worker runs its steps 20 times slower (8 s each), so the workflow is still on it when it is
    # killed however long the second worker takes to start on a loaded machine, and holds a 6 s lease, which
    # cannot lapse before the kill: the survivor's sweep is what this test is about.
    first = h.start(("-c", "2"), {"CRASHY_EFFECTS": effects, "CRASHY_LEASE": "6.0", "CRASHY_SLOW": "20"},
                    wait=True)
    wait_for(lambda: "elected leader" in h.log(first), 15, "the first worker to lead")
    wid = h.client.enqueue(h.wf.chain, steps=6, seconds=0.4).workflow_id
    wait_for(lambda: (e := h.execution(wid))["status"] == "running" and e["attempt"] == 1, 15,
             "the leader to claim the workflow")
    assert h.execution(wid)["owner_id"].split(":")[1] == str(first.pid)

    second = h.start(("-c", "2"), {"CRASHY_EFFECTS": effects}, wait=True)
    time.sleep(1.0)  # three poll intervals: the follower keeps trying, and keeps losing
    assert "elected leader" not in h.log(second)
    assert len(lock_holders(h.db, schema)) == 1

    first.send_signal(signal.SIGKILL)
    first.wait(timeout=5)
    # The killed leader's session ends with it, and its lock: the follower is elected at its next try.
    wait_for(lambda: "elected leader" in h.log(second), 15, "the survivor to be elected leader")
    # As the leader it sweeps the dead worker's expired lease; the workflow then completes on it.
    h.wait_status(wid, {"succeeded"}, timeout=60)
    execution = h.execution(wid)
    assert execution["attempt"] == 2 and execution["recoveries"] == 1
    assert execution["output"]["pid"] == second.pid
    assert f"execution {wid}: lease expired, re-enqueued" in h.log(second)
    assert second.poll() is None


def test_paused_leader_is_deposed_and_resigns_when_it_resumes(h: WorkerHarness, schema: str) -> None:
    first = h.start(("-c", "2"), {}, wait=True)
    wait_for(lambda: "elected leader" in h.log(first), 15, "the first worker to lead")
    second = h.start(("-c", "2"), {}, wait=True)
    [paused_backend] = lock_holders(h.db, schema)
    first.send_signal(signal.SIGSTOP)
    try:
        # Its session idles past three poll intervals (0.9 s; at least 1 s): the server ends it, and the
        # lock with it, although the paused process never closed anything.
        wait_for(lambda: "elected leader" in h.log(second), 15, "the other worker to be elected")
        assert lock_holders(h.db, schema) not in ([], [paused_backend])
    finally:
        first.send_signal(signal.SIGCONT)
    wait_for(lambda: "no longer the leader" in h.log(first), 15, "the resumed worker to resign")
    time.sleep(1.0)
    assert len(lock_holders(h.db, schema)) == 1
    assert h.log(first).count("elected leader") == 1  # it campaigns again, and loses
    assert first.poll() is None and second.poll() is None
