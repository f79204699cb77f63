"""Retention: delete finished executions (with their step outputs, messages and events) older than a cutoff,
in small batches. Unfinished executions, and children whose parent is unfinished, are never deleted.

Each batch is one statement in its own short transaction that skips locked rows, so a cleanup of millions
of rows never holds locks for long and never waits on (or blocks) workers.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from psycopg.rows import dict_row

from . import store

if TYPE_CHECKING:
    from .db import Database

DEFAULT_BATCH_SIZE = 1000
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")


@dataclass(frozen=True, slots=True)
class Deleted:
    executions: int
    steps: int
    messages: int = 0
    events: int = 0


def parse_duration(text: str) -> timedelta:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w``, or a sum such as ``1d12h``."""
    compact = text.strip().lower().replace(" ", "")
    parts = _DURATION.findall(compact)
    if not compact or "".join(f"{n}{u}" for n, u in parts) != compact:
        raise ValueError(f"{text!r} is not a duration: use a number and a unit s, m, h, d or w, e.g. 30d or 1d12h")
    return timedelta(seconds=sum(float(n) * _UNITS[u] for n, u in parts))


def check_statuses(statuses: Iterable[str]) -> list[str]:
    """Only finished executions may be deleted: anything else may still run or be waited on."""
    chosen = sorted(set(statuses))
    if not chosen:
        raise ValueError("give at least one status to clean up")
    unfinished = [s for s in chosen if s not in store.executions.TERMINAL]
    if unfinished:
        finished = ", ".join(sorted(store.executions.TERMINAL))
        raise ValueError(f"only finished executions can be cleaned up ({finished}); not {', '.join(unfinished)}")
    return chosen


def _seconds(older_than: timedelta | float) -> float:
    seconds = older_than.total_seconds() if isinstance(older_than, timedelta) else float(older_than)
    if seconds < 0:
        raise ValueError("older_than must not be negative")
    return seconds


def cutoff(older_than: timedelta | float) -> store.Call[datetime]:
    return store.Call("cleanup_cutoff", {"older_than": _seconds(older_than)}, lambda rows: rows[0][0])


def count(cutoff: datetime, statuses: list[str]) -> store.Call[int]:
    return store.Call("cleanup_count", {"cutoff": cutoff, "statuses": statuses}, lambda rows: int(rows[0][0]))


def batch(cutoff: datetime, statuses: list[str], limit: int) -> store.Call[Deleted]:
    if limit < 1:
        raise ValueError("batch size must be at least 1")
    return store.Call("cleanup_batch", {"cutoff": cutoff, "statuses": statuses, "limit": limit},
                      lambda rows: Deleted(**{k: int(n) for k, n in rows[0].items()}), row_factory=dict_row)


def batch_in_bucket(bucket: int, cutoff: datetime, statuses: list[str], limit: int) -> store.Call[Deleted]:
    """``batch`` in one bucket of a schema with the Citus layout (the retention duty's statement there)."""
    return store.Call("citus_cleanup_bucket", {"bucket": bucket, "cutoff": cutoff, "statuses": statuses,
                                               "limit": limit},
                      lambda rows: Deleted(**{k: int(n) for k, n in rows[0].items()}), row_factory=dict_row)


def cleanup(db: Database, older_than: timedelta | float, statuses: Iterable[str] = store.executions.TERMINAL, *,
            batch_size: int = DEFAULT_BATCH_SIZE, dry_run: bool = False,
            on_start: Callable[[int], None] | None = None,
            on_batch: Callable[[Deleted], None] | None = None) -> Deleted:
    """Delete finished executions that were created and finished more than ``older_than`` ago, with their
    step outputs, the messages sent to them and the events they published. A child whose parent has not
    finished is kept (the parent may still wait on it).

    Returns the totals deleted (for ``dry_run``, the executions that would be, and 0 of the rest). ``on_start``
    receives how many executions match before the first batch; ``on_batch`` each batch's counts.
    """
    chosen = check_statuses(statuses)
    if batch_size < 1:
        raise ValueError("batch size must be at least 1")
    limit = db.run(cutoff(older_than))
    if dry_run or on_start is not None:
        matching = db.run(count(limit, chosen))
        if on_start is not None:
            on_start(matching)
        if dry_run:
            return Deleted(matching, 0)
    total = Deleted(0, 0)
    while True:
        deleted = db.run(batch(limit, chosen, batch_size))
        total = Deleted(total.executions + deleted.executions, total.steps + deleted.steps,
                        total.messages + deleted.messages, total.events + deleted.events)
        if on_batch is not None:
            on_batch(deleted)
        if deleted.executions < batch_size:
            return total
