"""``manage.py pgdurable_worker [MODULE:APP]``: a pgdurable worker with the project's settings loaded, so
workflows and steps use the Django ORM."""

from __future__ import annotations

import importlib
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from pgdurable.app import App
from pgdurable.cli._common import setup_logging
from pgdurable.contrib.django.durable import setting
from pgdurable.errors import ConfigurationError
from pgdurable.startup import wait_for_database
from pgdurable.worker import run_until_stopped


class Command(BaseCommand):
    help = "Run a pgdurable worker: claim and run workflows until SIGTERM/SIGINT (a second one exits at once)."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("target", nargs="?", help='The App to serve, MODULE:ATTRIBUTE (default: '
                                                      'settings.PGDURABLE["APP"]).')
        parser.add_argument("--queue", "-q", action="append", dest="queues",
                            help="Queue to serve (repeatable); default: every queue the App declares.")
        parser.add_argument("--concurrency", "-c", type=int, default=16, help="Executions run at once.")
        parser.add_argument("--wait-for-db", type=float, default=300.0, dest="wait_for_db",
                            help="Seconds to keep retrying while the database does not answer at start.")

    def handle(self, *args: Any, target: str | None = None, queues: list[str] | None = None,
               concurrency: int = 16, wait_for_db: float = 300.0, **options: Any) -> None:
        target = target or setting("APP")
        if not target:
            raise CommandError('name the App to serve: manage.py pgdurable_worker MODULE:APP, or set '
                               'settings.PGDURABLE = {"APP": "MODULE:APP"}')
        setup_logging(options.get("verbosity", 1) >= 2)
        module_name, _, attribute = target.partition(":")
        if not module_name or not attribute:
            raise CommandError(f"{target!r} is not MODULE:APP (for example shop.durable:app)")
        app = getattr(importlib.import_module(module_name), attribute, None)
        if not isinstance(app, App):
            raise CommandError(f"{target} is not a pgdurable App")
        try:
            wait_for_database(app.db, wait_for_db)
        except ConfigurationError as exc:
            raise CommandError(f"pgdurable_worker: {exc}") from None
        run_until_stopped(app.worker(queues=queues, concurrency=concurrency))
