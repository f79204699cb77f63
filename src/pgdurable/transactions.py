"""Transactional steps: the step's own database writes and its checkpoint commit in one transaction.

The step receives a connection in an open transaction. Just before commit, the checkpoint row is written
in that same transaction, and only if this worker still owns the execution's current attempt; otherwise
everything rolls back. So the step's effects happen exactly once: either they and the record of them
commit together, or neither does and the step runs again from a clean state.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from .context import ExecutionContext, current
from .effects import Invoke, Pause
from .errors import ConfigurationError, LeaseLost, SerializationError, StepTimeout
from .orm import async_session_transaction, session_kind, session_transaction
from .plans import Plan, drive_async, drive_sync, record_step
from .serialization import Signature
from .steps import RetryPolicy, StepRun, running_step
from .workflows import refuse_generator

if TYPE_CHECKING:
    from .runtime import Runtime

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


class _CheckpointCanceled(Exception):
    """The engine's own checkpoint statement was cancelled (statement_timeout, pg_cancel_backend): not the
    step's failure, so it never counts against the step's retry policy."""


class TransactionRun(StepRun):
    """A transactional step's call: conflicts between transactions retry on a budget of their own, and so does
    a lost database connection."""

    conflicts = 0
    # Set by the caller before ``failed``: the try failed because the step's connection was lost.
    disconnected = False
    reconnects = 0
    disconnected_at: float | None = None
    # How long a lost connection is retried before this attempt is given up (the App's lease).
    reconnect_seconds = 0.0

    def retry_delay(self, exc: BaseException) -> float | None:
        if isinstance(exc, _CONFLICTS):
            self.conflicts += 1
            return float(min(0.01 * 2 ** (self.conflicts - 1), 1.0)) if self.conflicts < _CONFLICT_ATTEMPTS else None
        if self.disconnected or isinstance(exc, _CheckpointCanceled):
            return self._reconnect_delay(exc)
        return super().retry_delay(exc)

    def _reconnect_delay(self, exc: BaseException) -> float:
        """A lost connection is not the step's failure, so it is never recorded as one: the transaction rolled
        back with it (or, if COMMIT itself was cut off, committed together with the checkpoint, and the next
        try is fenced). Retry while the lease may still hold; then give the attempt up: its lease runs out and
        the execution resumes from its checkpoints."""
        now = time.monotonic()
        if self.ctx.lease_ran_out():
            # Paused (or cut off) past the lease: another worker may own the execution by now, so the body is
            # not run again; the attempt ends here.
            self.ctx.lost = True
            raise LeaseLost(f"execution {self.ctx.execution_id}: attempt {self.ctx.attempt} gave up: its lease ran "
                            f"out while transactional step #{self.step_id} ({self.name}) was cut off from the "
                            f"database ({exc})") from exc
        if self.disconnected_at is None:
            self.disconnected_at = now
        elif now - self.disconnected_at >= self.reconnect_seconds:
            self.ctx.lost = True  # heartbeats leave it alone from now on
            raise LeaseLost(f"execution {self.ctx.execution_id}: attempt {self.ctx.attempt} gave up: transactional "
                            f"step #{self.step_id} ({self.name}) lost its database connection for "
                            f"{now - self.disconnected_at:.1f} s ({exc})") from exc
        self.reconnects += 1
        return float(min(0.05 * 2 ** (self.reconnects - 1), 1.0))

    def checkpoint_params(self, value: Any) -> tuple[Any, ...]:
        """The checkpoint written inside the step's transaction (an unencodable result rolls it back)."""
        try:
            output = self.output = self.ctx.serializer.dumps(value)
        except SerializationError as exc:
            raise SerializationError(f"transactional step {self.name!r} (#{self.step_id}) returned a value that "
                                     f"cannot be stored: {exc}") from None
        return (self.ctx.execution_id, self.ctx.attempt, self.step_id, self.name, output, None, self.tries,
                self.started)

    def lost(self) -> LeaseLost:
        self.ctx.lost = True
        return LeaseLost(f"execution {self.ctx.execution_id}: attempt {self.ctx.attempt} lost its lease; "
                         f"transactional step #{self.step_id} ({self.name}) was rolled back")


def _broken(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any] | None, exc: BaseException) -> bool:
    """Did this try fail because the step's connection was lost, or because no transaction could be opened
    (no connection from the pool in time, or BEGIN on a connection the server had closed)?"""
    if conn is None:
        return isinstance(exc, psycopg.OperationalError)  # PoolTimeout is one too
    return conn.broken


