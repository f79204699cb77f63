"""Read models of the engine's state for operators: queues, workers, outcomes over time, pages of executions,
one execution with its steps, children, events and messages, schedules, table health. Used by the dashboard
and ``pgdurable status``; every statement is a named query in ``sql/queries/dashboard.sql``.

Executions and steps are read as JSON objects of their columns, so columns added by later migrations
(parent, deadline, version...) reach the views without a change here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from psycopg.rows import dict_row

from . import display, store
from .store.calls import rows_of

# Stored JSON longer than this (in characters) is shown cut, with a link to the whole value.
PAYLOAD_PREVIEW = 64 * 1024
STEP_PREVIEW = 4 * 1024
MAX_STEPS = 2000
# What hangs off one execution is listed up to these many rows, and counted up to COUNT_CAP.
MAX_CHILDREN, MAX_MESSAGES, MAX_EVENTS = 100, 100, 200
COUNT_CAP = 10_000
# Streams on a workflow's page: this many keys, each with its newest values.
MAX_STREAMS, MAX_STREAM_VALUES = 20, 20
# What a waiting execution waits for, by its wait_reason ('recv:<topic>': a message), in a few words.
# 'parked': its history does not replay on the code that claimed it (see "Versions and deploys").
WAIT_KINDS = {"delay": "delayed", "sleep": "sleeping", "recv": "receiving", "children": "on children",
              "parked": "parked"}


@dataclass(frozen=True, slots=True)
class QueueStats:
    queue: str
    ready: int
    delayed: int
    running: int
    # running executions whose lease expired a while ago: no sweeper is taking them back
    stale: int
    oldest_ready_seconds: float | None
    live_workers: int
    # status 'waiting' (suspended: holds no worker slot), in all, and by what it waits for (WAIT_KINDS)
    waiting: int = 0
    waiting_for: dict[str, int] = field(default_factory=dict)
    # waiting executions whose wake-up time passed a while ago: no worker's timer is running
    overdue: int = 0

    @property
    def enqueued(self) -> int:
        return self.ready + self.delayed


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    id: str
    hostname: str
    pid: int
    queues: list[str]
    workflows: list[str]
    concurrency: int
    started_at: datetime
    heartbeat_at: datetime
    alive: bool
    app_version: str | None = None


@dataclass(frozen=True, slots=True)
class Unrunnable:
    id: str
    name: str
    queue: str
    created_at: datetime
    reason: str


@dataclass(frozen=True, slots=True)
class ListedExecution:
    id: str
    name: str
    queue: str
    status: str
    attempt: int
    created_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    error_type: str | None
    error_message: str | None
    wait_reason: str | None = None


@dataclass(frozen=True, slots=True)
class Payload:
    """Stored JSON text, possibly cut to a preview; ``size`` is the whole value's size in bytes."""

    text: str
    size: int

    @property
    def cut(self) -> bool:
        return self.size > len(self.text.encode())


@dataclass(frozen=True, slots=True)
class ExecutionDetail:
    fields: dict[str, Any]
    output: Payload | None
    error: dict[str, Any] | None
    parent_name: str | None = None
    parent_status: str | None = None

    @property
    def id(self) -> str:
        return str(self.fields["id"])

    @property
    def status(self) -> str:
        return str(self.fields["status"])

    def time(self, name: str) -> datetime | None:
        return parse_time(self.fields.get(name))


@dataclass(frozen=True, slots=True)
class StepDetail:
    fields: dict[str, Any]
    output: Payload | None
    error: dict[str, Any] | None

    @property
    def step_id(self) -> int:
        return int(self.fields["step_id"])

    @property
    def name(self) -> str:
        return str(self.fields.get("step_name", ""))

    @property
    def attempts(self) -> int:
        return int(self.fields.get("attempts") or 1)

    def time(self, name: str) -> datetime | None:
        return parse_time(self.fields.get(name))


@dataclass(frozen=True, slots=True)
class Child:
    id: str
    name: str
    status: str
    wait_reason: str | None
    available_at: datetime | None
    created_at: datetime
    completed_at: datetime | None


@dataclass(frozen=True, slots=True)
class Children:
    """The first children (``MAX_CHILDREN``) and counts by status; ``capped``: there are at least
    ``COUNT_CAP`` children, and the counts are of that many."""

    shown: list[Child]
    by_status: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.by_status.values())

    @property
    def capped(self) -> bool:
        return self.total >= COUNT_CAP


