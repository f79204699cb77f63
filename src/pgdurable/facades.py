"""The App's calls of two domains with logic modules of their own: schedules (scheduling.py, fired by
worker/maintenance/scheduler.py) and table bindings (bindings.py). Mixins of the App facade (app.py), each a
thin layer over its domain: every call is one plan or statement of that module, sync and async."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from . import bindings, scheduling
from .bindings import Binding
from .runtime import Runtime
from .schedules import CatchUp, Schedule, delete_schedule, get_schedule, list_schedules, pause_schedule
from .workflows import Workflow

W = TypeVar("W", bound=Workflow[Any, Any])


class ScheduleCalls:
    runtime: Runtime

    # -- schedules (logic: schedules.py, and worker/maintenance/scheduler.py fires them) ------------------

    def schedule(self, name: str, workflow: Workflow[..., Any] | str, cron: str, *, timezone: str = "UTC",
                 queue: str | None = None, priority: int | None = None, args: Mapping[str, Any] | None = None,
                 catch_up: CatchUp = "skip", pass_scheduled_at: bool | None = None) -> Schedule:
        """Create or redefine the schedule ``name``: workers enqueue ``workflow`` at every tick of ``cron``.

        ``cron``: 5 fields, 6 with seconds first, or @hourly/@daily/@weekly/@monthly/@yearly, read as
        wall-clock time in ``timezone`` (an IANA name). ``args``: the workflow's keyword arguments.
        ``pass_scheduled_at``: also pass the tick's time as ``scheduled_at`` (default: when the workflow has
        such a parameter). ``catch_up``: after downtime, "skip" fires only ticks late by less than 60 s,
        "all" fires every missed tick. Everything is checked now: ``ValueError``/``TypeError`` on a bad
        expression, time zone or arguments. Redefining keeps the next tick unless the timetable changed.
        """
        return self.runtime.db.run_plan(scheduling.store_definition(scheduling.define(
            self.runtime, name, workflow, cron, timezone=timezone, queue=queue, priority=priority, args=args,
            catch_up=catch_up, pass_scheduled_at=pass_scheduled_at)), transaction=True)

    async def schedule_async(self, name: str, workflow: Workflow[..., Any] | str, cron: str, *,
                             timezone: str = "UTC", queue: str | None = None, priority: int | None = None,
                             args: Mapping[str, Any] | None = None, catch_up: CatchUp = "skip",
                             pass_scheduled_at: bool | None = None) -> Schedule:
        return await self.runtime.db.arun_plan(scheduling.store_definition(scheduling.define(
            self.runtime, name, workflow, cron, timezone=timezone, queue=queue, priority=priority, args=args,
            catch_up=catch_up, pass_scheduled_at=pass_scheduled_at)), transaction=True)

    def scheduled(self, cron: str, *, name: str | None = None, timezone: str = "UTC", queue: str | None = None,
                  priority: int | None = None, args: Mapping[str, Any] | None = None, catch_up: CatchUp = "skip",
                  pass_scheduled_at: bool | None = None) -> Callable[[W], W]:
        """Decorator, above ``@app.workflow``: run the workflow on a cron schedule (named after the workflow
        unless ``name`` is given; options as in ``schedule``). Checked at once; stored (created, or redefined
        where it changed) when a worker starts."""

        def register(workflow: W) -> W:
            if not isinstance(workflow, Workflow):
                raise TypeError("@app.scheduled goes above @app.workflow: it schedules a registered workflow")
            return scheduling.declare(self.runtime, workflow, scheduling.define(
                self.runtime, name or workflow.name, workflow, cron, timezone=timezone, queue=queue, priority=priority,
                args=args, catch_up=catch_up, pass_scheduled_at=pass_scheduled_at))

        return register

    def get_schedule(self, name: str) -> Schedule | None:
        return self.runtime.db.run(get_schedule(name))

    async def get_schedule_async(self, name: str) -> Schedule | None:
        return await self.runtime.db.arun(get_schedule(name))

    def list_schedules(self) -> list[Schedule]:
        return self.runtime.db.run(list_schedules())

    async def list_schedules_async(self) -> list[Schedule]:
        return await self.runtime.db.arun(list_schedules())

    def unschedule(self, name: str) -> bool:
        """Delete a schedule; True if it existed. Executions it already enqueued are left alone."""
        return self.runtime.db.run(delete_schedule(name))

    async def unschedule_async(self, name: str) -> bool:
        return await self.runtime.db.arun(delete_schedule(name))

    def pause_schedule(self, name: str) -> bool:
        """Stop firing a schedule until it is resumed; True if it exists."""
        return self.runtime.db.run(pause_schedule(name))

    async def pause_schedule_async(self, name: str) -> bool:
        return await self.runtime.db.arun(pause_schedule(name))

    def resume_schedule(self, name: str) -> bool:
        """Fire a paused schedule again from its first tick after now (ticks missed while paused do not fire);
        True if it exists. ``ValueError`` if its stored expression or time zone is invalid."""
        return self.runtime.db.run_plan(scheduling.resume(name), transaction=True)

    async def resume_schedule_async(self, name: str) -> bool:
        return await self.runtime.db.arun_plan(scheduling.resume(name), transaction=True)


class BindingCalls:
    runtime: Runtime

    # -- table bindings (logic: bindings.py; the trigger: migration 0015) -----------------------------------

    def bind_table(self, table: str, workflow: Workflow[..., Any] | str, *,
                   on: str | Iterable[str] = ("insert",), when: str | None = None, name: str | None = None,
                   pass_old: bool | None = None, queue: str | None = None, priority: int | None = None,
                   max_recoveries: int | None = None, timeout_seconds: float | None = None) -> Binding:
        """Enqueue ``workflow`` for every change of a row of ``table`` (an insert, update or delete, as
        ``on`` says) for which ``when`` holds, inside the writing transaction: exactly one execution per
        change if that transaction commits, none if it rolls back. A trigger does it, so every writer (any
        language, any role) is covered; the writing role needs no rights on pgdurable's tables.

        The row's columns are the workflow's arguments by name (columns it does not take are left out; a
        parameter without a default that no column fills is refused now). ``pass_old``: also pass the row
        before the change as ``old`` (default: whether the workflow has a parameter named ``old``).
        ``when``: a SQL boolean expression on ``NEW`` and ``OLD``, written by the developer (never from
        user input), e.g. ``"NEW.status = 'paid'"``. ``name``: the binding's name (default
        ``"<table>:<workflow>"``); binding the same name again replaces the binding. The table needs a
        primary key. See docs/table-bound-workflows.md.
        """
        return bindings.bind(self.runtime, table, workflow, on=on, when=when, name=name, pass_old=pass_old,
                             queue=queue, priority=priority, max_recoveries=max_recoveries,
                             timeout_seconds=timeout_seconds)

    async def bind_table_async(self, table: str, workflow: Workflow[..., Any] | str, *,
                               on: str | Iterable[str] = ("insert",), when: str | None = None,
                               name: str | None = None, pass_old: bool | None = None, queue: str | None = None,
                               priority: int | None = None, max_recoveries: int | None = None,
                               timeout_seconds: float | None = None) -> Binding:
        # Several statements in one transaction, with checks between them: the sync implementation, on a thread.
        return await asyncio.to_thread(
            self.bind_table, table, workflow, on=on, when=when, name=name, pass_old=pass_old, queue=queue,
            priority=priority, max_recoveries=max_recoveries, timeout_seconds=timeout_seconds)

    def bindings(self) -> list[Binding]:
        """Every table binding, with the table its trigger is on now (``installed_on``; None if it is gone)."""
        return self.runtime.db.run(bindings.list_bindings())

    async def bindings_async(self) -> list[Binding]:
        return await self.runtime.db.arun(bindings.list_bindings())

    def restore_bindings(self) -> list[str]:
        """Re-create, from their records, the triggers of the bindings whose table exists but whose trigger
        is gone (the table was dropped and created again); returns their names."""
        return self.runtime.db.run(bindings.restore())

    async def restore_bindings_async(self) -> list[str]:
        return await self.runtime.db.arun(bindings.restore())

    def unbind_table(self, name: str) -> bool:
        """Remove a table binding (its trigger and its record); True if it existed. Executions it already
        enqueued are left alone."""
        return self.runtime.db.run(bindings.unbind(name))

    async def unbind_table_async(self, name: str) -> bool:
        return await self.runtime.db.arun(bindings.unbind(name))
