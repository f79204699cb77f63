"""What the App's schedule methods do: check a definition now (so that a bad one fails at creation, not at
3 am), store it, remember a declared one for the workers, resume a paused one. The rows and statements are in
schedules.py; workers fire schedules in worker/maintenance/scheduler.py."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

from . import limits, store
from .cron import CronSchedule
from .runtime import Runtime
from .schedules import (
    CATCH_UP_POLICIES,
    SCHEDULED_AT,
    CatchUp,
    Schedule,
    ScheduleDefinition,
    database_now,
    get_schedule,
    lock_schedule,
    resume_schedule,
    upsert_schedule,
)
from .workflows import Workflow

W = TypeVar("W", bound=Workflow[Any, Any])


def define(runtime: Runtime, name: str, workflow: Workflow[..., Any] | str, cron: str, *, timezone: str,
           queue: str | None, priority: int | None, args: Mapping[str, Any] | None, catch_up: str,
           pass_scheduled_at: bool | None) -> ScheduleDefinition:
    """Check everything a schedule's ticks will need, now, so that a bad one fails at creation, not at 3 am."""
    if not isinstance(name, str) or not limits.NAME.fullmatch(name):
        raise ValueError(f"schedule name {name!r} is not valid: 1 to 100 letters, digits, or _ . : -")
    if catch_up not in CATCH_UP_POLICIES:
        raise ValueError(f"catch_up must be 'skip' or 'all', not {catch_up!r}")
    timetable = CronSchedule(cron, timezone)
    timetable.next_after(datetime.now(UTC))  # only to check that it ever fires: firing uses the database's clock
    arguments = dict(args or {})
    if not all(isinstance(key, str) for key in arguments):
        raise TypeError("schedule args must be a mapping of argument names to values")
    if queue is not None and (not isinstance(queue, str) or not limits.NAME.fullmatch(queue)):
        raise ValueError(f"queue {queue!r} is not valid: 1 to 100 letters, digits, or _ . : -")

    known = runtime.registry.resolve(workflow)
    if known is None:
        # A workflow another process defines: its signature is unknown here, so only encoding is checked.
        assert isinstance(workflow, str)
        workflow_name, default_queue, default_priority = workflow, "default", 0
        max_recoveries = runtime.settings.max_recoveries
        passes = bool(pass_scheduled_at)
        if not workflow or len(workflow) > 200:
            raise ValueError("workflow name must be 1 to 200 characters")
    else:
        workflow_name, default_queue, default_priority = known.name, known.queue, known.priority
        max_recoveries = runtime.settings.max_recoveries if known.max_recoveries is None else known.max_recoveries
        parameters = known.signature.signature.parameters
        takes_it = SCHEDULED_AT in parameters
        passes = takes_it if pass_scheduled_at is None else pass_scheduled_at
        if passes and not takes_it:
            raise TypeError(f"workflow {known.name!r} has no parameter {SCHEDULED_AT!r} to receive the tick's time; "
                            "add one or leave pass_scheduled_at off")
    if passes and SCHEDULED_AT in arguments:
        raise ValueError(f"args must not hold {SCHEDULED_AT!r}: each tick passes its own time")
    if known is None:
        encoded = runtime.serializer.dumps(arguments)
    else:
        # Bound with a stand-in tick time, as a tick will be: missing or unknown arguments fail now. The
        # arguments are stored by parameter name, as an enqueue stores them; each tick adds its own time.
        bound = known.bind((), {**arguments, **({SCHEDULED_AT: datetime.now(UTC)} if passes else {})})
        if passes:
            del bound[SCHEDULED_AT]
        encoded = known.encode_bound(runtime.serializer, bound)
    policy: CatchUp = "skip" if catch_up == "skip" else "all"
    return ScheduleDefinition(
        name=name, workflow_name=workflow_name, cron=timetable, queue=queue or default_queue,
        priority=default_priority if priority is None else priority, max_recoveries=max_recoveries,
        args=encoded, pass_scheduled_at=passes, catch_up=policy,
        timeout_seconds=None if known is None else known.timeout_seconds)


def store_definition(runtime: Runtime, definition: ScheduleDefinition) -> Schedule:
    """Create or redefine a schedule; its next tick is computed from the database's clock."""
    with runtime.db.pool.connection() as conn, conn.transaction():
        now = store.run(conn, database_now())
        stored = store.run(conn, upsert_schedule(definition, definition.cron.next_after(now)))
    if stored is None:  # a concurrent definition of the same name won; read what it stored
        stored = runtime.db.run(get_schedule(definition.name))
    assert stored is not None
    return stored


def declare(runtime: Runtime, workflow: W, definition: ScheduleDefinition) -> W:
    """@app.scheduled: remember the schedule; workers store it when they start."""
    if definition.name in runtime.declared_schedules:
        raise ValueError(f"schedule {definition.name!r} is declared twice; give one of them @app.scheduled(name=...)")
    runtime.declared_schedules[definition.name] = definition
    return workflow


def resume(runtime: Runtime, name: str) -> bool:
    with runtime.db.pool.connection() as conn, conn.transaction():
        found = store.run(conn, lock_schedule(name))
        if found is None:
            return False
        try:
            next_fire_at = CronSchedule(found.cron, found.timezone).next_after(found.now)
        except ValueError as exc:
            raise ValueError(f"schedule {name!r} cannot be resumed: {exc}; redefine it") from None
        return store.run(conn, resume_schedule(name, next_fire_at))
