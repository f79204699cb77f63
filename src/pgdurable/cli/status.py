"""``pgdurable status``: the health report (queues, workers, stuck work, database) with an exit code.

The report itself is collected and drawn by ``pgdurable.status``; this is only the command."""

from __future__ import annotations

import json

import psycopg
import typer
from rich.markup import escape

from ..app import App
from ..errors import ConfigurationError
from ..redaction import describe, redact
from ._common import AsJson, DatabaseUrl, Schema, console, dump

# typer rewraps each paragraph of an epilog, so a paragraph is one line (blank lines separate them);
# epilogs are rich markup, so a literal [ is written \[.
STATUS_EPILOG = (
    "Examples:\n\n  pgdurable status\n\n  pgdurable status --json | jq .queues\n\n"
    "Exit codes: 0 healthy; 1 something needs attention (enqueued work no live worker can run, expired leases "
    "nobody sweeps, waiting work past its wake-up time, a schema to migrate, vacuum falling behind); 2 the "
    "database cannot be reached.")


def status(database_url: DatabaseUrl = None, schema: Schema = None, as_json: AsJson = False) -> None:
    """Queues (ready, waiting, running), live workers, stuck work and database health, with an exit code."""
    from .. import status as health

    app = App(database_url, schema=schema, auto_migrate=False)
    try:
        report = health.collect(app.db.conninfo, app.schema)
    except (ConfigurationError, psycopg.OperationalError) as exc:
        # A malformed URL or a database that does not answer; never with the URL's password.
        reason = redact(str(exc)) if isinstance(exc, ConfigurationError) else describe(exc)
        if as_json:
            print(json.dumps({"healthy": False, "exit_code": health.UNREACHABLE, "error": reason}))
        else:
            console.print(f"[red]database unreachable:[/red] {escape(reason)}")
        raise typer.Exit(health.UNREACHABLE) from None
    finally:
        app.close()
    if as_json:
        print(dump(report.to_json()))
    else:
        health.render(report, console)
    raise typer.Exit(report.exit_code)
