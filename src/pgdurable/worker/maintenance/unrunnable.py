"""Unrunnable detection: an execution waiting longer than ``unknown_workflow_grace_seconds`` on a queue whose
live workers do not know its workflow is failed with a clear message, instead of waiting forever.

Leader-only: the check reads the worker registry of the whole schema, so its answer does not depend on
which worker asks; one asking is enough.
"""

from __future__ import annotations

import logging

from ... import store
from . import Deps, Duty
from .buckets import PerBucket, rows

log = logging.getLogger("pgdurable.worker")


class Unrunnable(Duty):
    name = "unrunnable detection"

    def __init__(self, deps: Deps) -> None:
        super().__init__(deps)
        self.per_bucket: PerBucket[list[store.claims.Named]] = PerBucket(deps, self.name)

    @property
    def enabled(self) -> bool:
        return self.deps.settings.unknown_workflow_grace_seconds is not None

    async def once(self) -> None:
        grace = self.deps.settings.unknown_workflow_grace_seconds
        if grace is None:
            return
        buckets = self.deps.buckets()
        if buckets is None:
            found = await self.deps.run(store.claims.fail_unrunnable(grace))
        else:
            answers = await self.per_bucket.each(
                buckets, lambda bucket, size: store.claims.fail_unrunnable_bucket(bucket, grace, size), rows)
            found = [named for answer in answers.values() for named in answer]
        for failed in found:
            log.warning("execution %s: failed, no live worker knows workflow %r", failed.id, failed.name)
