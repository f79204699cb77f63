"""A pgdurable app for tests that run real worker processes and crash, stop or kill them.

Served by ``python -m pgdurable worker tests.apps.crashy:app`` (the ``spawn_worker`` fixture), which sets
PGDURABLE_DATABASE_URL and PGDURABLE_SCHEMA. Timings come from the environment so that one test can
shorten or lengthen them:

  CRASHY_LEASE            lease_seconds (default 2.0)
  CRASHY_GRACE            shutdown_grace_seconds (default 1.0)
  CRASHY_PATIENCE         shutdown_patience_seconds (default 15.0)
  CRASHY_UNKNOWN_GRACE    unknown_workflow_grace_seconds (default 1.0)
  CRASHY_EFFECTS          file that every step run appends its side effects to
  CRASHY_SLOW             factor on every crashy.work step's sleep in this process (default 1)

Each step run appends two lines to CRASHY_EFFECTS (one write each, O_APPEND, so lines of concurrent
processes never interleave):

  <workflow_id> <label> <pid> begin <start> <start>
  <workflow_id> <label> <pid> end <start> <end>

``define(app)`` registers the same workflows on any App, so a test can enqueue with the real definitions
(and their decorator defaults, such as max_recoveries) on its own App pointed at the test schema.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from types import SimpleNamespace
from typing import Any

import pgdurable


def _effect(label: str, phase: str, start: float, end: float) -> None:
    path = os.environ.get("CRASHY_EFFECTS")
    if not path:
        return
    line = f"{pgdurable.current_workflow_id()} {label} {os.getpid()} {phase} {start:.6f} {end:.6f}\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def define(app: pgdurable.App) -> SimpleNamespace:
    """Register crashy's workflows and steps on ``app``."""

    @app.step(name="crashy.work", max_attempts=1)
    def work(label: str, seconds: float) -> dict[str, Any]:
        start = time.time()
        _effect(label, "begin", start, start)
        time.sleep(seconds * float(os.environ.get("CRASHY_SLOW", "1")))
        _effect(label, "end", start, time.time())
        return {"label": label, "pid": os.getpid()}

    @app.step(name="crashy.die", max_attempts=1)
    def die(label: str) -> None:
        start = time.time()
        _effect(label, "begin", start, start)
        os.kill(os.getpid(), signal.SIGKILL)  # the worker process dies mid-step, every time
        time.sleep(60)  # pragma: no cover

    @app.workflow(name="crashy.chain")
    def chain(steps: int, seconds: float = 0.05, long_step: int = -1,
              long_seconds: float = 0.0) -> dict[str, Any]:
        """``steps`` steps s0..s{n-1}; step ``long_step`` sleeps ``long_seconds`` instead."""
        results = [work(f"s{i}", long_seconds if i == long_step else seconds) for i in range(steps)]
        return {"pid": os.getpid(), "labels": [r["label"] for r in results],
                "step_pids": [r["pid"] for r in results]}

    @app.workflow(name="crashy.suicide", max_recoveries=2)
    def suicide() -> str:
        work("before", 0.0)
        die("die")
        return "unreachable"

    @app.workflow(name="crashy.stubborn")
    async def stubborn() -> None:
        """Swallows every cancellation, as no workflow should: its worker's stop can never end by itself."""
        start = time.time()
        _effect("stubborn", "begin", start, start)
        while True:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(3600)

    @app.step(name="crashy.exits", max_attempts=1)
    def exits(code: int) -> None:
        sys.exit(code)  # as library code does (argparse refusing its arguments, a CLI's main)

    @app.workflow(name="crashy.exits_in_a_step")
    def exits_in_a_step() -> None:
        exits(3)

    @app.workflow(name="crashy.exits_on_the_loop")
    async def exits_on_the_loop() -> None:
        sys.exit(4)  # on the worker's event loop, which runs on the process's main thread

    @app.workflow(name="crashy.interrupts_in_a_thread")
    def interrupts_in_a_thread() -> None:
        raise KeyboardInterrupt  # raised by code: a workflow thread is never interrupted by a signal

    @app.workflow(name="crashy.interrupts_on_the_loop")
    async def interrupts_on_the_loop() -> None:
        raise KeyboardInterrupt  # under pgdurable worker, SIGINT is a graceful stop: this is the code's

    return SimpleNamespace(work=work, die=die, chain=chain, suicide=suicide, stubborn=stubborn,
                           exits_in_a_step=exits_in_a_step, exits_on_the_loop=exits_on_the_loop,
                           interrupts_in_a_thread=interrupts_in_a_thread,
                           interrupts_on_the_loop=interrupts_on_the_loop)


app = pgdurable.App(
    lease_seconds=float(os.environ.get("CRASHY_LEASE", "2.0")),
    sweep_seconds=0.3,
    poll_seconds=0.3,
    shutdown_grace_seconds=float(os.environ.get("CRASHY_GRACE", "1.0")),
    shutdown_patience_seconds=float(os.environ.get("CRASHY_PATIENCE", "15.0")),
    unknown_workflow_grace_seconds=float(os.environ.get("CRASHY_UNKNOWN_GRACE", "1.0")),
)
workflows = define(app)
