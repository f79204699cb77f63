"""Children and other awaited executions: enqueuing a child as a step, and the outcomes a waiter reads."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.rows import dict_row

from .calls import Call, every


def enqueue_child(*, parent: str, attempt: int, step_id: int, step_name: str, started_at: datetime, id: str,
                  name: str, queue: str, priority: int, input: str, max_recoveries: int, delay: float,
                  timeout: float | None, concurrency_key: str | None = None,
                  dedup_key: str | None = None, trace: str | None = None,
                  tags: str | None = None) -> Call[tuple[bool, str | None, str | None]]:
    """Returns (recorded, the name of the workflow the id belongs to, the conflict error recorded if the id
    belongs to another workflow)."""
    if dedup_key is not None:
        raise ValueError("dedup_key is for enqueues from outside workflows (a child's id already dedups it)")
    return Call("enqueue_child", {"parent": parent, "attempt": attempt, "step_id": step_id,
                                  "step_name": step_name, "started_at": started_at, "id": id, "name": name,
                                  "queue": queue, "priority": priority, "input": input,
                                  "max_recoveries": max_recoveries, "delay": delay, "timeout": timeout,
                                  "concurrency_key": concurrency_key, "trace": trace, "tags": tags},
                lambda rows: (bool(rows[0]["recorded"]), rows[0]["name"], rows[0]["conflict"]),
                row_factory=dict_row)


@dataclass(frozen=True, slots=True)
class Awaited:
    """One awaited execution's outcome as seen by its waiter; status None when there is no such execution."""

    id: str
    status: str | None
    output: str | None
    error: str | None
    is_child: bool


def awaited_status(*, id: str, attempt: int, ids: list[str]) -> Call[tuple[int | None, list[Awaited]]]:
    """(the waiter's wake-up count, the outcomes); a count of None means the waiter lost its execution."""
    def read(rows: list[dict[str, Any]]) -> tuple[int | None, list[Awaited]]:
        if not rows:
            return None, []
        return rows[0]["wakeups"], [Awaited(row["id"], row["status"], row["output"], row["error"],
                                            bool(row["is_child"])) for row in rows]
    return Call("awaited_status", {"id": id, "attempt": attempt, "ids": ids}, read, row_factory=dict_row)


def list_children(id: str) -> Call[list[tuple[Any, ...]]]:
    return Call("list_children", {"id": id}, every)
