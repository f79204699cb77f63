"""Producers: one per served queue, each claiming that queue's executions into the executor's free slots.

A producer sleeps until it is woken (a NOTIFY for its queue, a slot freed while it was waiting for room, the
poll interval as a fallback), then claims a batch. Two named helpers shape when it claims:

- the ``Debouncer`` lets wake-ups pile up for a moment while the worker is busy, so that claims come in
  batches instead of one statement per completion (an idle worker claims at once);
- the ``Backoff`` re-looks at a queue with limits in SQL after a short claim, because such a queue frees
  capacity without any NOTIFY (a concurrency slot's holder finished elsewhere, a rate window moved on).

Wake-ups cost the enqueuers (PostgreSQL serialises the commits of notifying transactions), so a producer
asks for one only when it is about to sleep: after a short claim it arms its doorbell for the queue (one
statement, committed), then claims once more, so that nothing committed before the bell was armed is left
behind; the next enqueue into the queue rings the bell (one NOTIFY) and disarms it. A busy producer claims
again on its own and needs no bell. One case escapes the bell: a transaction that looked at the bell just
before it was armed and committed after the claim that followed; the sleeping producer re-claims on a
backoff (50 ms, doubling up to the poll interval), so such work waits about as long as that transaction
was open, never a whole poll interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg

from .. import store
from ..config import Settings
from .executor import Executor

log = logging.getLogger("pgdurable.worker")
T = TypeVar("T")

# Claim at most this many executions per round trip.
CLAIM_BATCH = 64


class Debouncer:
    """Spaces claims at least ``interval`` apart while the worker is busy: the wake-ups that arrive within
    the interval (NOTIFYs, completions) are answered together by the next claim."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.last = 0.0

    def remaining(self) -> float:
        """How long to wait before the next claim (0 or less: claim now)."""
        return self.last + self.interval - time.monotonic()

    def fired(self) -> None:
        self.last = time.monotonic()


class Backoff:
    """A delay that starts at ``first``, doubles each time nothing comes, is capped at ``ceiling``, and is
    dropped (None) once the queue yields a full batch."""

    def __init__(self, first: float, ceiling: float) -> None:
        self.first, self.ceiling = first, ceiling
        self.delay: float | None = None

    def again(self, found_nothing: bool) -> None:
        previous = self.delay if found_nothing else None
        self.delay = min(previous * 2 if previous else self.first, self.ceiling)

    def reset(self) -> None:
        self.delay = None


