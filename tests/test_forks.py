"""A process forked from one that used pgdurable (multiprocessing's fork, gunicorn's and Celery's prefork
workers) gets its own connections and threads (forks.py): before, parent and child shared the parent's
server sessions and read each other's answers."""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Callable

import pytest

import pgdurable
from pgdurable.errors import ResultTimeout
from tests.harness import WAIT

fork = multiprocessing.get_context("fork")


def _in_a_fork(body: Callable[[], None]) -> multiprocessing.process.BaseProcess:
    child = fork.Process(target=body)
    child.start()
    return child


def _enqueue_and_read_back(app: pgdurable.App, flow: pgdurable.Workflow[..., int], who: str) -> None:
    for i in range(150):
        handle = app.enqueue(flow, i, workflow_id=f"{who}-{i}")
        execution = handle.get()
        assert (execution.id, execution.status) == (f"{who}-{i}", "enqueued")


def test_parent_and_forked_child_each_read_their_own_answers(app: pgdurable.App) -> None:
    @app.workflow()
    def flow(x: int) -> int:
        return x

    app.enqueue(flow, 0, workflow_id="before-the-fork")  # the parent's pool is open, with its connections
    child = _in_a_fork(lambda: _enqueue_and_read_back(app, flow, "child"))
    _enqueue_and_read_back(app, flow, "parent")  # at the same time as the child
    child.join(WAIT)
    assert child.exitcode == 0
    # The child exited without ending the parent's sessions: they still answer.
    _enqueue_and_read_back(app, flow, "parent-after")
    assert app.get("child-149").status == "enqueued"


def test_a_forked_child_starts_its_own_listener_and_local_worker(app: pgdurable.App) -> None:
    @app.workflow()
    def double(x: int) -> int:
        return 2 * x

    assert app.start(double, 1).result(timeout=WAIT) == 2  # the parent's App.start worker thread runs
    with pytest.raises(ResultTimeout):  # no worker serves it: the wait starts the parent's results listener
        app.enqueue(double, 0).result(timeout=0.2)
    assert app.runtime.completions.listening

    def in_the_child() -> None:
        assert not app.runtime.completions.listening  # the parent's listener thread stayed with the parent
        assert app.start(double, 21).result(timeout=WAIT) == 42  # run by the child's own worker thread
        listener = app.runtime.completions._thread
        assert listener is not None and listener.is_alive() and listener in threading.enumerate()

    child = _in_a_fork(in_the_child)
    child.join(WAIT)
    assert child.exitcode == 0
    assert app.start(double, 2).result(timeout=WAIT) == 4  # and the parent's go on
