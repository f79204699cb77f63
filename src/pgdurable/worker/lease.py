"""Leases: the heartbeat that keeps a worker's claims alive, and the fencing bookkeeping that stops an
execution the moment the heartbeat shows it is no longer ours.

A lease lives on the database's clock. Every ``heartbeat_seconds`` (a third of the lease) one statement
extends the leases of every execution still held and returns the attempt each row is at; an execution whose
attempt moved on (swept and claimed elsewhere, cancelled, timed out) is abandoned without writing. The writes
themselves are fenced in SQL on the attempt, so this only saves the wasted work, never correctness.

On a schema with the Citus layout the heartbeat is one statement per bucket of the executions held (their
buckets asked of the coordinator first): a bucket whose statement fails (cancelled, timed out, its node down)
leaves its executions unrenewed until the next heartbeat, neither renewed nor abandoned, while the others are.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

from .. import store
from ..config import Settings
from .executor import Executor

log = logging.getLogger("pgdurable.worker")


class Heartbeat:
    """Renews the leases of the executor's executions (on the writer's connection, so that a heartbeat
    never races a batch of checkpoints on the same rows) and, for a claiming worker, its registry entry."""

    def __init__(self, worker_id: str, settings: Settings, executor: Executor, *, registered: bool,
                 run: Callable[[store.Call[Any]], Awaitable[Any]],
                 buckets: Callable[[], tuple[int, ...] | None] = lambda: None) -> None:
        self.worker_id = worker_id
        self.settings = settings
        self.executor = executor
        self.registered = registered
        self._run = run
        self._buckets = buckets

    async def run(self) -> None:
        executor = self.executor
        while True:
            await asyncio.sleep(self.settings.heartbeat_seconds)
            assert executor.batcher is not None
            held = {execution_id: r for execution_id, r in executor.running.items() if not r.context.lost}
            try:
                owned, answered = await self._renew(list(held))
                if self.registered:
                    await self._run(store.workers.worker_heartbeat(self.worker_id))
            except Exception as exc:
                log.warning("worker %s: heartbeat failed (%s)", self.worker_id, exc)
                continue
            renewed_by = time.monotonic() + self.settings.lease_seconds
            for execution_id, running in held.items():
                # Not running any more: it finished while the heartbeat was queued (its completion can share
                # the heartbeat's batch), so the heartbeat no longer finds it running; it was not lost.
                if executor.running.get(execution_id) is not running or execution_id not in answered:
                    continue
                if owned.get(execution_id) == running.claimed.attempt:
                    running.context.lease_ends_by = renewed_by
                elif not running.context.lost:
                    executor.abandon(running)

    async def _renew(self, ids: list[str]) -> tuple[dict[str, Any], set[str]]:
        """(the attempt of each execution the heartbeat found running as ours, the executions it could ask
        about): one statement on a single node, one per bucket on Citus."""
        batcher = self.executor.batcher
        assert batcher is not None
        lease = self.settings.lease_seconds
        if self._buckets() is None or len(ids) <= 1:
            return await batcher.run(store.claims.heartbeat(owner=self.worker_id, lease=lease, ids=ids)), set(ids)
        groups: dict[int, list[str]] = {}
        for execution_id, bucket in (await batcher.run(store.claims.buckets_of(ids))).items():
            groups.setdefault(bucket, []).append(execution_id)
        answers = await asyncio.gather(*(batcher.run(store.claims.heartbeat(owner=self.worker_id, lease=lease,
                                                                            ids=group))
                                         for group in groups.values()), return_exceptions=True)
        owned: dict[str, Any] = {}
        answered: set[str] = set()
        failed: list[BaseException] = []
        for group, answer in zip(groups.values(), answers, strict=True):
            if isinstance(answer, psycopg.Error):
                failed.append(answer)
            elif isinstance(answer, BaseException):
                raise answer
            else:
                owned.update(answer)
                answered.update(group)
        if failed:
            if not answered:
                raise failed[-1]
            log.warning("worker %s: heartbeat failed in %d of %d buckets (%s); their leases are renewed at the "
                        "next one", self.worker_id, len(failed), len(groups), failed[-1])
        return owned, answered
