"""Leadership: one worker per schema runs the maintenance duties that only add load when every worker runs
them (``maintenance.Duty.leader_only``).

As River does: each claiming worker keeps a dedicated session and tries ``pg_try_advisory_lock`` on a key
derived from the schema name every poll interval. The session that gets the lock is the leader until it
releases it (a graceful stop) or the session ends: a leader that crashes, is SIGKILLed or loses its
connection loses the lock with its session, and another worker takes it at its next try, within a poll
interval. The leader checks its session every poll interval and stops its duties as soon as the check
fails.

A leader whose process is paused (SIGSTOP, a frozen VM, a loop blocked for long) keeps a healthy TCP session,
so the server would never end it, and nothing would be swept until it resumed. So the leader's session sets
``idle_session_timeout``: its checks keep it busy every poll interval, and once they stop for three poll
intervals (at least 1 s) the server ends the session and the lock goes to another worker; the paused leader
finds its session gone when it resumes, and resigns. Short, because while a paused leader is not deposed
nobody sweeps: a crashed worker's executions would wait for that on top of their lease. Deposing a leader
that was only slow costs nothing but a new election. Two leaders can
therefore overlap for at most a poll interval (a session ended between two checks):
the duties are idempotent statements, so that wastes a little work and never breaks anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import psycopg

from .. import store
from ..db import Database
from ..waiting import cancel_and_wait
from .maintenance import Duty

log = logging.getLogger("pgdurable.worker")

_IDLE_SESSION_TIMEOUT_SQL = "SELECT set_config('idle_session_timeout', %s, false)"


class Leadership:
    """Campaigns for the schema's leadership and, while this worker holds it, runs the leader's duties."""

    def __init__(self, db: Database, worker_id: str, poll_seconds: float, duties: list[Duty],
                 stopping: Callable[[], bool] = lambda: False) -> None:
        self.db = db
        # A worker that is stopping neither campaigns nor keeps the lead: another worker takes over at once.
        self.stopping = stopping
        self.worker_id = worker_id
        self.poll_seconds = poll_seconds
        self.deposed_after = max(3 * poll_seconds, 1.0)  # silent this long, a leader's session is ended
        self.duties = duties
        self.is_leader = False
        self.elections = 0  # how many times this worker became the leader
        self._tasks: list[asyncio.Task[None]] = []

    async def run(self) -> None:
        schema = self.db.schema
        while True:
            conn: psycopg.AsyncConnection[Any] | None = None
            try:
                conn = await self.db.aconnect()
                await conn.execute(_IDLE_SESSION_TIMEOUT_SQL, (str(int(self.deposed_after * 1000)),))
                while True:
                    try:
                        if self.stopping():
                            return  # the finally below stops the duties and ends the session (and the lock)
                        if not self.is_leader:
                            if await store.arun(conn, store.workers.try_leadership(schema)):
                                self._lead()
                        elif not await store.arun(conn, store.workers.holds_leadership(schema)):
                            await self._resign("its lock is gone")
                    except psycopg.errors.QueryCanceled:
                        pass  # a statement timeout or pg_cancel_backend: the session and its lock live on
                    await asyncio.sleep(self.poll_seconds)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self.is_leader:
                    await self._resign(f"its session failed: {exc}")
                else:
                    log.debug("worker %s: cannot campaign for leadership (%s)", self.worker_id, exc)
                await asyncio.sleep(min(self.poll_seconds, 1.0))
            finally:
                await self._stop_duties()
                if conn is not None:  # ending the session releases the lock: another worker takes over
                    with contextlib.suppress(Exception):
                        await conn.close()

    def _lead(self) -> None:
        self.is_leader = True
        self.elections += 1
        log.info("worker %s: elected leader of schema %s", self.worker_id, self.db.schema)
        self._tasks = [asyncio.create_task(duty.run(), name=f"pgdurable-leader:{type(duty).__name__}")
                       for duty in self.duties if duty.enabled]

    async def _resign(self, why: str) -> None:
        log.warning("worker %s: no longer the leader of schema %s (%s)", self.worker_id, self.db.schema, why)
        await self._stop_duties()

    async def _stop_duties(self) -> None:
        """Cancel the duties and wait for them to end (never for long): none may outlive the leadership, nor
        hold a pooled connection while the worker closes its pools."""
        self.is_leader = False
        tasks, self._tasks = self._tasks, []
        left = await cancel_and_wait(tasks, patience=5.0)
        if left:
            log.warning("worker %s: %d leader duties did not stop within 5 s of their cancellation",
                        self.worker_id, len(left))
