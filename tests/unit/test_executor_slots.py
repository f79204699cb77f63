"""The executor's slot count (worker/executor.py): an execution whose completion is being written holds no
slot a claim must leave for it, so that a claim sent meanwhile (an enqueue rang the bell as soon as the result
committed) is not cut short, and says truly whether the queue ran dry."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from pgdurable import store
from pgdurable.worker.executor import Executor, Running


def _executor(concurrency: int = 2) -> Executor:
    runtime: Any = SimpleNamespace(observers=None)
    return Executor(runtime, "w1", concurrency, on_free=lambda: None, on_suspend=lambda id, at: None)


def _running(executor: Executor, id: str) -> Running:
    claimed = store.claims.Claimed(id=id, name="w", attempt=1, input="{}")
    context: Any = SimpleNamespace(lost=False)  # all the slot count and abandon() look at
    running = Running(claimed, context)
    executor.running[id] = running
    return running


def test_a_finishing_execution_frees_its_slot_for_claims() -> None:
    executor = _executor()
    first = _running(executor, "a")
    assert executor.free() == 1 and executor.busy()
    executor._finishing(first, True)
    assert executor.free() == 2 and not executor.busy()
    executor._finishing(first, True)  # once only
    assert executor.free() == 2
    executor._finishing(first, False)
    assert executor.free() == 1 and executor.busy()


def test_an_execution_given_up_while_finishing_is_not_counted_twice() -> None:
    executor = _executor()
    first, second = _running(executor, "a"), _running(executor, "b")
    executor._finishing(first, True)
    assert executor.free() == 1
    executor.abandon(first)  # its lease was lost while the completion was written (a sync workflow: no task)
    assert executor.finishing == 0 and executor.free() == 1
    executor._finishing(first, False)  # its completion returns: nothing to undo
    assert executor.finishing == 0 and executor.free() == 1
    assert list(executor.running) == ["b"] and second.finishing is False
