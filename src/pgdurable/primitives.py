"""What a workflow can wait on: durable sleep, messages, child workflows; and events, sends, patches, tags
and streams.

Each primitive is written once, as a plan: a generator that yields effects (a step write, or a statement
on the worker's writer) and receives their results. ``drive_sync`` runs a plan from a sync workflow's
thread, ``drive_async`` from an async workflow's task; nothing else differs between the two.

Waiting never holds a worker slot: the plan records what it waits for (a wake-up time, a timeout) as a
step, then suspends the execution ('waiting', out of the claim index) and unwinds the workflow with
``Suspended``. When it is woken (its time came, a message arrived, a child finished), a worker claims it
again, replays the recorded steps and reaches the same wait, which now finds what it waited for.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from . import failures, limits, store
from .context import ExecutionContext, current
from .errors import ConfigurationError, ResultTimeout, WorkflowIdConflict, WorkflowNotFound, outcome_error
from .plans import Plan, drive_async, drive_sync

# An awaited execution that is not our child cannot wake us: look at it again this often.
_NON_CHILD_POLL_SECONDS = 1.0
_MAX_ID_LENGTH = 200


class Suspended(BaseException):
    """Unwinds a workflow that is now waiting in the database. A BaseException, so that a workflow's
    ``except Exception`` does not swallow it."""


def workflow_context(what: str) -> ExecutionContext:
    ctx = current()
    if ctx is None:
        raise ConfigurationError(f"{what} works inside a workflow (not in a step, nor outside workflows)")
    return ctx


# ---- plans --------------------------------------------------------------------------------------------

def _suspend(ctx: ExecutionContext, wake_at: datetime | None, reason: str, wakeups: int | None) -> Plan:
    """Suspend the execution and unwind, or return when a wake-up arrived since ``wakeups`` was read."""
    done = yield store.claims.suspend(id=ctx.execution_id, attempt=ctx.attempt, wake_at=wake_at, reason=reason,
                                      wakeups=wakeups)
    if done:
        ctx.suspended(wake_at)
        raise Suspended(ctx.execution_id)
    if wakeups is None:
        raise ctx.lease_lost(f"suspending for {reason}")
    # Something tried to wake us between looking and suspending: the caller looks again.


def _record(ctx: ExecutionContext, step_id: int, name: str, output: str) -> Plan:
    if not (yield ctx.step_write(step_id, name, output)):
        raise ctx.lease_lost(f"recording step #{step_id} ({name})")


def _timer(ctx: ExecutionContext, name: str, seconds: float | None, until: datetime | None) -> Plan:
    """Record (or replay) a point in database time; None stays None (no timeout)."""
    step_id, recorded = ctx.begin_step(name)
    if recorded is not None:
        text = ctx.serializer.loads(recorded.output or "null", str | None)
        return None if text is None else datetime.fromisoformat(text)
    if until is None and seconds is not None:
        until = ctx.db_now() + timedelta(seconds=max(seconds, 0.0))
    if until is not None and until.tzinfo is None:
        raise ValueError("sleep_until needs a timezone-aware datetime")
    yield from _record(ctx, step_id, name, json.dumps(until.isoformat() if until is not None else None))
    return until


def sleep_plan(ctx: ExecutionContext, seconds: float | None, until: datetime | None) -> Plan:
    wake_at = yield from _timer(ctx, "pgdurable.sleep", seconds, until)
    assert wake_at is not None
    while ctx.db_now() < wake_at:
        yield from _suspend(ctx, wake_at, "sleep", None)


def recv_plan(ctx: ExecutionContext, topic: str, timeout: float | None) -> Plan:
    deadline = yield from _timer(ctx, "pgdurable.recv.deadline", timeout, None)
    step_id, recorded = ctx.begin_step("pgdurable.recv")
    if recorded is not None:
        return ctx.replay(recorded, Any)
    started = ctx.db_now()
    while True:
        got: store.messaging.Received = yield store.messaging.receive(
            id=ctx.execution_id, attempt=ctx.attempt, topic=topic, step_id=step_id, step_name="pgdurable.recv",
            started_at=started)
        if not got.owned:
            raise ctx.lease_lost("receiving a message")
        if got.found:
            return ctx.serializer.loads(got.message or "null", Any)
        if deadline is not None and ctx.db_now() >= deadline:
            yield from _record(ctx, step_id, "pgdurable.recv", "null")
            return None
        yield from _suspend(ctx, deadline, f"recv:{topic}", got.wakeups)


def set_event_plan(ctx: ExecutionContext, key: str, value: Any) -> Plan:
    step_id, recorded = ctx.begin_step("pgdurable.set_event")
    if recorded is not None:
        return
    text = ctx.serializer.dumps(value)
    published = yield store.messaging.set_event(id=ctx.execution_id, attempt=ctx.attempt, step_id=step_id,
                                                step_name="pgdurable.set_event", started_at=ctx.db_now(), key=key,
                                                value=text)
    if not published:
        raise ctx.lease_lost(f"publishing event {key!r}")


def set_tags_plan(ctx: ExecutionContext, tags: dict[str, str]) -> Plan:
    """Add to the execution's tags: a step, so a replay does not write them again."""
    checked = limits.tags(tags)
    if checked is None:  # nothing to add: no step either
        return
    step_id, recorded = ctx.begin_step("pgdurable.set_tags")
    if recorded is not None:
        return
    written = yield store.messaging.set_tags(id=ctx.execution_id, attempt=ctx.attempt, step_id=step_id,
                                             step_name="pgdurable.set_tags", started_at=ctx.db_now(),
                                             tags=json.dumps(checked))
    if not written:
        raise ctx.lease_lost("setting tags")


