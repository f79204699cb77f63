"""Fakes for the unit layer: a connection that answers the batcher's statements from memory."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import psycopg
from psycopg import errors


class _FakeResult:
    nfields = 1


class FakeCursor:
    def __init__(self, rows: list[tuple[Any, ...]] | None) -> None:
        # What store.run reads of the result: whether it has rows to fetch.
        self.pgresult = None if rows is None else _FakeResult()
        self._rows = rows or []

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self._rows


class AsyncFakeCursor(FakeCursor):
    async def fetchall(self) -> list[tuple[Any, ...]]:  # type: ignore[override]
        return self._rows


class FakeDatabase:
    """What write_step(s) / write_completions / write_checkpoints / heartbeat do, in memory.

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
        self.bells: list[list[list[str]]] = []  # the doorbells armed by every completion statement, in order
        self.after_statement: Callable[[], None] = lambda: None
        # Executions whose step rows are left out without an error, as citus_write_steps leaves out a bucket
        # whose worker node cannot be reached.
        self.unreachable_steps: set[str] = set()
        self._txn: list[Callable[[], None]] | None = None

    # -- one statement ----------------------------------------------------------------------------------

    def execute(self, params: Any) -> list[tuple[Any, ...]] | None:
        if self.fail is not None:
            raise self.fail
        params = dict(params or {})
        if "steps" in params:  # write_checkpoints: both kinds in one statement
            params["rows"] = json.dumps(json.loads(params.pop("steps")) + json.loads(params.pop("completions")))
        if "step_id" in params:  # write_step: the row write_steps would read, from scalar parameters
            error = params["error"]
            params = {"rows": json.dumps([[
                params["execution_id"], params["attempt"], params["step_id"], params["step_name"],
                params["tries"], params["started_at"].isoformat(), json.loads(params["output"]),
                None if error is None else json.loads(error)]])}
        if "rows" in params:
            rows = json.loads(params["rows"])
            self.statements.append(rows)
            if "bells" in params:
                self.bells.append(json.loads(params["bells"]))
            try:
                if any(self.refuse(row) for row in rows):
                    raise self.error("invalid input syntax for type json")
                return self._write(rows)
            finally:
                self.after_statement()
        if "ids" in params and "owner" in params:  # heartbeat
            return [(i, a) for i, a in sorted(self.owned) if i in params["ids"]]
        if "ids" in params:  # citus_buckets_of: one bucket for all
            return [(i, 0) for i in params["ids"]]
        raise AssertionError(f"unexpected statement with {params}")

    def _write(self, rows: list[list[Any]]) -> list[tuple[Any, ...]]:
        written: list[tuple[Any, ...]] = []
        undo: list[Callable[[], None]] = []
        for row in rows:
            if len(row) == 8:  # [execution_id, attempt, step_id, step_name, tries, started_at, output, error]
                eid, attempt, step_id = row[0], row[1], row[2]
                if ((eid, attempt) in self.owned and (eid, step_id) not in self.steps
                        and eid not in self.unreachable_steps):
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
    """Just what ``store.run`` and the batcher use: execute -> cursor (pgresult, fetchall), transaction."""

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


# ---- a workflow attempt without a worker: for the primitives' plans (primitives.py) -----------------------------

class FakeRunner:
    """Answers a plan's effects: StepWrites (True unless the step's name is in ``fenced``), lists of them,
    and store.Calls by name via ``answers[name]`` (a value, or a callable taking the call's params).
    Every effect is kept in ``effects``, in order."""

    def __init__(self, **answers: Any) -> None:
        self.answers: dict[str, Any] = answers
        self.fenced: set[str] = set()
        self.effects: list[Any] = []

    def __call__(self, effect: Any) -> Any:
        from pgdurable.batcher import StepWrite
        self.effects.append(effect)
        if isinstance(effect, list):
            return [write.step_name not in self.fenced for write in effect]
        if isinstance(effect, StepWrite):
            return effect.step_name not in self.fenced
        answer = self.answers[effect.name]
        if isinstance(answer, BaseException):
            raise answer
        return answer(dict(effect.params)) if callable(answer) else answer

    def calls(self, name: str | None = None) -> list[Any]:
        from pgdurable.batcher import StepWrite
        return [e for e in self.effects if not isinstance(e, StepWrite | list) and (name is None or e.name == name)]

    def writes(self) -> list[Any]:
        from pgdurable.batcher import StepWrite
        flat: list[Any] = []
        for e in self.effects:
            flat.extend(e if isinstance(e, list) else [e] if isinstance(e, StepWrite) else [])
        return flat


class FakeContext:
    """What the primitives' plans use of an ExecutionContext: the step counter over recorded steps, the
    database clock, the serializer, fencing (lease_lost, suspended), and perform_sync/perform_async, which
    hand every effect to a FakeRunner."""

    def __init__(self, runner: FakeRunner, recorded: dict[int, Any] | None = None, *,
                 now: Any = None, execution_id: str = "wf-1", attempt: int = 1) -> None:
        from datetime import UTC, datetime

        from pgdurable.serialization import JsonSerializer
        self.runner = runner
        self.recorded = recorded or {}
        self.now = now or datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
        self.execution_id = execution_id
        self.workflow_name = "wf"
        self.attempt = attempt
        self.serializer = JsonSerializer()
        self.lost = False
        self.suspensions: list[Any] = []
        self._next_step = 0

    def begin_step(self, step_name: str) -> tuple[int, Any]:
        step_id = self._next_step
        self._next_step += 1
        recorded = self.recorded.get(step_id)
        assert recorded is None or recorded.step_name == step_name, (step_id, step_name, recorded)
        return step_id, recorded

    def peek_step(self) -> tuple[int, Any]:
        return self._next_step, self.recorded.get(self._next_step)

    def replay(self, recorded: Any, return_hint: Any) -> Any:
        from pgdurable import failures
        if recorded.error is not None:
            raise failures.rebuild(json.loads(recorded.error))
        return self.serializer.loads(recorded.output or "null", return_hint)

    def db_now(self) -> Any:
        return self.now

    def step_write(self, step_id: int, step_name: str, output: str | None, error: str | None = None,
                   started_at: Any = None) -> Any:
        from pgdurable.batcher import StepWrite
        return StepWrite(self.execution_id, self.attempt, step_id, step_name, output, error, 1,
                         started_at or self.now)

    def perform_sync(self, effect: Any) -> Any:
        return self.runner(effect)

    async def perform_async(self, effect: Any) -> Any:
        return self.runner(effect)

    def settle_sync(self) -> None:  # no deferred step checkpoints here: the primitives' plans write directly
        pass

    async def settle_async(self) -> None:
        pass

    def suspended(self, wake_at: Any) -> None:
        self.lost = True
        self.suspensions.append(wake_at)

    def lease_lost(self, what: str) -> Exception:
        from pgdurable.errors import LeaseLost
        self.lost = True
        return LeaseLost(f"execution {self.execution_id}: attempt {self.attempt} no longer owns it ({what})")


def recorded_from(runner: FakeRunner) -> dict[int, Any]:
    """The steps a first run recorded (the writes the runner accepted), as a replay loads them."""
    from pgdurable.store.checkpoints import RecordedStep
    return {w.step_id: RecordedStep(w.step_name, w.output, w.error) for w in runner.writes()
            if w.step_name not in runner.fenced}
