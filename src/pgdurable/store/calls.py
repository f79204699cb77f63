"""A statement as data (``Call``: a named query, its parameters, and how to read its rows), and the only two
places that execute one: ``run`` and ``arun``.

Building a ``Call`` does no I/O, so one definition serves both the sync and the async driver. Rows that become
objects are mapped by column name (``row_factory``: psycopg's ``class_row`` or ``dict_row``), never by
position: a column added to or moved in a query either lands in the field of its name or fails loudly (an
unknown field), instead of silently shifting the fields after it.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any, Generic, TypeVar

import psycopg
from psycopg import sql
from psycopg.rows import BaseRowFactory, class_row, tuple_row

from ..errors import SchemaNotInstalled
from ..sqlfiles import query, schema_sql
from .prepared import NOT_PREPARED, Statements

T = TypeVar("T")
Rows = list[tuple[Any, ...]]


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    name: str
    params: Mapping[str, Any]
    # Reads the fetched rows: tuples, or what row_factory makes of each row.
    read: Callable[[list[Any]], T]
    # For a connection that is not pgdurable's own: the query's {schema} is replaced by this identifier.
    schema: str | None = None
    # How to build each row, by column name (psycopg.rows.class_row / dict_row); None: plain tuples.
    row_factory: BaseRowFactory[Any] | None = None


@cache
def rows_of(cls: type[T]) -> BaseRowFactory[T]:
    """psycopg's ``class_row(cls)``, made once: each call gets the same factory, so that a connection's
    prepared statement keeps the row maker the factory made for it (store/prepared.py) instead of
    reading the result's column names again at every call."""
    return class_row(cls)


def _statement(call: Call[Any], conn: Any = None) -> Any:
    """The call's statement: its Citus version on a connection whose schema has the Citus layout."""
    if call.schema is None:
        return query(call.name, conn is not None and conn in _citus)
    return sql.SQL(query(call.name)).format(schema=sql.Identifier(call.schema))


class OwnConnection(psycopg.Connection[Any]):
    """A connection of pgdurable's own (its pools', the worker's writer's and listeners'). Outside a
    transaction, ``run`` executes a named query as a statement prepared on it, through libpq (``named()``,
    store/prepared.py); otherwise on one cursor, made once. A new cursor per statement cost
    about 30 us of client CPU, a tenth of a step checkpoint's: psycopg looks up again how to send each
    parameter and read each column (docs/benchmarks.md, "One cursor per connection"). One owner uses such a
    connection at a time, as pools and the writer do. The application's connections (transactional steps,
    co-located enqueues) stay plain."""

    _statements: psycopg.Cursor[Any] | None = None
    _named: Statements | None = None  # (psycopg's own Connection has a _prepared)

    def statements(self) -> psycopg.Cursor[Any]:
        cursor = self._statements
        if cursor is None or cursor.closed:
            cursor = self._statements = self.cursor()
        return cursor

    def named(self) -> Statements:
        """Its named queries as prepared statements sent through libpq (store/prepared.py)."""
        found = self._named
        if found is None:
            found = self._named = Statements(self)
        return found


class AsyncOwnConnection(psycopg.AsyncConnection[Any]):
    """As ``OwnConnection``, async."""

    _statements: psycopg.AsyncCursor[Any] | None = None
    _named: Statements | None = None

    def statements(self) -> psycopg.AsyncCursor[Any]:
        cursor = self._statements
        if cursor is None or cursor.closed:
            cursor = self._statements = self.cursor()
        return cursor

    def named(self) -> Statements:
        found = self._named
        if found is None:
            found = self._named = Statements(self)
        return found


def run(conn: psycopg.Connection[Any], call: Call[T]) -> T:
    with _schema_errors(conn, call):
        if isinstance(conn, OwnConnection):
            if call.schema is None:
                citus = conn in _citus
                prepared = conn.named()
                if prepared.usable(call.name, citus):
                    result = prepared.run(call.name, citus, call.params, call.read, call.row_factory)
                    if result is not NOT_PREPARED:
                        return result  # type: ignore[no-any-return]
            cursor = conn.statements()
            _use_rows(cursor, call.row_factory)
            cursor.execute(_statement(call, conn), call.params)
            try:
                return call.read(cursor.fetchall() if _has_rows(cursor) else [])
            finally:
                _free(cursor)
        if call.row_factory is None:
            cur = conn.execute(_statement(call, conn), call.params)
            return call.read(cur.fetchall() if _has_rows(cur) else [])
        with conn.cursor(row_factory=call.row_factory) as named:
            named.execute(_statement(call, conn), call.params)
            return call.read(named.fetchall() if _has_rows(named) else [])