def write_stream_plan(ctx: ExecutionContext, key: str, value: Any, close: bool) -> Plan:
    """Write one value to the stream ``key`` (or close it): the value and its step are one statement, so a
    replay finds the step and writes nothing, and a value is never written twice."""
    limits.key(key, "stream key")
    name = "pgdurable.close_stream" if close else "pgdurable.write_stream"
    step_id, recorded = ctx.begin_step(name)
    if recorded is not None:
        return
    text = None if close else ctx.serializer.dumps(value)
    written = yield store.messaging.write_stream(id=ctx.execution_id, attempt=ctx.attempt, step_id=step_id,
                                                 step_name=name, started_at=ctx.db_now(), key=key, value=text)
    if not written:
        raise ctx.lease_lost(f"writing to stream {key!r}")


def send_plan(ctx: ExecutionContext, call: store.Call[bool]) -> Plan:
    """A send from a workflow: a step, with an idempotency key derived from it, so a replay that runs it
    again stores nothing twice."""
    step_id, recorded = ctx.begin_step("pgdurable.send")
    if recorded is not None:
        return
    params = dict(call.params)
    params["key"] = params["key"] or f"{ctx.execution_id}:{step_id}"
    yield store.Call(call.name, params, call.read)
    yield from _record(ctx, step_id, "pgdurable.send", "null")


def child_id(ctx: ExecutionContext, step_id: int) -> str:
    """Deterministic: a replay that enqueues the same child again finds the one it made."""
    candidate = f"{ctx.execution_id}:{step_id}"
    if len(candidate) <= _MAX_ID_LENGTH:
        return candidate
    return str(uuid.uuid5(uuid.NAMESPACE_URL, candidate))


def enqueue_child_plan(ctx: ExecutionContext, name: str, execution_id: str | None,
                       params: dict[str, Any]) -> Plan:
    step_name = f"pgdurable.enqueue:{name}"
    step_id, recorded = ctx.begin_step(step_name)
    if recorded is not None:
        if recorded.error is not None:  # the id belonged to another workflow when this first ran
            raise failures.rebuild(json.loads(recorded.error))
        return ctx.serializer.loads(recorded.output or "null", str)
    new_id = execution_id or child_id(ctx, step_id)
    recorded_now, owner_name, conflict = yield store.children.enqueue_child(
        parent=ctx.execution_id, attempt=ctx.attempt, step_id=step_id, step_name=step_name,
        started_at=ctx.db_now(), id=new_id, name=name, **params)
    if not recorded_now:
        raise ctx.lease_lost(f"starting child workflow {name!r}")
    if conflict is not None:  # recorded as the step's error: raise exactly what a replay will raise
        raise failures.rebuild(json.loads(conflict))
    if owner_name is not None and owner_name != name:
        raise WorkflowIdConflict(f"workflow id {new_id!r} already belongs to an execution of {owner_name!r}")
    return new_id


