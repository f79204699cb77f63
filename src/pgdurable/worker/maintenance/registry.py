"""Worker registry pruning: forget workers that stopped heartbeating an hour ago (they crashed; their
leases are swept separately). A worker's own registration and heartbeat are in ``..lease``.

Leader-only: one DELETE covers the whole registry; every worker repeating it adds nothing.
"""

from __future__ import annotations

from ... import store
from . import Duty


class WorkerPruning(Duty):
    name = "worker registry pruning"

    async def once(self) -> None:
        await self.deps.run(store.workers.prune_workers())
