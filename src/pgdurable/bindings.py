"""Table-bound workflows: a trigger on an application's table enqueues a workflow for every matching row
change, inside the writing transaction (the SQL is in migration 0015: ``bind_table``, ``table_binding_fire``).

This module decides which columns a workflow receives (its parameters by name), checks the options, and
stores a binding; docs/table-bound-workflows.md describes the behaviour.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from . import store
from .enqueue import check_options
from .runtime import Runtime
from .store import Call
from .workflows import Workflow

OPERATIONS = ("insert", "update", "delete")
OLD = "old"


@dataclass(frozen=True, slots=True)
class Binding:
    """A table binding (a row of ``list_table_bindings()``). ``installed_on``: the table its trigger is on
    now, None if the trigger is gone (the table was dropped: bind again or unbind)."""

    name: str
    relation: str
    workflow_name: str
    operations: list[str]
    when_condition: str | None
    key_columns: list[str]
    columns: list[str] | None
    pass_old: bool
    queue: str
    priority: int
    max_recoveries: int
    timeout_seconds: float | None
    installed_on: str | None
    created_at: datetime
    updated_at: datetime


def operations(on: str | Iterable[str]) -> list[str]:
    """The operations that fire a binding, checked: a non-empty subset of insert, update, delete."""
    found = [on] if isinstance(on, str) else list(on)
    if not found or any(not isinstance(op, str) or op.lower() not in OPERATIONS for op in found):
        raise ValueError(f"on must be one or more of {', '.join(OPERATIONS)}, not {on!r}")
    return sorted({op.lower() for op in found})


def arguments(workflow: Workflow[..., Any] | None, table: str, table_columns: Sequence[str],
              pass_old: bool | None) -> tuple[list[str] | None, bool]:
    """Which columns a binding passes (None: all of them) and whether it passes the old row as ``old``.

    Columns map to the workflow's parameters by name; columns it does not take are left out (a workflow
    with ``**kwargs`` takes them all). A parameter without a default that no column fills is refused now,
    not at the first change. ``pass_old`` defaults to whether the workflow has a parameter named ``old``.
    A workflow known only by name (registered elsewhere) gets every column.
    """
    if workflow is None:
        return None, bool(pass_old)
    parameters = workflow.signature.signature.parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    by_name = {name: p for name, p in parameters.items()
               if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}
    positional_only = [name for name, p in parameters.items()
                       if p.kind is inspect.Parameter.POSITIONAL_ONLY and p.default is inspect.Parameter.empty]
    if positional_only:
        raise TypeError(f"workflow {workflow.name!r} has positional-only parameters {positional_only}; "
                        "a binding passes columns by name")
    if pass_old is None:
        pass_old = OLD in by_name
    if pass_old and OLD not in by_name and not takes_any:
        raise TypeError(f"pass_old=True passes the row before the change as the argument {OLD!r}, but workflow "
                        f"{workflow.name!r} has no such parameter")
    wanted = [name for name in by_name if not (pass_old and name == OLD)]
    present = set(table_columns)
    missing = [name for name in wanted if name not in present and by_name[name].default is inspect.Parameter.empty]
    if missing:
        raise TypeError(f"workflow {workflow.name!r} requires {missing}, which table {table} has no column(s) for "
                        f"(its columns: {list(table_columns)}); give those parameters defaults or bind another "
                        "workflow")
    if takes_any:
        return None, pass_old
    return [name for name in wanted if name in present], pass_old


def bind(runtime: Runtime, table: str, workflow: Workflow[..., Any] | str, *, on: str | Iterable[str],
         when: str | None, name: str | None, pass_old: bool | None, queue: str | None, priority: int | None,
         max_recoveries: int | None, timeout_seconds: float | None) -> Binding:
    if not isinstance(table, str) or not table:
        raise TypeError(f"table must be a table's name (e.g. 'shop.orders'), not {table!r}")
    if when is not None and not isinstance(when, str):
        raise TypeError(f"when must be a SQL boolean expression (a string), not {type(when).__name__}")
    ops = operations(on)
    definition = runtime.registry.resolve(workflow)
    workflow_name = definition.name if definition is not None else workflow
    assert isinstance(workflow_name, str)
    check_options(queue=queue, priority=priority, max_recoveries=max_recoveries, timeout_seconds=timeout_seconds)
    if definition is not None:
        queue = queue or definition.queue
        priority = definition.priority if priority is None else priority
        max_recoveries = definition.max_recoveries if max_recoveries is None else max_recoveries
        timeout_seconds = definition.timeout_seconds if timeout_seconds is None else timeout_seconds
    with runtime.db.pool.connection() as conn, conn.transaction(), _sql_errors():
        present: list[str] = store.run(conn, table_columns(table))
        columns, passes_old = arguments(definition, table, present, pass_old)
        bound: str = store.run(conn, Call("bind_table", {
            "table": table, "workflow_name": workflow_name, "operations": ops, "when_condition": when,
            "name": name, "columns": columns, "pass_old": passes_old, "queue": queue or "default",
            "priority": 0 if priority is None else priority,
            "max_recoveries": runtime.settings.max_recoveries if max_recoveries is None else max_recoveries,
            "timeout_seconds": timeout_seconds}, lambda rows: rows[0][0]))
        found = next((b for b in store.run(conn, list_bindings()) if b.name == bound), None)
    assert found is not None
    return found


def table_columns(table: str) -> Call[list[str]]:
    return Call("table_columns", {"table": table}, lambda rows: [row[0] for row in rows])


def list_bindings() -> Call[list[Binding]]:
    return Call("list_table_bindings", {}, list, row_factory=store.calls.rows_of(Binding))


def restore() -> Call[list[str]]:
    return Call("restore_table_bindings", {}, lambda rows: [row[0] for row in rows])


def unbind(name: str) -> Call[bool]:
    return Call("unbind_table", {"name": name}, lambda rows: bool(rows[0][0]))


@contextlib.contextmanager
def _sql_errors() -> Iterator[None]:
    """The SQL checks' refusals (a missing table or column, no primary key, a bad when clause) as ValueError
    with PostgreSQL's message and hint; other database errors (a missing privilege...) pass through."""
    try:
        yield
    except psycopg.Error as exc:
        if not exc.sqlstate or exc.sqlstate[:2] not in {"22", "42", "55"} or exc.sqlstate == "42501":
            raise
        hint = exc.diag.message_hint
        raise ValueError(f"cannot bind table: {exc.diag.message_primary}" + (f" ({hint})" if hint else "")) from exc
