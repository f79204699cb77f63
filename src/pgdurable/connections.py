"""The psycopg connection behind what a caller hands us: a psycopg connection, a SQLAlchemy Session /
Connection (sync or async) running on the psycopg driver, or Django's connection (its psycopg 3 backend).
Statements sent on it join its transaction."""

from __future__ import annotations

from typing import Any

import psycopg


def sync_driver_connection(conn: Any) -> psycopg.Connection[Any]:
    if isinstance(conn, psycopg.Connection):
        return conn
    if callable(getattr(conn, "ensure_connection", None)):  # Django's DatabaseWrapper: opened on first use
        conn.ensure_connection()
        if isinstance(conn.connection, psycopg.Connection):
            return conn.connection
    # SQLAlchemy: Session.connection() is a method, Connection.connection the pooled DBAPI connection.
    connection = conn.connection() if callable(getattr(conn, "connection", None)) else conn
    driver = getattr(getattr(connection, "connection", None), "driver_connection", None)
    if isinstance(driver, psycopg.Connection):
        return driver
    raise TypeError(f"conn must be a psycopg Connection, a SQLAlchemy Session or Connection using the psycopg "
                    f"driver (postgresql+psycopg://...), or Django's connection on psycopg 3; got "
                    f"{type(conn).__name__}")


async def async_driver_connection(conn: Any) -> psycopg.AsyncConnection[Any]:
    if isinstance(conn, psycopg.AsyncConnection):
        return conn
    # SQLAlchemy asyncio: AsyncSession.connection() and AsyncConnection.get_raw_connection() are coroutines.
    connection = await conn.connection() if callable(getattr(conn, "connection", None)) else conn
    raw = await connection.get_raw_connection() if hasattr(connection, "get_raw_connection") else None
    driver = getattr(raw, "driver_connection", None)
    if isinstance(driver, psycopg.AsyncConnection):
        return driver
    raise TypeError(f"conn must be a psycopg AsyncConnection, or a SQLAlchemy AsyncSession or AsyncConnection "
                    f"using the psycopg driver (postgresql+psycopg://...); got {type(conn).__name__}")
