"""A Pydantic AI capability that makes each tool call of a run a checkpointed step, waiting for a human's
approval first where the tool asks for one."""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import psycopg
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.capabilities.abstract import ValidatedToolArgs, WrapToolExecuteHandler
from pydantic_ai.exceptions import ToolRetryError
from pydantic_ai.messages import ToolCallPart
from pydantic_ai.tools import RunContext, ToolDefinition
from pydantic_core import to_jsonable_python

from ..context import current
from ..primitives import recv_async, set_event_async
from . import records

# The transaction of the transactional tool call running now (see ``connection``).
_transaction: contextvars.ContextVar[psycopg.AsyncConnection[Any] | None] = contextvars.ContextVar(
    "pgdurable_ai_transaction", default=None)

ToolStep = Callable[[Callable[[], Awaitable[Any]]], Awaitable[dict[str, Any]]]


def connection() -> psycopg.AsyncConnection[Any]:
    """The connection of the transactional tool call running now: what the tool writes with it commits
    together with the call's checkpoint, or not at all."""
    conn = _transaction.get()
    if conn is None:
        raise RuntimeError("pgdurable.ai.connection() is for tools declared transactional, while they run "
                           "inside a durable agent's workflow")
    return conn


async def run_tool(call: Callable[[], Awaitable[Any]]) -> dict[str, Any]:
    """A plain tool step's body: the tool's outcome as recorded."""
    try:
        return records.tool_value(await call())
    except ToolRetryError as retry:
        return records.tool_retry(retry)


async def run_tool_in_transaction(conn: psycopg.AsyncConnection[Any],
                                  call: Callable[[], Awaitable[Any]]) -> dict[str, Any]:
    """A transactional tool step's body. A retry the tool asks for (``ModelRetry``) is recorded like a result,
    but what the tool wrote before asking is rolled back (a savepoint)."""
    token = _transaction.set(conn)
    try:
        async with conn.transaction():
            value = await call()
        return records.tool_value(value)
    except ToolRetryError as retry:
        return records.tool_retry(retry)
    finally:
        _transaction.reset(token)


@dataclass
class DurableTools(AbstractCapability[Any]):
    """Inside a workflow each tool call is a step (from ``step_for``, by tool name), replayed from its record on
    resume; a tool in ``approval`` first publishes the call as the event ``approval_event`` and waits for a
    message on ``approval_topic`` (``{"approved": true}``, or false with a ``"reason"``)."""

    step_for: Callable[[str], ToolStep]
    approval: Collection[str] = field(default_factory=frozenset)
    approval_topic: str = "approval"
    approval_event: str = "approval"

    async def wrap_tool_execute(self, ctx: RunContext[Any], *, call: ToolCallPart, tool_def: ToolDefinition,
                                args: ValidatedToolArgs, handler: WrapToolExecuteHandler) -> Any:
        if current() is None:
            return await handler(args)
        if call.tool_name in self.approval:
            denied = await self._wait_for_approval(call, args)
            if denied is not None:
                return denied
        recorded = await self.step_for(call.tool_name)(lambda: handler(args))
        return records.tool_outcome(recorded)

    async def _wait_for_approval(self, call: ToolCallPart, args: ValidatedToolArgs) -> str | None:
        """None once approved; else what the model is told instead of the tool's result."""
        await set_event_async(self.approval_event, {"tool_name": call.tool_name, "tool_call_id": call.tool_call_id,
                                                    "args": to_jsonable_python(args)})
        answer = await recv_async(self.approval_topic)
        await set_event_async(self.approval_event, None)
        if isinstance(answer, dict) and answer.get("approved") is True:
            return None
        reason = answer.get("reason") if isinstance(answer, dict) else None
        return f"A human denied this call of {call.tool_name}" + (f": {reason}" if reason else ".")
