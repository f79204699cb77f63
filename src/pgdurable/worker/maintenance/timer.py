"""The timer: enqueues waiting executions whose time has come (durable sleeps, delayed starts, wait
timeouts). It sleeps until the next known wake-up by the database's clock, at most a poll interval (others
may add earlier ones), and a workflow of this worker that suspends sooner pokes it awake.

Every worker, not only the leader: it is latency-sensitive. A sleeper must wake on time, and the local poke
(a workflow suspending here for 50 ms) only reaches this worker's timer; on the leader alone every short
sleep would wait for the leader's next look, up to a poll interval late. Its cost when idle is one indexed
statement per poll interval per worker, and concurrent timers are harmless (each due row is woken by one
UPDATE; another finds it no longer waiting).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from ... import store
from ...waiting import wait_event
from . import Deps
from .wakeups import BucketWakeups

log = logging.getLogger("pgdurable.worker")


class Timer:
    name = "timer"

    def __init__(self, deps: Deps) -> None:
        self.deps = deps
        self.loop: asyncio.AbstractEventLoop | None = None
        self._kick = asyncio.Event()
        self._due: float | None = None  # the earliest wake-up a local workflow asked for (wall clock)
        self.buckets = BucketWakeups(deps)  # on Citus: which buckets to look in

    def suspended(self, execution_id: str, wake_at: Any) -> None:
        """A workflow of ours suspended until ``wake_at`` (from any thread): make sure the timer looks by then
        (on Citus, in its bucket)."""
        if wake_at is None or self.loop is None:
            return
        if self.deps.buckets() is not None:  # (a single node looks everywhere in one statement)
            self.buckets.suspended.append(execution_id)
        due = wake_at.timestamp()
        if self._due is None or due < self._due:
            self._due = due
            with contextlib.suppress(RuntimeError):  # a closed loop: the worker is exiting
                self.loop.call_soon_threadsafe(self._kick.set)

    async def run(self) -> None:
        self.loop = asyncio.get_running_loop()
        while True:
            self._kick.clear()
            wait = self.deps.settings.poll_seconds
            try:
                woken, next_due, db_now = await self._wake_due()
                if woken:
                    log.debug("worker %s: timer enqueued %d waiting executions", self.deps.worker_id, woken)
                offset = db_now.timestamp() - time.time()  # compare wake-ups on the database's clock
                due = next_due.timestamp() - offset if next_due is not None else None
                local_due = self._due - offset if self._due is not None else None
                self._due = None
                for candidate in (due, local_due):
                    if candidate is not None:
                        wait = min(wait, max(candidate - time.time(), 0.0))
            except Exception as exc:
                log.warning("worker %s: timer failed (%s)", self.deps.worker_id, exc)
            await wait_event(self._kick, wait + 0.002)

    async def _wake_due(self) -> tuple[int, Any, Any]:
        """(executions enqueued, when the next waiting one is due, the database's clock): one statement on a
        single node, one per bucket on Citus."""
        buckets = self.deps.buckets()
        if buckets is None:
            found: tuple[int, Any, Any] = await self.deps.run(store.claims.wake_due())
            return found
        return await self.buckets.look(buckets)