async def arun(conn: psycopg.AsyncConnection[Any], call: Call[T]) -> T:
    with _schema_errors(conn, call):
        if isinstance(conn, AsyncOwnConnection):
            if call.schema is None:
                citus = conn in _citus
                prepared = conn.named()
                if prepared.usable(call.name, citus):
                    result = await prepared.arun(call.name, citus, call.params, call.read, call.row_factory)
                    if result is not NOT_PREPARED:
                        return result  # type: ignore[no-any-return]
            cursor = conn.statements()
            _use_rows(cursor, call.row_factory)
            await cursor.execute(_statement(call, conn), call.params)
            try:
                return call.read(await cursor.fetchall() if _has_rows(cursor) else [])
            finally:
                _free(cursor)
        if call.row_factory is None:
            cur = await conn.execute(_statement(call, conn), call.params)
            return call.read(await cur.fetchall() if _has_rows(cur) else [])
        async with conn.cursor(row_factory=call.row_factory) as named:
            await named.execute(_statement(call, conn), call.params)
            return call.read(await named.fetchall() if _has_rows(named) else [])


def _use_rows(cursor: Any, row_factory: BaseRowFactory[Any] | None) -> None:
    """A reused cursor builds the next rows as the call asks (plain tuples by default)."""
    wanted = row_factory or tuple_row
    if cursor.row_factory is not wanted:
        cursor.row_factory = wanted


def _free(cursor: Any) -> None:
    """The result read, its memory goes back at once, as a cursor dropped after one statement would give it:
    a reused cursor would otherwise hold a large output until its connection's next statement."""
    if cursor.pgresult is not None:
        cursor.pgresult.clear()


def _has_rows(cur: Any) -> bool:
    """Whether the statement returned rows to fetch (what ``cursor.description`` tells, without building a
    Column object per field on every call: that cost a step checkpoint 8% of its time, py-spy)."""
    result = cur.pgresult
    return result is not None and (result.nfields > 0 or result.status == psycopg.pq.ExecStatus.TUPLES_OK)


# The schema each of pgdurable's own connections works in (set by db.configure), to name it in errors.
_schemas: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
# Those of them whose schema has the Citus layout: they run the named queries' Citus versions.
_citus: weakref.WeakSet[Any] = weakref.WeakSet()
# What a statement of ours meets on a schema that was never migrated, or migrated by an older pgdurable.
_MISSING = (psycopg.errors.InvalidSchemaName, psycopg.errors.UndefinedTable, psycopg.errors.UndefinedFunction,
            psycopg.errors.UndefinedColumn)


def remember_schema(conn: Any, schema: str, citus: bool = False) -> None:
    _schemas[conn] = schema
    if citus:
        _citus.add(conn)


def on_citus(conn: Any) -> bool:
    """Whether this connection of pgdurable's works in a schema with the Citus layout."""
    return conn in _citus


class _schema_errors:  # lower-case: used as `with _schema_errors(conn, call):`
    """A relation, function or schema of pgdurable's own that is missing means pgdurable is not installed (or
    is out of date) there, which deserves a message saying what to run, not libpq's. (A missing object of the
    application's, as a table binding may name, is the application's error: it goes through unchanged.)
    A class, not a contextlib generator: every statement enters it."""

    __slots__ = ("call", "conn")

    def __init__(self, conn: Any, call: Call[Any]) -> None:
        self.conn, self.call = conn, call

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if exc is None or not isinstance(exc, _MISSING):
            return
        schema = self.call.schema or _schemas.get(self.conn)
        detail = (str(exc).splitlines() or [type(exc).__name__])[0]
        if _names_own_object(detail, schema):
            raise SchemaNotInstalled(schema, detail) from exc


_MISSING_SCHEMA = re.compile(r'schema "(?P<name>[^"]+)" does not exist')
_MISSING_OBJECT = re.compile(r'(?:relation "(?P<relation>[^"]+)"|function (?P<function>[\w."]+)\()')


def _names_own_object(detail: str, schema: str | None) -> bool:
    """Whether an undefined-object error names our schema, or a table, view or function of pgdurable's (bare,
    or in our schema)."""
    found = _MISSING_SCHEMA.search(detail)
    if found:
        return schema is None or found.group("name") == schema
    found = _MISSING_OBJECT.search(detail)
    if not found:
        return False
    qualifier, _, name = (found.group("relation") or found.group("function")).replace('"', "").rpartition(".")
    return name in own_objects() and (not qualifier or schema is None or qualifier == schema)


@lru_cache(maxsize=1)
def own_objects() -> frozenset[str]:
    """The names of pgdurable's tables, views and functions (from sql/schema.sql)."""
    return frozenset(re.findall(r"^CREATE (?:OR REPLACE )?(?:TABLE|VIEW|FUNCTION) (?:IF NOT EXISTS )?(\w+)",
                                schema_sql(), re.MULTILINE)) | {"schema_migrations"}  # made by migrations.py


# ---- readers: what the statements of every subject make of their rows -------------------------------------

def nothing(rows: Rows) -> None:
    return None


def first(rows: list[T]) -> T | None:
    return rows[0] if rows else None


def only(rows: list[T]) -> T:
    """The one row a statement always returns."""
    return rows[0]


def every(rows: list[T]) -> list[T]:
    return rows


def first_column(rows: Rows) -> list[Any]:
    return [row[0] for row in rows]


def pairs(rows: Rows) -> dict[str, Any]:
    return {row[0]: row[1] for row in rows}
