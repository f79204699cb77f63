"""Every way the application creates an execution: enqueue (from anywhere, or as a child inside a workflow,
or on the caller's own connection), bulk enqueue, and fork. Options are checked and defaulted here, once,
for all of them; App.start (worker side: local.py) uses the same checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import psycopg

from . import limits, plans, primitives, store
from .client import WorkflowHandle
from .connections import async_driver_connection, sync_driver_connection
from .context import ExecutionContext, current
from .db import CallPlan
from .errors import DuplicateWorkflow, SerializationError, WorkflowIdConflict, WorkflowNotFound
from .ids import new_execution_id
from .runtime import Runtime
from .serialization import storage_problem, utf8_size
from .workflows import Workflow

# enqueue_many writes its rows in statements of at most this many executions.
_BULK_CHUNK = 5000


class Request:
    """One execution to create: its statement (an enqueue with every option checked and defaulted) and the
    type its result decodes to."""

    def __init__(self, runtime: Runtime, workflow: Workflow[..., Any] | str, args: tuple[Any, ...],
                 kwargs: dict[str, Any], *, workflow_id: str | None = None, queue: str | None = None,
                 priority: int | None = None, delay: float = 0.0, max_recoveries: int | None = None,
                 timeout_seconds: float | None = None, dedup_key: str | None = None,
                 concurrency_key: str | None = None, on_duplicate: str = "return",
                 tags: dict[str, str] | None = None, debounce_key: str | None = None,
                 debounce_seconds: float | None = None, debounce_max_seconds: float | None = None) -> None:
        definition = runtime.registry.resolve(workflow)
        if isinstance(workflow, str) and definition is None:
            # A workflow this process does not define: its signature is unknown, so arguments go by name.
            if args:
                raise TypeError(f"workflow {workflow!r} is not registered in this process; pass its "
                                "arguments by keyword so they can be stored by name")
            name, hint, default_queue, default_priority = workflow, Any, "default", 0
            input_text = runtime.serializer.dumps(kwargs)
            default_timeout = None
        else:
            assert definition is not None
            name, hint = definition.name, definition.signature.return_hint
            default_queue, default_priority = definition.queue, definition.priority
            max_recoveries = max_recoveries if max_recoveries is not None else definition.max_recoveries
            input_text = definition.encode_arguments(runtime.serializer, args, kwargs)
            default_timeout = definition.timeout_seconds
        if on_duplicate not in ("return", "raise"):
            raise ValueError('on_duplicate must be "return" or "raise"')
        check_options(workflow_id=workflow_id, queue=queue, priority=priority, max_recoveries=max_recoveries,
                      timeout_seconds=timeout_seconds, dedup_key=dedup_key, concurrency_key=concurrency_key)
        self.debounce = limits.debounce(debounce_key, debounce_seconds, debounce_max_seconds)
        if self.debounce is not None and (workflow_id is not None or dedup_key is not None or delay):
            raise ValueError("a debounced enqueue takes no workflow_id, dedup_key or delay: the burst decides "
                             "its execution's id and start")
        self.runtime, self.hint, self.on_duplicate = runtime, hint, on_duplicate
        self.call = store.executions.enqueue(
            id=workflow_id or new_execution_id(), name=name, queue=queue or default_queue,
            priority=default_priority if priority is None else priority, input=input_text,
            max_recoveries=runtime.settings.max_recoveries if max_recoveries is None else max_recoveries,
            delay=limits.delay_seconds(delay),
            timeout=timeout_seconds if timeout_seconds is not None else default_timeout,
            dedup_key=dedup_key, concurrency_key=concurrency_key, trace=runtime.trace(), tags=tags_text(tags),
            debounce=self.debounce)
        self.workflow_id = workflow_id

    def child_plan(self, ctx: ExecutionContext) -> plans.Plan:
        """Inside a workflow: start it as a child, recorded as a step of the parent."""
        if self.debounce is not None:
            raise ValueError("debounce_key is for enqueues from outside workflows (a child starts once, as a step)")
        params = {k: v for k, v in self.call.params.items()
                  if k not in ("id", "name", "debounce_key", "debounce_seconds", "debounce_max_seconds")}
        params["trace"] = self.runtime.trace(ctx.telemetry) if self.runtime.observers else None  # the parent's
        return primitives.enqueue_child_plan(ctx, self.call.params["name"], self.workflow_id, params)

    def in_transaction(self) -> store.Call[str]:
        """On the caller's connection, in its transaction, through the SQL function."""
        return store.executions.enqueue_in_transaction(self.call, self.runtime.schema)

    def plan(self) -> CallPlan[store.executions.Enqueued | None]:
        """The insert; if it created nothing, what holds the id or the dedup key instead."""
        enqueued = yield self.call
        if enqueued is None:
            params = self.call.params
            enqueued = yield store.executions.find_enqueued(id=params["id"], queue=params["queue"],
                                                            dedup_key=params["dedup_key"])
        return enqueued  # type: ignore[no-any-return]

    def handle(self, enqueued: store.executions.Enqueued | None) -> WorkflowHandle[Any]:
        runtime, call = self.runtime, self.call
        workflow_id, name, dedup_key = call.params["id"], call.params["name"], call.params["dedup_key"]
        if enqueued is None:  # what held the id or key finished and was deleted in between: never silently
            raise RuntimeError(f"enqueue of {workflow_id} neither created nor found the execution")
        if self.debounce is not None:  # the burst's pending execution, created or updated
            return WorkflowHandle(runtime, enqueued.id, self.hint)
        if enqueued.id != workflow_id:  # an unfinished execution holds the dedup key
            if self.on_duplicate == "raise":
                raise DuplicateWorkflow(enqueued.id, dedup_key)
            return WorkflowHandle(runtime, enqueued.id, self.hint)
        if enqueued.name != name:
            raise WorkflowIdConflict(
                f"workflow id {workflow_id!r} already belongs to an execution of {enqueued.name!r}, not {name!r}")
        return WorkflowHandle(runtime, workflow_id, self.hint)


