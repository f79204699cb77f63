"""Queue-policy refresh: a worker's copy of the limits of the queues it serves (set with ``App.queue``,
changed with ``pgdurable queues set``), so that its producers pick the right claim and local limit.

Every worker: each keeps its own copy, so the leader refreshing its own would not help the others.
"""

from __future__ import annotations

from collections.abc import Callable

from ... import store
from . import Deps, Duty


class PolicyRefresh(Duty):
    name = "queue policy refresh"
    leader_only = False

    def __init__(self, deps: Deps, queues: list[str],
                 apply: Callable[[dict[str, store.queues.QueuePolicy]], None]) -> None:
        super().__init__(deps)
        self.queues = queues
        self.apply = apply

    async def once(self) -> None:
        self.apply(await self.deps.run(store.queues.queue_policies(self.queues)))
