"""Hardening: a bad value stays in its own execution, and a replay decides as the first run did.

Each test here reproduces a way the engine once broke (issue 11) and checks the fix at its root.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from psycopg import sql

import pgdurable
from pgdurable import failures, store
from pgdurable.batcher import StepWrite, ThreadWaiter, _Plan
from pgdurable.errors import SerializationError, StepFailed, WorkflowIdConflict
from pgdurable.serialization import MAX_DEPTH
from tests.apps import crashy
from tests.harness import WAIT, wait_for

POISON: dict[str, Any] = {
    "nan": float("nan"),
    "-inf": float("-inf"),
    "nul": "before\x00after",
    "nul-key": {"k\x00": 1},
    "surrogate": "\ud800",
    "deep": None,  # built below: 3,000 nested lists
}


def _deep(levels: int) -> list[Any]:
    root: list[Any] = []
    node = root
    for _ in range(levels - 1):
        child: list[Any] = []
        node.append(child)
        node = child
    return root


POISON["deep"] = _deep(3000)


class Declined(Exception):
    """A custom constructor: its args are not what it takes."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"declined with code {code}: {reason}")
        self.code = code
        self.reason = reason


def _first_line(error: dict[str, Any] | None) -> str:
    return str((error or {}).get("message", ""))


# ---- poison values stay in their own execution --------------------------------------------------------------