def check_options(*, workflow_id: str | None = None, queue: str | None = None, priority: int | None = None,
                  max_recoveries: int | None = None, timeout_seconds: float | None = None,
                  dedup_key: str | None = None, concurrency_key: str | None = None) -> None:
    """Refuse, with a clear error and before anything is written, an option no statement could store."""
    if workflow_id is not None:
        limits.workflow_id(workflow_id)
    for label, key in (("dedup_key", dedup_key), ("concurrency_key", concurrency_key)):
        if key is not None:
            limits.key(key, label)
    if queue is not None:
        limits.queue_name(queue)
    if priority is not None:
        limits.priority(priority)
    if max_recoveries is not None:
        limits.max_recoveries(max_recoveries)
    limits.timeout_seconds(timeout_seconds)


def tags_text(tags: dict[str, str] | None) -> str | None:
    """Checked tags as the JSON text the statements take (None: no tags)."""
    checked = limits.tags(tags)
    return None if checked is None else json.dumps(checked)


def enqueue(request: Request, conn: Any = None) -> WorkflowHandle[Any]:
    ctx = current()
    if ctx is not None and conn is None:
        return WorkflowHandle(request.runtime, plans.drive_sync(ctx, request.child_plan(ctx)), request.hint)
    if conn is None:
        return request.handle(request.runtime.db.run_plan(request.plan()))
    driver = sync_driver_connection(conn)
    # Migrate (once) on our own connection first: the caller's is in a transaction, which a failed statement
    # would abort, and which must not hold the migration's locks until it ends.
    request.runtime.db.ensure_schema()
    with id_conflicts():
        created = store.run(driver, request.in_transaction())
    return WorkflowHandle(request.runtime, created, request.hint)


