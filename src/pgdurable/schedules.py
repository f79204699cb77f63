"""Cron schedules: their rows and statements, how a definition is validated, and the App's schedule methods.

A schedule enqueues one execution of a workflow per tick of a cron expression in a time zone. Workers fire
them (see scheduler.py); this module only defines and stores them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from . import store
from .cron import CronSchedule
from .store import Call, Rows
from .workflows import Workflow

if TYPE_CHECKING:
    from .app import App

W = TypeVar("W", bound=Workflow[Any, Any])
CatchUp = Literal["skip", "all"]

CATCH_UP_POLICIES: tuple[CatchUp, ...] = ("skip", "all")
# The same rule as queue names (and the table's CHECK).
_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,100}$")
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


def define(app: App, name: str, workflow: Workflow[..., Any] | str, cron: str, *, timezone: str,
           queue: str | None, priority: int | None, args: Mapping[str, Any] | None, catch_up: str,
           pass_scheduled_at: bool | None) -> ScheduleDefinition:
    """Check everything a schedule's ticks will need, now, so that a bad one fails at creation, not at 3 am."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"schedule name {name!r} is not valid: 1 to 100 letters, digits, or _ . : -")
    if catch_up not in CATCH_UP_POLICIES:
        raise ValueError(f"catch_up must be 'skip' or 'all', not {catch_up!r}")
    timetable = CronSchedule(cron, timezone)
    timetable.next_after(datetime.now(UTC))  # only to check that it ever fires: firing uses the database's clock
    arguments = dict(args or {})
    if not all(isinstance(key, str) for key in arguments):
        raise TypeError("schedule args must be a mapping of argument names to values")
    if queue is not None and (not isinstance(queue, str) or not _NAME.match(queue)):
        raise ValueError(f"queue {queue!r} is not valid: 1 to 100 letters, digits, or _ . : -")

    known = app._resolve(workflow)
    if known is None:
        # A workflow another process defines: its signature is unknown here, so only encoding is checked.
        assert isinstance(workflow, str)
        workflow_name, default_queue, default_priority = workflow, "default", 0
        max_recoveries = app.settings.max_recoveries
        passes = bool(pass_scheduled_at)
        if not workflow or len(workflow) > 200:
            raise ValueError("workflow name must be 1 to 200 characters")
    else:
        workflow_name, default_queue, default_priority = known.name, known.queue, known.priority
        max_recoveries = app.settings.max_recoveries if known.max_recoveries is None else known.max_recoveries
        parameters = known.signature.signature.parameters
        takes_it = SCHEDULED_AT in parameters
        passes = takes_it if pass_scheduled_at is None else pass_scheduled_at
        if passes and not takes_it:
            raise TypeError(f"workflow {known.name!r} has no parameter {SCHEDULED_AT!r} to receive the tick's time; "
                            "add one or leave pass_scheduled_at off")
    if passes and SCHEDULED_AT in arguments:
        raise ValueError(f"args must not hold {SCHEDULED_AT!r}: each tick passes its own time")
    if known is None:
        encoded = app.serializer.dumps(arguments)
    else:
        # Bound with a stand-in tick time, as a tick will be: missing or unknown arguments fail now. The
        # arguments are stored by parameter name, as an enqueue stores them; each tick adds its own time.
        bound = app._bind(known, (), {**arguments, **({SCHEDULED_AT: datetime.now(UTC)} if passes else {})})
        if passes:
            del bound[SCHEDULED_AT]
        encoded = app._encode_bound(known, bound)
    policy: CatchUp = "skip" if catch_up == "skip" else "all"
    return ScheduleDefinition(
        name=name, workflow_name=workflow_name, cron=timetable, queue=queue or default_queue,
        priority=default_priority if priority is None else priority, max_recoveries=max_recoveries,
        args=encoded, pass_scheduled_at=passes, catch_up=policy,
        timeout_seconds=None if known is None else known.timeout_seconds)


# ---- what App's methods do -------------------------------------------------------------------------------

def store_definition(app: App, definition: ScheduleDefinition) -> Schedule:
    """Create or redefine a schedule; its next tick is computed from the database's clock."""
    with app.db.pool.connection() as conn, conn.transaction():
        now = store.run(conn, database_now())
        stored = store.run(conn, upsert_schedule(definition, definition.cron.next_after(now)))
    if stored is None:  # a concurrent definition of the same name won; read what it stored
        stored = app.db.run(get_schedule(definition.name))
    assert stored is not None
    return stored


def declare(app: App, workflow: W, definition: ScheduleDefinition) -> W:
    """@app.scheduled: remember the schedule; workers store it when they start."""
    if definition.name in app.declared_schedules:
        raise ValueError(f"schedule {definition.name!r} is declared twice; give one of them @app.scheduled(name=...)")
    app.declared_schedules[definition.name] = definition
    return workflow


def resume(app: App, name: str) -> bool:
    with app.db.pool.connection() as conn, conn.transaction():
        found = store.run(conn, lock_schedule(name))
        if found is None:
            return False
        now, cron, timezone, _paused = found
        try:
            next_fire_at = CronSchedule(cron, timezone).next_after(now)
        except ValueError as exc:
            raise ValueError(f"schedule {name!r} cannot be resumed: {exc}; redefine it") from None
        return store.run(conn, resume_schedule(name, next_fire_at))
