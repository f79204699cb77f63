"""The pgdurable App of a Django project: its database from ``settings.DATABASES``, transactional steps on
Django's own connection and transaction."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from psycopg.conninfo import make_conninfo

from ... import limits
from ...app import App
from ...errors import ConfigurationError
from ...steps import RetryPolicy
from ...transactions import make_transaction_step
from ...workflows import default_name

# What libpq accepts in a connection string; Django's own connection parameters (cursor_factory, context,
# prepare_threshold, ...) are not among them.
_LIBPQ_KEYWORDS = frozenset(d.keyword.decode() for d in psycopg.pq.Conninfo.get_defaults())


def setting(name: str, default: Any = None) -> Any:
    """One key of ``settings.PGDURABLE``."""
    return getattr(settings, "PGDURABLE", {}).get(name, default)


def database_url(alias: str | None = None) -> str:
    """The libpq connection string of a ``settings.DATABASES`` entry (default: ``PGDURABLE["DATABASE"]``), as
    Django connects to it now (under the test runner: the test database)."""
    alias = alias or setting("DATABASE", DEFAULT_DB_ALIAS)
    connection = connections[alias]
    if connection.vendor != "postgresql":
        raise ConfigurationError(f"pgdurable needs PostgreSQL: DATABASES[{alias!r}] uses {connection.vendor}")
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    if not is_psycopg3:
        raise ConfigurationError("pgdurable needs Django's PostgreSQL backend on psycopg 3 (pip install "
                                 "'psycopg[binary]'); this process loaded psycopg2")
    params = connection.get_connection_params()
    return make_conninfo(**{k: v for k, v in params.items() if k in _LIBPQ_KEYWORDS and v is not None})


class DjangoApp(App):
    """``pgdurable.App`` on a database of ``settings.DATABASES`` (``database``: its alias, default
    ``PGDURABLE["DATABASE"]`` or ``"default"``), in ``PGDURABLE["SCHEMA"]``. The URL is read on first use,
    so a test runner's test database is the one used."""

    def __init__(self, *, database: str | None = None, **options: Any) -> None:
        if "schema" in options or "database_url" in options:
            raise ConfigurationError("DjangoApp takes its schema from settings.PGDURABLE['SCHEMA'] and its "
                                     "database from settings.DATABASES (manage.py migrate migrates that one)")
        self.alias: str = database or setting("DATABASE", DEFAULT_DB_ALIAS)
        super().__init__(lambda: database_url(self.alias), schema=setting("SCHEMA"), **options)

    def atomic(self, fn: Callable[..., Any] | None = None, *, name: str | None = None,
               isolation: str | None = None, max_attempts: int = 3, interval: float = 0.5, backoff: float = 2.0,
               max_interval: float = 60.0, no_retry: tuple[type[BaseException], ...] = (),
               timeout: float | None = None) -> Any:
        """Declare a transactional step that runs inside Django's ``transaction.atomic()`` on this App's
        database: everything the step writes through Django (the ORM, ``connection.cursor()``) commits with the
        step's checkpoint, or rolls back with it. The step takes no connection argument and is a plain ``def``
        (Django's ORM is synchronous); the options are those of ``App.transaction``."""
        policy = RetryPolicy(max_attempts=max_attempts, interval=interval, backoff=backoff,
                             max_interval=max_interval, no_retry=no_retry)
        seconds = limits.timeout_seconds(timeout, "step timeout")

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            step_name = name or default_name(fn)
            if inspect.iscoroutinefunction(fn):
                raise ConfigurationError(f"@app.atomic() step {step_name!r} must be a plain `def`: Django's ORM is "
                                         "synchronous (call it from sync workflows)")
            self.registry.steps.add(step_name)
            return make_transaction_step(self.runtime, fn, step_name, policy, isolation, seconds,
                                         own_scope=self._atomic)

        return register(fn) if fn is not None else register

    @contextlib.contextmanager
    def _atomic(self) -> Iterator[psycopg.Connection[Any]]:
        """Django's transaction on this thread's connection, and the psycopg connection underneath it."""
        connection = connections[self.alias]
        outermost = not connection.in_atomic_block
        if outermost:
            # A worker thread has no requests, so the step does what Django does around one: replace a
            # connection the server closed (a lease-long idle transaction ends the session), and afterwards
            # close it unless CONN_MAX_AGE keeps it.
            raw = connection.connection
            if raw is not None and (raw.closed or raw.broken):
                connection.close()
            connection.close_if_unusable_or_obsolete()
        try:
            with transaction.atomic(using=self.alias):
                raw = connection.connection
                if not isinstance(raw, psycopg.Connection):
                    raise ConfigurationError(f"DATABASES[{self.alias!r}] does not connect with psycopg 3")
                yield raw
        finally:
            if outermost:
                connection.close_if_unusable_or_obsolete()
