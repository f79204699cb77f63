"""``pgdurable schedules ...``: list, create, delete, pause and resume cron schedules."""

from __future__ import annotations

import json
from typing import Annotated, Any, cast

import typer
from rich.table import Table

from ..schedules import CatchUp, Schedule
from ._common import AsJson, DatabaseUrl, Schema, command_group, console, jsonable, open_app, when

schedules_cli = command_group("Cron schedules: a workflow enqueued at every tick of a cron expression.")


def _schedule_dict(schedule: Schedule) -> dict[str, Any]:
    return {name: jsonable(getattr(schedule, name)) for name in Schedule.__slots__}


@schedules_cli.command("list")
def list_schedules(database_url: DatabaseUrl = None, schema: Schema = None, as_json: AsJson = False) -> None:
    """List schedules: their timetable, next and last tick, and whether they are paused (and why)."""
    with open_app(database_url, schema) as app:
        found = app.list_schedules()
    if as_json:
        print(json.dumps([_schedule_dict(s) for s in found], indent=2))
        return
    table = Table("name", "workflow", "cron", "timezone", "queue", "catch up", "next tick", "last tick", "state")
    for s in found:
        state = "active" if not s.paused else f"[red]paused: {s.last_error}[/red]" if s.last_error else "paused"
        table.add_row(s.name, s.workflow_name, s.cron, s.timezone, s.queue, s.catch_up,
                      when(s.next_fire_at) if not s.paused else "", when(s.last_fired_at), state)
    console.print(table)


@schedules_cli.command("create")
def create_schedule(
    name: Annotated[str, typer.Argument(help="The schedule's name (letters, digits, _ . : -).")],
    workflow: Annotated[str, typer.Argument(help="The workflow's name, as its workers register it.")],
    cron: Annotated[str, typer.Argument(
        help="5 fields (minute hour day month weekday), 6 with seconds first, or @hourly, @daily...")],
    timezone: Annotated[str, typer.Option("--timezone", "--tz", help="IANA time zone of the cron's times.")] = "UTC",
    queue: Annotated[str | None, typer.Option(help="Queue (default: 'default').")] = None,
    priority: Annotated[int | None, typer.Option(help="Priority of the executions (lower runs first).")] = None,
    args: Annotated[str | None, typer.Option("--args", help='Keyword arguments as a JSON object: \'{"n": 1}\'.')]
    = None,
    catch_up: Annotated[str, typer.Option(
        "--catch-up", help="After downtime: 'skip' (fire only ticks late by < 60 s) or 'all'.")] = "skip",
    pass_scheduled_at: Annotated[bool, typer.Option(
        "--pass-scheduled-at", help="Pass each tick's time as the argument scheduled_at.")] = False,
    database_url: DatabaseUrl = None, schema: Schema = None, as_json: AsJson = False,
) -> None:
    """Create a schedule, or redefine the one with this name (its next tick stays unless the cron changed)."""
    arguments: Any = None
    if args is not None:
        try:
            arguments = json.loads(args)
        except json.JSONDecodeError as exc:
            console.print(f"[red]--args is not valid JSON: {exc}[/red]")
            raise typer.Exit(2) from None
        if not isinstance(arguments, dict):
            console.print("[red]--args must be a JSON object of keyword arguments, like '{\"n\": 1}'[/red]")
            raise typer.Exit(2)
    with open_app(database_url, schema) as app:
        try:
            created = app.schedule(name, workflow, cron, timezone=timezone, queue=queue, priority=priority,
                                   args=arguments, catch_up=cast("CatchUp", catch_up),
                                   pass_scheduled_at=pass_scheduled_at)
        except (ValueError, TypeError) as exc:
            console.print(str(exc), markup=False, style="red")
            raise typer.Exit(2) from None
    if as_json:
        print(json.dumps(_schedule_dict(created), indent=2))
    else:
        paused = " [yellow](paused)[/yellow]" if created.paused else ""
        console.print(f"schedule {created.name}: {created.workflow_name} at {created.cron!r} ({created.timezone}), "
                      f"next tick {when(created.next_fire_at)}{paused}")


def _schedule_command(verb: str, name: str, as_json: bool, done: bool) -> None:
    if as_json:
        print(json.dumps({"name": name, verb: done}))
    elif done:
        console.print(f"schedule {name}: {verb}")
    else:
        console.print(f"[yellow]no schedule named {name}[/yellow]")
    if not done:
        raise typer.Exit(1)


@schedules_cli.command("delete")
def delete_schedule(name: str, database_url: DatabaseUrl = None, schema: Schema = None,
                    as_json: AsJson = False) -> None:
    """Delete a schedule (executions it already enqueued are left alone)."""
    with open_app(database_url, schema) as app:
        done = app.unschedule(name)
    _schedule_command("deleted", name, as_json, done)


@schedules_cli.command("pause")
def pause_schedule(name: str, database_url: DatabaseUrl = None, schema: Schema = None,
                   as_json: AsJson = False) -> None:
    """Stop firing a schedule until it is resumed."""
    with open_app(database_url, schema) as app:
        done = app.pause_schedule(name)
    _schedule_command("paused", name, as_json, done)


@schedules_cli.command("resume")
def resume_schedule(name: str, database_url: DatabaseUrl = None, schema: Schema = None,
                    as_json: AsJson = False) -> None:
    """Fire a paused schedule again from its next tick (the ticks missed while paused do not fire)."""
    with open_app(database_url, schema) as app:
        try:
            done = app.resume_schedule(name)
        except ValueError as exc:
            console.print(str(exc), markup=False, style="red")
            raise typer.Exit(2) from None
    _schedule_command("resumed", name, as_json, done)
