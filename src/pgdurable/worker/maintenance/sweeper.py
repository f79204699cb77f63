"""The sweeper: expired leases go back to the queue (or, past ``max_recoveries``, are dead-lettered).

Leader-only: one statement finds every expired lease of the schema (on Citus one per bucket, see
buckets.py), so a second worker running it finds
nothing more, and N workers sweeping only multiply the scans. A crashed worker's executions wait at most
about a sweep interval after their lease ends (plus a poll interval if the leader itself crashed).
"""

from __future__ import annotations

import logging

from ... import store
from . import Deps, Duty
from .buckets import PerBucket, rows

log = logging.getLogger("pgdurable.worker")


class Sweeper(Duty):
    name = "sweep of expired leases"

    def __init__(self, deps: Deps) -> None:
        super().__init__(deps)
        self.per_bucket: PerBucket[list[store.claims.Swept]] = PerBucket(deps, self.name)

    async def once(self) -> None:
        buckets = self.deps.buckets()
        if buckets is None:
            expired = await self.deps.run(store.claims.sweep_expired())
        else:
            answers = await self.per_bucket.each(buckets, store.claims.sweep_bucket, rows)
            expired = [swept for answer in answers.values() for swept in answer]
        for swept in expired:
            log.warning("execution %s: lease expired, %s (recovery %d)", swept.id,
                        "dead-lettered" if swept.status == "failed" else "re-enqueued", swept.recoveries)
        if expired and self.deps.observers:
            dead = sum(1 for swept in expired if swept.status == "failed")
            self.deps.observers.swept(len(expired) - dead, dead, 0)
