"""The guard of the unit layer: connecting fails loudly, and nothing started a server."""

from __future__ import annotations

import asyncio

import psycopg
import psycopg_pool
import pytest

from .conftest import DatabaseForbidden

URL = "postgresql://nobody@127.0.0.1:1/none"


def test_psycopg_connect_is_refused() -> None:
    with pytest.raises(DatabaseForbidden):
        psycopg.connect(URL)
    with pytest.raises(DatabaseForbidden):
        psycopg.Connection.connect(URL)


def test_async_connect_is_refused() -> None:
    with pytest.raises(DatabaseForbidden):
        asyncio.run(psycopg.AsyncConnection.connect(URL))


def test_pools_are_refused() -> None:
    with pytest.raises(DatabaseForbidden):
        psycopg_pool.ConnectionPool(URL, open=False)
    with pytest.raises(DatabaseForbidden):
        psycopg_pool.AsyncConnectionPool(URL, open=False)


def test_engine_database_paths_are_refused() -> None:
    """The engine's own connection helpers go through the patched functions too."""
    import pgdurable
    with pytest.raises(DatabaseForbidden):
        app = pgdurable.App(URL, schema="unit_guard")
        try:
            app.migrate()
        finally:
            app.close()


def test_marked_unit(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("unit") is not None


def test_no_embedded_server_was_started() -> None:
    """The embedded PostgreSQL is only started by the suite's database_url fixture, which is overridden here."""
    import sys
    embedded = sys.modules.get("pgdurable.embedded")
    started = getattr(embedded, "_started", None) if embedded else None
    assert not started
