"""The unit layer: pure logic, no database. ``pytest tests/unit`` runs it alone, in a few seconds.

Every test here runs with connecting made impossible: psycopg's connect functions and psycopg_pool's pools
raise ``DatabaseForbidden`` (loudly, with the test's name), and the suite's ``database_url`` fixture fails
instead of starting the embedded PostgreSQL. A test that needs a server belongs in ``tests/``, not here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import psycopg_pool
import pytest

UNIT_DIR = __file__.rsplit("/", 1)[0]


class DatabaseForbidden(AssertionError):
    """A unit test tried to reach a database."""


def _forbidden(what: str) -> Any:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise DatabaseForbidden(f"unit tests must not reach a database ({what} was called)")
    return refuse


def _aforbidden(what: str) -> Any:
    async def refuse(*args: Any, **kwargs: Any) -> Any:
        raise DatabaseForbidden(f"unit tests must not reach a database ({what} was called)")
    return refuse


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "unit: pure logic, no database (tests/unit; run alone with pytest tests/unit)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if str(item.path).startswith(UNIT_DIR):
            item.add_marker(pytest.mark.unit)


@pytest.fixture(autouse=True)
def _no_database(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(psycopg, "connect", _forbidden("psycopg.connect"))
    monkeypatch.setattr(psycopg.Connection, "connect", classmethod(_forbidden("psycopg.Connection.connect")))
    monkeypatch.setattr(psycopg.AsyncConnection, "connect",
                        classmethod(_aforbidden("psycopg.AsyncConnection.connect")))
    monkeypatch.setattr(psycopg_pool.ConnectionPool, "__init__", _forbidden("psycopg_pool.ConnectionPool"))
    monkeypatch.setattr(psycopg_pool.AsyncConnectionPool, "__init__",
                        _forbidden("psycopg_pool.AsyncConnectionPool"))
    yield


@pytest.fixture(scope="session")
def database_url() -> str:
    """Overrides the suite's fixture (which would start the embedded PostgreSQL): unit tests have none."""
    raise DatabaseForbidden("unit tests must not use the database_url fixture (it starts PostgreSQL)")