async def enqueue_async(request: Request, conn: Any = None) -> WorkflowHandle[Any]:
    ctx = current()
    if ctx is not None and conn is None:
        return WorkflowHandle(request.runtime, await plans.drive_async(ctx, request.child_plan(ctx)), request.hint)
    if conn is None:
        return request.handle(await request.runtime.db.arun_plan(request.plan()))
    driver = await async_driver_connection(conn)
    await asyncio.to_thread(request.runtime.db.ensure_schema)  # as in enqueue
    with id_conflicts():
        created = await store.arun(driver, request.in_transaction())
    return WorkflowHandle(request.runtime, created, request.hint)


# ---- many at once --------------------------------------------------------------------------------------------

class Bulk:
    """The statements of one enqueue_many (all or nothing), and how their outcome becomes handles."""

    def __init__(self, runtime: Runtime, workflow: Workflow[..., Any],
                 arguments: Iterable[tuple[Any, ...] | dict[str, Any]], workflow_ids: Sequence[str] | None,
                 queue: str | None, priority: int | None, delay: float,
                 tags: dict[str, str] | None = None) -> None:
        definition = runtime.registry.resolve(workflow)
        if definition is None:
            raise TypeError("enqueue_many takes a workflow registered on this App")
        delay = limits.delay_seconds(delay)
        check_options(queue=queue, priority=priority)
        tags_json = tags_text(tags)
        bound = [definition.bind(*_split(item)) for item in arguments]
        ids = list(workflow_ids) if workflow_ids is not None else [new_execution_id() for _ in bound]
        if len(ids) != len(bound):
            raise ValueError(f"{len(ids)} workflow_ids for {len(bound)} argument sets")
        if len(set(ids)) != len(ids):
            raise ValueError("workflow_ids must be distinct")
        for workflow_id in ids if workflow_ids is not None else ():
            limits.workflow_id(workflow_id)
        serializer = runtime.serializer
        self.runtime, self.workflow, self.ids = runtime, definition, ids
        self.calls: list[store.Call[set[str]]] = []
        for i in range(0, len(ids), _BULK_CHUNK):
            # Objects the insert function reads as they are ({id, input}): cheaper than rebuilding them in SQL.
            chunk: list[dict[str, Any]] = [
                {"id": workflow_id, "input": arguments_of_one} for workflow_id, arguments_of_one
                in zip(ids[i:i + _BULK_CHUNK], bound[i:i + _BULK_CHUNK], strict=True)]
            try:
                rows = serializer.inner.dumps(chunk)  # one encoder call for the whole chunk
                suspect = utf8_size(rows) > serializer.max_bytes or storage_problem(rows) is not None
            except SerializationError:
                rows, suspect = "", True
            if suspect:
                for row in chunk:  # name the argument that cannot be stored, or is too big
                    definition.encode_bound(serializer, row["input"])
                if not rows:
                    raise SerializationError(f"arguments of workflow {definition.name!r} cannot be stored")
            if definition.checks_types(serializer):  # every row at once, as enqueue checks one
                errors = definition.signature.rows_errors(rows)
                if errors:
                    where = errors[0]["loc"]
                    error = definition.argument_error({**errors[0], "loc": where[2:]}, chunk[where[0]]["input"])
                    raise type(error)(f"enqueue_many item {i + where[0]}: {error}")
            self.calls.append(store.executions.enqueue_many(
                rows=rows, name=definition.name, queue=queue or definition.queue,
                priority=definition.priority if priority is None else priority,
                max_recoveries=runtime.settings.max_recoveries if definition.max_recoveries is None
                else definition.max_recoveries, delay=delay, timeout=definition.timeout_seconds,
                trace=runtime.trace(), tags=tags_json))

    def missing(self, created: set[str]) -> list[str]:
        return [i for i in self.ids if i not in created] if len(created) != len(self.ids) else []

    def handles(self, existing: dict[str, Any]) -> list[WorkflowHandle[Any]]:
        clashes = {i: name for i, name in existing.items() if name != self.workflow.name}
        if clashes:
            some = ", ".join(f"{i!r} ({name})" for i, name in list(clashes.items())[:5])
            raise WorkflowIdConflict(f"{len(clashes)} workflow ids already belong to other workflows: {some}")
        hint = self.workflow.signature.return_hint
        return [WorkflowHandle(self.runtime, i, hint) for i in self.ids]


