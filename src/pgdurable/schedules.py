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

from .cron import CronSchedule
from .store import Call, Rows

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


def _schedule(row: tuple[Any, ...]) -> Schedule:
    values = list(row)
    values[7] = json.loads(values[7]) if isinstance(values[7], str) else values[7]  # args: jsonb as text
    return Schedule(*values)


def _one_schedule(rows: Rows) -> Schedule | None:
    return _schedule(rows[0]) if rows else None


def database_now() -> Call[datetime]:
    return Call("database_now", {}, lambda rows: rows[0][0])


def upsert_schedule(definition: ScheduleDefinition, next_fire_at: datetime) -> Call[Schedule | None]:
    return Call("upsert_schedule", {
        "name": definition.name, "workflow_name": definition.workflow_name, "cron": definition.cron.expression,
        "timezone": definition.cron.timezone, "queue": definition.queue, "priority": definition.priority,
        "max_recoveries": definition.max_recoveries, "args": definition.args,
        "pass_scheduled_at": definition.pass_scheduled_at, "catch_up": definition.catch_up,
        "next_fire_at": next_fire_at, "timeout_seconds": definition.timeout_seconds}, _one_schedule)


def get_schedule(name: str) -> Call[Schedule | None]:
    return Call("get_schedule", {"name": name}, _one_schedule)


def list_schedules() -> Call[list[Schedule]]:
    return Call("list_schedules", {}, lambda rows: [_schedule(row) for row in rows])


def lock_schedule(name: str) -> Call[tuple[Any, ...] | None]:
    """(database now, cron, timezone, paused) of one schedule, locked; None if there is no such schedule."""
    return Call("lock_schedule", {"name": name}, lambda rows: rows[0] if rows else None)


def delete_schedule(name: str) -> Call[bool]:
    return Call("delete_schedule", {"name": name}, bool)


def pause_schedule(name: str) -> Call[bool]:
    return Call("pause_schedule", {"name": name}, bool)


def resume_schedule(name: str, next_fire_at: datetime) -> Call[bool]:
    return Call("resume_schedule", {"name": name, "next_fire_at": next_fire_at}, bool)


def seconds_until_due() -> Call[float | None]:
    return Call("seconds_until_due", {}, lambda rows: float(rows[0][0]) if rows else None)


def lock_due_schedules(limit: int) -> Call[list[tuple[Any, ...]]]:
    """(database now, name, cron, timezone, catch_up, next_fire_at) of due schedules, locked."""
    return Call("lock_due_schedules", {"limit": limit}, lambda rows: rows)


def enqueue_ticks(rows: str) -> Call[set[str]]:
    """``rows``: a JSON array of [execution_id, schedule_name, tick]; returns the ids enqueued."""
    return Call("enqueue_ticks", {"rows": rows}, lambda found: {row[0] for row in found})


def squatted_ticks(rows: str) -> Call[list[tuple[Any, ...]]]:
    """``rows``: a JSON array of [execution_id, schedule_name, tick] not enqueued; returns (schedule_name,
    execution_id, workflow_name, created_at) of those held by an execution no firing created."""
    return Call("squatted_ticks", {"rows": rows}, lambda found: found)


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
