"""``pgdurable versions``: application versions with unfinished work, and moving one version's executions to
another (``versions migrate OLD NEW``)."""

from __future__ import annotations

import dataclasses
import json

import typer
from rich.table import Table

from ._common import NO_LOCALS, AsJson, DatabaseUrl, Schema, Typer, console, open_app

versions_cli = Typer(**NO_LOCALS, invoke_without_command=True,
                     help="Application versions: unfinished executions and live workers of each "
                          "(with no subcommand), and migrating one version's executions to another.")


@versions_cli.callback()
def versions(ctx: typer.Context, database_url: DatabaseUrl = None, schema: Schema = None,
             as_json: AsJson = False) -> None:
    """Each version's unfinished executions by status (parked apart) and its live workers.

    Example: pgdurable versions --json
    """
    if ctx.invoked_subcommand is not None:
        return
    with open_app(database_url, schema) as app:
        rows = app.versions()
    if as_json:
        print(json.dumps([dataclasses.asdict(r) for r in rows], indent=2))
        return
    table = Table("version", "enqueued", "waiting", "running", "parked", "live workers")
    for r in rows:
        table.add_row(r.app_version, str(r.enqueued), str(r.waiting), str(r.running),
                      f"[red]{r.parked}[/red]" if r.parked else "0", str(r.live_workers))
    console.print(table)


@versions_cli.command("migrate")
def migrate(old: str, new: str, database_url: DatabaseUrl = None, schema: Schema = None,
            as_json: AsJson = False) -> None:
    """Move the unfinished executions of version OLD to version NEW (NEW's workers resume them), re-enqueueing
    the parked ones (OLD = NEW: only re-enqueue the parked ones). Exit code 1 when nothing changed.

    Example: pgdurable versions migrate 3f2a9c0e1b7d release-8
    """
    with open_app(database_url, schema) as app:
        try:
            moved = app.migrate_version(old, new)
        except ValueError as exc:
            console.print(f"[red]{exc}[/red]")
            raise typer.Exit(2) from None
    if as_json:
        print(json.dumps({"from": old, "to": new, "moved": moved}))
    else:
        console.print(f"moved {moved} unfinished executions from version {old} to {new}")
    if not moved:
        raise typer.Exit(1)
