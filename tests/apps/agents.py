"""Durable Pydantic AI agents for tests/test_ai.py, played by scripted models (FunctionModel: no network).

Served by ``python -m pgdurable worker tests.apps.agents:app`` (the ``spawn_worker`` fixture sets
PGDURABLE_DATABASE_URL and PGDURABLE_SCHEMA); the environment says where effects go:

  AGENT_EFFECTS   file that each model call and each tool run appends a line to: ``<label> <pid>``
  AGENT_TABLE     the table (``schema.name``) the transactional tools insert into
  AGENT_GATE      while this file exists, the ``pause`` tool waits (a test kills the worker meanwhile)
  AGENT_LEASE     lease_seconds (default 2.0)

``define(app, ...)`` registers the same agents on any App, so in-process tests run them on theirs.
"""

from __future__ import annotations

import asyncio
import os
import time
from types import SimpleNamespace

from psycopg import sql
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import pgdurable
from pgdurable.ai import DurableAgent, connection

GATE_LIMIT_SECONDS = 120.0  # a gated pause ends on its own, so a test that fails leaves no stuck process


def effect(path: str, label: str) -> None:
    """One line per effect, one write each (O_APPEND): lines of concurrent processes never interleave."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{label} {os.getpid()}\n".encode())
    finally:
        os.close(fd)


def turn(messages: list[ModelMessage]) -> int:
    return sum(isinstance(m, ModelResponse) for m in messages) + 1


def tool_results(messages: list[ModelMessage]) -> list[object]:
    return [part.content for m in messages for part in m.parts if isinstance(part, ToolReturnPart)]


def define(app: pgdurable.App, effects: str, table: str, gate: str | None) -> SimpleNamespace:
    target = sql.Identifier(*table.split("."))

    async def insert(note: str) -> int:
        cur = await connection().execute(
            sql.SQL("INSERT INTO {} (note, pid) VALUES (%s, %s) RETURNING id").format(target), (note, os.getpid()))
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])

    def probe_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        """Write a row, pause, then answer with what the tools returned."""
        n = turn(messages)
        effect(effects, f"probe.model{n}")
        if n == 1:
            return ModelResponse(parts=[ToolCallPart("write_row", {"note": "probe"})])
        if n == 2:
            return ModelResponse(parts=[ToolCallPart("pause", {})])
        return ModelResponse(parts=[TextPart(f"done: {tool_results(messages)}")])

    probe = Agent(FunctionModel(probe_model), name="probe")

    @probe.tool_plain
    async def write_row(note: str) -> int:
        effect(effects, "probe.write_row")
        return await insert(note)

    @probe.tool_plain
    async def pause() -> str:
        effect(effects, "probe.pause")
        deadline = time.monotonic() + GATE_LIMIT_SECONDS
        while gate and os.path.exists(gate) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return "resumed"

    def gated_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        """Ask to delete a row (a call that needs approval), then report what happened."""
        n = turn(messages)
        effect(effects, f"gated.model{n}")
        if n == 1:
            return ModelResponse(parts=[ToolCallPart("write_row", {"note": "approved"})])
        return ModelResponse(parts=[TextPart(f"done: {tool_results(messages)}")])

    gated = Agent(FunctionModel(gated_model), name="gated")

    @gated.tool_plain(name="write_row")
    async def gated_write_row(note: str) -> int:
        effect(effects, "gated.write_row")
        return await insert(note)

    return SimpleNamespace(
        probe=DurableAgent(app, probe, transactional={"write_row"}),
        gated=DurableAgent(app, gated, transactional={"write_row"}, approval={"write_row"}),
    )


app = pgdurable.App(lease_seconds=float(os.environ.get("AGENT_LEASE", "2.0")), sweep_seconds=0.3, poll_seconds=0.3,
                    shutdown_grace_seconds=1.0)
agents = define(app, os.environ.get("AGENT_EFFECTS", os.devnull), os.environ.get("AGENT_TABLE", "agent_rows"),
                os.environ.get("AGENT_GATE"))
