"""Every statement the engine runs, as data: a named query, its parameters, and how to read its rows.

Building a ``Call`` does no I/O, so one definition serves both the sync and the async driver; ``run`` and
``arun`` are the only two places that execute them.

Rows that become objects are mapped by column name (``row_factory``: psycopg's ``class_row`` or
``dict_row``), never by position: a column added to or moved in a query either lands in the field of its
name or fails loudly (an unknown field), instead of silently shifting the fields after it.
"""

from __future__ import annotations

import json
import re
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any, Generic, TypeVar

import psycopg
from psycopg import sql
from psycopg.rows import BaseRowFactory, class_row, dict_row

from .errors import SchemaNotInstalled
from .sqlfiles import query, schema_sql

T = TypeVar("T")
Rows = list[tuple[Any, ...]]


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    name: str
    params: Mapping[str, Any]
    # Reads the fetched rows: tuples, or what row_factory makes of each row.
    read: Callable[[list[Any]], T]
    # For a connection that is not pgdurable's own: the query's {schema} is replaced by this identifier.
    schema: str | None = None
    # How to build each row, by column name (psycopg.rows.class_row / dict_row); None: plain tuples.
    row_factory: BaseRowFactory[Any] | None = None


def _statement(call: Call[Any]) -> Any:
    if call.schema is None:
        return query(call.name)
    return sql.SQL(query(call.name)).format(schema=sql.Identifier(call.schema))


def run(conn: psycopg.Connection[Any], call: Call[T]) -> T:
    with _schema_errors(conn, call):
        if call.row_factory is None:
            cur = conn.execute(_statement(call), call.params)
            return call.read(cur.fetchall() if cur.description else [])
        with conn.cursor(row_factory=call.row_factory) as named:
            named.execute(_statement(call), call.params)
            return call.read(named.fetchall() if named.description else [])


async def arun(conn: psycopg.AsyncConnection[Any], call: Call[T]) -> T:
    with _schema_errors(conn, call):
        if call.row_factory is None:
            cur = await conn.execute(_statement(call), call.params)
            return call.read(await cur.fetchall() if cur.description else [])
        async with conn.cursor(row_factory=call.row_factory) as named:
            await named.execute(_statement(call), call.params)
            return call.read(await named.fetchall() if named.description else [])


# The schema each of pgdurable's own connections works in (set by db.configure), to name it in errors.
_schemas: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
# What a statement of ours meets on a schema that was never migrated, or migrated by an older pgdurable.
_MISSING = (psycopg.errors.InvalidSchemaName, psycopg.errors.UndefinedTable, psycopg.errors.UndefinedFunction,
            psycopg.errors.UndefinedColumn)


def remember_schema(conn: Any, schema: str) -> None:
    _schemas[conn] = schema


@contextmanager
def _schema_errors(conn: Any, call: Call[Any]) -> Iterator[None]:
    """A relation, function or schema of pgdurable's own that is missing means pgdurable is not installed (or
    is out of date) there, which deserves a message saying what to run, not libpq's. (A missing object of the
    application's, as a table binding may name, is the application's error: it goes through unchanged.)"""
    try:
        yield
    except _MISSING as exc:
        schema = call.schema or _schemas.get(conn)
        detail = (str(exc).splitlines() or [type(exc).__name__])[0]
        if not _names_own_object(detail, schema):
            raise
        raise SchemaNotInstalled(schema, detail) from exc


_MISSING_SCHEMA = re.compile(r'schema "(?P<name>[^"]+)" does not exist')
_MISSING_OBJECT = re.compile(r'(?:relation "(?P<relation>[^"]+)"|function (?P<function>[\w."]+)\()')


def _names_own_object(detail: str, schema: str | None) -> bool:
    """Whether an undefined-object error names our schema, or a table, view or function of pgdurable's (bare,
    or in our schema)."""
    found = _MISSING_SCHEMA.search(detail)
    if found:
        return schema is None or found.group("name") == schema
    found = _MISSING_OBJECT.search(detail)
    if not found:
        return False
    qualifier, _, name = (found.group("relation") or found.group("function")).replace('"', "").rpartition(".")
    return name in own_objects() and (not qualifier or schema is None or qualifier == schema)


