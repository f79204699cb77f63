"""A write batch of the worker's writer (batcher.py): the items it takes (step checkpoints, completions, other
statements on the worker's own rows), their waiters, and ``_Plan``, which runs one batch the same way on a sync
or an async connection: the writes as one statement (on Citus, one per kind in one transaction per bucket), a
batch refused for one write's data split into single writes, then the statements, and each waiter told.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from . import store
from .errors import SerializationError

log = logging.getLogger("pgdurable.worker")

# A batch that fails is retried this many times (reconnecting) before its writers are told it failed.
FLUSH_ATTEMPTS = 3

# A batch of at most this many writes goes to the statements planned for a few rows (write_steps_few and
# its siblings: each execution looked up by its id, whatever the count of running executions); a larger one
# to those that hash-join the running executions. Beside 10,000 running executions a batch of one cost
# 1.7-1.8 ms the second way and 0.10-0.22 the first; beside 64, both alike up to 8 rows, the first 5-10%
# dearer at 32 (bench/running.py; docs/benchmarks.md, "Batches beside many running executions").
FEW_ROWS = 16


@dataclass(slots=True)
class StepWrite:
    execution_id: str
    attempt: int
    step_id: int
    step_name: str
    output: str | None
    error: str | None
    tries: int
    started_at: datetime
    # Handed over without waiting (ExecutionContext.defer_step): its workflow went on with the step's value.
    deferred: bool = False


@dataclass(slots=True)
class Completion:
    execution_id: str
    attempt: int
    status: str
    output: str | None
    error: str | None
    # (worker id, queue): the doorbell this worker arms in the completion's transaction, when finishing its
    # last execution of a queue that ran dry (worker/producer.py: before the caller hears of the result, who
    # may enqueue again at once).
    bell: tuple[str, str] | None = None


@dataclass(slots=True)
class Statement:
    """Any other statement on the worker's own rows (heartbeat, release), run between batches."""

    call: store.Call[Any]


Item = StepWrite | Completion | Statement


class ThreadWaiter:
    """A one-shot result for a workflow thread: a held lock released by the writer. Much cheaper to wake
    than a concurrent.futures.Future (no condition variable, no callbacks)."""

    __slots__ = ("_error", "_lock", "_result", "_set")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self._set = False
        self._result: Any = None
        self._error: BaseException | None = None

    def done(self) -> bool:
        return self._set

    def settle(self, result: Any, error: BaseException | None) -> None:
        self._result, self._error, self._set = result, error, True
        self._lock.release()

    def result(self) -> Any:
        self._lock.acquire()
        if self._error is not None:
            raise self._error
        return self._result


Waiter = asyncio.Future[Any] | ThreadWaiter


@dataclass(frozen=True)
class _Atomic:
    """Two statements a batch runs in one transaction: ``first``, then what ``then`` makes of its result (or
    nothing, if it returns None)."""

    first: store.Call[Any]
    then: Callable[[Any], store.Call[Any] | None]


_DONE = object()  # what _resume returns once a plan has ended


def _resume(plan: Generator[Any, Any, None], result: Any, error: BaseException | None) -> Any:
    """The plan's next request, given the last one's result or error; _DONE once it has ended."""
    try:
        return plan.throw(error) if error is not None else plan.send(result)
    except StopIteration:
        return _DONE


def _run_request(conn: psycopg.Connection[Any], request: store.Call[Any] | _Atomic) -> Any:
    if not isinstance(request, _Atomic):
        return store.run(conn, request)
    with conn.transaction():
        results = [store.run(conn, request.first)]
        if (second := request.then(results[0])) is not None:
            results.append(store.run(conn, second))
        return results


async def _arun_request(conn: psycopg.AsyncConnection[Any], request: store.Call[Any] | _Atomic) -> Any:
    if not isinstance(request, _Atomic):
        return await store.arun(conn, request)
    async with conn.transaction():
        results = [await store.arun(conn, request.first)]
        if (second := request.then(results[0])) is not None:
            results.append(await store.arun(conn, second))
        return results


