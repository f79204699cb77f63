"""An attempt's hold on an execution: claiming it (or starting it owned), keeping its lease, suspending it
until a wake-up; and the duties that end holds: waking the due, expiring deadlines, sweeping expired
leases, failing what no worker can run."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.rows import dict_row

from .calls import Call, every, first_column, pairs, rows_of


@dataclass(frozen=True, slots=True)
class Claimed:
    id: str
    name: str
    attempt: int
    input: str
    # The database's clock when it was claimed: durable timers are computed on database time.
    db_now: datetime | None = None
    # Whether it may have recorded steps already (a later attempt, or a fork).
    has_history: bool = False
    # The application version it had before this claim (another one when this worker adopted it).
    previous_version: str | None = None


def start_owned(*, id: str, name: str, queue: str, priority: int, input: str, max_recoveries: int,
                owner: str, lease: float, timeout: float | None, version: str,
                trace: str | None = None, tags: str | None = None) -> Call[tuple[Any, ...] | None]:
    return Call("start_owned", {"id": id, "name": name, "queue": queue, "priority": priority, "input": input,
                                "max_recoveries": max_recoveries, "owner": owner, "lease": lease,
                                "timeout": timeout, "version": version, "trace": trace, "tags": tags},
                lambda rows: rows[0] if rows else None)


def claim(*, queue: str, names: list[str], owner: str, lease: float, limit: int,
          version: str, adopt: float | None = None, bucket: int | None = None,
          arm: bool = False) -> Call[list[Claimed]]:
    """``bucket``: on a Citus schema, the one bucket to claim in (the producer rotates over them).
    ``arm``: a claim that finds nothing also arms the owner's doorbell for the queue (single node only)."""
    return Call("claim", {"queue": queue, "names": names, "owner": owner, "lease": lease, "limit": limit,
                          "version": version, "adopt": adopt, "bucket": bucket, "arm": arm}, every,
                row_factory=rows_of(Claimed))


def claimable_buckets(*, queue: str, names: list[str]) -> Call[list[int]]:
    """On a Citus schema: the buckets that have executions of these workflows to claim now (no locks: a
    look across every shard, for an idle producer)."""
    return Call("claimable_buckets", {"queue": queue, "names": names}, first_column)


def claim_with_policy(*, queue: str, names: list[str], owner: str, lease: float, limit: int,
                      version: str, adopt: float | None = None) -> Call[list[Claimed]]:
    return Call("claim_with_policy", {"queue": queue, "names": names, "owner": owner, "lease": lease,
                                      "limit": limit, "version": version, "adopt": adopt}, every,
                row_factory=rows_of(Claimed))


def buckets_of(ids: list[str]) -> Call[dict[str, int]]:
    """On a schema with the Citus layout: the bucket of each execution id (computed on the coordinator, no
    table read), so that a batch of writes or a heartbeat can go out one bucket per statement."""
    return Call("citus_buckets_of", {"ids": ids}, pairs)


def heartbeat(*, owner: str, lease: float, ids: list[str]) -> Call[dict[str, Any]]:
    return Call("heartbeat", {"owner": owner, "lease": lease, "ids": ids}, pairs)


def release(*, owner: str, ids: list[str]) -> Call[list[Any]]:
    return Call("release", {"owner": owner, "ids": ids}, first_column)


def suspend(*, id: str, attempt: int, wake_at: datetime | None, reason: str,
            wakeups: int | None) -> Call[bool]:
    return Call("suspend", {"id": id, "attempt": attempt, "wake_at": wake_at, "reason": reason,
                            "wakeups": wakeups}, bool)


def wake_due() -> Call[tuple[int, datetime | None, datetime]]:
    """(executions enqueued, when the next waiting one is due, the database's clock)."""
    return Call("wake_due", {}, lambda rows: (int(rows[0]["woken"]), rows[0]["next_due"], rows[0]["now"]),
                row_factory=dict_row)


def expire_deadlines() -> Call[list[Any]]:
    return Call("expire_deadlines", {}, first_column)


@dataclass(frozen=True, slots=True)
class Swept:
    """An execution whose lease expired: re-enqueued, or failed once out of recoveries."""

    id: str
    status: str
    recoveries: int


@dataclass(frozen=True, slots=True)
class Named:
    id: str
    name: str


def sweep_expired() -> Call[list[Swept]]:
    return Call("sweep_expired", {}, every, row_factory=rows_of(Swept))


def fail_unrunnable(grace: float) -> Call[list[Named]]:
    return Call("fail_unrunnable", {"grace": grace}, every, row_factory=rows_of(Named))


# On a schema with the Citus layout the duties above run one bucket per statement (worker/maintenance/buckets.py):
# at most ``limit`` executions of ``bucket``.

def wake_bucket(bucket: int, limit: int) -> Call[tuple[int, datetime | None, datetime]]:
    """``wake_due`` in one bucket: (executions enqueued, when its next waiting one is due, the database's clock)."""
    return Call("citus_wake_bucket", {"bucket": bucket, "limit": limit},
                lambda rows: (int(rows[0]["woken"]), rows[0]["next_due"], rows[0]["now"]), row_factory=dict_row)


def expire_bucket(bucket: int, limit: int) -> Call[list[Any]]:
    return Call("citus_expire_bucket", {"bucket": bucket, "limit": limit}, first_column)


def sweep_bucket(bucket: int, limit: int) -> Call[list[Swept]]:
    return Call("citus_sweep_bucket", {"bucket": bucket, "limit": limit}, every, row_factory=rows_of(Swept))


def fail_unrunnable_bucket(bucket: int, grace: float, limit: int) -> Call[list[Named]]:
    return Call("citus_fail_unrunnable_bucket", {"bucket": bucket, "grace": grace, "limit": limit}, every,
                row_factory=rows_of(Named))