def test_unstorable_step_outputs_fail_their_own_step_and_no_one_else(
        app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    @app.step()
    def produce(kind: str) -> Any:
        return POISON.get(kind, kind)

    @app.step()
    def raise_with_nul() -> None:
        raise ValueError("bad\x00message \ud800 here")

    @app.workflow()
    def poisoned(kind: str) -> Any:
        if kind == "error-with-nul":
            raise_with_nul()
        return produce(kind)

    @app.workflow()
    def innocent(n: int) -> int:
        produce(str(n))
        return n

    start_worker(app, concurrency=32)
    kinds = [*POISON, "error-with-nul"]
    handles = []
    for i in range(5):  # interleaved, so that innocent and poisoned writes share group commits
        handles += [(None, app.enqueue(innocent, i * 10 + j)) for j in range(4)]
        handles += [(kind, app.enqueue(poisoned, kind)) for kind in kinds]
    for kind, handle in handles:
        if kind is None:
            assert handle.result(timeout=90) is not None
            continue
        with pytest.raises(pgdurable.WorkflowFailed) as failed:
            handle.result(timeout=90)
        row = app.get(handle.workflow_id)
        assert row is not None and row.status == "failed" and row.recoveries == 0, (kind, row)
        if kind == "error-with-nul":
            assert failed.value.type == "ValueError"
            assert "bad\\x00message \\ud800 here" in failed.value.remote_message
            step = app.steps(handle.workflow_id)[0]
            assert step.error is not None and json.loads(step.error)["type"] == "ValueError"
        else:
            assert failed.value.type == "pgdurable.errors.SerializationError", (kind, failed.value)
            assert "'produce'" in failed.value.remote_message, failed.value.remote_message  # names the step
            steps = app.steps(handle.workflow_id)
            assert len(steps) == 1 and steps[0].output is None and steps[0].error is not None


def test_unstorable_workflow_results_fail_that_workflow(app: pgdurable.App,
                                                        start_worker: Callable[..., Any]) -> None:
    @app.workflow()
    def returns(kind: str) -> Any:
        return POISON[kind]

    start_worker(app)
    for kind in POISON:
        with pytest.raises(pgdurable.WorkflowFailed) as failed:
            app.enqueue(returns, kind).result(timeout=60)
        assert failed.value.type == "pgdurable.errors.SerializationError", kind


def test_unstorable_arguments_fail_at_enqueue(app: pgdurable.App) -> None:
    @app.workflow()
    def takes(value: Any) -> None:
        return None

    app.migrate()
    for kind, value in POISON.items():
        with pytest.raises(SerializationError):
            app.enqueue(takes, value)
        with pytest.raises(SerializationError):
            app.enqueue_many(takes, [(1,), (value,)])
        with pytest.raises(SerializationError):
            app.send("nobody", value)
        assert app.list_workflows() == [], kind
    nested_ok = _deep(MAX_DEPTH - 2)
    assert app.enqueue(takes, nested_ok).workflow_id  # as deep as can be read back is accepted


def test_the_payload_limit_counts_bytes_not_characters(make_app: Callable[..., pgdurable.App]) -> None:
    app = make_app(max_payload_bytes=64 * 1024)

    @app.workflow()
    def takes(text: str) -> None:
        return None

    app.migrate()
    emoji = "💥" * 20_000  # 20,000 characters, 80,000 bytes of UTF-8
    with pytest.raises(SerializationError, match="exceeds the limit"):
        app.enqueue(takes, emoji)
    with pytest.raises(SerializationError, match="exceeds the limit"):
        app.enqueue_many(takes, [(emoji,)])
    app.enqueue(takes, "💥" * 15_000)  # 60,000 bytes: within


class _Garbage:
    """A serializer that writes text PostgreSQL refuses for one value: only the group commit can catch it."""

    def __init__(self) -> None:
        self.inner = pgdurable.serialization.JsonSerializer()

    def dumps(self, value: Any) -> str:
        return "{not json" if value == "garbage" else self.inner.dumps(value)

    def loads(self, text: str, type_hint: Any = Any) -> Any:
        return self.inner.loads(text, type_hint)


def test_a_write_the_database_refuses_is_charged_to_its_own_step(
        make_app: Callable[..., pgdurable.App], start_worker: Callable[..., Any]) -> None:
    app = make_app(serializer=_Garbage())
    gate = threading.Barrier(9, timeout=60)

    @app.step()
    def produce(value: str) -> str:
        gate.wait()  # all nine finish together, so their checkpoints go out in the same batches
        return value

    @app.workflow()
    def run(value: str) -> str:
        return produce(value)

    start_worker(app, concurrency=16)
    good = [app.enqueue(run, f"fine-{i}") for i in range(8)]
    bad = app.enqueue(run, "garbage")
    assert [h.result(timeout=90) for h in good] == [f"fine-{i}" for i in range(8)]
    with pytest.raises(pgdurable.WorkflowFailed) as failed:
        bad.result(timeout=90)
    assert failed.value.type == "pgdurable.errors.SerializationError"
    assert "'produce'" in failed.value.remote_message and "refused" in failed.value.remote_message
    for handle in good:
        row = app.get(handle.workflow_id)
        assert row is not None and row.recoveries == 0 and row.attempt == 1


def _claim_all(app: pgdurable.App, owner: str) -> list[store.claims.Claimed]:
    return app.db.run(store.claims.claim(queue="default", names=["noop"], owner=owner, lease=60, limit=100,
                                         version=app.version))


def test_group_commit_splits_a_refused_batch_and_keys_outcomes_by_attempt(app: pgdurable.App,
                                                                          database_url: str) -> None:
    @app.workflow()
    def noop() -> None:
        return None

    first, second = app.enqueue(noop).workflow_id, app.enqueue(noop).workflow_id
    claimed = {c.id: c for c in _claim_all(app, "w1")}
    assert set(claimed) == {first, second}
    now = datetime.now(UTC)

    def write(execution_id: str, attempt: int, step_id: int, output: str) -> StepWrite:
        return StepWrite(execution_id, attempt, step_id, "s", output, None, 1, now)

    # One write of the batch cannot be stored: only that one is refused.
    batch: list[tuple[Any, Any]] = [(write(first, 1, 0, '"ok"'), ThreadWaiter()),
                                    (write(second, 1, 0, "{not json"), ThreadWaiter()),
                                    (write(first, 1, 1, '"also ok"'), ThreadWaiter())]
    plan = _Plan(batch)
    with psycopg.connect(app.db.conninfo, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(app.schema)))
        plan.execute(conn)
        plan.settle(None)
        assert batch[0][1].result() is True and batch[2][1].result() is True
        with pytest.raises(SerializationError, match="refused"):
            batch[1][1].result()

        # The second execution is taken over (attempt 2). Writes of both attempts in one batch: the old one
        # learns it lost, even though the new one wrote the very same step.
        conn.execute("UPDATE workflow_executions SET attempt = 2 WHERE id = %s", (second,))
        batch = [(write(second, 1, 0, '"old"'), ThreadWaiter()), (write(second, 2, 0, '"new"'), ThreadWaiter())]
        plan = _Plan(batch)
        plan.execute(conn)
        plan.settle(None)
        assert batch[0][1].result() is False
        assert batch[1][1].result() is True
    assert [json.loads(s.output or "null") for s in app.steps(second)] == ["new"]


