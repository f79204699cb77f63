"""Automatic retention (``retention_seconds``): one small batch of old finished executions deleted per
interval, so deleting never competes with the work.

Leader-only: batches skip locked rows, so several workers could delete side by side, but the point of small
batches is a bounded background cost, and N workers would multiply it by N.
"""

from __future__ import annotations

import logging

from ... import retention, store
from . import Duty

log = logging.getLogger("pgdurable.worker")


class Retention(Duty):
    name = "retention"

    @property
    def enabled(self) -> bool:
        return self.deps.settings.retention_seconds is not None

    async def once(self) -> None:
        older_than = self.deps.settings.retention_seconds
        if older_than is None:
            return
        cutoff = await self.deps.run(retention.cutoff(older_than))
        deleted = await self.deps.run(retention.batch(cutoff, sorted(store.executions.TERMINAL),
                                                      self.deps.settings.retention_batch_size))
        if deleted.executions:
            log.info("worker %s: retention deleted %d finished executions and %d step outputs",
                     self.deps.worker_id, deleted.executions, deleted.steps)