@dataclass(frozen=True, slots=True)
class MessageInfo:
    id: int
    topic: str
    message: Payload
    idempotency_key: str | None
    created_at: datetime
    consumed_at: datetime | None
    consumed_by_step: int | None


@dataclass(frozen=True, slots=True)
class Messages:
    """The newest messages (``MAX_MESSAGES``), how many there are and how many wait to be received (both
    counted up to ``COUNT_CAP``)."""

    shown: list[MessageInfo]
    total: int
    pending: int

    @property
    def capped(self) -> bool:
        return self.total >= COUNT_CAP


@dataclass(frozen=True, slots=True)
class EventValue:
    key: str
    step_id: int
    value: Payload
    created_at: datetime
    # for a key's current value: how many values the key has had
    versions: int = 1


@dataclass(frozen=True, slots=True)
class StreamValue:
    step_id: int
    value: Payload
    created_at: datetime


@dataclass(frozen=True, slots=True)
class StreamInfo:
    """One stream of an execution: how many values, closed or not, and its newest values (newest first)."""

    key: str
    count: int
    closed: bool
    last_at: datetime
    newest: list[StreamValue]


@dataclass(frozen=True, slots=True)
class Events:
    """Each key's current value, and the newest values of every key (newest first)."""

    latest: list[EventValue]
    history: list[EventValue]


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    name: str
    workflow_name: str
    cron: str
    timezone: str
    queue: str
    paused: bool
    next_fire_at: datetime | None
    last_fired_at: datetime | None
    last_error: str | None
    catch_up: str


@dataclass(frozen=True, slots=True)
class TableStats:
    name: str
    total_bytes: int
    table_bytes: int
    live_tuples: int
    dead_tuples: int
    last_autovacuum: datetime | None
    last_vacuum: datetime | None
    autovacuum_count: int


@dataclass(frozen=True, slots=True)
class ServerInfo:
    version: str
    database_bytes: int
    now: datetime


@dataclass(frozen=True, slots=True)
class ListFilter:
    status: str | None = None
    name: str | None = None
    queue: str | None = None
    id_prefix: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    parent: str | None = None
    # Tags the executions must have, as a JSON object's text.
    tags: str | None = None


@dataclass(frozen=True, slots=True)
class Outcomes:
    """Finished executions per bucket (index 0 = the oldest bucket) and status, over a window."""

    bucket_seconds: int
    buckets: list[dict[str, int]] = field(default_factory=list)

    def total(self, status: str) -> int:
        return sum(b.get(status, 0) for b in self.buckets)

    def statuses(self) -> list[str]:
        return sorted({s for b in self.buckets for s in b})


def parse_time(value: Any) -> datetime | None:
    """A time of a row read as JSON; infinity or a year past 9999 as display.ExtremeTime, never an error."""
    return display.parse_time(value)


def _payload(text: str | None, size: int | None) -> Payload | None:
    return Payload(text, size or 0) if text is not None else None


def _load(value: Any) -> Any:
    """A row read as JSON (its payload columns left out, so it is shallow)."""
    return display.load_json(value) if isinstance(value, str | bytes) else value


def _json_object(text: Any) -> dict[str, Any] | None:
    """A stored error as an object with string type, message and traceback, whatever the stored JSON is."""
    return display.error_fields(text)


# ---- calls ------------------------------------------------------------------------------------------------

def now() -> store.Call[datetime]:
    return store.Call("dash_now", {}, lambda rows: rows[0][0])


def queues(stale_seconds: float = 60.0) -> store.Call[list[QueueStats]]:
    def read(rows: list[dict[str, Any]]) -> list[QueueStats]:
        return [QueueStats(row["queue"], row["ready"], row["delayed"], row["running"], row["stale"],
                           row["oldest_ready_seconds"], row["live_workers"], row["waiting"],
                           {kind: row[kind] for kind in WAIT_KINDS if row[kind]}, row["overdue"]) for row in rows]

    return store.Call("dash_queues", {"stale": stale_seconds}, read, row_factory=dict_row)


def workers() -> store.Call[list[WorkerInfo]]:
    return store.Call("dash_workers", {}, list, row_factory=rows_of(WorkerInfo))


def unrunnable(limit: int = 50) -> store.Call[list[Unrunnable]]:
    return store.Call("dash_unrunnable", {"limit": limit}, list, row_factory=rows_of(Unrunnable))


