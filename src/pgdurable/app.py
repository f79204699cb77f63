"""The application object: the public facade over a ``Runtime``. It registers workflows and steps, and its
methods are the client API; the work is done below it (enqueue.py, local.py, scheduling.py, events.py, the
worker), which never import it."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from datetime import timedelta
from typing import Any, ParamSpec, TypeVar, overload

import psycopg

from . import enqueue, events, forks, limits, local, plans, primitives, store, streams
from .client import WorkflowHandle
from .completions import CompletionListener
from .config import Settings, database_url_from_env, schema_name
from .connections import async_driver_connection, sync_driver_connection
from .context import current
from .db import CallPlan, Database
from .embedded import embedded_database_url
from .errors import WorkflowNotFound
from .facades import BindingCalls, ScheduleCalls
from .migrations import migrate
from .redaction import SecretUrl, redact
from .runtime import Runtime
from .schedules import (
    ScheduleDefinition,
)
from .serialization import JsonSerializer, Serializer, SizeLimit
from .steps import RetryPolicy, make_step
from .telemetry import Observer, Observers
from .transactions import make_transaction_step
from .worker import Worker
from .workflows import Registry, Workflow, default_name

P = ParamSpec("P")
R = TypeVar("R")


class App(ScheduleCalls, BindingCalls):
    """A pgdurable application. Create one (or several: there is no global state) and register workflows.

    ``database_url`` defaults to ``PGDURABLE_DATABASE_URL``, then ``DATABASE_URL``, then an embedded
    PostgreSQL started on first use. Nothing connects until the first call that needs the database. It may be
    a function returning the URL, called then (an integration whose settings are read late, as Django's).
    """

    def __init__(self, database_url: str | Callable[[], str] | None = None, *, schema: str | None = None,
                 serializer: Serializer | None = None, auto_migrate: bool = True,
                 settings: Settings | None = None, **tunables: Any) -> None:
        settings = settings or Settings(**tunables)
        # The database URL is resolved on first use, so an App can be defined at import time before the
        # environment is set.
        self.runtime = Runtime(
            database_url=lambda: ((database_url() if callable(database_url) else database_url)
                                  or database_url_from_env() or embedded_database_url()),
            schema=schema_name(schema), settings=settings,
            serializer=SizeLimit(serializer or JsonSerializer(), settings.max_payload_bytes),
            auto_migrate=auto_migrate)
        self._local: local.LocalRuntime | None = None
        self._local_lock = threading.Lock()
        forks.forget_in_forked_child(self)

    def __repr__(self) -> str:
        known = self.db.known_conninfo
        return (f"<pgdurable.App schema={self.schema!r} database="
                f"{redact(known, known) if known is not None else '(not connected yet)'!r}>")

    @property
    def database_url(self) -> str:
        """The URL this App connects to: the one given, else ``PGDURABLE_DATABASE_URL``, ``DATABASE_URL``, else
        the embedded server's (started by this call if need be). The value is usable as is (psycopg, psql);
        its repr masks the password."""
        return SecretUrl(self.db.conninfo)

    # What the runtime holds, under the names the App has always had.
    @property
    def schema(self) -> str:
        return self.runtime.schema

    @property
    def settings(self) -> Settings:
        return self.runtime.settings

    @property
    def serializer(self) -> SizeLimit:
        return self.runtime.serializer

    @property
    def registry(self) -> Registry:
        return self.runtime.registry

    @property
    def db(self) -> Database:
        return self.runtime.db

    @property
    def observers(self) -> Observers:
        return self.runtime.observers

    @property
    def completions(self) -> CompletionListener:
        return self.runtime.completions

    @property
    def queue_policies(self) -> dict[str, store.queues.QueuePolicy]:
        return self.runtime.queue_policies

    @property
    def declared_schedules(self) -> dict[str, ScheduleDefinition]:
        return self.runtime.declared_schedules

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
             backoff: float = 2.0, max_interval: float = 60.0, no_retry: tuple[type[BaseException], ...] = (),
             timeout: float | None = None) -> Callable[[Callable[P, R]], Callable[P, R]]: ...

    def step(self, fn: Callable[..., Any] | None = None, *, name: str | None = None, max_attempts: int = 3,
             interval: float = 0.5, backoff: float = 2.0, max_interval: float = 60.0,
             no_retry: tuple[type[BaseException], ...] = (), timeout: float | None = None) -> Any:
        """Declare a step: run at least once, recorded exactly once, replayed from its record.

        A failing step is retried ``max_attempts`` times in all, waiting ``interval * backoff**n`` seconds
        (at most ``max_interval``); exception types in ``no_retry`` fail it at once. An attempt that runs
        longer than ``timeout`` seconds fails with ``StepTimeout`` (an async step is cancelled; a sync step's
        thread is abandoned and its late result ignored), and is retried like any failure.
        """
        policy = RetryPolicy(max_attempts=max_attempts, interval=interval, backoff=backoff,
                             max_interval=max_interval, no_retry=no_retry)
        seconds = limits.timeout_seconds(timeout, "step timeout")

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            step_name = name or default_name(fn)
            self.registry.steps.add(step_name)
            return make_step(fn, step_name, policy, seconds)

        return register(fn) if fn is not None else register

    def transaction(self, fn: Callable[..., Any] | None = None, *, name: str | None = None,
                    isolation: str | None = None, max_attempts: int = 3, interval: float = 0.5,
                    backoff: float = 2.0, max_interval: float = 60.0,
                    no_retry: tuple[type[BaseException], ...] = (), timeout: float | None = None) -> Any:
        """Declare a transactional step: it receives a connection in an open transaction as its first
        argument (callers leave it out), and its writes commit together with its checkpoint, or not at all.

        ``isolation``: None (the server's default), "read committed", "repeatable read" or "serializable".
        Serialization failures and deadlocks roll back and retry on their own budget of attempts.
        ``timeout``: the server cancels any statement of the step that runs longer (statement_timeout); the
        attempt then rolls back and fails with ``StepTimeout``, retried like any failure.
        """
        policy = RetryPolicy(max_attempts=max_attempts, interval=interval, backoff=backoff,
                             max_interval=max_interval, no_retry=no_retry)
        seconds = limits.timeout_seconds(timeout, "step timeout")

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            step_name = name or default_name(fn)
            self.registry.steps.add(step_name)
            return make_transaction_step(self.runtime, fn, step_name, policy, isolation, seconds)

        return register(fn) if fn is not None else register

    # -- enqueue ------------------------------------------------------------------------------------------

    def enqueue(self, workflow: Workflow[..., R] | str, *args: Any, workflow_id: str | None = None,
                queue: str | None = None, priority: int | None = None, delay: float = 0.0,
                max_recoveries: int | None = None, timeout_seconds: float | None = None,
                dedup_key: str | None = None, concurrency_key: str | None = None, on_duplicate: str = "return",
                conn: Any = None, tags: dict[str, str] | None = None, debounce_key: str | None = None,
                debounce_seconds: float | None = None, debounce_max_seconds: float | None = None,
                **kwargs: Any) -> WorkflowHandle[R]:
        """Durably enqueue a workflow; a worker runs it. A given ``workflow_id`` is an idempotency key.

        With ``conn`` (a psycopg connection, or a SQLAlchemy Session or Connection on psycopg), the
        execution is written on that connection, in its current transaction: it exists if and only if
        that transaction commits, and workers are woken when it does.

        ``dedup_key``: while an unfinished execution of the queue has this key, no second one is enqueued:
        the handle of the existing one is returned (``on_duplicate="raise"``: ``DuplicateWorkflow``).
        ``concurrency_key``: executions sharing it are limited together by the queue's ``key_concurrency``.

        ``tags``: searchable labels, string keys and values (``list_workflows(tags=...)``).
        ``debounce_key`` with ``debounce_seconds``: while an execution of this workflow with this key has not
        started, this enqueue replaces its arguments (and tags) and moves its start to ``debounce_seconds``
        from now, but never later than ``debounce_max_seconds`` (if given) after the burst's first enqueue;
        returns that execution's handle. One execution runs per burst.

        Called inside a workflow, it starts a child workflow: a step (replay finds the same child), with
        a deterministic id, the parent's deadline, and cancellation cascading from the parent.
        """
        request = enqueue.Request(self.runtime, workflow, args, kwargs, workflow_id=workflow_id, queue=queue,
                                  priority=priority, delay=delay, max_recoveries=max_recoveries,
                                  timeout_seconds=timeout_seconds, dedup_key=dedup_key,
                                  concurrency_key=concurrency_key, on_duplicate=on_duplicate, tags=tags,
                                  debounce_key=debounce_key, debounce_seconds=debounce_seconds,
                                  debounce_max_seconds=debounce_max_seconds)
        return enqueue.enqueue(request, conn)

    async def enqueue_async(self, workflow: Workflow[..., R] | str, *args: Any, workflow_id: str | None = None,
                            queue: str | None = None, priority: int | None = None, delay: float = 0.0,
                            max_recoveries: int | None = None, timeout_seconds: float | None = None,
                            dedup_key: str | None = None, concurrency_key: str | None = None,
                            on_duplicate: str = "return", conn: Any = None, tags: dict[str, str] | None = None,
                            debounce_key: str | None = None, debounce_seconds: float | None = None,
                            debounce_max_seconds: float | None = None, **kwargs: Any) -> WorkflowHandle[R]:
        request = enqueue.Request(self.runtime, workflow, args, kwargs, workflow_id=workflow_id, queue=queue,
                                  priority=priority, delay=delay, max_recoveries=max_recoveries,
                                  timeout_seconds=timeout_seconds, dedup_key=dedup_key,
                                  concurrency_key=concurrency_key, on_duplicate=on_duplicate, tags=tags,
                                  debounce_key=debounce_key, debounce_seconds=debounce_seconds,
                                  debounce_max_seconds=debounce_max_seconds)
        return await enqueue.enqueue_async(request, conn)

    def enqueue_many(self, workflow: Workflow[..., R], arguments: Iterable[tuple[Any, ...] | dict[str, Any]], *,
                     workflow_ids: Sequence[str] | None = None, queue: str | None = None,
                     priority: int | None = None, delay: float = 0.0,
                     tags: dict[str, str] | None = None) -> list[WorkflowHandle[R]]:
        """Enqueue many executions of one workflow in one transaction: all of them or none.

        Each item of ``arguments`` is a tuple of positional arguments or a dict of keyword arguments.
        ``workflow_ids``, when given, are idempotency keys as in ``enqueue``. ``tags``: given to every one.
        """
        return enqueue.enqueue_many(enqueue.Bulk(self.runtime, workflow, arguments, workflow_ids, queue, priority,
                                                 delay, tags))

    async def enqueue_many_async(self, workflow: Workflow[..., R],
                                 arguments: Iterable[tuple[Any, ...] | dict[str, Any]], *,
                                 workflow_ids: Sequence[str] | None = None, queue: str | None = None,
                                 priority: int | None = None, delay: float = 0.0,
                                 tags: dict[str, str] | None = None) -> list[WorkflowHandle[R]]:
        return await enqueue.enqueue_many_async(enqueue.Bulk(self.runtime, workflow, arguments, workflow_ids, queue,
                                                             priority, delay, tags))

    def observe(self, observer: Observer) -> Observer:
        """Register a metrics or tracing observer (see pgdurable.metrics, pgdurable.tracing)."""
        self.observers.add(observer)
        return observer

    # -- run in this process ------------------------------------------------------------------------------

    def start(self, workflow: Workflow[..., R], *args: Any, workflow_id: str | None = None,
              priority: int | None = None, max_recoveries: int | None = None,
              timeout_seconds: float | None = None, tags: dict[str, str] | None = None,
              **kwargs: Any) -> WorkflowHandle[R]:
        """Run a workflow durably in this process, now. If the process dies, a worker resumes it.

        On a queue with limits (``app.queue(...)``, stored), the limits decide when it runs: it is enqueued
        and a worker runs it, exactly as ``enqueue`` would.

        Inside a workflow this starts a child workflow, exactly like ``enqueue``. A workflow that waits
        (durable sleep, messages, children) is resumed by a worker (``pgdurable worker``), not here.
        """
        if current() is not None:
            return self.enqueue(workflow, *args, workflow_id=workflow_id, priority=priority,
                                max_recoveries=max_recoveries, timeout_seconds=timeout_seconds, tags=tags, **kwargs)
        return local.start(local.Start(self.runtime, self._local_runtime(), workflow, args, kwargs,
                                       workflow_id=workflow_id, priority=priority, max_recoveries=max_recoveries,
                                       timeout_seconds=timeout_seconds, tags=tags))

    async def start_async(self, workflow: Workflow[..., R], *args: Any, workflow_id: str | None = None,
                          priority: int | None = None, max_recoveries: int | None = None,
                          timeout_seconds: float | None = None, tags: dict[str, str] | None = None,
                          **kwargs: Any) -> WorkflowHandle[R]:
        if current() is not None:
            return await self.enqueue_async(workflow, *args, workflow_id=workflow_id, priority=priority,
                                            max_recoveries=max_recoveries, timeout_seconds=timeout_seconds,
                                            tags=tags, **kwargs)
        runner = self._local if self._local is not None else await asyncio.to_thread(self._local_runtime)
        return await local.start_async(local.Start(
            self.runtime, runner, workflow, args, kwargs, workflow_id=workflow_id, priority=priority,
            max_recoveries=max_recoveries, timeout_seconds=timeout_seconds, tags=tags))

    def _local_runtime(self) -> local.LocalRuntime:
        with self._local_lock:
            if self._local is None:
                self.db.ensure_schema()
                self._local = local.LocalRuntime(self.runtime)
            return self._local

    # -- management ---------------------------------------------------------------------------------------

    def handle(self, workflow_id: str) -> WorkflowHandle[Any]:
        return WorkflowHandle(self.runtime, workflow_id)

    # Each query below is one store.Call (or a plan of them), run by db.run and, in the *_async form, by
    # db.arun: one implementation, two drivers.

    def get(self, workflow_id: str) -> store.executions.Execution | None:
        """The execution's row, or None."""
        return self.db.run(store.executions.get_execution(workflow_id))

    async def get_async(self, workflow_id: str) -> store.executions.Execution | None:
        return await self.db.arun(store.executions.get_execution(workflow_id))

    def steps(self, workflow_id: str) -> list[store.checkpoints.Step]:
        """Its recorded steps, in order."""
        return self.db.run(store.checkpoints.list_steps(workflow_id))

    async def steps_async(self, workflow_id: str) -> list[store.checkpoints.Step]:
        return await self.db.arun(store.checkpoints.list_steps(workflow_id))

    def list_workflows(self, *, status: str | None = None, name: str | None = None, queue: str | None = None,
                       tags: dict[str, str] | None = None, limit: int = 50) -> list[store.executions.Execution]:
        """The newest executions, filtered. ``tags``: those whose tags include all of these (searched along
        an index, whatever the number of executions)."""
        return self.db.run(self._list_call(status, name, queue, tags, limit))

    async def list_workflows_async(self, *, status: str | None = None, name: str | None = None,
                                   queue: str | None = None, tags: dict[str, str] | None = None,
                                   limit: int = 50) -> list[store.executions.Execution]:
        return await self.db.arun(self._list_call(status, name, queue, tags, limit))

    def _list_call(self, status: str | None, name: str | None, queue: str | None, tags: dict[str, str] | None,
                   limit: int) -> store.Call[list[store.executions.Execution]]:
        wanted = enqueue.tags_text(tags)
        if wanted is not None:
            return store.executions.list_executions_by_tags(tags=wanted, status=status, name=name, queue=queue,
                                                            limit=limit)
        return store.executions.list_executions(status=status, name=name, queue=queue, limit=limit)

    def cancel(self, workflow_id: str) -> bool:
        """Cancel an enqueued or running execution. A running one stops at its next step."""
        return self.db.run(store.executions.cancel(workflow_id))

    async def cancel_async(self, workflow_id: str) -> bool:
        return await self.db.arun(store.executions.cancel(workflow_id))

    def resume(self, workflow_id: str) -> bool:
        """Re-enqueue a failed or cancelled execution. Completed steps are kept; a failed step runs again."""
        return self.db.run(store.executions.resume(workflow_id))

    async def resume_async(self, workflow_id: str) -> bool:
        return await self.db.arun(store.executions.resume(workflow_id))

    # -- queue policies -----------------------------------------------------------------------------------

    def queue(self, name: str, *, concurrency: int | None = None, worker_concurrency: int | None = None,
              rate_limit: int | None = None, rate_period: float | None = None,
              key_concurrency: int | None = None) -> store.queues.QueuePolicy:
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
        policy = store.queues.QueuePolicy(name, concurrency, worker_concurrency, rate_limit, rate_period,
                                          key_concurrency)
        self.queue_policies[name] = policy
        return policy

    def apply_queue_policies(self) -> None:
        """Store the declared queue policies (workers do this when they start)."""
        self.db.run_plan(self._store_policies())

    async def apply_queue_policies_async(self) -> None:
        await self.db.arun_plan(self._store_policies())

    def _store_policies(self) -> CallPlan[None]:
        for policy in list(self.queue_policies.values()):
            yield store.queues.set_queue_policy(policy)

    def fork(self, workflow_id: str, from_step: int, *, new_workflow_id: str | None = None) -> WorkflowHandle[Any]:
        """A new execution of the same workflow and input that reuses the recorded outputs of steps before
        ``from_step`` and runs again from there, on the code deployed now (fix a bug, then re-run)."""
        return enqueue.fork(enqueue.Fork(self.runtime, workflow_id, from_step, new_workflow_id))

    async def fork_async(self, workflow_id: str, from_step: int, *,
                         new_workflow_id: str | None = None) -> WorkflowHandle[Any]:
        return await enqueue.fork_async(enqueue.Fork(self.runtime, workflow_id, from_step, new_workflow_id))

    def children(self, workflow_id: str) -> list[tuple[Any, ...]]:
        """(id, name, status, created_at, completed_at) of the workflows this one started."""
        return self.db.run(store.children.list_children(workflow_id))

    async def children_async(self, workflow_id: str) -> list[tuple[Any, ...]]:
        return await self.db.arun(store.children.list_children(workflow_id))

    # -- messages and events ------------------------------------------------------------------------------

    def send(self, workflow_id: str, message: Any, *, topic: str | None = None,
             idempotency_key: str | None = None, conn: Any = None) -> bool:
        """Send ``message`` to a workflow, which receives it with ``pgdurable.recv(topic)``. With a key, a
        retried send is stored once (returns False for the repeat). With ``conn``, inside that connection's
        transaction. Inside a workflow, the send is a step (sent once however often the workflow replays)."""
        call = self._send_call(workflow_id, message, topic, idempotency_key)
        ctx = current()
        if ctx is not None and conn is None:
            plans.drive_sync(ctx, primitives.send_plan(ctx, call))
            return True
        with _missing_destination(workflow_id):
            if conn is not None:
                driver = sync_driver_connection(conn)
                self.db.ensure_schema()  # on our own connection, not in the caller's transaction
                return store.run(driver, store.messaging.send_message_in_transaction(call, self.schema))
            return self.db.run(call)

    async def send_async(self, workflow_id: str, message: Any, *, topic: str | None = None,
                         idempotency_key: str | None = None, conn: Any = None) -> bool:
        call = self._send_call(workflow_id, message, topic, idempotency_key)
        ctx = current()
        if ctx is not None and conn is None:
            await plans.drive_async(ctx, primitives.send_plan(ctx, call))
            return True
        with _missing_destination(workflow_id):
            if conn is not None:
                driver = await async_driver_connection(conn)
                await asyncio.to_thread(self.db.ensure_schema)
                return await store.arun(driver, store.messaging.send_message_in_transaction(call, self.schema))
            return await self.db.arun(call)

    def _send_call(self, workflow_id: str, message: Any, topic: str | None,
                   idempotency_key: str | None) -> store.Call[bool]:
        return store.messaging.send_message(destination=workflow_id, message=self.serializer.dumps(message),
                                            topic=topic or "", key=idempotency_key)

    def get_event(self, workflow_id: str, key: str, timeout: float | None = None) -> Any:
        """The latest value workflow ``workflow_id`` published under ``key``; waits up to ``timeout`` seconds
        for a first one (woken by NOTIFY), then returns None. Inside a workflow the answer is recorded as a
        step (the wait holds the worker slot)."""
        return events.get_event(self.runtime, workflow_id, key, timeout)

    async def get_event_async(self, workflow_id: str, key: str, timeout: float | None = None) -> Any:
        return await events.get_event_async(self.runtime, workflow_id, key, timeout)

    def events(self, workflow_id: str) -> list[store.messaging.Event]:
        """Every value the workflow published, by key then in order (values decoded)."""
        return self._decoded_events(self.db.run(store.messaging.list_events(workflow_id)))

    async def events_async(self, workflow_id: str) -> list[store.messaging.Event]:
        return self._decoded_events(await self.db.arun(store.messaging.list_events(workflow_id)))

    def read_stream(self, workflow_id: str, key: str) -> Iterator[Any]:
        """The values workflow ``workflow_id`` writes to its stream ``key`` (``pgdurable.write_stream``), in
        order, as they are written (woken by NOTIFY); the iteration ends when the stream is closed or the
        workflow ends. From outside workflows."""
        return streams.read_stream(self.runtime, workflow_id, key)

    def read_stream_async(self, workflow_id: str, key: str) -> AsyncIterator[Any]:
        """``read_stream`` as an async iterator: ``async for value in app.read_stream_async(id, key)``."""
        return streams.read_stream_async(self.runtime, workflow_id, key)

    def streams(self, workflow_id: str) -> list[store.messaging.Stream]:
        """The workflow's streams: each key, its number of values, and whether it is closed."""
        return self.db.run(store.messaging.list_streams(workflow_id))

    async def streams_async(self, workflow_id: str) -> list[store.messaging.Stream]:
        return await self.db.arun(store.messaging.list_streams(workflow_id))

    def messages(self, workflow_id: str) -> list[store.messaging.Message]:
        """Messages sent to the workflow, consumed or not, in the order sent (decoded)."""
        return self._decoded_messages(self.db.run(store.messaging.list_messages(workflow_id)))

    async def messages_async(self, workflow_id: str) -> list[store.messaging.Message]:
        return self._decoded_messages(await self.db.arun(store.messaging.list_messages(workflow_id)))

    def _decoded_events(self, rows: list[store.messaging.Event]) -> list[store.messaging.Event]:
        return [dataclasses.replace(e, value=self.serializer.loads(e.value, Any)) for e in rows]

    def _decoded_messages(self, rows: list[store.messaging.Message]) -> list[store.messaging.Message]:
        return [dataclasses.replace(m, message=self.serializer.loads(m.message, Any)) for m in rows]

    @property
    def version(self) -> str:
        """The application version this app's workers stamp on the executions they start."""
        return self.runtime.version

    def versions(self) -> list[store.versions.AppVersion]:
        """Every application version with unfinished executions or live workers: its unfinished executions
        by status (``parked``: waiting for a worker whose code replays their history, apart from
        ``waiting``) and its live workers."""
        return self.db.run(store.versions.app_versions())

    async def versions_async(self) -> list[store.versions.AppVersion]:
        return await self.db.arun(store.versions.app_versions())

    def migrate_version(self, old: str, new: str) -> int:
        """Move the unfinished executions of version ``old`` to version ``new`` (its workers resume them) and
        re-enqueue the parked ones; returns how many moved. For when the new code replays the old histories
        (a ``patched()`` change) or when no worker of ``old`` will ever run again. With ``old == new``, only
        re-enqueue that version's parked executions (a fix deployed under a pinned version)."""
        return self.db.run(_migrate_version_call(old, new))

    async def migrate_version_async(self, old: str, new: str) -> int:
        return await self.db.arun(_migrate_version_call(old, new))

    def cleanup(self, older_than: timedelta | float, statuses: Iterable[str] = store.executions.TERMINAL, *,
                batch_size: int = 1000) -> int:
        """Delete finished executions (and their steps) created and finished more than ``older_than`` ago
        (a timedelta, or seconds), in batches of ``batch_size`` that never block workers. Returns how many
        executions were deleted. Only ``succeeded``, ``failed`` and ``cancelled`` may be given."""
        from .retention import cleanup

        return cleanup(self.db, older_than, statuses, batch_size=batch_size).executions

    async def cleanup_async(self, older_than: timedelta | float, statuses: Iterable[str] = store.executions.TERMINAL, *,
                            batch_size: int = 1000) -> int:
        # Batches in a loop with progress callbacks: the sync implementation, on a thread.
        return await asyncio.to_thread(self.cleanup, older_than, statuses, batch_size=batch_size)

    def migrate(self) -> list[int]:
        """Create or upgrade the schema; returns the migration versions applied."""
        return migrate(self.db.conninfo, self.schema, citus_mode=self.db.citus_mode)

    async def migrate_async(self) -> list[int]:
        return await asyncio.to_thread(self.migrate)

    # -- workers ------------------------------------------------------------------------------------------

    def worker(self, *, queues: list[str] | None = None, concurrency: int = 16) -> Worker:
        return Worker(self.runtime, queues=queues, concurrency=concurrency)

    def run_worker(self, *, queues: list[str] | None = None, concurrency: int = 16) -> None:
        """Run a worker in this process until SIGTERM/SIGINT."""
        worker = self.worker(queues=queues, concurrency=concurrency)
        asyncio.run(worker.run(handle_signals=True))

    def _forget_inherited(self) -> list[Any]:
        """In a forked child: App.start's worker thread is the parent's (forks.py)."""
        dropped = [self._local]
        self._local, self._local_lock = None, threading.Lock()
        return dropped

    def close(self) -> None:
        if self._local is not None:
            self._local.close()
            self._local = None
        self.runtime.close()

    def __enter__(self) -> App:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()



def _migrate_version_call(old: str, new: str) -> store.Call[int]:
    if not old or not new:
        raise ValueError(f"migrate_version needs two non-empty versions (got {old!r} and {new!r})")
    return store.versions.migrate_app_version(old=old, new=new)


@contextlib.contextmanager
def _missing_destination(workflow_id: str) -> Iterator[None]:
    try:
        yield
    except psycopg.errors.NoDataFound as exc:
        raise WorkflowNotFound(workflow_id) from exc
