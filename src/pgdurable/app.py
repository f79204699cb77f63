"""The application object: registry of workflows and steps, configuration, and the client API."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import timedelta
from typing import Any, ParamSpec, TypeVar, overload

import psycopg

from . import limits, schedules, store, waits
from .client import CompletionListener, WorkflowHandle
from .config import Settings, database_url_from_env, schema_name
from .connections import async_driver_connection, sync_driver_connection
from .context import current
from .db import Database
from .embedded import embedded_database_url
from .errors import (
    ConfigurationError,
    DuplicateWorkflow,
    SerializationError,
    WorkflowIdConflict,
    WorkflowNotFound,
)
from .migrations import migrate
from .schedules import CatchUp, Schedule, ScheduleDefinition
from .serialization import JsonSerializer, Serializer, SizeLimit, storage_problem, utf8_size
from .steps import RetryPolicy, make_step
from .telemetry import Observer, Observers
from .transactions import make_transaction_step
from .workflows import Registry, Workflow, default_name

P = ParamSpec("P")
R = TypeVar("R")
W = TypeVar("W", bound=Workflow[Any, Any])


class App:
    """A pgdurable application. Create one (or several: there is no global state) and register workflows.

    ``database_url`` defaults to ``PGDURABLE_DATABASE_URL``, then ``DATABASE_URL``, then an embedded
    PostgreSQL started on first use. Nothing connects until the first call that needs the database.
    """

    def __init__(self, database_url: str | None = None, *, schema: str | None = None,
                 serializer: Serializer | None = None, auto_migrate: bool = True,
                 settings: Settings | None = None, **tunables: Any) -> None:
        self.schema = schema_name(schema)
        self.settings = settings or Settings(**tunables)
        self.serializer = SizeLimit(serializer or JsonSerializer(), self.settings.max_payload_bytes)
        self.registry = Registry()
        # Declared with @app.scheduled; a worker stores them when it starts.
        self.declared_schedules: dict[str, ScheduleDefinition] = {}
        # Resolved on first use, so an App can be defined at import time before the environment is set.
        self.db = Database(lambda: database_url or database_url_from_env() or embedded_database_url(),
                           self.schema,
                           auto_migrate=auto_migrate)
        self.completions = CompletionListener(self)
        self.queue_policies: dict[str, store.QueuePolicy] = {}
        self.observers = Observers()
        self._local: _LocalRuntime | None = None
        self._local_lock = threading.Lock()

    # -- registration -------------------------------------------------------------------------------------

    @overload
    def workflow(self, fn: Callable[P, R]) -> Workflow[P, R]: ...

    @overload
    def workflow(self, fn: None = None, *, name: str | None = None, queue: str = "default", priority: int = 0,
                 max_recoveries: int | None = None,
                 timeout_seconds: float | None = None) -> Callable[[Callable[P, R]], Workflow[P, R]]: ...

    def workflow(self, fn: Callable[..., Any] | None = None, *, name: str | None = None,
                 queue: str = "default", priority: int = 0,
                 max_recoveries: int | None = None, timeout_seconds: float | None = None) -> Any:
        """Register a workflow. Its steps are checkpointed; its return value is its result.

        ``timeout_seconds``: a time budget counted from the first start (children inherit the deadline);
        past it the execution fails with ``pgdurable.WorkflowTimeout``.
        """

        limits.timeout_seconds(timeout_seconds)
        limits.queue_name(queue)
        limits.priority(priority)
        if max_recoveries is not None:
            limits.max_recoveries(max_recoveries)

        def register(fn: Callable[..., Any]) -> Workflow[..., Any]:
            workflow = Workflow(fn, name=name or default_name(fn), queue=queue, priority=priority,
                                max_recoveries=max_recoveries, timeout_seconds=timeout_seconds)
            self.registry.add(workflow)
            return workflow

        return register(fn) if fn is not None else register

    @overload
    def step(self, fn: Callable[P, R]) -> Callable[P, R]: ...

    @overload
    def step(self, fn: None = None, *, name: str | None = None, max_attempts: int = 3, interval: float = 0.5,
             backoff: float = 2.0, max_interval: float = 60.0,
             no_retry: tuple[type[BaseException], ...] = ()) -> Callable[[Callable[P, R]], Callable[P, R]]: ...

    def step(self, fn: Callable[..., Any] | None = None, *, name: str | None = None, max_attempts: int = 3,
             interval: float = 0.5, backoff: float = 2.0, max_interval: float = 60.0,
             no_retry: tuple[type[BaseException], ...] = ()) -> Any:
        """Declare a step: run at least once, recorded exactly once, replayed from its record.

        A failing step is retried ``max_attempts`` times in all, waiting ``interval * backoff**n`` seconds
        (at most ``max_interval``); exception types in ``no_retry`` fail it at once.
        """
        policy = RetryPolicy(max_attempts=max_attempts, interval=interval, backoff=backoff,
                             max_interval=max_interval, no_retry=no_retry)

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            step_name = name or default_name(fn)
            self.registry.steps.add(step_name)
            return make_step(fn, step_name, policy)

        return register(fn) if fn is not None else register

    def transaction(self, fn: Callable[..., Any] | None = None, *, name: str | None = None,
                    isolation: str | None = None, max_attempts: int = 3, interval: float = 0.5,
                    backoff: float = 2.0, max_interval: float = 60.0,
                    no_retry: tuple[type[BaseException], ...] = ()) -> Any:
        """Declare a transactional step: it receives a connection in an open transaction as its first
        argument (callers leave it out), and its writes commit together with its checkpoint, or not at all.

        ``isolation``: None (the server's default), "read committed", "repeatable read" or "serializable".
        Serialization failures and deadlocks roll back and retry on their own budget of attempts.
        """
        policy = RetryPolicy(max_attempts=max_attempts, interval=interval, backoff=backoff,
                             max_interval=max_interval, no_retry=no_retry)

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            step_name = name or default_name(fn)
            self.registry.steps.add(step_name)
            return make_transaction_step(self, fn, step_name, policy, isolation)

        return register(fn) if fn is not None else register

    # -- enqueue ------------------------------------------------------------------------------------------

    def enqueue(self, workflow: Workflow[..., R] | str, *args: Any, workflow_id: str | None = None,
                queue: str | None = None, priority: int | None = None, delay: float = 0.0,
                max_recoveries: int | None = None, timeout_seconds: float | None = None,
                dedup_key: str | None = None, concurrency_key: str | None = None, on_duplicate: str = "return",
                conn: Any = None, **kwargs: Any) -> WorkflowHandle[R]:
        """Durably enqueue a workflow; a worker runs it. A given ``workflow_id`` is an idempotency key.

        With ``conn`` (a psycopg connection, or a SQLAlchemy Session or Connection on psycopg), the
        execution is written on that connection, in its current transaction: it exists if and only if
        that transaction commits, and workers are woken when it does.

        ``dedup_key``: while an unfinished execution of the queue has this key, no second one is enqueued:
        the handle of the existing one is returned (``on_duplicate="raise"``: ``DuplicateWorkflow``).
        ``concurrency_key``: executions sharing it are limited together by the queue's ``key_concurrency``.

        Called inside a workflow, it starts a child workflow: a step (replay finds the same child), with
        a deterministic id, the parent's deadline, and cancellation cascading from the parent.
        """
        call, hint = self._enqueue_call(workflow, args, kwargs, workflow_id, queue, priority, delay,
                                        max_recoveries, timeout_seconds, dedup_key, concurrency_key, on_duplicate)
        ctx = current()
        if ctx is not None and conn is None:
            child = self._child_plan(ctx, call, workflow_id)
            return WorkflowHandle(self, waits.drive_sync(ctx, child), hint)
        if conn is None:
            return self._handle(self.db.run(call), call, hint, on_duplicate)
        in_transaction = store.enqueue_in_transaction(call, self.schema)
        with _id_conflicts():
            return WorkflowHandle(self, store.run(sync_driver_connection(conn), in_transaction), hint)

    async def enqueue_async(self, workflow: Workflow[..., R] | str, *args: Any, workflow_id: str | None = None,
                            queue: str | None = None, priority: int | None = None, delay: float = 0.0,
                            max_recoveries: int | None = None, timeout_seconds: float | None = None,
                            dedup_key: str | None = None, concurrency_key: str | None = None,
                            on_duplicate: str = "return", conn: Any = None,
                            **kwargs: Any) -> WorkflowHandle[R]:
        call, hint = self._enqueue_call(workflow, args, kwargs, workflow_id, queue, priority, delay,
                                        max_recoveries, timeout_seconds, dedup_key, concurrency_key, on_duplicate)
        ctx = current()
        if ctx is not None and conn is None:
            child = self._child_plan(ctx, call, workflow_id)
            return WorkflowHandle(self, await waits.drive_async(ctx, child), hint)
        if conn is None:
            return self._handle(await self.db.arun(call), call, hint, on_duplicate)
        in_transaction = store.enqueue_in_transaction(call, self.schema)
        with _id_conflicts():
            return WorkflowHandle(self, await store.arun(await async_driver_connection(conn), in_transaction),
                                  hint)

    def enqueue_many(self, workflow: Workflow[..., R], arguments: Iterable[tuple[Any, ...] | dict[str, Any]], *,
                     workflow_ids: Sequence[str] | None = None, queue: str | None = None,
                     priority: int | None = None, delay: float = 0.0) -> list[WorkflowHandle[R]]:
        """Enqueue many executions of one workflow in one transaction: all of them or none.

        Each item of ``arguments`` is a tuple of positional arguments or a dict of keyword arguments.
        ``workflow_ids``, when given, are idempotency keys as in ``enqueue``.
        """
        batch = self._bulk(workflow, arguments, workflow_ids, queue, priority, delay)
        with self.db.pool.connection() as conn, conn.transaction():
            created: set[str] = set()
            for call in batch.calls:
                rows: set[str] = store.run(conn, call)
                created.update(rows)
            missing = batch.missing(created)
            existing = store.run(conn, store.names_of(missing)) if missing else {}
            return batch.handles(self, existing)  # inside the transaction: a clash rolls everything back

    async def enqueue_many_async(self, workflow: Workflow[..., R],
                                 arguments: Iterable[tuple[Any, ...] | dict[str, Any]], *,
                                 workflow_ids: Sequence[str] | None = None, queue: str | None = None,
                                 priority: int | None = None, delay: float = 0.0) -> list[WorkflowHandle[R]]:
        batch = self._bulk(workflow, arguments, workflow_ids, queue, priority, delay)
        pool = await self.db.async_pool()
        async with pool.connection() as conn, conn.transaction():
            created: set[str] = set()
            for call in batch.calls:
                rows: set[str] = await store.arun(conn, call)
                created.update(rows)
            missing = batch.missing(created)
            existing = await store.arun(conn, store.names_of(missing)) if missing else {}
            return batch.handles(self, existing)

    def _bulk(self, workflow: Workflow[..., Any], arguments: Iterable[tuple[Any, ...] | dict[str, Any]],
              workflow_ids: Sequence[str] | None, queue: str | None, priority: int | None,
              delay: float) -> _Bulk:
        definition = self._resolve(workflow)
        if definition is None:
            raise TypeError("enqueue_many takes a workflow registered on this App")
        delay = limits.delay_seconds(delay)
        if queue is not None:
            limits.queue_name(queue)
        if priority is not None:
            limits.priority(priority)
        bound = [self._bind(definition, *_split(item)) for item in arguments]
        ids = list(workflow_ids) if workflow_ids is not None else [str(uuid.uuid4()) for _ in bound]
        if len(ids) != len(bound):
            raise ValueError(f"{len(ids)} workflow_ids for {len(bound)} argument sets")
        if len(set(ids)) != len(ids):
            raise ValueError("workflow_ids must be distinct")
        for workflow_id in ids if workflow_ids is not None else ():
            limits.workflow_id(workflow_id)
        calls = []
        for i in range(0, len(ids), _BULK_CHUNK):
            chunk: list[dict[str, Any]] = [
                {"id": workflow_id, "input": arguments_of_one} for workflow_id, arguments_of_one
                in zip(ids[i:i + _BULK_CHUNK], bound[i:i + _BULK_CHUNK], strict=True)]
            try:
                rows = self.serializer.inner.dumps(chunk)  # one encoder call for the whole chunk
                suspect = utf8_size(rows) > self.serializer.max_bytes or storage_problem(rows) is not None
            except SerializationError:
                rows, suspect = "", True
            if suspect:
                for row in chunk:  # name the argument that cannot be stored, or is too big
                    self._encode_bound(definition, row["input"])
                if not rows:
                    raise SerializationError(f"arguments of workflow {definition.name!r} cannot be stored")
            calls.append(store.enqueue_many(
                rows=rows, name=definition.name, queue=queue or definition.queue,
                priority=definition.priority if priority is None else priority,
                max_recoveries=self.settings.max_recoveries if definition.max_recoveries is None
                else definition.max_recoveries, delay=delay, timeout=definition.timeout_seconds,
                trace=self._trace()))
        return _Bulk(definition, ids, calls)

    def _child_plan(self, ctx: Any, call: store.Call[Any], workflow_id: str | None) -> waits.Plan:
        params = {k: v for k, v in call.params.items() if k not in ("id", "name")}
        params["trace"] = self._trace(ctx.telemetry) if self.observers else None  # the parent's trace
        return waits.enqueue_child_plan(ctx, call.params["name"], workflow_id, params)

    def observe(self, observer: Observer) -> Observer:
        """Register a metrics or tracing observer (see pgdurable.metrics, pgdurable.tracing)."""
        self.observers.add(observer)
        return observer

    def _trace(self, parent: Any = None) -> str | None:
        """The trace context to store with an execution enqueued now, as JSON text (None: no tracing)."""
        if not self.observers:
            return None
        carrier = self.observers.trace_carrier(parent)
        return json.dumps(carrier) if carrier else None

    def _enqueue_call(self, workflow: Workflow[..., Any] | str, args: tuple[Any, ...], kwargs: dict[str, Any],
                      workflow_id: str | None, queue: str | None, priority: int | None, delay: float,
                      max_recoveries: int | None, timeout_seconds: float | None = None,
                      dedup_key: str | None = None, concurrency_key: str | None = None,
                      on_duplicate: str = "return") -> tuple[store.Call[store.Enqueued | None], Any]:
        definition = self._resolve(workflow)
        if isinstance(workflow, str) and definition is None:
            # A workflow this process does not define: its signature is unknown, so arguments go by name.
            if args:
                raise TypeError(f"workflow {workflow!r} is not registered in this process; pass its "
                                "arguments by keyword so they can be stored by name")
            name, hint, default_queue, default_priority = workflow, Any, "default", 0
            input_text = self.serializer.dumps(kwargs)
            default_timeout = None
        else:
            assert definition is not None
            name, hint = definition.name, definition.signature.return_hint
            default_queue, default_priority = definition.queue, definition.priority
            max_recoveries = max_recoveries if max_recoveries is not None else definition.max_recoveries
            input_text = self._encode_arguments(definition, args, kwargs)
            default_timeout = definition.timeout_seconds
        delay = limits.delay_seconds(delay)
        timeout_seconds = limits.timeout_seconds(timeout_seconds)
        if on_duplicate not in ("return", "raise"):
            raise ValueError('on_duplicate must be "return" or "raise"')
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
        call = store.enqueue(
            id=workflow_id or str(uuid.uuid4()), name=name, queue=queue or default_queue,
            priority=default_priority if priority is None else priority, input=input_text,
            max_recoveries=self.settings.max_recoveries if max_recoveries is None else max_recoveries,
            delay=delay, timeout=timeout_seconds if timeout_seconds is not None else default_timeout,
            dedup_key=dedup_key, concurrency_key=concurrency_key, trace=self._trace())
        return call, hint

    def _encode_arguments(self, workflow: Workflow[..., Any], args: tuple[Any, ...],
                          kwargs: dict[str, Any]) -> str:
        return self._encode_bound(workflow, self._bind(workflow, args, kwargs))

    @staticmethod
    def _bind(workflow: Workflow[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        try:
            return workflow.signature.bind(args, kwargs)
        except TypeError as exc:
            raise TypeError(f"arguments do not fit workflow {workflow.name!r}: {exc}") from None

    def _encode_bound(self, workflow: Workflow[..., Any], bound: dict[str, Any]) -> str:
        try:
            return self.serializer.dumps(bound)
        except SerializationError:
            for argument, value in bound.items():  # name the argument that cannot be stored
                try:
                    self.serializer.dumps(value)
                except SerializationError as exc:
                    raise SerializationError(
                        f"argument {argument!r} of workflow {workflow.name!r} cannot be stored: {exc}") from None
            raise

    def _resolve(self, workflow: Workflow[..., Any] | str) -> Workflow[..., Any] | None:
        if isinstance(workflow, Workflow):
            if self.registry.get(workflow.name) is not workflow:
                raise ConfigurationError(f"workflow {workflow.name!r} is registered on another App")
            return workflow
        if isinstance(workflow, str):
            return self.registry.get(workflow)
        raise TypeError(f"expected a workflow registered with @app.workflow or its name, got {workflow!r}")

    def _handle(self, enqueued: store.Enqueued | None, call: store.Call[Any], hint: Any,
                on_duplicate: str = "return") -> WorkflowHandle[Any]:
        workflow_id, name, dedup_key = call.params["id"], call.params["name"], call.params["dedup_key"]
        if enqueued is None:  # lost a race with a concurrent enqueue of the same id or dedup key
            existing = self.db.run(store.get_execution(workflow_id))
            if existing is not None:
                enqueued = store.Enqueued(existing.id, existing.name, False)
            elif dedup_key is not None:
                enqueued = self.db.run(store.find_duplicate(queue=call.params["queue"], dedup_key=dedup_key))
            if enqueued is None:
                raise RuntimeError(f"enqueue of {workflow_id} neither created nor found the execution")
        if enqueued.id != workflow_id:  # an unfinished execution holds the dedup key
            if on_duplicate == "raise":
                raise DuplicateWorkflow(enqueued.id, dedup_key)
            return WorkflowHandle(self, enqueued.id, hint)
        if enqueued.name != name:
            raise WorkflowIdConflict(
                f"workflow id {workflow_id!r} already belongs to an execution of {enqueued.name!r}, not {name!r}")
        return WorkflowHandle(self, workflow_id, hint)

    # -- run in this process ------------------------------------------------------------------------------

    def start(self, workflow: Workflow[..., R], *args: Any, workflow_id: str | None = None,
              priority: int | None = None, max_recoveries: int | None = None,
              timeout_seconds: float | None = None, **kwargs: Any) -> WorkflowHandle[R]:
        """Run a workflow durably in this process, now. If the process dies, a worker resumes it.

        On a queue with limits (``app.queue(...)``, stored), the limits decide when it runs: it is enqueued
        and a worker runs it, exactly as ``enqueue`` would.

        Inside a workflow this starts a child workflow, exactly like ``enqueue``. A workflow that waits
        (durable sleep, messages, children) is resumed by a worker (``pgdurable worker``), not here.
        """
        if current() is not None:
            return self.enqueue(workflow, *args, workflow_id=workflow_id, priority=priority,
                                max_recoveries=max_recoveries, timeout_seconds=timeout_seconds, **kwargs)
        definition = self._resolve(workflow)
        assert definition is not None
        timeout_seconds = limits.timeout_seconds(timeout_seconds)
        if workflow_id is not None:
            limits.workflow_id(workflow_id)
        if priority is not None:
            limits.priority(priority)
        if max_recoveries is not None:
            limits.max_recoveries(max_recoveries)
        runtime = self._local_runtime()
        input_text = self._encode_arguments(definition, args, kwargs)
        row = self.db.run(store.start_owned(
            id=workflow_id or str(uuid.uuid4()), name=definition.name, queue=definition.queue,
            priority=definition.priority if priority is None else priority, input=input_text,
            max_recoveries=self.settings.max_recoveries if max_recoveries is None else max_recoveries,
            owner=runtime.worker.id, lease=self.settings.lease_seconds,
            timeout=timeout_seconds if timeout_seconds is not None else definition.timeout_seconds,
            version=self.version, trace=(trace := self._trace())))
        assert row is not None
        execution_id, name, _, attempt, stored_input, db_now, owned = row
        if name != definition.name:
            raise WorkflowIdConflict(f"workflow id {execution_id!r} already belongs to {name!r}")
        if owned:  # else its queue has limits: it was enqueued, and a worker runs it when they allow
            runtime.submit(store.Claimed(execution_id, name, attempt, stored_input, db_now), trace)
        return WorkflowHandle(self, execution_id, definition.signature.return_hint)

    def _local_runtime(self) -> _LocalRuntime:
        with self._local_lock:
            if self._local is None:
                self.db.ensure_schema()
                self._local = _LocalRuntime(self)
            return self._local

    # -- management ---------------------------------------------------------------------------------------

    def handle(self, workflow_id: str) -> WorkflowHandle[Any]:
        return WorkflowHandle(self, workflow_id)

    def get(self, workflow_id: str) -> store.Execution | None:
        return self.db.run(store.get_execution(workflow_id))

    def steps(self, workflow_id: str) -> list[store.Step]:
        return self.db.run(store.list_steps(workflow_id))

    def list_workflows(self, *, status: str | None = None, name: str | None = None, queue: str | None = None,
             limit: int = 50) -> list[store.Execution]:
        return self.db.run(store.list_executions(status=status, name=name, queue=queue, limit=limit))

    def cancel(self, workflow_id: str) -> bool:
        """Cancel an enqueued or running execution. A running one stops at its next step."""
        return self.db.run(store.cancel(workflow_id))

    async def cancel_async(self, workflow_id: str) -> bool:
        return await self.db.arun(store.cancel(workflow_id))

    def resume(self, workflow_id: str) -> bool:
        """Re-enqueue a failed or cancelled execution. Completed steps are kept; a failed step runs again."""
        with self.db.pool.connection() as conn, conn.transaction():
            store.run(conn, store.forget_failed_steps(workflow_id))
            return store.run(conn, store.resume(workflow_id))

    # -- queue policies -----------------------------------------------------------------------------------

    def queue(self, name: str, *, concurrency: int | None = None, worker_concurrency: int | None = None,
              rate_limit: int | None = None, rate_period: float | None = None,
              key_concurrency: int | None = None) -> store.QueuePolicy:
        """Declare a queue's limits, enforced in SQL across every worker: ``concurrency`` running at once
        in all, ``worker_concurrency`` per worker process, ``rate_limit`` starts per ``rate_period``
        seconds, ``key_concurrency`` running per ``concurrency_key``. Stored when a worker of this app
        starts (or now, with ``apply_queue_policies``); a queue without limits claims on the fast path."""
        for label, value in (("concurrency", concurrency), ("worker_concurrency", worker_concurrency),
                             ("rate_limit", rate_limit), ("key_concurrency", key_concurrency)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or not 1 <= value < 2 ** 31):
                raise ValueError(f"queue {name!r}: {label} must be an integer from 1 to {2 ** 31 - 1:,}")
        limits.queue_name(name)
        if (rate_limit is None) != (rate_period is None):
            raise ValueError(f"queue {name!r}: give rate_limit and a positive rate_period together")
        if rate_period is not None:
            rate_period = limits.rate_period(rate_period)
        policy = store.QueuePolicy(name, concurrency, worker_concurrency, rate_limit, rate_period, key_concurrency)
        self.queue_policies[name] = policy
        return policy

    def apply_queue_policies(self) -> None:
        """Store the declared queue policies (workers do this when they start)."""
        for policy in self.queue_policies.values():
            self.db.run(store.set_queue_policy(policy))

    def fork(self, workflow_id: str, from_step: int, *, new_workflow_id: str | None = None) -> WorkflowHandle[Any]:
        """A new execution of the same workflow and input that reuses the recorded outputs of steps before
        ``from_step`` and runs again from there, on the code deployed now (fix a bug, then re-run)."""
        if from_step < 0:
            raise ValueError("from_step must be >= 0")
        new_id = new_workflow_id or str(uuid.uuid4())
        with _id_conflicts():
            created, name, _ = self.db.run(store.fork(source=workflow_id, id=new_id, from_step=from_step))
        if created is None or name is None:
            raise WorkflowNotFound(workflow_id)
        definition = self.registry.get(name)
        return WorkflowHandle(self, new_id, definition.signature.return_hint if definition else Any)

    def children(self, workflow_id: str) -> list[tuple[Any, ...]]:
        """(id, name, status, created_at, completed_at) of the workflows this one started."""
        return self.db.run(store.list_children(workflow_id))

    # -- messages and events ------------------------------------------------------------------------------

    def send(self, workflow_id: str, message: Any, *, topic: str | None = None,
             idempotency_key: str | None = None, conn: Any = None) -> bool:
        """Send ``message`` to a workflow, which receives it with ``pgdurable.recv(topic)``. With a key, a
        retried send is stored once (returns False for the repeat). With ``conn``, inside that connection's
        transaction. Inside a workflow, the send is a step (sent once however often the workflow replays)."""
        call = self._send_call(workflow_id, message, topic, idempotency_key)
        ctx = current()
        if ctx is not None and conn is None:
            waits.drive_sync(ctx, waits.send_plan(ctx, call))
            return True
        with _missing_destination(workflow_id):
            if conn is not None:
                return store.run(sync_driver_connection(conn), store.send_message_in_transaction(call, self.schema))
            return self.db.run(call)

    async def send_async(self, workflow_id: str, message: Any, *, topic: str | None = None,
                         idempotency_key: str | None = None, conn: Any = None) -> bool:
        call = self._send_call(workflow_id, message, topic, idempotency_key)
        ctx = current()
        if ctx is not None and conn is None:
            await waits.drive_async(ctx, waits.send_plan(ctx, call))
            return True
        with _missing_destination(workflow_id):
            if conn is not None:
                return await store.arun(await async_driver_connection(conn),
                                        store.send_message_in_transaction(call, self.schema))
            return await self.db.arun(call)

    def _send_call(self, workflow_id: str, message: Any, topic: str | None,
                   idempotency_key: str | None) -> store.Call[bool]:
        return store.send_message(destination=workflow_id, message=self.serializer.dumps(message),
                                  topic=topic or "", key=idempotency_key)

    def get_event(self, workflow_id: str, key: str, timeout: float | None = None) -> Any:
        """The latest value workflow ``workflow_id`` published under ``key``; waits up to ``timeout`` seconds
        for a first one (woken by NOTIFY), then returns None. Inside a workflow the answer is recorded as a
        step (the wait holds the worker slot)."""
        from .events import get_event

        return get_event(self, workflow_id, key, timeout)

    async def get_event_async(self, workflow_id: str, key: str, timeout: float | None = None) -> Any:
        from .events import get_event_async

        return await get_event_async(self, workflow_id, key, timeout)

    def events(self, workflow_id: str) -> list[store.Event]:
        """Every value the workflow published, by key then in order (values decoded)."""
        return [dataclasses.replace(e, value=self.serializer.loads(e.value, Any))
                for e in self.db.run(store.list_events(workflow_id))]

    def messages(self, workflow_id: str) -> list[store.Message]:
        """Messages sent to the workflow, consumed or not, in the order sent (decoded)."""
        return [dataclasses.replace(m, message=self.serializer.loads(m.message, Any))
                for m in self.db.run(store.list_messages(workflow_id))]

    @property
    def version(self) -> str:
        """The application version this app's workers stamp on the executions they start."""
        return (self.settings.app_version or os.environ.get("PGDURABLE_APP_VERSION")
                or self.registry.fingerprint())

    def cleanup(self, older_than: timedelta | float, statuses: Iterable[str] = store.TERMINAL, *,
                batch_size: int = 1000) -> int:
        """Delete finished executions (and their steps) created and finished more than ``older_than`` ago
        (a timedelta, or seconds), in batches of ``batch_size`` that never block workers. Returns how many
        executions were deleted. Only ``succeeded``, ``failed`` and ``cancelled`` may be given."""
        from .retention import cleanup

        return cleanup(self.db, older_than, statuses, batch_size=batch_size).executions

    def migrate(self) -> list[int]:
        """Create or upgrade the schema; returns the migration versions applied."""
        return migrate(self.db.conninfo, self.schema)

    # -- schedules (the logic lives in schedules.py and scheduler.py) ---------------------------------------

    def schedule(self, name: str, workflow: Workflow[..., Any] | str, cron: str, *, timezone: str = "UTC",
                 queue: str | None = None, priority: int | None = None, args: Mapping[str, Any] | None = None,
                 catch_up: CatchUp = "skip", pass_scheduled_at: bool | None = None) -> Schedule:
        """Create or redefine the schedule ``name``: workers enqueue ``workflow`` at every tick of ``cron``.

        ``cron``: 5 fields, 6 with seconds first, or @hourly/@daily/@weekly/@monthly/@yearly, read as
        wall-clock time in ``timezone`` (an IANA name). ``args``: the workflow's keyword arguments.
        ``pass_scheduled_at``: also pass the tick's time as ``scheduled_at`` (default: when the workflow has
        such a parameter). ``catch_up``: after downtime, "skip" fires only ticks late by less than 60 s,
        "all" fires every missed tick. Everything is checked now: ``ValueError``/``TypeError`` on a bad
        expression, time zone or arguments. Redefining keeps the next tick unless the timetable changed.
        """
        return schedules.store_definition(self, schedules.define(
            self, name, workflow, cron, timezone=timezone, queue=queue, priority=priority, args=args,
            catch_up=catch_up, pass_scheduled_at=pass_scheduled_at))

    def scheduled(self, cron: str, *, name: str | None = None, timezone: str = "UTC", queue: str | None = None,
                  priority: int | None = None, args: Mapping[str, Any] | None = None, catch_up: CatchUp = "skip",
                  pass_scheduled_at: bool | None = None) -> Callable[[W], W]:
        """Decorator, above ``@app.workflow``: run the workflow on a cron schedule (named after the workflow
        unless ``name`` is given; options as in ``schedule``). Checked at once; stored (created, or redefined
        where it changed) when a worker starts."""

        def register(workflow: W) -> W:
            if not isinstance(workflow, Workflow):
                raise TypeError("@app.scheduled goes above @app.workflow: it schedules a registered workflow")
            return schedules.declare(self, workflow, schedules.define(
                self, name or workflow.name, workflow, cron, timezone=timezone, queue=queue, priority=priority,
                args=args, catch_up=catch_up, pass_scheduled_at=pass_scheduled_at))

        return register

    def get_schedule(self, name: str) -> Schedule | None:
        return self.db.run(schedules.get_schedule(name))

    def list_schedules(self) -> list[Schedule]:
        return self.db.run(schedules.list_schedules())

    def unschedule(self, name: str) -> bool:
        """Delete a schedule; True if it existed. Executions it already enqueued are left alone."""
        return self.db.run(schedules.delete_schedule(name))

    def pause_schedule(self, name: str) -> bool:
        """Stop firing a schedule until it is resumed; True if it exists."""
        return self.db.run(schedules.pause_schedule(name))

    def resume_schedule(self, name: str) -> bool:
        """Fire a paused schedule again from its first tick after now (ticks missed while paused do not fire);
        True if it exists. ``ValueError`` if its stored expression or time zone is invalid."""
        return schedules.resume(self, name)

    # -- workers ------------------------------------------------------------------------------------------

    def worker(self, *, queues: list[str] | None = None, concurrency: int = 16) -> Any:
        from .worker import Worker

        return Worker(self, queues=queues, concurrency=concurrency)

    def run_worker(self, *, queues: list[str] | None = None, concurrency: int = 16) -> None:
        """Run a worker in this process until SIGTERM/SIGINT."""
        worker = self.worker(queues=queues, concurrency=concurrency)
        asyncio.run(worker.run(handle_signals=True))

    def close(self) -> None:
        if self._local is not None:
            self._local.close()
            self._local = None
        self.completions.stop()
        self.db.close()

    def __enter__(self) -> App:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_BULK_CHUNK = 5000


@contextlib.contextmanager
def _missing_destination(workflow_id: str) -> Iterator[None]:
    try:
        yield
    except psycopg.errors.NoDataFound as exc:
        raise WorkflowNotFound(workflow_id) from exc


@contextlib.contextmanager
def _id_conflicts() -> Iterator[None]:
    """The SQL function reports a workflow id taken by another workflow as a unique violation."""
    try:
        yield
    except psycopg.errors.UniqueViolation as exc:
        raise WorkflowIdConflict(str(exc).splitlines()[0]) from exc


def _split(item: tuple[Any, ...] | dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if isinstance(item, dict):
        return (), item
    if isinstance(item, tuple):
        return item, {}
    raise TypeError(f"enqueue_many takes tuples of positional arguments or dicts of keyword arguments, "
                    f"got {type(item).__name__}")


class _Bulk:
    """The statements of one enqueue_many, and how to turn their outcome into handles."""

    def __init__(self, workflow: Workflow[..., Any], ids: list[str], calls: list[store.Call[set[str]]]) -> None:
        self.workflow, self.ids, self.calls = workflow, ids, calls

    def missing(self, created: set[str]) -> list[str]:
        return [i for i in self.ids if i not in created] if len(created) != len(self.ids) else []

    def handles(self, app: App, existing: dict[str, Any]) -> list[WorkflowHandle[Any]]:
        clashes = {i: name for i, name in existing.items() if name != self.workflow.name}
        if clashes:
            some = ", ".join(f"{i!r} ({name})" for i, name in list(clashes.items())[:5])
            raise WorkflowIdConflict(f"{len(clashes)} workflow ids already belong to other workflows: {some}")
        hint = self.workflow.signature.return_hint
        return [WorkflowHandle(app, i, hint) for i in self.ids]


class _LocalRuntime:
    """A claim-less worker on a daemon thread: runs App.start() executions and heartbeats their leases."""

    def __init__(self, app: App) -> None:
        from .worker import Worker

        self.worker = Worker(app, concurrency=64, claim=False)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._main, name="pgdurable-local", daemon=True)
        self.thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self.worker.run())

    def submit(self, claimed: store.Claimed, trace: str | None = None) -> None:
        asyncio.run_coroutine_threadsafe(self.worker.adopt_new(claimed, trace), self.loop).result()

    def close(self) -> None:
        self.worker.stop_threadsafe()
        self.thread.join(timeout=self.worker.settings.shutdown_grace_seconds + 5)