class Producer:
    """Claims one queue's executions for a worker (plain claims, or policy claims on a queue with limits)."""

    # While busy, claims at most this often when few slots are free or the queue keeps running dry.
    COALESCE_SECONDS = 0.005
    # After a short policy claim, look again this soon (doubling while nothing comes).
    POLICY_RECHECK_SECONDS = 0.01
    # Asleep with its doorbell armed, look again this soon (doubling while nothing comes): catches the work
    # of a transaction that looked at the bell just before it was armed (see the module's docstring).
    IDLE_RECHECK_SECONDS = 0.05

    def __init__(self, queue: str, *, worker_id: str, names: list[str], version: str, settings: Settings,
                 executor: Executor, policies: Callable[[], dict[str, store.queues.QueuePolicy]],
                 run: Callable[[store.Call[Any]], Awaitable[Any]], stopping: asyncio.Event) -> None:
        self.queue = queue
        self.worker_id = worker_id
        self.names = names
        self.version = version
        self.settings = settings
        self.executor = executor
        self.policies = policies
        self._run = run
        self._stopping = stopping
        self.debouncer = Debouncer(self.COALESCE_SECONDS)
        self.recheck = Backoff(self.POLICY_RECHECK_SECONDS, settings.poll_seconds)
        self.idle = Backoff(self.IDLE_RECHECK_SECONDS, settings.poll_seconds)
        # Whether this worker's doorbell for the queue is armed (as far as it knows: a NOTIFY for the queue
        # means some enqueue disarmed it).
        self.armed = False
        self._wake = asyncio.Event()
        # Waiting for room (no free slot, or the last claim filled its batch): a freed slot wakes it.
        self.hungry = True

    def wake(self) -> None:
        self._wake.set()

    def rung(self) -> None:
        """A NOTIFY for the queue: its doorbells were rung (disarmed); wake up."""
        self.armed = False
        self._wake.set()

    def slot_freed(self) -> None:
        if self.hungry:
            self._wake.set()

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)

    async def run(self) -> None:
        executor = self.executor
        batch_floor = max(1, executor.concurrency // 4)
        last_was_short = False
        lost_connections = 0
        while not self._stopping.is_set():
            # Clear before claiming: a NOTIFY that arrives during the claim still wakes the next wait.
            self._wake.clear()
            limit = min(executor.free(), CLAIM_BATCH)
            if limit > 0 and executor.running and (limit < batch_floor or last_was_short):
                pause = self.debouncer.remaining()
                if pause > 0:
                    await asyncio.sleep(pause)
                    continue
            policy = self.policies().get(self.queue)
            if limit > 0 and policy is not None and policy.worker_concurrency is not None:
                limit = min(limit, policy.worker_concurrency - executor.count(self.queue))
            if limit <= 0:
                self.hungry = True
                await self._sleep(self.settings.poll_seconds)
                continue
            self.debouncer.fired()
            started = time.monotonic()
            in_sql = policy is not None and policy.claims_in_sql
            claim = store.claims.claim_with_policy if in_sql else store.claims.claim
            executor.reserved += limit  # until the claimed are running: other producers see them taken
            retry, claimed = 0.0, list[store.claims.Claimed]()
            try:
                try:
                    claimed = await self._run(claim(
                        queue=self.queue, names=self.names, owner=self.worker_id,
                        lease=self.settings.lease_seconds, limit=limit, version=self.version,
                        adopt=self.settings.adopt_after_seconds))
                except psycopg.OperationalError as exc:
                    # A lost connection (server restart, terminated backend): the pool drops it, and others
                    # it holds may be dead too. Retry soon, backing off while the server stays away.
                    lost_connections += 1
                    log.warning("worker %s: claim failed (%s); retrying", self.worker_id, exc)
                    retry = min(0.05 * 2 ** (lost_connections - 1), 1.0)
                except Exception:
                    log.exception("worker %s: claim failed; retrying", self.worker_id)
                    retry = 1.0
                else:
                    if executor.observers:
                        executor.observers.claimed(self.queue, len(claimed), time.monotonic() - started)
                    last_was_short = len(claimed) < limit
                    lost_connections = 0
                    if in_sql:
                        if last_was_short:
                            self.recheck.again(found_nothing=not claimed)
                        else:
                            self.recheck.reset()
                    if claimed and not await executor.launch(claimed, self.queue, self._run):
                        retry = 1.0  # as after a failed claim
            finally:
                executor.reserved -= limit
            if retry:
                await asyncio.sleep(retry)
                continue
            if claimed and not last_was_short:
                self.hungry = True
                self.idle.reset()
                continue  # there may be more waiting
            self.hungry = False
            if not self.armed:
                if await self._arm():
                    continue  # claim once more: what committed before the bell was armed rang nothing
            else:
                self.idle.again(found_nothing=not claimed)
            poll = self.settings.poll_seconds
            await self._sleep(min(poll, self.recheck.delay or poll, self.idle.delay or poll))

    async def _arm(self) -> bool:
        try:
            await self._run(store.workers.arm_doorbell(id=self.worker_id, queue=self.queue))
        except Exception as exc:  # the poll (and the next round) still find the work
            log.warning("worker %s: could not arm the doorbell of queue %s (%s)", self.worker_id, self.queue, exc)
            return False
        self.armed = True
        return True
