"""The ``pgdurable`` command line: run workers, migrate, inspect and steer executions, and the demo.

This module builds the typer app (``cli``, run by ``main``) from one module per command or command group:
``worker`` (run a worker), ``maintenance`` (migrate, cleanup), ``database_url``, ``workers``, ``status``,
``dashboard``, ``demo``, and the groups ``workflows``, ``queues``, ``schedules``, ``bindings`` and ``versions``.
What they share (option types, the root group's error handling, the console, JSON and table helpers) is in
``_common``. Imports go one way: this module imports the command modules, they import ``_common`` and the
engine, and nothing imports back up into this package.
"""

from __future__ import annotations

from . import (
    bindings,
    dashboard,
    database_url,
    demo,
    maintenance,
    queues,
    schedules,
    status,
    versions,
    worker,
    workers,
    workflows,
)
from ._common import NO_LOCALS, Commands, Typer

__all__ = ["cli", "main"]

cli = Typer(cls=Commands, **NO_LOCALS,
                  help="Durable Python workflows with PostgreSQL as the only orchestrator.\n\n"
                       "Exit codes: 0 done; 1 not done (no such execution, nothing to change, or something "
                       "needs attention); 2 bad input or the database cannot be used. Commands that read or "
                       "change state take --json for scripts.",
                  no_args_is_help=True, add_completion=False)

# The order here is the order of `pgdurable --help`: commands first, then the groups.
cli.command()(worker.worker)
cli.command()(maintenance.migrate)
cli.command("database-url")(database_url.database_url)
cli.command()(workers.workers)
cli.command()(demo.demo)
cli.command(epilog=status.STATUS_EPILOG)(status.status)
cli.command(epilog=maintenance.CLEANUP_EPILOG)(maintenance.cleanup)
cli.command(epilog=dashboard.DASHBOARD_EPILOG)(dashboard.dashboard)
cli.add_typer(workflows.workflows_cli, name="workflows")
cli.add_typer(queues.queues_cli, name="queues")
cli.add_typer(schedules.schedules_cli, name="schedules")
cli.add_typer(bindings.bindings_cli, name="bindings")
cli.add_typer(versions.versions_cli, name="versions")


def main() -> None:
    cli()
