"""The engine's core: everything below the public ``App`` works on a ``Runtime``, never on the App.

A Runtime holds what the engine needs to run and create executions: the database, the registry of workflows,
the serializer, the settings, the observers (metrics, tracing), the completion listener that wakes result
waiters, and the application version its workers stamp. ``App`` is a thin facade over one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from . import store
from .completions import CompletionListener
from .config import Settings
from .db import Database
from .schedules import ScheduleDefinition
from .serialization import SizeLimit
from .telemetry import Observers
from .workflows import Registry


class Runtime:
    def __init__(self, *, database_url: Callable[[], str], schema: str, settings: Settings,
                 serializer: SizeLimit, auto_migrate: bool = True) -> None:
        self.schema = schema
        self.settings = settings
        self.serializer = serializer
        self.registry = Registry()
        self.db = Database(database_url, schema, auto_migrate=auto_migrate, citus_mode=settings.citus)
        self.completions = CompletionListener(self.db)
        self.observers = Observers()
        # Declared in code; stored when a worker of this application starts.
        self.queue_policies: dict[str, store.queues.QueuePolicy] = {}
        self.declared_schedules: dict[str, ScheduleDefinition] = {}

    @property
    def version(self) -> str:
        """The application version this application's workers stamp on the executions they start."""
        return (self.settings.app_version or os.environ.get("PGDURABLE_APP_VERSION")
                or self.registry.fingerprint())

    def trace(self, parent: Any = None) -> str | None:
        """The trace context to store with an execution created now, as JSON text (None: no tracing)."""
        if not self.observers:
            return None
        carrier = self.observers.trace_carrier(parent)
        return json.dumps(carrier) if carrier else None

    def use_database(self, db: Database, settings: Settings | None = None) -> Callable[[], None]:
        """Work on ``db`` (another database or schema), with ``settings`` if given, until the function returned
        is called, which closes ``db``'s listener and puts everything back. pgdurable.testing gives an
        application its private test schema this way; the caller closes ``db`` itself."""
        saved = (self.db, self.schema, self.completions, self.settings)
        self.db, self.schema, self.completions = db, db.schema, CompletionListener(db)
        self.settings = settings or self.settings

        def restore() -> None:
            self.completions.stop()
            self.db, self.schema, self.completions, self.settings = saved

        return restore

    def close(self) -> None:
        self.completions.stop()
        self.db.close()