def await_plan(ctx: ExecutionContext, ids: Sequence[str], timeout: float | None) -> Plan:
    """Wait for every execution in ``ids`` to finish; returns their outcomes as recorded (see ``outcome``).

    Each outcome is a step of its own, recorded as soon as it is known, so a replay neither waits again
    nor sees a different result. A timeout is recorded too, as the outcome of the first unfinished one.
    """
    deadline = yield from _timer(ctx, "pgdurable.wait.deadline", timeout, None)
    slots = [ctx.begin_step("pgdurable.result") for _ in ids]
    outcomes: dict[int, str] = {i: rec.output or "null" for i, (_, rec) in enumerate(slots) if rec is not None}
    if any(json.loads(text).get("status") == "timeout" for text in outcomes.values()):
        return [outcomes.get(i) for i in range(len(ids))]  # this wait timed out when it first ran
    while True:
        pending = [i for i in range(len(ids)) if i not in outcomes]
        if not pending:
            return [outcomes[i] for i in range(len(ids))]
        wakeups, rows = yield store.children.awaited_status(id=ctx.execution_id, attempt=ctx.attempt,
                                                            ids=[ids[i] for i in pending])
        if wakeups is None:
            raise ctx.lease_lost("waiting for other workflows")
        by_id = {row.id: row for row in rows}
        finished: dict[int, str] = {}
        for i in pending:
            row = by_id[ids[i]]
            if row.status is None:
                raise WorkflowNotFound(ids[i])
            if row.status in store.executions.TERMINAL:
                finished[i] = json.dumps({"id": ids[i], "status": row.status})[:-1] + (
                    f', "output": {row.output or "null"}, "error": {row.error or "null"}}}')
        timed_out = not finished and deadline is not None and ctx.db_now() >= deadline
        if timed_out:
            finished[pending[0]] = json.dumps({"id": ids[pending[0]], "status": "timeout"})
        if finished:
            written = yield [ctx.step_write(slots[i][0], "pgdurable.result", text) for i, text in finished.items()]
            if not all(written):
                raise ctx.lease_lost("recording results of awaited workflows")
            outcomes.update(finished)
            if timed_out:
                return [outcomes.get(i) for i in range(len(ids))]
            continue
        wake_at = deadline
        if not all(by_id[ids[i]].is_child for i in pending):
            poll = ctx.db_now() + timedelta(seconds=_NON_CHILD_POLL_SECONDS)
            wake_at = poll if wake_at is None else min(wake_at, poll)
        yield from _suspend(ctx, wake_at, "children", wakeups)


def outcome(ctx: ExecutionContext, recorded: str | None, return_hint: Any) -> Any:
    """The value of one awaited execution's recorded outcome, or its failure raised."""
    if recorded is None:
        raise ResultTimeout("an earlier awaited workflow timed out")
    info = json.loads(recorded)
    status = info["status"]
    if status == "succeeded":
        return ctx.serializer.loads(json.dumps(info.get("output")), return_hint)
    if status == "timeout":
        raise ResultTimeout(f"workflow {info['id']} did not finish in time; it keeps running")
    raise outcome_error(info["id"], status, info.get("error"))


def patched(name: str) -> bool:
    """True where the workflow runs the new code of change ``name``; False while replaying history that
    was recorded before the change. Use it to change a workflow while executions are in flight::

        if pgdurable.patched("send-receipt"):
            send_receipt(order)        # new executions, and old ones that had not got this far yet

    Once no execution from before the change is left, drop the condition (keep the new branch).
    """
    ctx = current()
    if ctx is None:
        return True
    marker = f"pgdurable.patch:{name}"
    step_id, recorded = ctx.peek_step()
    if recorded is not None and recorded.step_name != marker:
        return False  # history from before the change: the old code recorded something else here
    ctx.begin_step(marker)
    if recorded is None:
        # Not waited for: the execution's next write commits after this one, or fails with it.
        ctx.write_nowait(ctx.step_write(step_id, marker, "true"))
    return True


# ---- the public primitives ----------------------------------------------------------------------------

def sleep(seconds: float) -> None:
    """Sleep durably inside a workflow: the worker slot is released, and the workflow resumes on any worker
    once ``seconds`` of database time have passed, even across restarts."""
    ctx = workflow_context("pgdurable.sleep()")
    drive_sync(ctx, sleep_plan(ctx, seconds, None))


