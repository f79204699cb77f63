"""Leases: the heartbeat that keeps a worker's claims alive, and the fencing bookkeeping that stops an
execution the moment the heartbeat shows it is no longer ours.

A lease lives on the database's clock. Every ``heartbeat_seconds`` (a third of the lease) one statement
extends the leases of every execution still held and returns the attempt each row is at; an execution whose
attempt moved on (swept and claimed elsewhere, cancelled, timed out) is abandoned without writing. The writes
themselves are fenced in SQL on the attempt, so this only saves the wasted work, never correctness.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from .. import store
from ..config import Settings
from .executor import Executor

log = logging.getLogger("pgdurable.worker")


class Heartbeat:
    """Renews the leases of the executor's executions (on the writer's connection, so that a heartbeat
    never races a batch of checkpoints on the same rows) and, for a claiming worker, its registry entry."""

    def __init__(self, worker_id: str, settings: Settings, executor: Executor, *, registered: bool,
                 run: Callable[[store.Call[Any]], Awaitable[Any]]) -> None:
        self.worker_id = worker_id
        self.settings = settings
        self.executor = executor
        self.registered = registered
        self._run = run

    async def run(self) -> None:
        executor = self.executor
        while True:
            await asyncio.sleep(self.settings.heartbeat_seconds)
            assert executor.batcher is not None
            held = {execution_id: r for execution_id, r in executor.running.items() if not r.context.lost}
            try:
                owned = await executor.batcher.run(store.claims.heartbeat(
                    owner=self.worker_id, lease=self.settings.lease_seconds, ids=list(held)))
                if self.registered:
                    await self._run(store.workers.worker_heartbeat(self.worker_id))
            except Exception as exc:
                log.warning("worker %s: heartbeat failed (%s)", self.worker_id, exc)
                continue
            for execution_id, running in held.items():
                # Not running any more: it finished while the heartbeat was queued (its completion can share
                # the heartbeat's batch), so the heartbeat no longer finds it running; it was not lost.
                if executor.running.get(execution_id) is not running:
                    continue
                if owned.get(execution_id) != running.claimed.attempt and not running.context.lost:
                    executor.abandon(running)