def unrunnable_count() -> store.Call[int]:
    return store.Call("dash_unrunnable_count", {}, lambda rows: int(rows[0][0]))


def outcomes(window_seconds: int = 3600, bucket_seconds: int = 60,
             lookback_seconds: int = 86400) -> store.Call[Outcomes]:
    count = window_seconds // bucket_seconds

    def read(rows: list[dict[str, Any]]) -> Outcomes:
        buckets: list[dict[str, int]] = [{} for _ in range(count)]
        for row in rows:
            if 0 <= row["ago"] < count:
                buckets[count - 1 - row["ago"]][row["status"]] = int(row["n"])
        return Outcomes(bucket_seconds, buckets)

    return store.Call("dash_outcomes", {"window": window_seconds, "bucket": bucket_seconds,
                                        "lookback": window_seconds + lookback_seconds}, read, row_factory=dict_row)


def estimated_rows(schema: str) -> store.Call[int]:
    """The planner's estimate of the executions stored; -1 when the table was never analyzed."""
    return store.Call("dash_estimated_rows", {"schema": schema}, lambda rows: int(rows[0][0]) if rows else -1)


def count_capped(cap: int) -> store.Call[int]:
    return store.Call("dash_count_capped", {"cap": cap}, lambda rows: int(rows[0][0]))


def list_page(where: ListFilter, *, older_than: tuple[datetime, str] | None = None,
              newer_than: tuple[datetime, str] | None = None, limit: int = 50) -> store.Call[list[ListedExecution]]:
    """A page of executions, newest first, before ``older_than`` or (reading backwards) after ``newer_than``.

    Keyset paging on (created_at, id): no OFFSET, so every page costs the same however deep it is.
    """
    params: dict[str, Any] = {
        "status": where.status, "name": where.name, "queue": where.queue, "prefix": where.id_prefix,
        # until is exclusive, the query's bound inclusive (so that the default, infinity, keeps rows created
        # at infinity): one microsecond, the resolution of timestamptz, earlier.
        "since": where.since or "-infinity", "until": _before(where.until) if where.until else "infinity",
        "limit": limit,
        "parent": where.parent,
        "tags": where.tags,
    }
    if newer_than is not None:
        params["at"], params["id"] = _at(newer_than[0]), newer_than[1]
        return store.Call("dash_list_newer", params, lambda rows: rows[::-1], row_factory=rows_of(ListedExecution))
    if older_than is None:
        return store.Call("dash_list_first", params, list, row_factory=rows_of(ListedExecution))
    params["at"], params["id"] = _at(older_than[0]), older_than[1]
    return store.Call("dash_list_older", params, list, row_factory=rows_of(ListedExecution))


def _before(when: datetime) -> datetime | str:
    try:
        return when - timedelta(microseconds=1)
    except OverflowError:
        return "-infinity"


def _at(when: datetime) -> datetime | str:
    """A cursor's time as a parameter: an ExtremeTime as PostgreSQL's text of it, so paging is exact."""
    return when.source if isinstance(when, display.ExtremeTime) else when


def exists(execution_id: str) -> store.Call[bool]:
    return store.Call("dash_exists", {"id": execution_id}, bool)


def execution(execution_id: str, preview: int = PAYLOAD_PREVIEW) -> store.Call[ExecutionDetail | None]:
    def read(rows: list[dict[str, Any]]) -> ExecutionDetail | None:
        if not rows:
            return None
        row = rows[0]
        return ExecutionDetail(_load(row["fields"]), _payload(row["output"], row["output_size"]),
                               _json_object(row["error"]), row["parent_name"], row["parent_status"])

    return store.Call("dash_execution", {"id": execution_id, "max": preview}, read, row_factory=dict_row)


def execution_input(execution_id: str, preview: int = PAYLOAD_PREVIEW) -> store.Call[Payload | None]:
    return store.Call("dash_input", {"id": execution_id, "max": preview}, lambda rows: rows[0] if rows else None,
                      row_factory=rows_of(Payload))


def payload(execution_id: str, column: str) -> store.Call[str | None]:
    if column not in ("input", "output", "error"):
        raise ValueError(f"no payload column {column!r}")
    return store.Call("dash_payload", {"id": execution_id, "column": column},
                      lambda rows: rows[0][0] if rows else None)


