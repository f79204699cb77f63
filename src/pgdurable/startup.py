"""Starting against a database that is not there yet: wait with backoff, but fail fast on bad credentials."""

from __future__ import annotations

import logging
import time

import psycopg

from .db import Database
from .dberrors import explain
from .errors import ConfigurationError, migrate_command

log = logging.getLogger("pgdurable")


def is_credentials_error(exc: psycopg.Error) -> bool:
    """Wrong user, password or database name: waiting will not fix it."""
    return explain(exc).permanent


def wait_for_database(db: Database, timeout: float) -> None:
    """Connect (and migrate) once the database answers, retrying with backoff for up to ``timeout`` seconds.

    Raises ConfigurationError at once for a malformed URL and for credentials or a database name that the
    server refuses, and after ``timeout`` when it never answered. Without auto-migration the connection is
    checked all the same, and a schema where pgdurable is not installed is refused. No message quotes the
    URL's password.
    """
    deadline = time.monotonic() + timeout
    delay = 0.5
    while True:
        try:
            db.ensure_schema()
            if not db.auto_migrate:
                remaining = max(1, int(deadline - time.monotonic()))
                if db.check(connect_timeout=min(remaining, 10)) == 0:
                    raise ConfigurationError(
                        f"pgdurable is not installed in schema {db.schema!r} of this database (and this app does "
                        f"not migrate: auto_migrate=False): run `{migrate_command(db.schema)}` first")
            return
        except psycopg.OperationalError as exc:
            problem = explain(exc, db.conninfo)
            reason = problem.message
            if problem.permanent:
                raise ConfigurationError(reason) from None
            if time.monotonic() + delay > deadline:
                raise ConfigurationError(
                    f"the database did not answer within {timeout:.0f} s: {reason}") from None
            log.warning("database unavailable (%s); retrying in %.1f s", reason, delay)
            time.sleep(delay)
            delay = min(delay * 2, 10.0)
