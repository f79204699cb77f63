"""Automatic retention (``retention_seconds``): one small batch of old finished executions deleted per
interval, so deleting never competes with the work.

Leader-only: batches skip locked rows, so several workers could delete side by side, but the point of small
batches is a bounded background cost, and N workers would multiply it by N.
"""

from __future__ import annotations

import logging

from ... import retention, store
from . import Deps, Duty
from .buckets import PerBucket

log = logging.getLogger("pgdurable.worker")


class Retention(Duty):
    name = "retention"

    def __init__(self, deps: Deps) -> None:
        super().__init__(deps)
        self.per_bucket: PerBucket[retention.Deleted] = PerBucket(deps, self.name)
        self.start = 0  # on Citus: the bucket this pass begins with (each pass the next one, so all get turns)

    @property
    def enabled(self) -> bool:
        return self.deps.settings.retention_seconds is not None

    async def once(self) -> None:
        older_than = self.deps.settings.retention_seconds
        if older_than is None:
            return
        cutoff = await self.deps.run(retention.cutoff(older_than))
        statuses = sorted(store.executions.TERMINAL)
        size = self.deps.settings.retention_batch_size
        buckets = self.deps.buckets()
        if buckets is None:
            deleted = await self.deps.run(retention.batch(cutoff, statuses, size))
        else:
            self.start = (self.start + 1) % len(buckets)
            answers = await self.per_bucket.each(
                buckets[self.start:] + buckets[:self.start],
                lambda bucket, n: retention.batch_in_bucket(bucket, cutoff, statuses, n),
                lambda answer: answer.executions, budget=size)
            deleted = retention.Deleted(*(sum(getattr(a, f) for a in answers.values())
                                          for f in ("executions", "steps", "messages", "events")))
        if deleted.executions:
            log.info("worker %s: retention deleted %d finished executions and %d step outputs",
                     self.deps.worker_id, deleted.executions, deleted.steps)
