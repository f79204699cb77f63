"""Queues: their policies (limits) and their depths."""

from __future__ import annotations

from dataclasses import dataclass

from .calls import Call, every, nothing, rows_of


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """Limits of one queue (None: no limit). See App.queue."""

    name: str
    concurrency: int | None = None
    worker_concurrency: int | None = None
    rate_limit: int | None = None
    rate_period_seconds: float | None = None
    key_concurrency: int | None = None

    @property
    def claims_in_sql(self) -> bool:
        """Whether claims of this queue need the policy-aware claim (the worker limit is local)."""
        return any(v is not None for v in (self.concurrency, self.rate_limit, self.key_concurrency))


def queue_policies(names: list[str] | None) -> Call[dict[str, QueuePolicy]]:
    return Call("queue_policies", {"names": names}, lambda rows: {row.name: row for row in rows},
                row_factory=rows_of(QueuePolicy))


def set_queue_policy(policy: QueuePolicy) -> Call[None]:
    return Call("set_queue_policy", {"name": policy.name, "concurrency": policy.concurrency,
                                     "worker_concurrency": policy.worker_concurrency,
                                     "rate_limit": policy.rate_limit,
                                     "rate_period_seconds": policy.rate_period_seconds,
                                     "key_concurrency": policy.key_concurrency}, nothing)


@dataclass(frozen=True, slots=True)
class QueueDepth:
    """Unfinished executions of one queue in one status; for 'enqueued', how long the oldest available one
    has waited."""

    queue: str
    status: str
    count: int
    oldest_seconds: float | None


def queue_depths() -> Call[list[QueueDepth]]:
    return Call("queue_depths", {}, every, row_factory=rows_of(QueueDepth))
