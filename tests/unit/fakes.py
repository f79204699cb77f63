"""Fakes for the unit layer: a connection that answers the batcher's statements from memory."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import psycopg
from psycopg import errors


class FakeCursor:
    def __init__(self, rows: list[tuple[Any, ...]] | None) -> None:
        self.description = None if rows is None else [("column",)]
        self._rows = rows or []

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self._rows


class AsyncFakeCursor(FakeCursor):
    async def fetchall(self) -> list[tuple[Any, ...]]:  # type: ignore[override]
        return self._rows


class FakeDatabase:
    """What write_steps / write_completions / heartbeat do, in memory.

    ``owned``: the (execution_id, attempt) pairs whose writer still holds the lease; writes of other attempts
    are fenced (no row returned). ``refuse``: a predicate on a row (the decoded JSON array) that makes the
    whole statement fail with ``error`` (a DataError, like a value PostgreSQL refuses). ``fail``: a
    non-data exception raised by every statement while set (a lost connection).
    """

    def __init__(self, owned: set[tuple[str, int]]) -> None:
        self.owned = owned
        self.steps: dict[tuple[str, int], tuple[Any, ...]] = {}
        self.completions: dict[str, tuple[Any, ...]] = {}
        self.refuse: Callable[[list[Any]], bool] = lambda row: False
        self.error: type[psycopg.Error] = errors.InvalidTextRepresentation
        self.fail: BaseException | None = None
        self.statements: list[list[list[Any]]] = []  # the rows of every write statement, in order
        self.after_statement: Callable[[], None] = lambda: None
        self._txn: list[Callable[[], None]] | None = None

    # -- one statement ----------------------------------------------------------------------------------

    def execute(self, params: Any) -> list[tuple[Any, ...]] | None:
        if self.fail is not None:
            raise self.fail
        params = dict(params or {})
        if "rows" in params:
            rows = json.loads(params["rows"])
            self.statements.append(rows)
            try:
                if any(self.refuse(row) for row in rows):
                    raise self.error("invalid input syntax for type json")
                return self._write(rows)
            finally:
                self.after_statement()
        if "ids" in params and "owner" in params:  # heartbeat
            return [(i, a) for i, a in sorted(self.owned) if i in params["ids"]]
        raise AssertionError(f"unexpected statement with {params}")

    def _write(self, rows: list[list[Any]]) -> list[tuple[Any, ...]]:
        written: list[tuple[Any, ...]] = []
        undo: list[Callable[[], None]] = []
        for row in rows:
            if len(row) == 8:  # [execution_id, attempt, step_id, step_name, tries, started_at, output, error]
                eid, attempt, step_id = row[0], row[1], row[2]
                if (eid, attempt) in self.owned and (eid, step_id) not in self.steps:
                    self.steps[(eid, step_id)] = tuple(row)
                    undo.append(lambda k=(eid, step_id): self.steps.pop(k))
                    written.append((eid, attempt, step_id))
            else:  # [execution_id, attempt, status, output, error]
                eid, attempt = row[0], row[1]
                if (eid, attempt) in self.owned:
                    self.owned.discard((eid, attempt))
                    self.completions[eid] = tuple(row)
                    undo.append(lambda k=eid, a=attempt: (self.completions.pop(k), self.owned.add((k, a))))
                    written.append((eid, attempt, None))
        if self._txn is not None:
            self._txn.extend(undo)
        return written

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        assert self._txn is None, "nested transaction"
        self._txn = []
        try:
            yield
        except BaseException:
            for undo in reversed(self._txn):
                undo()
            raise
        finally:
            self._txn = None


class FakeConnection:
    """Just what ``store.run`` and the batcher use: execute -> cursor (description, fetchall), transaction."""

    closed = False

    def __init__(self, db: FakeDatabase) -> None:
        self.db = db

    def execute(self, statement: Any, params: Any = None) -> FakeCursor:
        return FakeCursor(self.db.execute(params))

    def transaction(self) -> contextlib.AbstractContextManager[None]:
        return self.db.transaction()

    def close(self) -> None:
        self.closed = True


class AsyncFakeConnection:
    closed = False

    def __init__(self, db: FakeDatabase) -> None:
        self.db = db

    async def execute(self, statement: Any, params: Any = None) -> AsyncFakeCursor:
        return AsyncFakeCursor(self.db.execute(params))

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        with self.db.transaction():
            yield

    async def close(self) -> None:
        self.closed = True