def enqueue_many(bulk: Bulk) -> list[WorkflowHandle[Any]]:
    with bulk.runtime.db.pool.connection() as conn, conn.transaction():
        created: set[str] = set()
        for call in bulk.calls:
            rows: set[str] = store.run(conn, call)
            created.update(rows)
        missing = bulk.missing(created)
        existing = store.run(conn, store.executions.names_of(missing)) if missing else {}
        return bulk.handles(existing)  # inside the transaction: a clash rolls everything back


async def enqueue_many_async(bulk: Bulk) -> list[WorkflowHandle[Any]]:
    pool = await bulk.runtime.db.async_pool()
    async with pool.connection() as conn, conn.transaction():
        created: set[str] = set()
        for call in bulk.calls:
            rows: set[str] = await store.arun(conn, call)
            created.update(rows)
        missing = bulk.missing(created)
        existing = await store.arun(conn, store.executions.names_of(missing)) if missing else {}
        return bulk.handles(existing)


def _split(item: tuple[Any, ...] | dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if isinstance(item, dict):
        return (), item
    if isinstance(item, tuple):
        return item, {}
    raise TypeError(f"enqueue_many takes tuples of positional arguments or dicts of keyword arguments, "
                    f"got {type(item).__name__}")


# ---- fork ---------------------------------------------------------------------------------------------------

class Fork:
    """A new execution of the same workflow and input that reuses the recorded steps before ``from_step``:
    its statement, and how its outcome becomes a handle (or a clear error)."""

    def __init__(self, runtime: Runtime, workflow_id: str, from_step: int, new_workflow_id: str | None) -> None:
        if isinstance(from_step, bool) or not isinstance(from_step, int) or from_step < 0:
            raise ValueError(f"from_step must be a step number (an integer >= 0), got {from_step!r}")
        if new_workflow_id is not None:
            limits.workflow_id(new_workflow_id)
        self.runtime, self.source, self.from_step = runtime, workflow_id, from_step
        self.call = store.executions.fork(source=workflow_id, id=new_workflow_id or new_execution_id(),
                                          from_step=from_step)

    def handle(self, forked: store.executions.Forked) -> WorkflowHandle[Any]:
        if not forked.source_found:
            raise WorkflowNotFound(self.source)
        if forked.id is None or forked.name is None:
            steps = forked.recorded_steps
            raise ValueError(
                f"cannot fork {self.source} from step {self.from_step}: it has {steps} recorded step"
                f"{'' if steps == 1 else 's'} (numbered from 0), so from_step may be 0 to {steps}")
        definition = self.runtime.registry.get(forked.name)
        return WorkflowHandle(self.runtime, forked.id, definition.signature.return_hint if definition else Any)


def fork(request: Fork) -> WorkflowHandle[Any]:
    with id_conflicts():
        forked = request.runtime.db.run(request.call)
    return request.handle(forked)


async def fork_async(request: Fork) -> WorkflowHandle[Any]:
    with id_conflicts():
        forked = await request.runtime.db.arun(request.call)
    return request.handle(forked)


@contextlib.contextmanager
def id_conflicts() -> Iterator[None]:
    """The SQL function reports a workflow id taken by another workflow as a unique violation."""
    try:
        yield
    except psycopg.errors.UniqueViolation as exc:
        raise WorkflowIdConflict(str(exc).splitlines()[0]) from exc