@lru_cache(maxsize=1)
def own_objects() -> frozenset[str]:
    """The names of pgdurable's tables, views and functions (from sql/schema.sql)."""
    return frozenset(re.findall(r"^CREATE (?:OR REPLACE )?(?:TABLE|VIEW|FUNCTION) (?:IF NOT EXISTS )?(\w+)",
                                schema_sql(), re.MULTILINE)) | {"schema_migrations"}  # made by migrations.py


# ---- rows -------------------------------------------------------------------------------------------------

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
class Step:
    step_id: int
    step_name: str
    output: str | None
    error: str | None
    attempts: int
    recorded_by_attempt: int
    started_at: datetime
    completed_at: datetime


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


@dataclass(frozen=True, slots=True)
class Enqueued:
    id: str
    name: str
    created: bool


@dataclass(frozen=True, slots=True)
class RecordedStep:
    step_name: str
    output: str | None
    error: str | None


# ---- readers ----------------------------------------------------------------------------------------------

def _nothing(rows: Rows) -> None:
    return None


def _first_column(rows: Rows) -> list[Any]:
    return [row[0] for row in rows]


def _first(rows: list[T]) -> T | None:
    return rows[0] if rows else None


def _all(rows: list[T]) -> list[T]:
    return rows


def _recorded_steps(rows: list[dict[str, Any]]) -> dict[str, dict[int, RecordedStep]]:
    found: dict[str, dict[int, RecordedStep]] = {}
    for row in rows:
        found.setdefault(row["execution_id"], {})[row["step_id"]] = RecordedStep(
            row["step_name"], row["output"], row["error"])
    return found


# What a group commit wrote, by (execution_id, attempt, step_id or None for a completion): keyed by the
# attempt too, so that two attempts of one execution in one batch never take each other's outcome.
WriteKey = tuple[str, int, int | None]


def _written(rows: Rows) -> set[WriteKey]:
    return {(row[0], row[1], row[2]) for row in rows}


def _pairs(rows: Rows) -> dict[str, Any]:
    return {row[0]: row[1] for row in rows}


def _tuples(rows: Rows) -> list[tuple[Any, ...]]:
    return rows


# ---- calls ------------------------------------------------------------------------------------------------

def enqueue(*, id: str, name: str, queue: str, priority: int, input: str, max_recoveries: int,
            delay: float, timeout: float | None = None, dedup_key: str | None = None,
            concurrency_key: str | None = None, trace: str | None = None, tags: str | None = None,
            debounce: tuple[str, float, float | None] | None = None) -> Call[Enqueued | None]:
    """``tags``: a JSON object's text; ``debounce``: (key, seconds, max seconds), see limits.debounce."""
    debounce_key, debounce_seconds, debounce_max_seconds = debounce or (None, None, None)
    return Call("enqueue", {"id": id, "name": name, "queue": queue, "priority": priority, "input": input,
                            "max_recoveries": max_recoveries, "delay": delay, "timeout": timeout,
                            "dedup_key": dedup_key, "concurrency_key": concurrency_key, "trace": trace,
                            "tags": tags, "debounce_key": debounce_key, "debounce_seconds": debounce_seconds,
                            "debounce_max_seconds": debounce_max_seconds},
                _first, row_factory=class_row(Enqueued))


def find_enqueued(*, id: str, queue: str, dedup_key: str | None) -> Call[Enqueued | None]:
    return Call("find_enqueued", {"id": id, "queue": queue, "dedup_key": dedup_key}, _first,
                row_factory=class_row(Enqueued))


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
    return Call("names_of", {"ids": ids}, _pairs)


def start_owned(*, id: str, name: str, queue: str, priority: int, input: str, max_recoveries: int,
                owner: str, lease: float, timeout: float | None, version: str,
                trace: str | None = None, tags: str | None = None) -> Call[tuple[Any, ...] | None]:
    return Call("start_owned", {"id": id, "name": name, "queue": queue, "priority": priority, "input": input,
                                "max_recoveries": max_recoveries, "owner": owner, "lease": lease,
                                "timeout": timeout, "version": version, "trace": trace, "tags": tags},
                lambda rows: rows[0] if rows else None)


def claim(*, queue: str, names: list[str], owner: str, lease: float, limit: int,
          version: str, adopt: float | None = None) -> Call[list[Claimed]]:
    return Call("claim", {"queue": queue, "names": names, "owner": owner, "lease": lease, "limit": limit,
                          "version": version, "adopt": adopt}, _all, row_factory=class_row(Claimed))