def steps(execution_id: str, preview: int = STEP_PREVIEW, limit: int = MAX_STEPS) -> store.Call[list[StepDetail]]:
    def read(rows: list[dict[str, Any]]) -> list[StepDetail]:
        return [StepDetail(_load(row["fields"]), _payload(row["output"], row["output_size"]),
                           _json_object(row["error"])) for row in rows]

    return store.Call("dash_steps", {"id": execution_id, "max": preview, "limit": limit}, read,
                      row_factory=dict_row)


def children_counts(execution_id: str, cap: int = COUNT_CAP) -> store.Call[dict[str, int]]:
    return store.Call("dash_children_counts", {"id": execution_id, "cap": cap},
                      lambda rows: {row["status"]: int(row["n"]) for row in rows}, row_factory=dict_row)


def children(execution_id: str, limit: int = MAX_CHILDREN, cap: int = COUNT_CAP) -> store.Call[list[Child]]:
    return store.Call("dash_children", {"id": execution_id, "limit": limit, "cap": cap},
                      list, row_factory=rows_of(Child))


def message_counts(execution_id: str, cap: int = COUNT_CAP) -> store.Call[tuple[int, int]]:
    return store.Call("dash_message_counts", {"id": execution_id, "cap": cap},
                      lambda rows: (int(rows[0]["total"]), int(rows[0]["pending"])), row_factory=dict_row)


def messages(execution_id: str, limit: int = MAX_MESSAGES, preview: int = STEP_PREVIEW,
             cap: int = COUNT_CAP) -> store.Call[list[MessageInfo]]:
    def read(rows: list[dict[str, Any]]) -> list[MessageInfo]:
        return [MessageInfo(row["id"], row["topic"], Payload(row["text"], row["size"]), row["idempotency_key"],
                            row["created_at"], row["consumed_at"], row["consumed_by_step"]) for row in rows]

    return store.Call("dash_messages", {"id": execution_id, "limit": limit, "max": preview, "cap": cap}, read,
                      row_factory=dict_row)


def events_latest(execution_id: str, limit: int = MAX_EVENTS,
                  preview: int = STEP_PREVIEW) -> store.Call[list[EventValue]]:
    def read(rows: list[dict[str, Any]]) -> list[EventValue]:
        return [EventValue(row["key"], row["step_id"], Payload(row["text"], row["size"]), row["created_at"],
                           int(row["versions"])) for row in reversed(rows)]

    return store.Call("dash_events_latest", {"id": execution_id, "limit": limit, "max": preview}, read,
                      row_factory=dict_row)


def events_history(execution_id: str, limit: int = MAX_EVENTS,
                   preview: int = STEP_PREVIEW) -> store.Call[list[EventValue]]:
    def read(rows: list[dict[str, Any]]) -> list[EventValue]:
        return [EventValue(row["key"], row["step_id"], Payload(row["text"], row["size"]), row["created_at"])
                for row in rows]

    return store.Call("dash_events_history", {"id": execution_id, "limit": limit, "max": preview}, read,
                      row_factory=dict_row)


def stream_keys(execution_id: str, limit: int = MAX_STREAMS) -> store.Call[list[store.messaging.Stream]]:
    return store.messaging.list_streams(execution_id, limit)


def stream_values(execution_id: str, stream: store.messaging.Stream, limit: int = MAX_STREAM_VALUES,
                  preview: int = STEP_PREVIEW) -> store.Call[StreamInfo]:
    def read(rows: list[dict[str, Any]]) -> StreamInfo:
        return StreamInfo(stream.key, stream.values, stream.closed, stream.last_at,
                          [StreamValue(row["step_id"], Payload(row["text"], row["size"]), row["created_at"])
                           for row in rows])

    return store.Call("dash_stream_values", {"id": execution_id, "key": stream.key, "limit": limit,
                                             "max": preview}, read, row_factory=dict_row)


def schedules(limit: int = 500) -> store.Call[list[ScheduleInfo]]:
    return store.Call("dash_schedules", {"limit": limit}, list, row_factory=rows_of(ScheduleInfo))


def known_names() -> store.Call[list[str]]:
    return store.Call("dash_known_names", {}, lambda rows: [row[0] for row in rows])


def tables(schema: str) -> store.Call[list[TableStats]]:
    return store.Call("dash_tables", {"schema": schema}, list, row_factory=rows_of(TableStats))


def server() -> store.Call[ServerInfo]:
    return store.Call("dash_server", {}, lambda rows: rows[0], row_factory=rows_of(ServerInfo))
