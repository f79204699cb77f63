"""Transactional steps: the step's own database writes and its checkpoint commit in one transaction.

The step receives a connection in an open transaction. Just before commit, the checkpoint row is written
in that same transaction, and only if this worker still owns the execution's current attempt; otherwise
everything rolls back. So the step's effects happen exactly once: either they and the record of them
commit together, or neither does and the step runs again from a clean state.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from .context import ExecutionContext, _in_step, current, utcnow
from .errors import ConfigurationError, LeaseLost
from .serialization import Signature
from .steps import RetryPolicy, _encode

if TYPE_CHECKING:
    from .app import App

ISOLATION_LEVELS = {
    None: None,
    "read committed": sql.SQL("SET TRANSACTION ISOLATION LEVEL READ COMMITTED"),
    "repeatable read": sql.SQL("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"),
    "serializable": sql.SQL("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"),
}

# Conflicts between concurrent transactions are retried on their own budget, whatever the step's policy.
_CONFLICTS = (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected)
_CONFLICT_ATTEMPTS = 10


class _Fenced(Exception):
    """The checkpoint was refused: this worker no longer owns the attempt. Rolls the transaction back."""


def _conflict_delay(tries: int) -> float:
    return float(min(0.01 * 2 ** (tries - 1), 1.0))


def make_transaction_step(app: App, fn: Callable[..., Any], name: str, policy: RetryPolicy,
                          isolation: str | None) -> Callable[..., Any]:
    if isolation not in ISOLATION_LEVELS:
        raise ConfigurationError(f"isolation must be one of {sorted(k for k in ISOLATION_LEVELS if k)}")
    parameters = list(inspect.signature(fn).parameters)
    if not parameters:
        raise ConfigurationError(f"transactional step {name!r} must take the connection as its first parameter")
    return_hint = Signature(fn).return_hint
    set_isolation = ISOLATION_LEVELS[isolation]
    checkpoint = sql.SQL("SELECT {}.checkpoint_step(%s, %s, %s, %s, %s::jsonb, %s::jsonb, %s, %s)").format(
        sql.Identifier(app.schema))
    timeout = str(int(app.settings.lease_seconds * 1000))

    # The statements that open every step transaction. A worker paused inside the transaction (SIGSTOP,
    # a long GC pause, a lost network) must not hold its row locks forever: the server ends the session
    # once it has idled in the transaction for a lease.
    opening: list[tuple[sql.SQL, tuple[Any, ...] | None]] = [] if set_isolation is None else [
        (set_isolation, None)]
    opening.append((sql.SQL("SELECT set_config('idle_in_transaction_session_timeout', %s, true)"), (timeout,)))

    def checkpoint_params(ctx: ExecutionContext, step_id: int, output: str | None, tries: int,
                          started: Any) -> tuple[Any, ...]:
        return (ctx.execution_id, ctx.attempt, step_id, name, output, None, tries, started)

    def next_delay(exc: BaseException, tries: int, conflicts: int) -> float | None:
        if isinstance(exc, _CONFLICTS):
            return _conflict_delay(conflicts) if conflicts < _CONFLICT_ATTEMPTS else None
        return policy.retries(exc, tries)

    if inspect.iscoroutinefunction(fn):
        async_fn = fn

        @functools.wraps(fn)
        async def async_transaction(*args: Any, **kwargs: Any) -> Any:
            ctx = current()
            pool = await app.db.app_async_pool()
            if ctx is None:  # outside a workflow: a plain transaction, nothing recorded
                async with pool.connection() as conn, conn.transaction():
                    for statement, params in opening:
                        await conn.execute(statement, params)
                    return await async_fn(conn, *args, **kwargs)
            step_id, recorded = ctx.begin_step(name)
            if recorded is not None:
                return ctx.replay(recorded, return_hint)
            started, tries, conflicts = utcnow(), 0, 0
            token = _in_step.set(True)
            try:
                while True:
                    tries += 1
                    try:
                        async with pool.connection() as conn, conn.transaction():
                            for statement, params in opening:
                                await conn.execute(statement, params)
                            value = await async_fn(conn, *args, **kwargs)
                            output, _, failure = _encode(ctx, value, None)
                            if failure is not None:
                                raise failure
                            cur = await conn.execute(checkpoint, checkpoint_params(ctx, step_id, output, tries,
                                                                                   started))
                            row = await cur.fetchone()
                            if not (row and row[0]):
                                raise _Fenced
                        return value
                    except _Fenced:
                        raise _lost(ctx, step_id) from None
                    except Exception as exc:
                        conflicts += isinstance(exc, _CONFLICTS)
                        delay = next_delay(exc, tries, conflicts)
                        if delay is None:
                            failure = exc
                            break
                        await asyncio.sleep(delay)
            finally:
                _in_step.reset(token)
            _, error, recorded_failure = _encode(ctx, None, failure)
            await ctx.record(step_id, name, None, error, tries, started)
            assert recorded_failure is not None
            raise recorded_failure

        step: Callable[..., Any] = async_transaction
    else:
        @functools.wraps(fn)
        def sync_transaction(*args: Any, **kwargs: Any) -> Any:
            ctx = current()
            if ctx is None:
                with app.db.app_pool.connection() as conn, conn.transaction():
                    for statement, params in opening:
                        conn.execute(statement, params)
                    return fn(conn, *args, **kwargs)
            step_id, recorded = ctx.begin_step(name)
            if recorded is not None:
                return ctx.replay(recorded, return_hint)
            started, tries, conflicts = utcnow(), 0, 0
            token = _in_step.set(True)
            try:
                while True:
                    tries += 1
                    try:
                        with app.db.app_pool.connection() as conn, conn.transaction():
                            for statement, params in opening:
                                conn.execute(statement, params)
                            value = fn(conn, *args, **kwargs)
                            output, _, failure = _encode(ctx, value, None)
                            if failure is not None:
                                raise failure
                            row = conn.execute(checkpoint, checkpoint_params(ctx, step_id, output, tries,
                                                                             started)).fetchone()
                            if not (row and row[0]):
                                raise _Fenced
                        return value
                    except _Fenced:
                        raise _lost(ctx, step_id) from None
                    except Exception as exc:
                        conflicts += isinstance(exc, _CONFLICTS)
                        delay = next_delay(exc, tries, conflicts)
                        if delay is None:
                            failure = exc
                            break
                        time.sleep(delay)
            finally:
                _in_step.reset(token)
            _, error, recorded_failure = _encode(ctx, None, failure)
            ctx.record_sync(step_id, name, None, error, tries, started)
            assert recorded_failure is not None
            raise recorded_failure

        step = sync_transaction
    step.__pgdurable_step__ = name  # type: ignore[attr-defined]
    return step


def _lost(ctx: ExecutionContext, step_id: int) -> LeaseLost:
    ctx.lost = True
    return LeaseLost(f"execution {ctx.execution_id}: attempt {ctx.attempt} lost its lease; transactional "
                     f"step #{step_id} was rolled back")