@dataclass(frozen=True, slots=True)
class Transactions:
    """How a transactional step opens, uses and ends its transaction: the only part that differs between sync
    and async steps. Each callable returns its result (sync) or an awaitable of it (async); the plan yields
    them as ``Invoke`` effects, so ``drive_sync`` calls them and ``drive_async`` awaits them."""

    scope: Callable[[], Any]  # a new context manager (sync or async) that yields (what the step gets, conn)
    enter: Callable[[Any], Any]
    exit: Callable[[Any, BaseException | None], Any]
    execute: Callable[[Any, Any, Any], Any]
    fetch_one: Callable[[Any, Any, Any], Any]
    # Statements that open every step transaction, and the checkpoint written just before its commit.
    opening: tuple[tuple[sql.Composable, tuple[Any, ...] | None], ...]
    checkpoint: sql.Composable
    # The step's timeout: every statement of the transaction runs under it (statement_timeout).
    timeout: float | None = None


def _exit_args(exc: BaseException | None) -> tuple[Any, Any, Any]:
    return (None, None, None) if exc is None else (type(exc), exc, exc.__traceback__)


def sync_transactions(open_scope: Callable[[], contextlib.AbstractContextManager[tuple[Any, Any]]],
                      opening: tuple[tuple[sql.Composable, tuple[Any, ...] | None], ...],
                      checkpoint: sql.Composable, timeout: float | None = None) -> Transactions:
    return Transactions(
        scope=open_scope,
        enter=lambda scope: scope.__enter__(),
        exit=lambda scope, exc: scope.__exit__(*_exit_args(exc)),
        execute=lambda conn, statement, params: conn.execute(statement, params),
        fetch_one=lambda conn, statement, params: conn.execute(statement, params).fetchone(),
        opening=opening, checkpoint=checkpoint, timeout=timeout)


async def _fetch_one(conn: psycopg.AsyncConnection[Any], statement: Any, params: Any) -> Any:
    return await (await conn.execute(statement, params)).fetchone()


def async_transactions(open_scope: Callable[[], contextlib.AbstractAsyncContextManager[tuple[Any, Any]]],
                       opening: tuple[tuple[sql.Composable, tuple[Any, ...] | None], ...],
                       checkpoint: sql.Composable, timeout: float | None = None) -> Transactions:
    return Transactions(
        scope=open_scope,
        enter=lambda scope: scope.__aenter__(),
        exit=lambda scope, exc: scope.__aexit__(*_exit_args(exc)),
        execute=lambda conn, statement, params: conn.execute(statement, params),
        fetch_one=_fetch_one,
        opening=opening, checkpoint=checkpoint, timeout=timeout)


def in_transaction(tx: Transactions, body: Invoke, run: TransactionRun | None) -> Plan:
    """Open a transaction, run the step's body in it (it gets the transaction's handle first), and, inside a
    workflow, write the checkpoint in the same transaction; then commit. Anything raised rolls it back."""
    conn = None
    try:
        scope = tx.scope()
        handle, conn = yield Invoke(tx.enter, (scope,))
        try:
            for statement, params in tx.opening:
                yield Invoke(tx.execute, (conn, statement, params))
            try:
                value = yield replace(body, args=(handle, *body.args))
            except psycopg.errors.QueryCanceled as exc:
                if tx.timeout is None or "statement timeout" not in str(exc):
                    raise
                raise StepTimeout(f"{body.label}: a statement ran past the step's timeout of {tx.timeout:g} s "
                                  f"and was cancelled by the server ({str(exc).strip()}); the transaction rolled "
                                  "back") from exc
            if run is not None:
                try:
                    row = yield Invoke(tx.fetch_one, (conn, tx.checkpoint, run.checkpoint_params(value)))
                except psycopg.errors.QueryCanceled as exc:
                    raise _CheckpointCanceled(str(exc)) from exc
                if not row or not row[0]:
                    raise _Fenced
        except BaseException as exc:
            yield Invoke(tx.exit, (scope, exc))  # rolls back
            raise
        yield Invoke(tx.exit, (scope, None))  # commits (a failed commit is raised here)
        return value
    except Exception as exc:
        if run is not None:
            run.disconnected = _broken(conn, exc)
        raise


def transaction_step_plan(run: TransactionRun, tx: Transactions, body: Invoke) -> Plan:
    """One call of a transactional step inside a workflow: replay its record, or run it with retries. A success
    is recorded by its own transaction; only a failure is recorded afterwards, through the writer (no write
    of the step was kept)."""
    if run.recorded is not None:
        return run.replay()
    with running_step():
        for _ in run.attempts():
            try:
                run.succeeded((yield from in_transaction(tx, body, run)))
            except _Fenced:
                raise run.lost() from None
            except Exception as exc:
                if (delay := run.failed(exc)) is not None:
                    yield Pause(delay)
    if run.failure is None:
        run.ctx.step_done(run.name, run.step_id, run.started, False, run.tries)
        return run.as_replayed()
    yield from record_step(run.ctx, *run.checkpoint())
    return run.result()


