"""Maintenance: the duties a worker performs besides running executions, one small service per file.

Each duty is a ``Duty``: one pass every ``interval`` seconds, a failed pass logged and retried at the next
one. ``leader_only`` duties run only on the schema's elected leader (see ``..leader``), because running them
on every worker would only add load: they act on the whole schema, and one worker doing them suffices. The
others run on every worker: the timer and the scheduler (``timer.py``, ``scheduler.py``) because they are
latency-sensitive and already safe to run everywhere, the queue-policy refresh because it refreshes the
worker's own copy.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from ... import store
from ...config import Settings
from ...telemetry import Observers

log = logging.getLogger("pgdurable.worker")


@dataclass
class Deps:
    """What a duty works with: a pooled query runner, the worker's identity, settings and observers, and the
    schema's Citus buckets (None on a single node: each duty is then one statement; on Citus, one per bucket,
    see ``buckets.py``)."""

    run: Callable[[store.Call[Any]], Awaitable[Any]]
    worker_id: str
    settings: Settings
    observers: Observers
    buckets: Callable[[], tuple[int, ...] | None] = lambda: None


class Duty:
    """A periodic maintenance pass."""

    name: ClassVar[str]
    leader_only: ClassVar[bool] = True

    def __init__(self, deps: Deps) -> None:
        self.deps = deps
        self.passes = 0  # completed passes, for tests and debugging

    @property
    def interval(self) -> float:
        return self.deps.settings.sweep_seconds

    @property
    def enabled(self) -> bool:
        return True

    async def once(self) -> None:
        raise NotImplementedError

    async def run(self) -> None:
        while True:
            # Spread the passes of workers that started together (the every-worker duties).
            await asyncio.sleep(self.interval * random.uniform(0.5, 1.5))
            try:
                await self.once()
                self.passes += 1
            except Exception as exc:
                log.warning("worker %s: %s failed (%s)", self.deps.worker_id, self.name, exc)
