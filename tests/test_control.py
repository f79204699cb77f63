"""Control: deadlines (propagated to children), cascading cancel that stops a running workflow at once,
resume, fork from a step; and versioning: version stamps, strict workers resuming only their own version, and
patched() for changing a workflow's code under executions in flight (adoption: tests/test_versions.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql

import pgdurable
from tests.harness import WAIT, execution, wait_for


def test_timeout_fails_a_sleeping_workflow_and_its_children(app: pgdurable.App,
                                                            start_worker: Callable[..., Any]) -> None:
    @app.workflow()
    def child() -> str:
        pgdurable.sleep(60)
        return "never"

    @app.workflow(timeout_seconds=1.0)
    def parent() -> str:
        return str(app.enqueue(child, workflow_id="late-child").result())

    start_worker(app)
    handle = app.enqueue(parent, workflow_id="late-parent")
    with pytest.raises(pgdurable.WorkflowTimeout) as failure:
        handle.result(timeout=WAIT)
    assert failure.value.type == "pgdurable.WorkflowTimeout"
    wait_for(lambda: execution(app, "late-child").status == "failed", WAIT, "the child to time out too")
    parent_row, child_row = execution(app, "late-parent"), execution(app, "late-child")
    assert child_row.deadline == parent_row.deadline  # inherited
    assert child_row.error_info["type"] == "pgdurable.WorkflowTimeout"


def test_timeout_stops_a_running_workflow_between_steps(app: pgdurable.App,
                                                        start_worker: Callable[..., Any]) -> None:
    ran: list[int] = []

    @app.step()
    def tick(i: int) -> int:
        ran.append(i)
        time.sleep(0.2)
        return i

    @app.workflow()
    def busy() -> None:
        for i in range(100):
            tick(i)

    runner = start_worker(app)
    handle = app.enqueue(busy, timeout_seconds=1.0)
    with pytest.raises(pgdurable.WorkflowTimeout):
        handle.result(timeout=WAIT)
    stopped_at = len(ran)
    # once the worker has let go of the attempt (no step thread either), no further step can start
    wait_for(lambda: handle.workflow_id not in runner.worker.running and runner.worker.busy_threads == 0, WAIT,
             "the worker to drop the timed-out attempt")
    assert len(ran) <= stopped_at + 1, "a timed-out workflow must stop running steps"
    assert stopped_at < 20


def test_cancel_cascades_and_a_cancelled_workflow_runs_no_further_step(
        app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    in_step, release = threading.Event(), threading.Event()
    ran: list[str] = []

    @app.step()
    def blocking() -> None:
        ran.append("blocking")
        in_step.set()
        release.wait(WAIT)

    @app.step()
    def after() -> None:
        ran.append("after")

    @app.workflow()
    def victim() -> None:
        blocking()
        after()

    @app.workflow()
    def sleepy_child() -> None:
        pgdurable.sleep(60)

    @app.workflow()
    def family() -> None:
        handles = [app.enqueue(sleepy_child) for _ in range(3)]
        pgdurable.gather(handles)

    runner = start_worker(app)
    handle = app.enqueue(victim, workflow_id="victim")
    assert in_step.wait(WAIT)
    assert app.cancel("victim") is True
    release.set()
    with pytest.raises(pgdurable.WorkflowCancelled):
        handle.result(timeout=WAIT)
    # the worker lets go of the attempt once its checkpoint is refused: from then on no step can run
    wait_for(lambda: "victim" not in runner.worker.running and runner.worker.busy_threads == 0, WAIT,
             "the worker to drop the cancelled attempt")
    assert ran == ["blocking"]  # the step in flight finished, its checkpoint was refused, no step after
    assert app.steps("victim") == []

    parent = app.enqueue(family, workflow_id="family")
    wait_for(lambda: len(app.children("family")) == 3 and execution(app, "family").status == "waiting", WAIT,
             "the family to wait for its children")
    assert app.cancel("family") is True
    assert {row[2] for row in app.children("family")} == {"cancelled"}
    with pytest.raises(pgdurable.WorkflowCancelled):
        parent.result(timeout=WAIT)
    assert app.cancel("family") is False  # already finished


def test_resume_a_cancelled_workflow_and_fork_from_a_step(app: pgdurable.App,
                                                          start_worker: Callable[..., Any]) -> None:
    calls: list[str] = []

    @app.step()
    def record(label: str) -> str:
        calls.append(label)
        return label

    @app.workflow()
    def three(tag: str) -> list[str]:
        out = [record(f"{tag}-a"), record(f"{tag}-b")]
        pgdurable.recv("go", timeout=60)
        out.append(record(f"{tag}-c"))
        return out

    start_worker(app)
    handle = app.enqueue(three, "x", workflow_id="orig")
    wait_for(lambda: execution(app, "orig").status == "waiting", WAIT, "the workflow to wait")
    app.cancel("orig")
    assert app.resume("orig") is True
    app.send("orig", None, topic="go")
    assert handle.result(timeout=WAIT) == ["x-a", "x-b", "x-c"]
    assert calls == ["x-a", "x-b", "x-c"]  # resume kept the recorded steps

    forked = app.fork("orig", from_step=1, new_workflow_id="fork-1")
    app.send("fork-1", None, topic="go")
    assert forked.result(timeout=WAIT) == ["x-a", "x-b", "x-c"]
    assert calls == ["x-a", "x-b", "x-c", "x-b", "x-c"]  # step 0 reused, steps 1 onwards ran again
    row = execution(app, "fork-1")
    assert row.forked_from == "orig"
    with pytest.raises(pgdurable.WorkflowNotFound):
        app.fork("no-such", from_step=0)
    with pytest.raises(pgdurable.WorkflowIdConflict):
        app.fork("orig", from_step=0, new_workflow_id="fork-1")


def test_versions_are_stamped_and_only_matching_workers_resume_in_strict_mode(
        make_app: Callable[..., pgdurable.App], start_worker: Callable[..., Any], database_url: str) -> None:
    v1 = make_app(app_version="v1")

    @v1.workflow(name="job")
    def job_v1() -> str:
        pgdurable.recv(timeout=60)
        return "v1"

    v2 = make_app(app_version="v2", adopt_after_seconds=None)  # strict: never adopts another version's

    @v2.workflow(name="job")
    def job_v2() -> str:
        pgdurable.recv(timeout=60)
        return "v2"

    @v2.workflow(name="later")
    def later_v2() -> str:
        return "later"

    old_worker = start_worker(v1)
    started = v1.enqueue(job_v1, workflow_id="started-on-v1")
    wait_for(lambda: execution(v1, "started-on-v1").status == "waiting", WAIT, "it to wait")
    assert execution(v1, "started-on-v1").app_version == "v1"
    old_worker.stop()

    start_worker(v2)
    fresh = v2.enqueue(job_v2, workflow_id="fresh")  # not started yet: any version may take it
    wait_for(lambda: execution(v2, "fresh").status == "waiting", WAIT, "the new one to wait")
    assert execution(v2, "fresh").app_version == "v2"
    v2.send("started-on-v1", None)
    v2.send("fresh", None)
    assert fresh.result(timeout=WAIT) == "v2"
    # Enqueued after "started-on-v1" was made runnable, with the same priority: a claim that ignored versions
    # would take the older one first. Once it has run, the v2 worker has had its chance and passed.
    assert v2.enqueue(later_v2).result(timeout=WAIT) == "later"
    assert execution(v2, "started-on-v1").status == "enqueued"  # left for a v1 worker
    with psycopg.connect(database_url) as conn:
        reason = conn.execute(sql.SQL("SELECT reason FROM {}.unrunnable_executions WHERE id = 'started-on-v1'")
                              .format(sql.Identifier(v2.schema))).fetchone()
    assert reason == ("no live worker runs application version v1 or adopts other versions",)
    start_worker(v1)
    assert started.result(timeout=WAIT) == "v1"


def test_default_version_is_a_stable_hash_of_workflow_code(make_app: Callable[..., pgdurable.App]) -> None:
    a, b = make_app(), make_app()
    for app in (a, b):
        @app.workflow(name="same")
        def same() -> int:
            return 1
    assert a.version == b.version and len(a.version) == 12
    c = make_app()

    @c.workflow(name="same")
    def different() -> int:
        return 2
    assert c.version != a.version
    assert make_app(app_version="release-7").version == "release-7"


def test_patched_keeps_old_executions_on_their_old_path(make_app: Callable[..., pgdurable.App],
                                                        start_worker: Callable[..., Any]) -> None:
    before = make_app(app_version="stable")
    log: list[str] = []

    @before.step()
    def old_step() -> str:
        log.append("old")
        return "old"

    @before.workflow(name="evolving")
    def evolving_v1() -> list[str]:
        first = pgdurable.recv(timeout=60)
        return [str(first), old_step()]

    runner = start_worker(before)
    in_flight = before.enqueue(evolving_v1, workflow_id="in-flight")
    wait_for(lambda: execution(before, "in-flight").status == "waiting", WAIT, "it to wait")
    runner.stop()

    after = make_app(app_version="stable")

    @after.step(name="old_step")
    def old_step_again() -> str:
        log.append("old")
        return "old"

    @after.step()
    def new_step() -> str:
        log.append("new")
        return "new"

    @after.workflow(name="evolving")
    def evolving_v2() -> list[str]:
        first = pgdurable.recv(timeout=60)
        if pgdurable.patched("use-new-step"):
            return [str(first), new_step()]
        return [str(first), old_step_again()]

    start_worker(after)
    # The in-flight execution had not reached the change: it takes the new path from there on.
    after.send("in-flight", "m1")
    assert in_flight.result(timeout=WAIT) == ["m1", "new"]

    # An execution that recorded the old step before the change replays the old path.
    with psycopg.connect(after.db.conninfo) as conn:
        conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(after.schema)))
        conn.execute("INSERT INTO workflow_executions (id, name, status, input, app_version) "
                     "VALUES ('replayed', 'evolving', 'enqueued', '{}', 'stable')")
        conn.execute("INSERT INTO operation_outputs (execution_id, step_id, step_name, output, "
                     "recorded_by_attempt, started_at) VALUES ('replayed', 0, 'pgdurable.recv.deadline', "
                     "'null', 1, now()), ('replayed', 1, 'pgdurable.recv', '\"m0\"', 1, now()), "
                     "('replayed', 2, 'old_step', '\"old\"', 1, now())")
        conn.execute("UPDATE workflow_executions SET attempt = 1 WHERE id = 'replayed'")
        conn.commit()
    assert after.handle("replayed").result(timeout=WAIT) == ["m0", "old"]
    assert log == ["new"]  # the replayed old step came from its record; nothing ran twice
    fresh = after.enqueue(evolving_v2)
    after.send(fresh.workflow_id, "m2")
    assert fresh.result(timeout=WAIT) == ["m2", "new"]


def test_cli_send_fork_show_and_queue_policies(app: pgdurable.App, database_url: str, schema: str,
                                               start_worker: Callable[..., Any]) -> None:
    import json

    from typer.testing import CliRunner

    from pgdurable.cli import cli

    def run(*args: str) -> Any:
        return CliRunner().invoke(cli, [*args, "--database-url", database_url, "--schema", schema])

    @app.step()
    def shout(text: str) -> str:
        return text.upper()

    @app.workflow()
    def echo() -> str:
        heard = pgdurable.recv("say", timeout=30)
        pgdurable.set_event("heard", heard)
        return shout(str(heard))

    start_worker(app)
    handle = app.enqueue(echo, workflow_id="cli-echo")
    wait_for(lambda: execution(app, "cli-echo").status == "waiting", WAIT, "it to wait")
    bad = run("workflows", "send", "cli-echo", "{not json")
    assert bad.exit_code == 2 and "JSON" in bad.output
    assert run("workflows", "send", "nobody", '"x"').exit_code == 1
    sent = run("workflows", "send", "cli-echo", '"hi"', "--topic", "say", "--json")
    assert json.loads(sent.output) == {"id": "cli-echo", "sent": True}
    assert handle.result(timeout=WAIT) == "HI"
    shown = json.loads(run("workflows", "show", "cli-echo", "--json").output)
    assert shown["events"][0]["key"] == "heard" and shown["events"][0]["value"] == "hi"
    assert shown["messages"][0]["message"] == "hi" and shown["messages"][0]["consumed_at"]
    assert shown["app_version"] == app.version

    forked = json.loads(run("workflows", "fork", "cli-echo", "--from-step", "3", "--json").output)
    assert app.handle(forked["forked"]).result(timeout=WAIT) == "HI"  # the receive was reused, shout ran again
    assert run("workflows", "fork", "nobody", "--from-step", "0").exit_code == 1

    stored = run("queues", "set", "emails", "--concurrency", "5", "--rate-limit", "10", "--rate-period", "60")
    assert stored.exit_code == 0
    listed = json.loads(run("queues", "list", "--json").output)
    assert listed == [{"name": "emails", "concurrency": 5, "worker_concurrency": None, "rate_limit": 10,
                       "rate_period_seconds": 60.0, "key_concurrency": None}]
    assert run("queues", "set", "emails", "--rate-limit", "10").exit_code == 2
    assert run("queues", "set", "emails").exit_code == 0  # no limits: removed
    assert json.loads(run("queues", "list", "--json").output) == []
