"""``pgdurable dashboard``: serve the web dashboard (the dashboard itself is ``pgdurable.dashboard``)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from ..app import App
from ._common import DatabaseUrl, Schema, console, setup_logging

# typer rewraps each paragraph of an epilog, so a paragraph is one line (blank lines separate them);
# epilogs are rich markup, so a literal [ is written \[.
DASHBOARD_EPILOG = (
    "Examples:\n\n  pgdurable dashboard\n\n  pgdurable dashboard --read-only\n\n"
    "  pgdurable dashboard --host 0.0.0.0 --port 9000 --token \"$DASHBOARD_TOKEN\"\n\n"
    "  pgdurable dashboard --host 0.0.0.0 --read-only --allowed-host dash.internal\n\n"
    "Security: it listens on loopback unless --host says otherwise. Actions (cancel, resume, fork) need a token: "
    "with neither --token nor --read-only a random one is made and printed as a login link. Any other address "
    "needs --token, or --read-only with --allowed-host (the Host names it answers to; others are refused). "
    "A login is a server-side session that logout ends; repeated wrong tokens are backed off (429).\n\n"
    "Exit code 2: bad options, or the dashboard extra is not installed (pip install 'pgdurable\\[dashboard]').")


def dashboard(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8080,
    token: Annotated[str | None, typer.Option(
        envvar="PGDURABLE_DASHBOARD_TOKEN", help="Secret needed to open the dashboard and to act.")] = None,
    read_only: Annotated[bool, typer.Option("--read-only", help="No actions: view only.")] = False,
    allowed_host: Annotated[list[str] | None, typer.Option(
        "--allowed-host", help="A Host name browsers use to reach it (repeatable); other Host headers are "
                               "refused (DNS rebinding).")] = None,
    database_url: DatabaseUrl = None, schema: Schema = None,
) -> None:
    """Serve the web dashboard: overview, workflows, steps timeline, cancel/resume/fork."""
    from ..dashboard.serve import DashboardOptionsError, serve

    setup_logging()
    try:
        serve(App(database_url, schema=schema, auto_migrate=False), host=host, port=port, token=token,
              read_only=read_only, console=console, allowed_hosts=allowed_host or ())
    except DashboardOptionsError as exc:
        console.print(f"[red]pgdurable dashboard: {escape(str(exc))}[/red]")
        raise typer.Exit(2) from None
