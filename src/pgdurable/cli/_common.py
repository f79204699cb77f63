"""What the commands share: the root group's error handling, the option types, the console, opening the App,
and the helpers that turn rows into JSON or short table cells."""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Annotated, Any

import psycopg
import typer
from rich.console import Console
from typer.core import TyperGroup

from .. import display
from ..app import App
from ..errors import ConfigurationError
from ..redaction import describe, redact


class Commands(TyperGroup):
    """Every command: a configuration error (a malformed database URL...) or a database that cannot be reached
    is a message and exit code 2, never a traceback; no message quotes the database password."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except ConfigurationError as exc:
            fail(redact(str(exc)))
        except psycopg.OperationalError as exc:
            fail(f"the database cannot be reached: {describe(exc)}")


def fail(message: str) -> None:
    Console(stderr=True).print(f"pgdurable: {message}", style="red", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(2)


# Tracebacks never show local variables: they would show the database URL with its password.
NO_LOCALS: dict[str, Any] = {"pretty_exceptions_show_locals": False}


def command_group(help: str) -> typer.Typer:
    """A group of subcommands (``pgdurable workflows ...``); with no subcommand it prints its help."""
    return typer.Typer(**NO_LOCALS, help=help, no_args_is_help=True)


console = Console()

DatabaseUrl = Annotated[str | None, typer.Option(
    "--database-url", envvar="PGDURABLE_DATABASE_URL",
    help="PostgreSQL URL (else DATABASE_URL, else the embedded server).")]
Schema = Annotated[str | None, typer.Option("--schema", envvar="PGDURABLE_SCHEMA",
                                            help="Schema holding pgdurable's tables.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


def open_app(database_url: str | None, schema: str | None) -> App:
    return App(database_url, schema=schema)


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def jsonable(value: Any) -> Any:
    return display.plain(value)


def payload(text: str | None) -> Any:
    """Stored JSON decoded, or a note saying why it cannot be shown (nested too deeply): never a crash."""
    return display.json_or_note(text) if text else None


def dump(value: Any) -> str:
    """JSON for scripts: strict (no NaN), whatever the rows hold."""
    return json.dumps(display.plain(value), indent=2, allow_nan=False)


def short(value: Any, width: int = 40) -> str:
    text = value if isinstance(value, str) else display.dumps(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def when(value: datetime | None) -> str:
    return display.format_time(value, None)


def error_fields(text: str | None) -> dict[str, Any]:
    return display.error_fields(text) or {}
