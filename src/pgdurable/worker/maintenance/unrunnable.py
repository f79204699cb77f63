"""Unrunnable detection: an execution waiting longer than ``unknown_workflow_grace_seconds`` on a queue whose
live workers do not know its workflow is failed with a clear message, instead of waiting forever.

Leader-only: the check reads the worker registry of the whole schema, so its answer does not depend on
which worker asks; one asking is enough.
"""

from __future__ import annotations

import logging

from ... import store
from . import Duty

log = logging.getLogger("pgdurable.worker")


class Unrunnable(Duty):
    name = "unrunnable detection"

    @property
    def enabled(self) -> bool:
        return self.deps.settings.unknown_workflow_grace_seconds is not None

    async def once(self) -> None:
        grace = self.deps.settings.unknown_workflow_grace_seconds
        if grace is None:
            return
        for failed in await self.deps.run(store.claims.fail_unrunnable(grace)):
            log.warning("execution %s: failed, no live worker knows workflow %r", failed.id, failed.name)