# A transaction opened by an integration on a connection it owns (Django's ``transaction.atomic()``): a new
# context manager that yields the psycopg connection underneath, in the open transaction.
OwnScope = Callable[[], contextlib.AbstractContextManager[psycopg.Connection[Any]]]


def make_transaction_step(runtime: Runtime, fn: Callable[..., Any], name: str, policy: RetryPolicy,
                          isolation: str | None, timeout: float | None = None,
                          own_scope: OwnScope | None = None) -> Callable[..., Any]:
    """The step's callable. With ``own_scope``, the step's transaction is the one that scope opens and the body
    takes no connection argument (it reaches the transaction its own way, as Django's ORM does)."""
    if isolation not in ISOLATION_LEVELS:
        raise ConfigurationError(f"isolation must be one of {sorted(k for k in ISOLATION_LEVELS if k)}")
    refuse_generator(fn, "step", name)
    signature = Signature(fn)
    parameters = list(signature.param_hints)
    is_async = inspect.iscoroutinefunction(fn)
    if own_scope is not None and is_async:
        raise ConfigurationError(f"transactional step {name!r} runs in its integration's own transaction, "
                                 "which is synchronous: declare it with `def`")
    if not parameters and own_scope is None:
        raise ConfigurationError(f"transactional step {name!r} must take the connection as its first parameter")
    first_hint: Any = signature.param_hints[parameters[0]] if own_scope is None else None
    kind = session_kind(first_hint)
    if kind is not None and (kind == "async") != is_async:
        raise ConfigurationError(f"transactional step {name!r}: use Session with `def` and AsyncSession with "
                                 "`async def`")
    set_isolation = ISOLATION_LEVELS[isolation]
    checkpoint = sql.SQL("SELECT {}.checkpoint_step(%s, %s, %s, %s, %s::jsonb, %s::jsonb, %s, %s)").format(
        sql.Identifier(runtime.schema))
    # A worker paused inside the transaction (SIGSTOP, a long GC pause, a lost network) must not hold its row
    # locks forever: the server ends the session once it has idled in the transaction for a lease.
    opening: tuple[tuple[sql.Composable, tuple[Any, ...] | None], ...] = (
        *(() if set_isolation is None else ((set_isolation, None),)),
        (sql.SQL("SELECT set_config('idle_in_transaction_session_timeout', %s, true)"),
         (str(int(runtime.settings.lease_seconds * 1000)),)),
        # The step's timeout, enforced by the server on each statement (a thread cannot be stopped, a
        # statement can): in ms, at least 1 (0 means none) and at most what the setting takes (about 24 days).
        *(() if timeout is None else (
            (sql.SQL("SELECT set_config('statement_timeout', %s, true)"),
             (str(min(max(1, round(timeout * 1000)), 2**31 - 1)),)),)))

    tx: Transactions
    if is_async:
        @contextlib.asynccontextmanager
        async def async_scope() -> AsyncIterator[tuple[Any, psycopg.AsyncConnection[Any]]]:
            if kind == "async":
                async with async_session_transaction(runtime.db, first_hint) as (session, conn):
                    yield session, conn
            else:
                pool = await runtime.db.app_async_pool()
                async with pool.connection() as conn, conn.transaction():
                    yield conn, conn

        tx = async_transactions(async_scope, opening, checkpoint, timeout)
    else:
        @contextlib.contextmanager
        def sync_scope() -> Iterator[tuple[Any, psycopg.Connection[Any]]]:
            if own_scope is not None:
                with own_scope() as conn:
                    yield None, conn
            elif kind == "sync":
                with session_transaction(runtime.db, first_hint) as (session, conn):
                    yield session, conn
            else:
                with runtime.db.app_pool.connection() as conn, conn.transaction():
                    yield conn, conn

        tx = sync_transactions(sync_scope, opening, checkpoint, timeout)

    def without_handle(_handle: None, *args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    call = fn if own_scope is None else without_handle

    def plan(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[ExecutionContext | None, Plan]:
        body = Invoke(call, args, kwargs, label=f"transactional step {name!r}")
        ctx = current()
        if ctx is None:  # outside a workflow: a plain transaction, nothing recorded
            return None, in_transaction(tx, body, None)
        run = TransactionRun(ctx, name, policy, signature.return_hint)
        run.reconnect_seconds = runtime.settings.lease_seconds
        return ctx, transaction_step_plan(run, tx, body)

    if is_async:
        @functools.wraps(fn)
        async def async_step(*args: Any, **kwargs: Any) -> Any:
            return await drive_async(*plan(args, kwargs))

        step: Callable[..., Any] = async_step
    else:
        @functools.wraps(fn)
        def sync_step(*args: Any, **kwargs: Any) -> Any:
            return drive_sync(*plan(args, kwargs))

        step = sync_step
    step.__pgdurable_step__ = name  # type: ignore[attr-defined]
    return step
