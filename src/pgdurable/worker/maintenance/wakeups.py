"""The timer on a schema with the Citus layout: where to look for due executions (docs/scale-out.md,
"Maintenance duties").

A look in every bucket is one routed statement per bucket. The timer makes it once every poll interval (it
covers what the single-node timer's one statement covers then: wake-ups that other workers or delayed
enqueues added), and in between looks only where it knows something is due: the buckets whose next wake-up,
learnt at their last look, has come; the buckets of this worker's workflows that just suspended until a time
(the timer is poked for them); the buckets whose last look failed.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Sequence
from datetime import UTC, datetime

import psycopg

from ... import store
from . import Deps
from .buckets import PerBucket


class BucketWakeups:
    def __init__(self, deps: Deps) -> None:
        self.deps = deps
        self.per_bucket: PerBucket[tuple[int, datetime | None, datetime]] = PerBucket(deps, "timer")
        self.due: dict[int, float] = {}  # bucket -> its next wake-up as last seen (database clock, epoch s)
        self.retry: set[int] = set()  # buckets whose last look failed
        # executions of this worker that suspended until a time (appended from workflow threads)
        self.suspended: collections.deque[str] = collections.deque()
        self.next_full = 0.0  # when to look in every bucket again (time.monotonic)
        self.offset = 0.0  # the database's clock minus this machine's

    async def look(self, buckets: Sequence[int]) -> tuple[int, datetime | None, datetime]:
        """(executions enqueued, the next wake-up known, the database's clock)."""
        ids = []
        while self.suspended:
            ids.append(self.suspended.popleft())
        now = time.monotonic()
        if now >= self.next_full:
            self.next_full = now + self.deps.settings.poll_seconds
            visit = list(buckets)
        else:
            db_now = time.time() + self.offset
            wanted = self.retry | {bucket for bucket, due in self.due.items() if due <= db_now}
            if ids:
                try:
                    found: dict[str, int] = await self.deps.run(store.claims.buckets_of(ids))
                except psycopg.Error:
                    self.next_full = 0.0  # their buckets are unknown: look in every one next time
                    raise
                wanted |= set(found.values())
            visit = [bucket for bucket in buckets if bucket in wanted]
        woken = 0
        if visit:
            try:
                answers = await self.per_bucket.each(visit, store.claims.wake_bucket, lambda answer: answer[0])
            except psycopg.Error:
                self.retry = set(visit)
                raise
            self.retry = set(visit) - set(answers)
            for bucket, (count, next_due, db_now_at) in answers.items():
                woken += count
                self.offset = db_now_at.timestamp() - time.time()
                if bucket in self.per_bucket.full:
                    self.due[bucket] = db_now_at.timestamp()  # it may have more due now
                elif next_due is None:
                    self.due.pop(bucket, None)
                else:
                    self.due[bucket] = next_due.timestamp()
        db_now = time.time() + self.offset
        # the next look: the soonest wake-up known, a failed bucket's retry, or the next look everywhere
        soonest = min([*self.due.values(), db_now + max(self.next_full - time.monotonic(), 0.0)])
        if self.retry:
            soonest = min(soonest, db_now + self.deps.settings.poll_seconds / 4)
        return woken, datetime.fromtimestamp(soonest, UTC), datetime.fromtimestamp(db_now, UTC)
