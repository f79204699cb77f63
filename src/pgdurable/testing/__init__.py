"""Test helpers for applications built on pgdurable.

``harness(app)`` runs the application on a private schema of a test database with a worker in this process
and a clock that skips idle time (see docs/testing.md). The pytest plugin (``pytest_plugin``, loaded by the
``pytest11`` entry point) gives it as the fixture ``pgdurable_harness``.
"""

from .harness import Harness, database_url_for_tests, harness

__all__ = ["Harness", "database_url_for_tests", "harness"]