class _Plan:
    """One batch: its writes as one statement (on Citus, one per kind in one transaction), then any other
    statements.

    On a schema with the Citus layout, one such transaction per bucket of the batch (the buckets of its
    execution ids asked of the coordinator once, then remembered): each commits on one node in one phase, and
    a bucket whose statement fails (cancelled, timed out, its node down) does not hold back the others. An
    attempt that failed is made again for the writes of the buckets that did not commit, only.

    A write the database refuses for its data (an invalid value, a broken constraint) must not charge the
    other writes of the batch: the batch (or the bucket's part of it) is then written again one write at a
    time, and only the writes refused on their own are reported as refused.
    """

    def __init__(self, batch: list[tuple[Item, Waiter]], buckets: dict[str, int] | None = None,
                 lost_steps: dict[tuple[str, int], BaseException | None] | None = None) -> None:
        self.batch = batch
        # Deferred step checkpoints (ExecutionContext.defer_step) that an earlier batch of the writer did not
        # write, by (execution id, attempt): the database's refusal, or None (the batch failed, or the attempt
        # was fenced). The workflow went on with the step's value, so that attempt's completion is not written
        # either: refused with the step's refusal, or reported not written (its execution replays).
        self.lost_steps = {} if lost_steps is None else lost_steps
        self.writes = [(item, waiter) for item, waiter in batch if not isinstance(item, Statement)]
        self.statements = [(item, waiter) for item, waiter in batch if isinstance(item, Statement)]
        self.written: set[store.checkpoints.WriteKey] = set()  # committed only
        self.refused: dict[int, BaseException] = {}
        self.outcomes: dict[int, tuple[Any, BaseException | None]] = {}
        self.failure: BaseException | None = None
        self.buckets = {} if buckets is None else buckets
        self.settled: set[int] = set()  # waiters whose writes committed or were refused: not written again

    def execute(self, conn: psycopg.Connection[Any]) -> None:
        """Run the batch on the writer's sync connection (from a workflow thread that leads)."""
        plan = self._statements(conn)
        request = _resume(plan, None, None)
        while request is not _DONE:
            try:
                result, error = _run_request(conn, request), None
            except Exception as exc:  # thrown into the plan, which decides
                result, error = None, exc
            request = _resume(plan, result, error)

    async def aexecute(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Run the batch on the writer's async connection (the event loop's flusher)."""
        plan = self._statements(conn)
        request = _resume(plan, None, None)
        while request is not _DONE:
            try:
                result, error = await _arun_request(conn, request), None
            except Exception as exc:
                result, error = None, exc
            request = _resume(plan, result, error)

    def _statements(self, conn: Any) -> Generator[Any, Any, None]:
        """The batch, written once for both connections: yields a ``store.Call`` to run (or an ``_Atomic`` of
        several, in one transaction) and receives its result, or has its exception thrown in."""
        todo = [(item, waiter) for item, waiter in self.writes if id(waiter) not in self.settled]
        self.refused = {key: exc for key, exc in self.refused.items() if key in self.settled}
        for write, waiter in todo if self.lost_steps else ():  # (empty but after a failure: the hot path)
            if isinstance(write, Completion) and (write.execution_id, write.attempt) in self.lost_steps:
                if (refusal := self.lost_steps[(write.execution_id, write.attempt)]) is not None:
                    self.refused[id(waiter)] = refusal
                self.settled.add(id(waiter))  # not written: reported so
        todo = [(item, waiter) for item, waiter in todo if id(waiter) not in self.settled]
        citus = store.calls.on_citus(conn)
        unknown = self._unknown(todo) if citus else []
        if unknown:
            found: dict[str, int] = yield store.claims.buckets_of(unknown)
            self.buckets.update(found)
        failure: BaseException | None = None
        for group in self._groups(todo) if citus else [todo]:
            try:
                try:
                    yield from self._write(group, citus)
                except Exception as exc:
                    if not self._refuse(group, exc):
                        raise
                    for one in group if len(group) > 1 else ():
                        if (step := self._refused_step_of(one)) is not None:
                            self.refused[id(one[1])] = step  # its step was refused just before, in this loop
                            continue
                        try:
                            yield from self._write([one], citus)
                        except Exception as single:
                            if not self._refuse([one], single):
                                raise
            except Exception as exc:
                failure = failure or exc
                continue
            self.settled.update(id(waiter) for _, waiter in group)
        if failure is not None:
            raise failure
        for item, waiter in self.statements:
            try:
                self.outcomes[id(waiter)] = ((yield item.call), None)
            except psycopg.Error as exc:
                self.outcomes[id(waiter)] = (None, exc)
        self.failure = None

    def _unknown(self, todo: Sequence[tuple[StepWrite | Completion, Waiter]]) -> list[str]:
        """On Citus: the execution ids of ``todo`` whose bucket must be asked for, when they are several."""
        ids = list(dict.fromkeys(item.execution_id for item, _ in todo))
        return [i for i in ids if i not in self.buckets] if len(ids) > 1 else []

    def _groups(self, todo: Sequence[tuple[StepWrite | Completion, Waiter]]) -> list[list[tuple[Item, Waiter]]]:
        """On Citus: the writes of ``todo`` by transaction, one bucket each (on a single node: all at once)."""
        groups: dict[int, list[tuple[Item, Waiter]]] = {}
        for item, waiter in todo:
            groups.setdefault(self.buckets.get(item.execution_id, -1), []).append((item, waiter))
        return list(groups.values())

    def _write(self, writes: Sequence[tuple[Item, Waiter]], citus: bool) -> Generator[Any, Any, None]:
        calls, written = _write_calls(writes, citus), set[store.checkpoints.WriteKey]()
        if len(calls) > 1:  # both kinds on Citus: still one commit, the steps' statement first
            def completions(steps: set[store.checkpoints.WriteKey]) -> store.Call[Any] | None:
                # A bucket whose node could not be reached is left out of the steps' statement (its steps
                # reported not written), and may be reachable again for the completions': a completion whose
                # deferred steps were not written is not written either (the workflow went on with them).
                done = self._completable(writes, self.written | steps)
                return _write_calls(done, citus)[0] if done else None
            for rows in (yield _Atomic(calls[0], completions)):
                written.update(rows)
        elif calls:
            written = yield calls[0]
        self.written.update(written)  # only once committed: a rolled-back statement wrote nothing

    @staticmethod
    def _completable(writes: Sequence[tuple[Item, Waiter]], written: set[store.checkpoints.WriteKey]
                     ) -> list[tuple[Item, Waiter]]:
        """The completions of ``writes`` whose attempt's deferred step checkpoints in ``writes`` are written."""
        unwritten = {(item.execution_id, item.attempt) for item, _ in writes
                     if isinstance(item, StepWrite) and item.deferred
                     and (item.execution_id, item.attempt, item.step_id) not in written}
        return [(item, waiter) for item, waiter in writes
                if isinstance(item, Completion) and (item.execution_id, item.attempt) not in unwritten]

    def _refused_step_of(self, write: tuple[Item, Waiter]) -> BaseException | None:
        """For a completion written one write at a time: the refusal of a deferred step checkpoint of the same
        attempt refused earlier in this batch, if any. Such a completion is refused too, not written: the
        workflow's result was computed from a step value that is not recorded."""
        item = write[0]
        if not isinstance(item, Completion) or not self.refused:
            return None
        for other, waiter in self.writes:
            if (isinstance(other, StepWrite) and other.deferred and other.execution_id == item.execution_id
                    and other.attempt == item.attempt and id(waiter) in self.refused):
                return self.refused[id(waiter)]
        return None

    def _refuse(self, writes: Sequence[tuple[Item, Waiter]], exc: BaseException) -> bool:
        """After the database refused ``writes`` for their data: a single write is marked refused, several
        are to be written again one at a time (True). False: not refused for the data, so a failure."""
        if not _refused_for_its_data(exc):
            return False
        if len(writes) > 1:
            log.warning("write batch of %d refused for its data (%s); writing it again one write at a time",
                        len(writes), _first_line(exc))
            return True
        item, waiter = writes[0]
        assert not isinstance(item, Statement)
        log.warning("execution %s attempt %d: the database refused a write (%s): %s", item.execution_id,
                    item.attempt, type(item).__name__, _first_line(exc))
        self.refused[id(waiter)] = exc
        return True

    def failed(self, exc: BaseException, attempt: int) -> None:
        self.failure = exc
        log.warning("write batch of %d failed (attempt %d of %d): %s", len(self.batch), attempt,
                    FLUSH_ATTEMPTS, exc)

    def settle(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """Tell every waiter its outcome. ``loop`` is given when settling from a thread other than its own.

        A write that failed outright counts as not written: its workflow stops, its lease runs out, and
        another attempt resumes it from its checkpoints. A write refused for its data raises
        ``SerializationError`` in its writer, which records that as the step's or workflow's error.
        """
        on_loop: list[tuple[asyncio.Future[Any], Any, BaseException | None]] = []
        for item, waiter in self.batch:
            result: Any
            error: BaseException | None
            if isinstance(item, Statement):
                result, error = self.outcomes.get(id(waiter), (None, self.failure))
            elif (refusal := self.refused.get(id(waiter))) is not None:
                result, error = None, SerializationError(
                    f"the database refused to store it: {_first_line(refusal)}")
                if isinstance(item, StepWrite) and item.deferred:
                    self.lost_steps[(item.execution_id, item.attempt)] = refusal
            else:
                key = (item.execution_id, item.attempt, item.step_id if isinstance(item, StepWrite) else None)
                result, error = key in self.written, None
                if not result and isinstance(item, StepWrite) and item.deferred:
                    self.lost_steps.setdefault((item.execution_id, item.attempt), None)
            if isinstance(waiter, ThreadWaiter):
                waiter.settle(result, error)
            elif loop is None:
                _settle_future(waiter, result, error)
            else:
                on_loop.append((waiter, result, error))
        if on_loop and loop is not None:
            with contextlib.suppress(RuntimeError):  # a closed loop: the worker is exiting
                loop.call_soon_threadsafe(_settle_futures, on_loop)


def _write_calls(writes: Sequence[tuple[Item, Waiter]], citus: bool
                 ) -> list[store.Call[set[store.checkpoints.WriteKey]]]:
    """The statements that write ``writes``: one, or on Citus one per kind (run in one transaction)."""
    if len(writes) == 1 and isinstance(writes[0][0], StepWrite) and not citus:
        w = writes[0][0]  # one step alone (steps in sequence): scalar parameters, no JSON array to take apart
        return [store.checkpoints.write_step(w.execution_id, w.attempt, w.step_id, w.step_name, w.tries,
                                             w.started_at, w.output, w.error)]
    steps = [_step_row(item) for item, _ in writes if isinstance(item, StepWrite)]
    done = [_completion_row(item) for item, _ in writes if isinstance(item, Completion)]
    bells = json.dumps(list(dict.fromkeys(item.bell for item, _ in writes
                                          if isinstance(item, Completion) and item.bell))) if done else "[]"
    few = len(writes) <= FEW_ROWS and not citus
    if steps and done and not citus:
        return [store.checkpoints.write_checkpoints(_array(steps), _array(done), bells, few=few)]
    calls = []
    if steps:
        calls.append(store.checkpoints.write_steps(_array(steps), few=few))
    if done:
        calls.append(store.checkpoints.write_completions(_array(done), bells, few=few))
    return calls


def _array(rows: list[str]) -> str:
    return "[" + ",".join(rows) + "]"


def _refused_for_its_data(exc: BaseException) -> bool:
    """A data exception (SQLSTATE class 22), a broken constraint (23) or a value too complex for the server
    (54), or a value the driver could not even send (a NUL byte, an unencodable character)."""
    if isinstance(exc, psycopg.Error):
        return isinstance(exc, psycopg.DataError) or (exc.sqlstate or "")[:2] in ("22", "23", "54")
    return isinstance(exc, ValueError)  # UnicodeEncodeError included


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:500]


def _settle_future(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def _settle_futures(outcomes: list[tuple[asyncio.Future[Any], Any, BaseException | None]]) -> None:
    for future, result, error in outcomes:
        _settle_future(future, result, error)


# Outputs and errors are already JSON text: they are spliced in as they are, not parsed and re-encoded.

def _step_row(w: StepWrite) -> str:
    head = json.dumps([w.execution_id, w.attempt, w.step_id, w.step_name, w.tries, w.started_at.isoformat()])
    return f"{head[:-1]},{w.output or 'null'},{w.error or 'null'}]"


def _completion_row(w: Completion) -> str:
    head = json.dumps([w.execution_id, w.attempt, w.status])
    return f"{head[:-1]},{w.output or 'null'},{w.error or 'null'}]"
