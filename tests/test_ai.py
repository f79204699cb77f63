"""Durable Pydantic AI agents (pgdurable.ai) on a real PostgreSQL, their models scripted (tests/apps/agents.py):
a run's model requests and tool calls are checkpointed steps, a SIGKILLed worker's run resumes without
calling the model again for a recorded turn nor repeating a recorded tool effect, and a tool that needs
approval waits for a message."""

from __future__ import annotations

import json
import signal
import subprocess
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.models.test import TestModel

import pgdurable
from pgdurable.ai import DurableAgent
from tests.apps import agents
from tests.conftest import ThreadWorker
from tests.harness import WAIT, execution, wait_for


class Setup:
    def __init__(self, app: pgdurable.App, db: psycopg.Connection[Any], schema: str, tmp_path: Path) -> None:
        self.app, self.db = app, db
        self.table = f"{schema}.agent_rows"
        self.effects = tmp_path / "effects.log"
        self.gate = tmp_path / "gate"
        db.execute("CREATE TABLE agent_rows (id serial PRIMARY KEY, note text NOT NULL, pid int NOT NULL)")

    def env(self) -> dict[str, str]:
        return {"AGENT_EFFECTS": str(self.effects), "AGENT_TABLE": self.table, "AGENT_GATE": str(self.gate)}

    def lines(self) -> list[tuple[str, int]]:
        text = self.effects.read_text() if self.effects.exists() else ""
        return [(label, int(pid)) for label, pid in (line.split() for line in text.splitlines())]

    def labels(self) -> Counter[str]:
        return Counter(label for label, _ in self.lines())

    def rows(self) -> list[tuple[str, int]]:
        return [(note, pid) for note, pid in self.db.execute("SELECT note, pid FROM agent_rows ORDER BY id")]

    def step_names(self, workflow_id: str) -> list[str]:
        return [s.step_name for s in self.app.steps(workflow_id)]


@pytest.fixture
def setup(app: pgdurable.App, db: psycopg.Connection[Any], schema: str, tmp_path: Path) -> Setup:
    return Setup(app, db, schema, tmp_path)


@pytest.fixture
def local(setup: Setup, start_worker: Callable[..., ThreadWorker]) -> Iterator[Any]:
    """The agents defined on the test's app, served by a worker in this process."""
    defined = agents.define(setup.app, str(setup.effects), setup.table, None)
    start_worker(setup.app)
    yield defined


def test_a_run_is_a_workflow_of_model_request_and_tool_call_steps(setup: Setup, local: Any) -> None:
    handle = setup.app.enqueue(local.probe.workflow, "go", workflow_id="probe-plain")
    assert handle.result(timeout=WAIT) == "done: [1, 'resumed']"
    assert setup.step_names("probe-plain") == [
        "probe.model_request", "probe.tool.write_row", "probe.model_request", "probe.tool.pause",
        "probe.model_request"]
    assert setup.labels() == {"probe.model1": 1, "probe.write_row": 1, "probe.model2": 1, "probe.pause": 1,
                              "probe.model3": 1}
    assert [note for note, _ in setup.rows()] == ["probe"]


def test_structured_output_and_sync_tools_with_pydantic_ais_test_model(
        setup: Setup, start_worker: Callable[..., ThreadWorker]) -> None:
    class Verdict(BaseModel):
        refund: bool
        cents: int

    agent = Agent(TestModel(), name="judge", output_type=Verdict)

    @agent.tool_plain
    def price(order_id: int) -> int:  # a sync tool: Pydantic AI runs it on a thread, inside its step
        return 1000 + order_id

    durable = DurableAgent(setup.app, agent)
    start_worker(setup.app)
    assert setup.app.enqueue(durable.workflow, "judge", workflow_id="judge-1").result(timeout=WAIT) == {
        "refund": False, "cents": 0}
    # The output tool is no step: the output comes from the recorded response, the same on every replay.
    assert setup.step_names("judge-1") == ["judge.model_request", "judge.tool.price", "judge.model_request"]
    assert json.loads(setup.app.steps("judge-1")[1].output or "null") == {"value": 1000}


def test_approval_waits_for_a_message_then_runs_or_skips_the_tool(setup: Setup, local: Any) -> None:
    approved = setup.app.enqueue(local.gated.workflow, "go", workflow_id="gated-yes")
    denied = setup.app.enqueue(local.gated.workflow, "go", workflow_id="gated-no")
    for wid in ("gated-yes", "gated-no"):
        pending = setup.app.get_event(wid, "approval", timeout=WAIT)
        assert pending["tool_name"] == "write_row" and pending["args"] == {"note": "approved"}, pending
        wait_for(lambda w=wid: execution(setup.app, w).status == "waiting", WAIT, f"{wid} to wait")
    assert setup.rows() == []  # nothing written before a human answered

    setup.app.send("gated-yes", {"approved": True}, topic="approval")
    setup.app.send("gated-no", {"approved": False, "reason": "not today"}, topic="approval")
    assert approved.result(timeout=WAIT) == "done: [1]"
    assert denied.result(timeout=WAIT) == "done: ['A human denied this call of write_row: not today']"
    assert [note for note, _ in setup.rows()] == ["approved"]
    # Each run replayed after its wait: per run, each turn's model call happened once; the tool ran once in all.
    assert setup.labels() == {"gated.model1": 2, "gated.model2": 2, "gated.write_row": 1}
    assert setup.app.get_event("gated-yes", "approval") is None
    assert "gated.tool.write_row" not in setup.step_names("gated-no")


def test_killed_worker_resumes_without_repeating_model_calls_or_tool_effects(
        setup: Setup, spawn_worker: Callable[..., subprocess.Popen[bytes]], database_url: str, schema: str) -> None:
    setup.gate.touch()
    env = setup.env()
    # A lease no stall of a loaded machine outlasts: the first worker must not lose the run before it is killed
    # (it would then run its unrecorded model call again itself, which is not what this test is about).
    first = spawn_worker("tests.apps.agents:app", "-c", "2", env={**env, "AGENT_LEASE": "6.0"})
    handle = setup.app.enqueue("probe.run", prompt="go", workflow_id="probe-crash")
    # The transactional tool committed, the second turn is recorded, and the pause tool is running: kill.
    wait_for(lambda: setup.labels()["probe.pause"] == 1, WAIT, "the run to reach its second tool call")
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=WAIT)
    recorded = setup.step_names("probe-crash")
    assert recorded == ["probe.model_request", "probe.tool.write_row", "probe.model_request"]

    setup.gate.unlink()
    second = spawn_worker("tests.apps.agents:app", "-c", "2", env=env)
    assert handle.result(timeout=WAIT) == "done: [1, 'resumed']"

    lines = setup.lines()
    assert [pid for label, pid in lines if label.startswith("probe.model")] == [first.pid, first.pid, second.pid]
    assert setup.labels() == {"probe.model1": 1, "probe.model2": 1, "probe.model3": 1, "probe.write_row": 1,
                              "probe.pause": 2}  # the unrecorded pause ran again; nothing recorded did
    assert setup.rows() == [("probe", first.pid)]
    assert setup.step_names("probe-crash") == [*recorded, "probe.tool.pause", "probe.model_request"]
    assert execution(setup.app, "probe-crash").attempt == 2