# ---- replays decide as the first run did -------------------------------------------------------------------

def test_a_custom_exception_replays_as_its_own_type(app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    @app.step(max_attempts=1)
    def charge() -> None:
        raise Declined(51, "insufficient funds")

    @app.step()
    def after(branch: str) -> str:
        return branch

    @app.workflow()
    def pay() -> str:
        try:
            charge()
        except Declined as exc:
            return after(f"declined:{exc.code}:{exc.reason}:{exc}")
        return after("other")

    start_worker(app)
    first = app.enqueue(pay).result(timeout=60)
    assert first == "declined:51:insufficient funds:declined with code 51: insufficient funds"
    replayed = app.fork(app.list_workflows()[0].id, 1)  # replays the recorded error of step 0
    assert replayed.result(timeout=60) == first


def test_exception_types_are_rebuilt_only_from_modules_already_imported() -> None:
    assert "json.tool" not in sys.modules
    rebuilt = failures.rebuild({"type": "json.tool.JSONDecodeError", "message": "x", "args": ["x"]})
    assert isinstance(rebuilt, StepFailed) and "json.tool" not in sys.modules  # never imported
    assert type(failures.rebuild({"type": "ValueError", "args": ["x"]})) is ValueError
    assert isinstance(failures.rebuild({"type": "os.system", "args": ["echo hi"]}), StepFailed)  # not a class
    exc = failures.rebuild(failures.describe(Declined(7, "no")))
    assert type(exc) is Declined and (exc.code, exc.reason, str(exc)) == (7, "no", "declined with code 7: no")

    class Local(Exception):
        pass

    text, raised = failures.recordable(Local("x"))
    assert isinstance(raised, StepFailed) and type(failures.rebuild(json.loads(text))) is StepFailed


def test_an_exception_class_a_replay_cannot_rebuild_is_what_the_first_run_raises(
        app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    class Local(Exception):
        pass

    @app.step(max_attempts=1)
    def fails() -> None:
        raise Local("defined inside a function")

    @app.workflow()
    def run() -> str:
        try:
            fails()
        except Local:
            return "local"
        except pgdurable.StepFailed as exc:
            return f"step-failed:{exc.error['message']}"
        return "none"

    start_worker(app)
    first = app.enqueue(run).result(timeout=60)
    assert first == "step-failed:defined inside a function"
    assert app.fork(app.list_workflows()[0].id, 1).result(timeout=60) == first


def test_a_child_id_conflict_is_recorded_and_replayed(app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    @app.workflow()
    def other() -> str:
        return "other"

    @app.workflow()
    def child() -> str:
        return "child"

    @app.step()
    def mark(branch: str) -> str:
        return branch

    @app.workflow()
    def parent() -> str:
        try:
            app.enqueue(child, workflow_id="taken-id")
        except WorkflowIdConflict as exc:
            return mark(f"conflict:{exc}")
        return mark("no conflict")

    start_worker(app)
    assert app.enqueue(other, workflow_id="taken-id").result(timeout=60) == "other"
    handle = app.enqueue(parent)
    first = handle.result(timeout=60)
    assert first.startswith("conflict:") and "'other'" in first
    steps = app.steps(handle.workflow_id)
    assert steps[0].step_name == "pgdurable.enqueue:child" and steps[0].output is None
    assert json.loads(steps[0].error or "{}")["type"] == "pgdurable.errors.WorkflowIdConflict"
    assert app.fork(handle.workflow_id, 1).result(timeout=60) == first  # the replay takes the same path


# ---- every way of creating an execution applies the same rules ---------------------------------------------

def test_times_out_of_range_are_refused_everywhere(app: pgdurable.App) -> None:
    for bad in (float("nan"), float("inf"), 1e300, -1, 0):
        with pytest.raises(ValueError, match="timeout_seconds"):
            app.workflow(name=f"t{bad}", timeout_seconds=bad)(lambda: None)

    @app.workflow()
    def noop() -> None:
        return None

    app.migrate()
    for bad in (float("nan"), float("inf"), 1e300, -1.0, 0.0):
        with pytest.raises(ValueError, match="timeout_seconds"):
            app.enqueue(noop, timeout_seconds=bad)
        with pytest.raises(ValueError, match="timeout_seconds"):
            app.start(noop, timeout_seconds=bad)
    for bad in (float("nan"), float("inf"), 1e12, -1.0):
        with pytest.raises(ValueError, match="delay"):
            app.enqueue(noop, delay=bad)
        with pytest.raises(ValueError, match="delay"):
            app.enqueue_many(noop, [()], delay=bad)
    for bad_id in ("", "x" * 201, "a\x00b", "\ud800", "sched:daily:2026-12-01T00:00:00Z"):
        with pytest.raises(ValueError, match="workflow_id"):
            app.enqueue(noop, workflow_id=bad_id)
        with pytest.raises(ValueError, match="workflow_id"):
            app.enqueue_many(noop, [()], workflow_ids=[bad_id])
    for bad_key in ("", "a\x00b"):
        with pytest.raises(ValueError, match="dedup_key"):
            app.enqueue(noop, dedup_key=bad_key)
    with pytest.raises(ValueError, match="priority"):
        app.enqueue(noop, priority=2 ** 31)
    with pytest.raises(ValueError, match="queue"):
        app.enqueue(noop, queue="no spaces")
    for bad_period in (float("nan"), float("inf"), 1e12, 0.0):
        with pytest.raises(ValueError, match="rate_period"):
            app.queue("limited", rate_limit=10, rate_period=bad_period)
    with pytest.raises(ValueError, match="concurrency"):
        app.queue("limited", concurrency=2 ** 31)
    assert app.list_workflows() == []


def test_every_way_of_creating_an_execution_applies_the_workflows_options(
        app: pgdurable.App, database_url: str, start_worker: Callable[..., Any]) -> None:
    @app.workflow(queue="parity", priority=3, max_recoveries=2, timeout_seconds=600)
    def job(n: int = 0) -> int:
        return n

    @app.workflow()
    def parent() -> str:
        return app.enqueue(job, 5, concurrency_key="tenant-a").workflow_id

    app.migrate()
    ids = {
        "enqueue": app.enqueue(job, 1, concurrency_key="tenant-a").workflow_id,
        "enqueue_many": app.enqueue_many(job, [(2,)])[0].workflow_id,
    }
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(sql.SQL("SELECT {}.enqueue_workflow('job', '{{\"n\": 3}}', 'parity', NULL, 3, NULL, "
                                   "NULL, 2, 600)").format(sql.Identifier(app.schema))).fetchone()
        assert row is not None
        ids["sql"] = row[0]
    ids["fork"] = app.fork(ids["enqueue"], 0).workflow_id
    app.schedule("parity-tick", job, "* * * * * *")
    start_worker(app, queues=["default"])  # runs the parent and fires the schedule; nothing claims 'parity'
    ids["child"] = app.enqueue(parent).result(timeout=60)
    ids["tick"] = wait_for(lambda: next((e.id for e in app.list_workflows(queue="parity")
                                         if e.id.startswith("sched:parity-tick:")), None), 60, "a schedule tick")
    rows = {how: app.get(execution_id) for how, execution_id in ids.items()}
    for how, row in rows.items():
        assert row is not None, how
        assert (row.queue, row.priority, row.max_recoveries, row.timeout_seconds) == ("parity", 3, 2, 600), how
    for how in ("enqueue", "fork", "child"):
        assert rows[how] is not None and rows[how].concurrency_key == "tenant-a", how  # type: ignore[union-attr]


def test_start_respects_the_queues_limits(app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    running = {"now": 0, "most": 0}
    lock = threading.Lock()

    @app.step()
    def hold() -> None:
        with lock:
            running["now"] += 1
            running["most"] = max(running["most"], running["now"])
        time.sleep(0.3)
        with lock:
            running["now"] -= 1

    @app.workflow(queue="one-at-a-time")
    def job(n: int) -> int:
        hold()
        return n

    app.queue("one-at-a-time", concurrency=1)
    app.migrate()
    app.apply_queue_policies()
    handles = [app.start(job, n) for n in range(3)]
    start_worker(app, queues=["one-at-a-time"])
    assert [h.result(timeout=90) for h in handles] == [0, 1, 2]
    assert running["most"] == 1


def test_sys_exit_or_keyboardinterrupt_from_a_workflow_fails_it_and_the_worker_goes_on(
        app: pgdurable.App, spawn_worker: Callable[..., Any]) -> None:
    """A workflow whose code raises SystemExit or KeyboardInterrupt once ended the worker process that ran
    it, and, its lease expired, every worker that claimed it after: a poison pill for the whole queue."""
    flows = crashy.define(app)
    worker = spawn_worker("tests.apps.crashy:app")
    expected = {flows.exits_in_a_step: "SystemExit: 3", flows.exits_on_the_loop: "SystemExit: 4",
                flows.interrupts_in_a_thread: "KeyboardInterrupt", flows.interrupts_on_the_loop: "KeyboardInterrupt"}
    for flow, error in expected.items():
        with pytest.raises(pgdurable.WorkflowFailed, match=error):
            app.enqueue(flow).result(timeout=WAIT)
    assert app.enqueue(flows.chain, 1, 0.0).result(timeout=WAIT)["labels"] == ["s0"]  # the same process
    assert worker.poll() is None


def test_a_steps_value_is_the_same_in_the_first_run_and_in_its_replays(
        app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    """JSON makes a tuple a list and a dict's int keys strings. The first run once saw the step's own value
    and its replays the stored one: code like ``d[1]`` worked until the first replay (after a sleep, a crash,
    a deploy), then failed with KeyError."""

    @app.step()
    def numbered() -> Any:
        return {1: "one"}

    @app.step()
    def pair():  # unannotated: read back as JSON gives it
        return (1, 2)

    @app.step()
    def typed() -> dict[int, tuple[int, int]]:
        return {1: (1, 2)}

    @app.transaction()
    def in_a_transaction(conn: psycopg.Connection[Any]) -> Any:
        return {2: "two"}

    @app.step()
    def seen(text: str) -> str:
        return text  # recorded: what the first run saw, which its replay reads back

    @app.workflow()
    def flow() -> dict[str, str]:
        values = [numbered(), pair(), typed(), in_a_transaction(), 7, "x"]
        first = seen(repr(values))
        pgdurable.sleep(0.2)  # the workflow resumes by replaying the steps above
        return {"first": first, "replayed": repr(values)}

    start_worker(app)
    result = app.enqueue(flow).result(timeout=WAIT)
    assert result["first"] == result["replayed"] == "[{'1': 'one'}, [1, 2], {1: (1, 2)}, {'2': 'two'}, 7, 'x']"
