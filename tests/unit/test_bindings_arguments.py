"""Which columns a table binding passes to a workflow (bindings.arguments), decided from its signature alone."""

from __future__ import annotations

from typing import Any

import pytest

from pgdurable.bindings import arguments, operations
from pgdurable.workflows import Workflow

COLUMNS = ["id", "status", "amount", "customer"]


def _workflow(fn: Any) -> Workflow[..., Any]:
    return Workflow(fn, name=fn.__name__, queue="default", priority=0, max_recoveries=None)


def test_columns_the_workflow_does_not_take_are_left_out() -> None:
    def fulfil(id: int, amount: float) -> None: ...
    assert arguments(_workflow(fulfil), "shop.orders", COLUMNS, None) == (["id", "amount"], False)


def test_a_parameter_named_old_asks_for_the_old_row() -> None:
    def audit(id: int, status: str, old: dict[str, Any] | None) -> None: ...
    assert arguments(_workflow(audit), "shop.orders", COLUMNS, None) == (["id", "status"], True)


def test_kwargs_take_every_column() -> None:
    def anything(id: int, **row: Any) -> None: ...
    assert arguments(_workflow(anything), "shop.orders", COLUMNS, None) == (None, False)
    assert arguments(_workflow(anything), "shop.orders", COLUMNS, True) == (None, True)


def test_optional_parameters_need_no_column() -> None:
    def fulfil(id: int, dry_run: bool = False) -> None: ...
    assert arguments(_workflow(fulfil), "shop.orders", COLUMNS, None) == (["id"], False)


def test_a_workflow_known_only_by_name_gets_every_column() -> None:
    assert arguments(None, "shop.orders", COLUMNS, None) == (None, False)


def test_a_required_parameter_no_column_fills_is_refused_now() -> None:
    def fulfil(id: int, address: str) -> None: ...
    with pytest.raises(TypeError, match=r"requires \['address'\].*shop.orders"):
        arguments(_workflow(fulfil), "shop.orders", COLUMNS, None)


def test_pass_old_needs_a_parameter_old() -> None:
    def fulfil(id: int) -> None: ...
    with pytest.raises(TypeError, match="no such parameter"):
        arguments(_workflow(fulfil), "shop.orders", COLUMNS, True)


def test_positional_only_parameters_cannot_be_passed_by_name() -> None:
    def fulfil(id: int, /) -> None: ...
    with pytest.raises(TypeError, match="positional-only"):
        arguments(_workflow(fulfil), "shop.orders", COLUMNS, None)


def test_operations() -> None:
    assert operations("insert") == ["insert"]
    assert operations(("UPDATE", "insert", "update")) == ["insert", "update"]
    for bad in ((), ("truncate",), "upsert", (1,)):
        with pytest.raises(ValueError, match="one or more of insert, update, delete"):
            operations(bad)  # type: ignore[arg-type]
