"""``pgdurable migrate`` and ``pgdurable cleanup``: create or upgrade the schema, delete old executions."""

from __future__ import annotations

import json
from typing import Annotated

import psycopg
import typer
from rich.console import Console
from rich.markup import escape

from ..app import App
from ..dberrors import explain
from ..errors import ConfigurationError, SchemaNotInstalled
from ._common import AsJson, DatabaseUrl, Schema, console, fail


def migrate(database_url: DatabaseUrl = None, schema: Schema = None, as_json: AsJson = False) -> None:
    """Create or upgrade pgdurable's schema (also done automatically on first use).

    Example: PGDURABLE_DATABASE_URL=postgresql://app@db/shop pgdurable migrate --json
    """
    app = App(database_url, schema=schema, auto_migrate=False)
    try:
        applied = app.migrate()
    except ConfigurationError as exc:
        fail(str(exc))
    except psycopg.OperationalError as exc:
        fail(explain(exc, app.db.known_conninfo).message)
    finally:
        app.close()
    if as_json:
        print(json.dumps({"schema": app.schema, "applied": applied}))
    else:
        console.print(f"schema {app.schema}: " + (f"applied {applied}" if applied else "already up to date"))


# typer rewraps each paragraph of an epilog, so a paragraph is one line (blank lines separate them);
# epilogs are rich markup, so a literal [ is written \[.
CLEANUP_EPILOG = (
    "Examples:\n\n  pgdurable cleanup --older-than 30d\n\n"
    "  pgdurable cleanup --older-than 7d --status failed,cancelled --dry-run\n\n"
    "  pgdurable cleanup --older-than 12h --batch-size 500 --json\n\n"
    "Exit codes: 0 done (or nothing to delete); 2 bad arguments or the database cannot be reached.")


def cleanup(
    older_than: Annotated[str, typer.Option(
        "--older-than", help="Delete executions created and finished longer ago than this: 30d, 12h, 90m, 2w.")],
    status: Annotated[str, typer.Option(
        "--status", help="Comma-separated finished statuses to delete.")] = "succeeded,failed,cancelled",
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Executions deleted per transaction.")] = 1000,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only count what would be deleted.")] = False,
    database_url: DatabaseUrl = None, schema: Schema = None, as_json: AsJson = False,
) -> None:
    """Delete finished executions with their steps, messages and events, in batches that never block workers."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .. import retention

    try:
        age = retention.parse_duration(older_than)
        statuses = retention.check_statuses(s.strip() for s in status.split(",") if s.strip())
    except ValueError as exc:
        console.print(f"[red]pgdurable cleanup: {escape(str(exc))}[/red]")
        raise typer.Exit(2) from None
    progress = Progress(TextColumn("deleting"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=Console(stderr=True), disable=as_json or dry_run)
    task = progress.add_task("cleanup", total=None)
    app = App(database_url, schema=schema, auto_migrate=False)
    try:
        with app, progress:
            result = retention.cleanup(
                app.db, age, statuses, batch_size=batch_size, dry_run=dry_run,
                on_start=lambda total: progress.update(task, total=total),
                on_batch=lambda batch: progress.advance(task, batch.executions))
    except SchemaNotInstalled as exc:  # its tables, or clock_now()
        fail(f"cleanup: {exc}")
    except psycopg.OperationalError as exc:
        fail(f"cleanup: {explain(exc, app.db.known_conninfo).message}")
    if as_json:
        key = "would_delete" if dry_run else "deleted"
        print(json.dumps({key: result.executions, "steps_deleted": result.steps,
                          "messages_deleted": result.messages, "events_deleted": result.events,
                          "dry_run": dry_run, "older_than_seconds": age.total_seconds(), "statuses": statuses}))
    elif dry_run:
        console.print(f"would delete {result.executions:,} executions ({', '.join(statuses)}) "
                      f"older than {older_than}")
    else:
        extra = f" ({result.messages:,} messages, {result.events:,} events)" if result.messages or result.events else ""
        console.print(f"deleted {result.executions:,} executions and {result.steps:,} step outputs{extra}")
