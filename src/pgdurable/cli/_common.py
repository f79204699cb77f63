"""What the commands share: the root group's error handling, the option types, the console, opening the App,
and the helpers that turn rows into JSON or short table cells."""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any, NoReturn, TypeVar

import psycopg
import typer
from rich.console import Console
from typer.core import TyperCommand, TyperGroup

from .. import display
from ..app import App
from ..dberrors import explain
from ..errors import ConfigurationError
from ..redaction import redact


def _untyped_flags(params: list[Any]) -> list[Any]:
    """Flags take no value, so their help shows none (typer labels each one <bool>, --help included)."""
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    return params


class Command(TyperCommand):
    def get_params(self, ctx: Any) -> list[Any]:
        return _untyped_flags(super().get_params(ctx))


class Group(TyperGroup):
    def get_params(self, ctx: Any) -> list[Any]:
        return _untyped_flags(super().get_params(ctx))


CommandFunction = TypeVar("CommandFunction", bound=Callable[..., Any])


class Typer(typer.Typer):
    """typer.Typer whose commands and groups show flags without a value type."""

    def __init__(self, *, cls: type[TyperGroup] | None = None, **options: Any) -> None:
        super().__init__(cls=cls or Group, **options)

    def command(self, *args: Any, cls: type[TyperCommand] | None = None,
                **options: Any) -> Callable[[CommandFunction], CommandFunction]:
        decorator: Callable[[CommandFunction], CommandFunction] = super().command(*args, cls=cls or Command,
                                                                                 **options)
        return decorator


class Commands(Group):
    """Every command: a configuration error (a malformed database URL...) or a database that cannot be reached
    is a message and exit code 2, never a traceback; no message quotes the database password."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except ConfigurationError as exc:
            fail(redact(str(exc)))
        except psycopg.OperationalError as exc:
            fail(explain(exc).message)


def fail(message: str, code: int = 2) -> NoReturn:
    """One line on stderr (never a traceback, never a password), and exit ``code`` (2: bad input, or the
    database cannot be used)."""
    Console(stderr=True).print(f"pgdurable: {redact(message)}", style="red", markup=False, highlight=False,
                               soft_wrap=True)
    raise typer.Exit(code)


def load_app(target: str) -> App:
    """The App at MODULE:ATTRIBUTE (the module imported from the current directory first)."""
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        fail(f"{target!r} is not MODULE:APP (for example myproject.workflows:app)")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            fail(f"no module named {exc.name!r} (importing {module_name!r} from {os.getcwd()}; "
                 "is it on PYTHONPATH, or run from its directory?)")
        fail(f"importing {module_name!r} failed: {type(exc).__name__}: {exc}")
    except Exception as exc:  # the application's own import-time error: say where, in one line
        logging.getLogger("pgdurable").debug("importing %s failed", module_name, exc_info=True)
        fail(f"importing {module_name!r} failed: {type(exc).__name__}: {exc}")
    app = getattr(module, attribute, None)
    if not isinstance(app, App):
        found = "nothing" if app is None else f"a {type(app).__name__}"
        fail(f"{module_name}:{attribute} is not a pgdurable.App (found {found})")
    return app


# Tracebacks never show local variables: they would show the database URL with its password.
NO_LOCALS: dict[str, Any] = {"pretty_exceptions_show_locals": False}


def command_group(help: str) -> typer.Typer:
    """A group of subcommands (``pgdurable workflows ...``); with no subcommand it prints its help."""
    return Typer(**NO_LOCALS, help=help, no_args_is_help=True)


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
