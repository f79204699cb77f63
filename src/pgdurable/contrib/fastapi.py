"""FastAPI integration (``pip install 'pgdurable[fastapi]'``).

- ``lifespan(app)``: the FastAPI app's lifespan opens the pgdurable App (migrated, pools ready) and, with
  ``worker=True``, runs a worker on the server's event loop (for small deployments; larger ones run
  ``pgdurable worker``).
- ``Connection``: a request's psycopg ``AsyncConnection`` in an open transaction, committed after the endpoint
  returns and before the response is sent (rolled back if it raises). Enqueue with ``conn=`` on it, and the
  request's writes and its workflow commit together. ``Session``: the same as a SQLAlchemy ``AsyncSession``
  (with the ``sqlalchemy`` extra).
- ``idempotency_key(namespace)``: the ``Idempotency-Key`` header as a workflow id in that namespace, so a
  retried POST finds the execution the first one started instead of starting another.
- ``event_stream(app, workflow_id, key)``: a workflow's stream (``read_stream_async``) as server-sent events.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

import psycopg
from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.responses import StreamingResponse

from .. import limits
from ..app import App
from ..orm import async_session_transaction, dispose_async_engine

__all__ = ["Connection", "Session", "event_stream", "idempotency_key", "lifespan"]
log = logging.getLogger("pgdurable")

# Keys are visible ASCII (RFC 9110 token-ish), as clients generate them (UUIDs, hashes); a structured-field
# string's quotes ("...") are accepted and removed.
_KEY_CHARACTERS = frozenset(chr(c) for c in range(0x21, 0x7F))
_KEY_MAX = 150  # the namespace and a colon fit within a workflow id's 200 characters


def lifespan(app: App, *, worker: bool = False, queues: list[str] | None = None,
             concurrency: int = 16) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    """``FastAPI(lifespan=lifespan(app))``: migrate (unless the App was made with ``auto_migrate=False``) and
    open the pools before the first request; with ``worker``, also serve ``queues`` (default: every queue the
    App declares) in this process. At shutdown the worker stops gracefully (what it runs past its grace period
    is released to other workers) and the pools of this event loop close."""

    @contextlib.asynccontextmanager
    async def run(api: FastAPI) -> AsyncIterator[None]:
        await asyncio.to_thread(app.db.ensure_schema)
        api.state.pgdurable = app
        await app.db.app_async_pool()
        runner = app.worker(queues=queues, concurrency=concurrency) if worker else None
        task = asyncio.create_task(runner.run(), name="pgdurable-worker") if runner is not None else None
        if task is not None:
            task.add_done_callback(_report_stop)
        try:
            yield
        finally:
            if runner is not None and task is not None:
                runner.stop()
                await asyncio.gather(task, return_exceptions=True)  # a failure was logged when it happened
            await dispose_async_engine(app.db)
            await app.db.aclose_loop_pool()

    return run


def _report_stop(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (error := task.exception()) is not None:
        log.error("pgdurable: the in-process worker stopped: %s: %s", type(error).__name__, error,
                  exc_info=error)


def _app_of(request: Request) -> App:
    app = getattr(request.app.state, "pgdurable", None)
    if not isinstance(app, App):
        raise RuntimeError("pgdurable.contrib.fastapi: create the FastAPI app with "
                           "FastAPI(lifespan=pgdurable.contrib.fastapi.lifespan(app))")
    return app


async def _connection(request: Request) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    pool = await _app_of(request).db.app_async_pool()
    async with pool.connection() as conn, conn.transaction():
        yield conn


# scope="function": the transaction ends when the endpoint returns, before the response is sent, so a
# success response means the request's writes (and what it enqueued) are committed.
Connection = Annotated[psycopg.AsyncConnection[Any], Depends(_connection, scope="function")]


try:
    from sqlalchemy.ext.asyncio import AsyncSession
except ImportError:  # without the sqlalchemy extra there is no Session dependency
    pass
else:
    async def _session(request: Request) -> AsyncIterator[AsyncSession]:
        async with async_session_transaction(_app_of(request).db, AsyncSession) as (session, _):
            yield session

    # A SQLAlchemy AsyncSession (postgresql+psycopg) in the request's transaction, ended as Connection's is:
    # what it flushes, and what is enqueued with conn=session, commits before the response is sent.
    Session = Annotated[AsyncSession, Depends(_session, scope="function")]


def idempotency_key(namespace: str, *, required: bool = True) -> Callable[..., str | None]:
    """A dependency giving the request's ``Idempotency-Key`` header as the workflow id ``"<namespace>:<key>"``
    (so two endpoints never share an execution). A missing header is a 400 when ``required`` (else None: the
    enqueue makes a fresh id); a malformed key (empty, longer than 150 characters, not visible ASCII) a 400."""
    limits.workflow_id(f"{namespace}:x")  # refuse a bad namespace when the route is declared, not per request

    def dependency(idempotency_key: Annotated[str | None, Header()] = None) -> str | None:
        if idempotency_key is None:
            if required:
                raise HTTPException(400, "this endpoint needs an Idempotency-Key header (a unique key per "
                                         "operation, reused when the request is retried)")
            return None
        key = idempotency_key.strip()
        if len(key) >= 2 and key[0] == key[-1] == '"':
            key = key[1:-1]
        if not 1 <= len(key) <= _KEY_MAX or not set(key) <= _KEY_CHARACTERS:
            raise HTTPException(400, f"Idempotency-Key must be 1 to {_KEY_MAX} visible ASCII characters")
        return f"{namespace}:{key}"

    return dependency


async def event_stream(app: App, workflow_id: str, key: str, request: Request | None = None) -> StreamingResponse:
    """The values the workflow writes to stream ``key``, as server-sent events: one ``data:`` event per value
    (its JSON), numbered by ``id:`` from 0, then an ``end`` event when the stream is closed or the workflow
    ends. A client reconnecting with ``Last-Event-ID`` (from ``request``) resumes after that value. 404 if
    there is no such workflow."""
    if await app.get_async(workflow_id) is None:
        raise HTTPException(404, f"no workflow {workflow_id!r}")
    after = _last_event_id(request.headers.get("last-event-id") if request is not None else None)
    values = app.read_stream_async(workflow_id, key)

    async def events() -> AsyncIterator[str]:
        index = -1
        async for value in values:
            index += 1
            if index > after:
                lines = app.serializer.dumps(value).splitlines() or [""]
                yield f"id: {index}\n" + "".join(f"data: {line}\n" for line in lines) + "\n"
        yield "event: end\ndata: \n\n"

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _last_event_id(header: str | None) -> int:
    try:
        return int(header) if header is not None else -1
    except ValueError:
        return -1
