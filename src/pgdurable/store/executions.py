"""Creating executions and reading, cancelling, resuming and forking them (sql/queries/executions.sql,
``fork`` in waits.sql)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .calls import Call, every, first, only, pairs, rows_of


@dataclass(frozen=True, slots=True)
class Execution:
    """A row of workflow_executions. Payload columns hold the stored JSON text."""

    id: str
    name: str
    queue: str
    status: str
    priority: int
    input: str
    output: str | None
    error: str | None
    owner_id: str | None
    lease_expires: datetime | None
    attempt: int
    recoveries: int
    max_recoveries: int
    available_at: datetime | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    wait_reason: str | None = None
    parent_id: str | None = None
    forked_from: str | None = None
    timeout_seconds: float | None = None
    deadline: datetime | None = None
    app_version: str | None = None
    dedup_key: str | None = None
    concurrency_key: str | None = None
    # The execution's tags, as a dict (stored as a JSON object; read as its text, decoded here).
    tags: dict[str, str] | None = None
    debounce_key: str | None = None
    # Why a parked execution (waiting, wait_reason "parked") is not resumed: see "Versions and deploys".
    parked_reason: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.tags, str):
            object.__setattr__(self, "tags", json.loads(self.tags))

    @property
    def error_info(self) -> dict[str, Any] | None:
        return json.loads(self.error) if self.error else None

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL


TERMINAL = frozenset({"succeeded", "failed", "cancelled"})


@dataclass(frozen=True, slots=True)
class Enqueued:
    id: str
    name: str
    created: bool


def enqueue(*, id: str, name: str, queue: str, priority: int, input: str, max_recoveries: int,
            delay: float, timeout: float | None = None, dedup_key: str | None = None,
            concurrency_key: str | None = None, trace: str | None = None, tags: str | None = None,
            debounce: tuple[str, float, float | None] | None = None) -> Call[Enqueued | None]:
    """``tags``: a JSON object's text; ``debounce``: (key, seconds, max seconds), see limits.debounce."""
    debounce_key, debounce_seconds, debounce_max_seconds = debounce or (None, None, None)
    # A debounced enqueue goes through insert_executions_v2, which holds what a burst does; one that is not, a
    # plain INSERT of the same row (executions.sql).
    statement = "enqueue" if debounce is None else "enqueue_debounced"
    return Call(statement, {"id": id, "name": name, "queue": queue, "priority": priority, "input": input,
                            "max_recoveries": max_recoveries, "delay": delay, "timeout": timeout,
                            "dedup_key": dedup_key, "concurrency_key": concurrency_key, "trace": trace,
                            "tags": tags, "debounce_key": debounce_key, "debounce_seconds": debounce_seconds,
                            "debounce_max_seconds": debounce_max_seconds},
                first, row_factory=rows_of(Enqueued))


def find_enqueued(*, id: str, queue: str, dedup_key: str | None) -> Call[Enqueued | None]:
    """What holds the id, else the dedup key, of an enqueue that created nothing."""
    return Call("find_enqueued", {"id": id, "queue": queue, "dedup_key": dedup_key}, first,
                row_factory=rows_of(Enqueued))


def enqueue_in_transaction(call: Call[Enqueued | None], schema: str) -> Call[str]:
    """The same enqueue, on the caller's connection and in its transaction, via the SQL function."""
    return Call("enqueue_in_transaction", call.params, lambda rows: str(rows[0][0]), schema=schema)


def enqueue_many(*, rows: str, name: str, queue: str, priority: int, max_recoveries: int,
                 delay: float, timeout: float | None = None, trace: str | None = None,
                 tags: str | None = None) -> Call[set[str]]:
    """``rows``: a JSON array of {"id": ..., "input": ...} objects (the rows of insert_executions_v2)."""
    return Call("enqueue_many", {"rows": rows, "name": name, "queue": queue, "priority": priority,
                                 "max_recoveries": max_recoveries, "delay": delay, "timeout": timeout,
                                 "trace": trace, "tags": tags},
                lambda found: {row[0] for row in found})


def names_of(ids: list[str]) -> Call[dict[str, Any]]:
    return Call("names_of", {"ids": ids}, pairs)


def get_execution(id: str) -> Call[Execution | None]:
    return Call("get_execution", {"id": id}, first, row_factory=rows_of(Execution))


def get_status(id: str) -> Call[tuple[Any, ...] | None]:
    return Call("get_status", {"id": id}, lambda rows: rows[0] if rows else None)


def await_status(id: str) -> Call[tuple[Any, ...] | None]:
    """get_status, registering an unfinished execution as awaited (its completion then notifies)."""
    return Call("await_status", {"id": id}, lambda rows: rows[0] if rows else None)


def list_executions(*, status: str | None, name: str | None, queue: str | None,
                    limit: int) -> Call[list[Execution]]:
    return Call("list_executions", {"status": status, "name": name, "queue": queue, "limit": limit},
                every, row_factory=rows_of(Execution))


def list_executions_by_tags(*, tags: str, status: str | None, name: str | None, queue: str | None,
                            limit: int) -> Call[list[Execution]]:
    """``tags``: a JSON object's text; executions whose tags contain it."""
    return Call("list_executions_by_tags", {"tags": tags, "status": status, "name": name, "queue": queue,
                                            "limit": limit}, every, row_factory=rows_of(Execution))


def cancel(id: str) -> Call[bool]:
    return Call("cancel", {"id": id}, lambda rows: bool(rows and rows[0][0]))


def resume(id: str) -> Call[bool]:
    """Re-enqueue a failed or cancelled execution, forgetting its failed step (one statement)."""
    return Call("resume", {"id": id}, bool)


@dataclass(frozen=True, slots=True)
class Unserved:
    """An execution's status and queue, and whether a live worker serves that queue and knows its workflow."""

    status: str
    queue: str
    name: str
    served: bool
    known: bool


def unserved(id: str) -> Call[Unserved | None]:
    return Call("unserved", {"id": id}, first, row_factory=rows_of(Unserved))


@dataclass(frozen=True, slots=True)
class Forked:
    id: str | None  # None: not forked (no such source, or from_step past its recorded steps)
    name: str | None
    copied: int
    source_found: bool
    recorded_steps: int


def fork(*, source: str, id: str, from_step: int) -> Call[Forked]:
    return Call("fork", {"source": source, "id": id, "from_step": from_step},
                only, row_factory=rows_of(Forked))


def trace_contexts(ids: list[str]) -> Call[dict[str, Any]]:
    """The stored trace context (JSON text) of those executions that have one."""
    return Call("trace_contexts", {"ids": ids}, pairs)
