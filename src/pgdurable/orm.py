"""SQLAlchemy glue for transactional steps (the optional extra ``pgdurable[sqlalchemy]``).

A transactional step whose first parameter is annotated ``sqlalchemy.orm.Session`` (or
``sqlalchemy.ext.asyncio.AsyncSession``) receives a session whose transaction is the step's transaction:
the session's writes and the step's checkpoint commit together.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

import psycopg

if TYPE_CHECKING:
    from .db import Database


def session_kind(hint: Any) -> str | None:
    """"sync" or "async" when ``hint`` is a SQLAlchemy session class, else None (a psycopg connection)."""
    if not isinstance(hint, type):
        return None
    try:
        from sqlalchemy.ext.asyncio import AsyncSession
        from sqlalchemy.orm import Session
    except ImportError:
        return None
    if issubclass(hint, AsyncSession):
        return "async"
    if issubclass(hint, Session):
        return "sync"
    return None


def _engine(db: Database) -> Any:
    engine = getattr(db, "_sa_engine", None)
    if engine is None:
        from sqlalchemy import create_engine

        conninfo = db.conninfo
        engine = create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(conninfo),
                               pool_size=db.pool_size * 4)
        db._sa_engine = engine  # type: ignore[attr-defined]
    return engine


def _async_engine(db: Database) -> Any:
    engines: dict[asyncio.AbstractEventLoop, Any] = db.__dict__.setdefault("_sa_async_engines", {})
    loop = asyncio.get_running_loop()
    if loop not in engines:
        from sqlalchemy.ext.asyncio import create_async_engine

        conninfo = db.conninfo

        async def connect() -> psycopg.AsyncConnection[Any]:
            return await psycopg.AsyncConnection.connect(conninfo)

        engines[loop] = create_async_engine("postgresql+psycopg://", async_creator=connect,
                                            pool_size=db.pool_size * 4)
    return engines[loop]


@contextlib.contextmanager
def session_transaction(db: Database, session_class: type[Any]) -> Iterator[tuple[Any, psycopg.Connection[Any]]]:
    """A session in a new transaction, with the psycopg connection underneath it."""
    with session_class(_engine(db)) as session, session.begin():
        yield session, session.connection().connection.driver_connection


@contextlib.asynccontextmanager
async def async_session_transaction(
        db: Database, session_class: type[Any]) -> AsyncIterator[tuple[Any, psycopg.AsyncConnection[Any]]]:
    async with session_class(_async_engine(db)) as session, session.begin():
        connection = await session.connection()
        raw = await connection.get_raw_connection()
        yield session, raw.driver_connection


async def dispose_async_engine(db: Database) -> None:
    """Close the running event loop's engine (its pooled connections), if one was made: its loop is ending."""
    engines: dict[asyncio.AbstractEventLoop, Any] = db.__dict__.get("_sa_async_engines", {})
    engine = engines.pop(asyncio.get_running_loop(), None)
    if engine is not None:
        await engine.dispose()