async def sleep_async(seconds: float) -> None:
    ctx = workflow_context("pgdurable.sleep_async()")
    await drive_async(ctx, sleep_plan(ctx, seconds, None))


def sleep_until(when: datetime) -> None:
    """Sleep durably until ``when`` (timezone-aware), on the database's clock."""
    ctx = workflow_context("pgdurable.sleep_until()")
    drive_sync(ctx, sleep_plan(ctx, None, when))


async def sleep_until_async(when: datetime) -> None:
    ctx = workflow_context("pgdurable.sleep_until_async()")
    await drive_async(ctx, sleep_plan(ctx, None, when))


def recv(topic: str | None = None, timeout: float | None = None) -> Any:
    """Receive the next message sent to this workflow on ``topic``: each message exactly once, in the order
    sent. Waits (without holding a worker slot) up to ``timeout`` seconds (None: no limit); None at timeout.
    """
    ctx = workflow_context("pgdurable.recv()")
    return drive_sync(ctx, recv_plan(ctx, topic or "", timeout))


async def recv_async(topic: str | None = None, timeout: float | None = None) -> Any:
    ctx = workflow_context("pgdurable.recv_async()")
    return await drive_async(ctx, recv_plan(ctx, topic or "", timeout))


def set_event(key: str, value: Any) -> None:
    """Publish ``value`` under ``key`` for this workflow; readers get the latest (App.get_event)."""
    ctx = workflow_context("pgdurable.set_event()")
    drive_sync(ctx, set_event_plan(ctx, key, value))


async def set_event_async(key: str, value: Any) -> None:
    ctx = workflow_context("pgdurable.set_event_async()")
    await drive_async(ctx, set_event_plan(ctx, key, value))


def gather(handles: Sequence[Any], timeout: float | None = None) -> list[Any]:
    """Inside a workflow: wait for several workflows (typically children) and return their results in
    order, without holding a worker slot while waiting. A failed one raises its ``WorkflowFailed``."""
    ctx = workflow_context("pgdurable.gather()")
    recorded = drive_sync(ctx, await_plan(ctx, [h.workflow_id for h in handles], timeout))
    return [outcome(ctx, r, h._return_hint) for r, h in zip(recorded, handles, strict=True)]


async def gather_async(handles: Sequence[Any], timeout: float | None = None) -> list[Any]:
    ctx = workflow_context("pgdurable.gather_async()")
    recorded = await drive_async(ctx, await_plan(ctx, [h.workflow_id for h in handles], timeout))
    return [outcome(ctx, r, h._return_hint) for r, h in zip(recorded, handles, strict=True)]


def set_tags(tags: dict[str, str]) -> None:
    """Add ``tags`` (string keys and values) to this workflow's tags, replacing values of keys it has; found
    with ``App.list_workflows(tags=...)``. Recorded as a step: written once, whatever replays."""
    ctx = workflow_context("pgdurable.set_tags()")
    drive_sync(ctx, set_tags_plan(ctx, tags))


async def set_tags_async(tags: dict[str, str]) -> None:
    ctx = workflow_context("pgdurable.set_tags_async()")
    await drive_async(ctx, set_tags_plan(ctx, tags))


def write_stream(key: str, value: Any) -> None:
    """Append ``value`` to this workflow's stream ``key``; readers (``App.read_stream``) get the values in
    order as they are written. Each value is written exactly once, even if the workflow is resumed."""
    ctx = workflow_context("pgdurable.write_stream()")
    drive_sync(ctx, write_stream_plan(ctx, key, value, False))


async def write_stream_async(key: str, value: Any) -> None:
    ctx = workflow_context("pgdurable.write_stream_async()")
    await drive_async(ctx, write_stream_plan(ctx, key, value, False))


def close_stream(key: str) -> None:
    """End the stream ``key``: its readers stop after its last value (they also stop when the workflow
    ends)."""
    ctx = workflow_context("pgdurable.close_stream()")
    drive_sync(ctx, write_stream_plan(ctx, key, None, True))


async def close_stream_async(key: str) -> None:
    ctx = workflow_context("pgdurable.close_stream_async()")
    await drive_async(ctx, write_stream_plan(ctx, key, None, True))
