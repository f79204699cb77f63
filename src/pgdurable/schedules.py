"""Cron schedules as data: their rows, definitions and statements.

A schedule enqueues one execution of a workflow per tick of a cron expression in a time zone (cron.py reads
the expression). scheduling.py checks and stores definitions for the App; workers fire them
(worker/maintenance/scheduler.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from psycopg.rows import dict_row

from .cron import CronSchedule
from .store import Call
from .store.calls import rows_of

CatchUp = Literal["skip", "all"]

CATCH_UP_POLICIES: tuple[CatchUp, ...] = ("skip", "all")
SCHEDULED_AT = "scheduled_at"


# ---- rows and statements ----------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Schedule:
    """A row of the schedules table."""

    name: str
    workflow_name: str
    cron: str
    timezone: str
    queue: str
    priority: int
    max_recoveries: int
    args: dict[str, Any]
    pass_scheduled_at: bool
    catch_up: str
    paused: bool
    next_fire_at: datetime | None
    last_fired_at: datetime | None
    last_error: str | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class LockedSchedule:
    """One schedule, locked, with the database's time (``clock_now()``)."""

    now: datetime
    cron: str
    timezone: str
    paused: bool


@dataclass(frozen=True, slots=True)
class DueSchedule:
    """A due schedule locked for firing, with the database's time."""

    now: datetime
    name: str
    cron: str
    timezone: str
    catch_up: CatchUp
    next_fire_at: datetime | None


@dataclass(frozen=True, slots=True)
class SquattedTick:
    """A tick whose deterministic id is held by an execution no firing of it created."""

    schedule_name: str
    execution_id: str
    workflow_name: str
    created_at: datetime


def _schedule(row: dict[str, Any]) -> Schedule:
    args = row["args"]
    return Schedule(**{**row, "args": json.loads(args) if isinstance(args, str) else args})  # jsonb as text


def _one_schedule(rows: list[dict[str, Any]]) -> Schedule | None:
    return _schedule(rows[0]) if rows else None


def database_now() -> Call[datetime]:
    return Call("database_now", {}, lambda rows: rows[0][0])


def upsert_schedule(definition: ScheduleDefinition, next_fire_at: datetime) -> Call[Schedule | None]:
    return Call("upsert_schedule", {
        "name": definition.name, "workflow_name": definition.workflow_name, "cron": definition.cron.expression,
        "timezone": definition.cron.timezone, "queue": definition.queue, "priority": definition.priority,
        "max_recoveries": definition.max_recoveries, "args": definition.args,
        "pass_scheduled_at": definition.pass_scheduled_at, "catch_up": definition.catch_up,
        "next_fire_at": next_fire_at, "timeout_seconds": definition.timeout_seconds}, _one_schedule,
        row_factory=dict_row)


def get_schedule(name: str) -> Call[Schedule | None]:
    return Call("get_schedule", {"name": name}, _one_schedule, row_factory=dict_row)


def list_schedules() -> Call[list[Schedule]]:
    return Call("list_schedules", {}, lambda rows: [_schedule(row) for row in rows], row_factory=dict_row)


def lock_schedule(name: str) -> Call[LockedSchedule | None]:
    """One schedule, locked; None if there is no such schedule."""
    return Call("lock_schedule", {"name": name}, lambda rows: rows[0] if rows else None,
                row_factory=rows_of(LockedSchedule))


def delete_schedule(name: str) -> Call[bool]:
    return Call("delete_schedule", {"name": name}, bool)


def pause_schedule(name: str) -> Call[bool]:
    return Call("pause_schedule", {"name": name}, bool)


def resume_schedule(name: str, next_fire_at: datetime) -> Call[bool]:
    return Call("resume_schedule", {"name": name, "next_fire_at": next_fire_at}, bool)


def seconds_until_due() -> Call[float | None]:
    return Call("seconds_until_due", {}, lambda rows: float(rows[0][0]) if rows else None)


def lock_due_schedules(limit: int) -> Call[list[DueSchedule]]:
    """The due schedules, locked for this firing transaction."""
    return Call("lock_due_schedules", {"limit": limit}, list, row_factory=rows_of(DueSchedule))


def enqueue_ticks(rows: str) -> Call[set[str]]:
    """``rows``: a JSON array of [execution_id, schedule_name, tick]; returns the ids enqueued."""
    return Call("enqueue_ticks", {"rows": rows}, lambda found: {row[0] for row in found})


def squatted_ticks(rows: str) -> Call[list[SquattedTick]]:
    """``rows``: a JSON array of [execution_id, schedule_name, tick] not enqueued; returns those held by an
    execution no firing created."""
    return Call("squatted_ticks", {"rows": rows}, list, row_factory=rows_of(SquattedTick))


def advance_schedules(rows: str) -> Call[None]:
    """``rows``: a JSON array of [schedule_name, next_fire_at, last_fired_at or null]."""
    return Call("advance_schedules", {"rows": rows}, lambda found: None)


def pause_invalid_schedules(rows: str) -> Call[None]:
    """``rows``: a JSON array of [schedule_name, error message]."""
    return Call("pause_invalid_schedules", {"rows": rows}, lambda found: None)


# ---- definitions ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ScheduleDefinition:
    """A validated schedule, ready to store: arguments already encoded as the JSON object an enqueue stores."""

    name: str
    workflow_name: str
    cron: CronSchedule
    queue: str
    priority: int
    max_recoveries: int
    args: str
    pass_scheduled_at: bool
    catch_up: CatchUp
    # The workflow's own time budget, given to every tick's execution (as an enqueue would).
    timeout_seconds: float | None = None
