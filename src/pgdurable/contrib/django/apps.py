"""The Django app ``pgdurable.contrib.django``: ``manage.py migrate`` migrates pgdurable's schema too."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate


class PgDurableConfig(AppConfig):
    name = "pgdurable.contrib.django"
    label = "pgdurable"
    verbose_name = "pgdurable"

    def ready(self) -> None:
        post_migrate.connect(migrate_engine, sender=self, dispatch_uid="pgdurable-migrate")


def migrate_engine(sender: AppConfig, using: str, verbosity: int = 1, **_: Any) -> None:
    """After Django's migrations on pgdurable's database (the test runner's test database included), create
    or upgrade pgdurable's schema: its own migrations, applied in order, each once."""
    from ...config import schema_name
    from ...migrations import migrate
    from .durable import database_url, setting

    if using != setting("DATABASE", "default"):
        return
    schema = schema_name(setting("SCHEMA"))
    applied = migrate(database_url(using), schema)
    if verbosity >= 1 and applied:
        print(f"  pgdurable: schema {schema} migrated to version {applied[-1]}")