def claim_with_policy(*, queue: str, names: list[str], owner: str, lease: float, limit: int,
                      version: str, adopt: float | None = None) -> Call[list[Claimed]]:
    return Call("claim_with_policy", {"queue": queue, "names": names, "owner": owner, "lease": lease,
                                      "limit": limit, "version": version, "adopt": adopt}, _all,
                row_factory=class_row(Claimed))


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
                row_factory=class_row(QueuePolicy))


def set_queue_policy(policy: QueuePolicy) -> Call[None]:
    return Call("set_queue_policy", {"name": policy.name, "concurrency": policy.concurrency,
                                     "worker_concurrency": policy.worker_concurrency,
                                     "rate_limit": policy.rate_limit,
                                     "rate_period_seconds": policy.rate_period_seconds,
                                     "key_concurrency": policy.key_concurrency}, _nothing)


def load_steps(ids: list[str]) -> Call[dict[str, dict[int, RecordedStep]]]:
    return Call("load_steps", {"ids": ids}, _recorded_steps, row_factory=dict_row)


def write_steps(rows: str) -> Call[set[WriteKey]]:
    """Step checkpoints as one JSON array; returns (execution_id, attempt, step_id) of the rows written."""
    return Call("write_steps", {"rows": rows}, _written)


def write_completions(rows: str) -> Call[set[WriteKey]]:
    """Completions as one JSON array; returns (execution_id, attempt, None) of the executions finished."""
    return Call("write_completions", {"rows": rows}, _written)


def heartbeat(*, owner: str, lease: float, ids: list[str]) -> Call[dict[str, Any]]:
    return Call("heartbeat", {"owner": owner, "lease": lease, "ids": ids}, _pairs)


def release(*, owner: str, ids: list[str]) -> Call[list[Any]]:
    return Call("release", {"owner": owner, "ids": ids}, _first_column)


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
    return Call("sweep_expired", {}, _all, row_factory=class_row(Swept))


def fail_unrunnable(grace: float) -> Call[list[Named]]:
    return Call("fail_unrunnable", {"grace": grace}, _all, row_factory=class_row(Named))


def get_execution(id: str) -> Call[Execution | None]:
    return Call("get_execution", {"id": id}, _first, row_factory=class_row(Execution))


def get_status(id: str) -> Call[tuple[Any, ...] | None]:
    return Call("get_status", {"id": id}, lambda rows: rows[0] if rows else None)


def await_status(id: str) -> Call[tuple[Any, ...] | None]:
    """get_status, registering an unfinished execution as awaited (its completion then notifies)."""
    return Call("await_status", {"id": id}, lambda rows: rows[0] if rows else None)


def list_executions(*, status: str | None, name: str | None, queue: str | None,
                    limit: int) -> Call[list[Execution]]:
    return Call("list_executions", {"status": status, "name": name, "queue": queue, "limit": limit},
                _all, row_factory=class_row(Execution))


def list_executions_by_tags(*, tags: str, status: str | None, name: str | None, queue: str | None,
                            limit: int) -> Call[list[Execution]]:
    """``tags``: a JSON object's text; executions whose tags contain it."""
    return Call("list_executions_by_tags", {"tags": tags, "status": status, "name": name, "queue": queue,
                                            "limit": limit}, _all, row_factory=class_row(Execution))


def set_tags(*, id: str, attempt: int, step_id: int, step_name: str, started_at: datetime,
             tags: str) -> Call[bool]:
    return Call("set_tags", {"id": id, "attempt": attempt, "step_id": step_id, "step_name": step_name,
                             "started_at": started_at, "tags": tags}, lambda rows: bool(rows[0][0]))


def list_steps(id: str) -> Call[list[Step]]:
    return Call("list_steps", {"id": id}, _all, row_factory=class_row(Step))


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
    return Call("unserved", {"id": id}, _first, row_factory=class_row(Unserved))


def register_worker(*, id: str, hostname: str, pid: int, queues: list[str], workflows: list[str],
                    concurrency: int, version: str, adopt: float | None = None,
                    lease: float | None = None) -> Call[None]:
    return Call("register_worker", {"id": id, "hostname": hostname, "pid": pid, "queues": queues,
                                    "workflows": workflows, "concurrency": concurrency, "version": version,
                                    "adopt": adopt, "lease": lease}, _nothing)


