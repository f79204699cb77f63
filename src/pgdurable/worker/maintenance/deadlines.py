"""Deadlines: executions past their ``timeout_seconds`` fail with ``pgdurable.WorkflowTimeout``.

Leader-only: one statement fails every late execution of the schema (and NOTIFYs its owner, which stops it);
more workers running it would only repeat the scan.
"""

from __future__ import annotations

import logging

from ... import store
from . import Duty

log = logging.getLogger("pgdurable.worker")


class Deadlines(Duty):
    name = "deadline check"

    async def once(self) -> None:
        late = await self.deps.run(store.claims.expire_deadlines())
        for execution_id in late:
            log.warning("execution %s: deadline passed, failed with pgdurable.WorkflowTimeout", execution_id)
        if late and self.deps.observers:
            self.deps.observers.swept(0, 0, len(late))
