"""App.start: run a workflow now, in this process, durably. The execution is inserted already owned by a
claim-less worker on a daemon thread, which runs it and heartbeats its lease; if this process dies, the lease
runs out and any worker resumes it from its checkpoints.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from . import store
from .client import WorkflowHandle
from .enqueue import check_options, tags_text
from .errors import WorkflowIdConflict
from .ids import new_execution_id
from .runtime import Runtime
from .worker import Worker
from .workflows import Workflow


class LocalRuntime:
    """A claim-less worker on a daemon thread: runs App.start() executions and heartbeats their leases."""

    def __init__(self, runtime: Runtime) -> None:
        self.worker = Worker(runtime, concurrency=64, claim=False)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._main, name="pgdurable-local", daemon=True)
        self.thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self.worker.run())

    def close(self) -> None:
        self.worker.stop_threadsafe()
        self.thread.join(timeout=self.worker.settings.shutdown_grace_seconds + 5)


class Start:
    """One App.start: its statement (the execution inserted already owned by ``local``), and what follows
    from its row: hand it to the local worker, or (a queue with limits) leave it enqueued for a worker."""

    def __init__(self, runtime: Runtime, local: LocalRuntime, workflow: Workflow[..., Any], args: tuple[Any, ...],
                 kwargs: dict[str, Any], *, workflow_id: str | None, priority: int | None,
                 max_recoveries: int | None, timeout_seconds: float | None,
                 tags: dict[str, str] | None = None) -> None:
        definition = runtime.registry.resolve(workflow)
        assert definition is not None
        check_options(workflow_id=workflow_id, priority=priority, max_recoveries=max_recoveries,
                      timeout_seconds=timeout_seconds)
        tags_json = tags_text(tags)
        input_text = definition.encode_arguments(runtime.serializer, args, kwargs)
        self.runtime, self.local, self.definition = runtime, local, definition
        self.trace = runtime.trace()
        self.call = store.claims.start_owned(
            id=workflow_id or new_execution_id(), name=definition.name, queue=definition.queue,
            priority=definition.priority if priority is None else priority, input=input_text,
            max_recoveries=runtime.settings.max_recoveries if max_recoveries is None else max_recoveries,
            owner=local.worker.id, lease=runtime.settings.lease_seconds,
            timeout=timeout_seconds if timeout_seconds is not None else definition.timeout_seconds,
            version=runtime.version, trace=self.trace, tags=tags_json)

    def claimed(self, row: tuple[Any, ...] | None) -> store.claims.Claimed | None:
        """The execution to run here, or None (its queue has limits: it was enqueued for a worker)."""
        assert row is not None
        execution_id, name, _, attempt, stored_input, db_now, owned = row
        if name != self.definition.name:
            raise WorkflowIdConflict(f"workflow id {execution_id!r} already belongs to {name!r}")
        return store.claims.Claimed(execution_id, name, attempt, stored_input, db_now) if owned else None

    def handle(self, row: tuple[Any, ...] | None) -> WorkflowHandle[Any]:
        assert row is not None
        return WorkflowHandle(self.runtime, row[0], self.definition.signature.return_hint)


def start(request: Start) -> WorkflowHandle[Any]:
    row = request.runtime.db.run(request.call)
    claimed = request.claimed(row)
    if claimed is not None:
        asyncio.run_coroutine_threadsafe(request.local.worker.adopt_new(claimed, request.trace),
                                         request.local.loop).result()
    return request.handle(row)


async def start_async(request: Start) -> WorkflowHandle[Any]:
    row = await request.runtime.db.arun(request.call)
    claimed = request.claimed(row)
    if claimed is not None:
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(
            request.local.worker.adopt_new(claimed, request.trace), request.local.loop))
    return request.handle(row)