def worker_heartbeat(id: str) -> Call[None]:
    return Call("worker_heartbeat", {"id": id}, _nothing)


def deregister_worker(id: str) -> Call[None]:
    return Call("deregister_worker", {"id": id}, _nothing)


def prune_workers() -> Call[None]:
    return Call("prune_workers", {}, _nothing)


def arm_doorbell(*, id: str, queue: str) -> Call[None]:
    return Call("arm_doorbell", {"id": id, "queue": queue}, _nothing)


def list_workers() -> Call[list[tuple[Any, ...]]]:
    return Call("list_workers", {}, _tuples)


def list_unrunnable(limit: int) -> Call[list[tuple[Any, ...]]]:
    return Call("list_unrunnable", {"limit": limit}, _tuples)


# ---- waits, messages, events, children, deadlines, forks (sql/queries/waits.sql) ------------------------

@dataclass(frozen=True, slots=True)
class Received:
    owned: bool
    wakeups: int | None
    found: bool
    message: str | None


@dataclass(frozen=True, slots=True)
class Awaited:
    """One awaited execution's outcome as seen by its waiter; status None when there is no such execution."""

    id: str
    status: str | None
    output: str | None
    error: str | None
    is_child: bool


@dataclass(frozen=True, slots=True)
class Message:
    id: int
    topic: str
    message: Any
    idempotency_key: str | None
    created_at: datetime
    consumed_at: datetime | None
    consumed_by_step: int | None


@dataclass(frozen=True, slots=True)
class Event:
    key: str
    step_id: int
    value: Any
    created_at: datetime


def park(*, id: str, attempt: int, reason: str, previous: str | None) -> Call[bool]:
    return Call("park", {"id": id, "attempt": attempt, "reason": reason, "previous": previous}, bool)


def unpark(*, version: str, names: list[str]) -> Call[int]:
    """Re-enqueue the parked executions of one version (and of these workflows); how many."""
    return Call("unpark", {"version": version, "names": names}, len)


@dataclass(frozen=True, slots=True)
class AppVersion:
    app_version: str
    enqueued: int
    waiting: int
    running: int
    parked: int
    live_workers: int


def app_versions() -> Call[list[AppVersion]]:
    return Call("app_versions", {}, list, row_factory=class_row(AppVersion))


def migrate_app_version(*, old: str, new: str) -> Call[int]:
    return Call("migrate_app_version", {"old": old, "new": new}, lambda rows: int(rows[0][0]))


def suspend(*, id: str, attempt: int, wake_at: datetime | None, reason: str,
            wakeups: int | None) -> Call[bool]:
    return Call("suspend", {"id": id, "attempt": attempt, "wake_at": wake_at, "reason": reason,
                            "wakeups": wakeups}, bool)


def wake_due() -> Call[tuple[int, datetime | None, datetime]]:
    """(executions enqueued, when the next waiting one is due, the database's clock)."""
    return Call("wake_due", {}, lambda rows: (int(rows[0]["woken"]), rows[0]["next_due"], rows[0]["now"]),
                row_factory=dict_row)


def expire_deadlines() -> Call[list[Any]]:
    return Call("expire_deadlines", {}, _first_column)


def receive(*, id: str, attempt: int, topic: str, step_id: int, step_name: str,
            started_at: datetime) -> Call[Received]:
    return Call("receive", {"id": id, "attempt": attempt, "topic": topic, "step_id": step_id,
                            "step_name": step_name, "started_at": started_at},
                lambda rows: Received(bool(rows[0]["owned"]), rows[0]["wakeups"], bool(rows[0]["found"]),
                                      rows[0]["message"]), row_factory=dict_row)


def send_message(*, destination: str, message: str, topic: str, key: str | None) -> Call[bool]:
    return Call("send_message", {"destination": destination, "message": message, "topic": topic, "key": key},
                lambda rows: bool(rows[0][0]))


def send_message_in_transaction(call: Call[bool], schema: str) -> Call[bool]:
    return Call("send_message_in_transaction", call.params, call.read, schema=schema)


def list_messages(id: str) -> Call[list[Message]]:
    return Call("list_messages", {"id": id}, _all, row_factory=class_row(Message))


