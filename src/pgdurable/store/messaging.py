"""What workflows exchange and publish: messages, events, tags and streams (their writes recorded as steps),
and reading them back (sql/queries/waits.sql; set_tags in executions.sql)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.rows import dict_row

from .calls import Call, every, rows_of


@dataclass(frozen=True, slots=True)
class Received:
    owned: bool
    wakeups: int | None
    found: bool
    message: str | None


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


@dataclass(frozen=True, slots=True)
class Message:
    id: int
    topic: str
    message: Any
    idempotency_key: str | None
    created_at: datetime
    consumed_at: datetime | None
    consumed_by_step: int | None


def list_messages(id: str) -> Call[list[Message]]:
    return Call("list_messages", {"id": id}, every, row_factory=rows_of(Message))


@dataclass(frozen=True, slots=True)
class Event:
    key: str
    step_id: int
    value: Any
    created_at: datetime


def set_event(*, id: str, attempt: int, step_id: int, step_name: str, started_at: datetime, key: str,
              value: str) -> Call[bool]:
    return Call("set_event", {"id": id, "attempt": attempt, "step_id": step_id, "step_name": step_name,
                              "started_at": started_at, "key": key, "value": value},
                lambda rows: bool(rows[0][0]))


def get_event(*, id: str, key: str) -> Call[str | None]:
    return Call("get_event", {"id": id, "key": key}, lambda rows: rows[0][0] if rows else None)


def list_events(id: str) -> Call[list[Event]]:
    return Call("list_events", {"id": id}, every, row_factory=rows_of(Event))


def set_tags(*, id: str, attempt: int, step_id: int, step_name: str, started_at: datetime,
             tags: str) -> Call[bool]:
    return Call("set_tags", {"id": id, "attempt": attempt, "step_id": step_id, "step_name": step_name,
                             "started_at": started_at, "tags": tags}, lambda rows: bool(rows[0][0]))


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
    return Call("list_streams", {"id": id, "limit": limit}, every, row_factory=rows_of(Stream))
