"""Deadlines: executions past their ``timeout_seconds`` fail with ``pgdurable.WorkflowTimeout``.

Leader-only: one statement fails every late execution of the schema (and NOTIFYs its owner, which stops it;
on Citus one statement per bucket, see buckets.py); more workers running it would only repeat the scan.
"""

from __future__ import annotations

import logging

from ... import store
from . import Deps, Duty
from .buckets import PerBucket, rows

log = logging.getLogger("pgdurable.worker")


class Deadlines(Duty):
    name = "deadline check"

    def __init__(self, deps: Deps) -> None:
        super().__init__(deps)
        self.per_bucket: PerBucket[list[str]] = PerBucket(deps, self.name)

    async def once(self) -> None:
        buckets = self.deps.buckets()
        if buckets is None:
            late = await self.deps.run(store.claims.expire_deadlines())
        else:
            answers = await self.per_bucket.each(buckets, store.claims.expire_bucket, rows)
            late = [execution_id for answer in answers.values() for execution_id in answer]
        for execution_id in late:
            log.warning("execution %s: deadline passed, failed with pgdurable.WorkflowTimeout", execution_id)
        if late and self.deps.observers:
            self.deps.observers.swept(0, 0, len(late))