def set_event(*, id: str, attempt: int, step_id: int, step_name: str, started_at: datetime, key: str,
              value: str) -> Call[bool]:
    return Call("set_event", {"id": id, "attempt": attempt, "step_id": step_id, "step_name": step_name,
                              "started_at": started_at, "key": key, "value": value},
                lambda rows: bool(rows[0][0]))


def get_event(*, id: str, key: str) -> Call[str | None]:
    return Call("get_event", {"id": id, "key": key}, lambda rows: rows[0][0] if rows else None)


def list_events(id: str) -> Call[list[Event]]:
    return Call("list_events", {"id": id}, _all, row_factory=class_row(Event))


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


def awaited_status(*, id: str, attempt: int, ids: list[str]) -> Call[tuple[int | None, list[Awaited]]]:
    """(the waiter's wake-up count, the outcomes); a count of None means the waiter lost its execution."""
    def read(rows: list[dict[str, Any]]) -> tuple[int | None, list[Awaited]]:
        if not rows:
            return None, []
        return rows[0]["wakeups"], [Awaited(row["id"], row["status"], row["output"], row["error"],
                                            bool(row["is_child"])) for row in rows]
    return Call("awaited_status", {"id": id, "attempt": attempt, "ids": ids}, read, row_factory=dict_row)


def list_children(id: str) -> Call[list[tuple[Any, ...]]]:
    return Call("list_children", {"id": id}, _tuples)


@dataclass(frozen=True, slots=True)
class Forked:
    id: str | None  # None: not forked (no such source, or from_step past its recorded steps)
    name: str | None
    copied: int
    source_found: bool
    recorded_steps: int


def _first_row(rows: list[T]) -> T:
    return rows[0]


def fork(*, source: str, id: str, from_step: int) -> Call[Forked]:
    return Call("fork", {"source": source, "id": id, "from_step": from_step},
                _first_row, row_factory=class_row(Forked))


@dataclass(frozen=True, slots=True)
class QueueDepth:
    """Unfinished executions of one queue in one status; for 'enqueued', how long the oldest available one
    has waited."""

    queue: str
    status: str
    count: int
    oldest_seconds: float | None


def queue_depths() -> Call[list[QueueDepth]]:
    return Call("queue_depths", {}, _all, row_factory=class_row(QueueDepth))


def trace_contexts(ids: list[str]) -> Call[dict[str, Any]]:
    """The stored trace context (JSON text) of those executions that have one."""
    return Call("trace_contexts", {"ids": ids}, _pairs)


def try_leadership(schema: str) -> Call[bool]:
    return Call("try_leadership", {"schema": schema}, lambda rows: bool(rows[0][0]))


def holds_leadership(schema: str) -> Call[bool]:
    return Call("holds_leadership", {"schema": schema}, lambda rows: bool(rows[0][0]))


# ---- streams (sql/queries/waits.sql) ------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class StreamRead:
    """One look at a stream: its execution had finished (when the values were read), the values after the
    last one seen (step id, JSON text), and whether the stream's close was among them. exists is False
    when there is no such execution."""

    exists: bool
    ended: bool
    values: list[tuple[int, str]]
    closed: bool


def _stream_read(rows: list[dict[str, Any]]) -> StreamRead:
    if not rows:
        return StreamRead(False, True, [], False)
    values = [(row["step_id"], row["value"]) for row in rows if row["step_id"] is not None and not row["closed"]]
    return StreamRead(True, bool(rows[0]["ended"]), values, any(row["closed"] for row in rows))


def write_stream(*, id: str, attempt: int, step_id: int, step_name: str, started_at: datetime, key: str,
                 value: str | None) -> Call[bool]:
    """A value (JSON text) written to a stream, or its close (``value`` None), recorded as the step."""
    return Call("write_stream", {"id": id, "attempt": attempt, "step_id": step_id, "step_name": step_name,
                                 "started_at": started_at, "key": key, "value": value},
                lambda rows: bool(rows[0][0]))


def read_stream(*, id: str, key: str, after: int, limit: int = 1000) -> Call[StreamRead]:
    return Call("read_stream", {"id": id, "key": key, "after": after, "limit": limit}, _stream_read,
                row_factory=dict_row)


@dataclass(frozen=True, slots=True)
class Stream:
    key: str
    values: int
    closed: bool
    last_at: datetime


def list_streams(id: str, limit: int = 1000) -> Call[list[Stream]]:
    return Call("list_streams", {"id": id, "limit": limit}, _all, row_factory=class_row(Stream))

