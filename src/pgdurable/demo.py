"""``pgdurable demo``: workflows survive a SIGKILLed worker and finish from their checkpoints on another.

The module-level ``app`` is what the demo's worker processes serve (``pgdurable worker pgdurable.demo:app``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console

from .app import App

SCHEMA = "pgdurable_demo"
STEP_SECONDS = 0.7

# Short leases so that the demo's second worker takes over within seconds of the kill.
app = App(schema=SCHEMA, lease_seconds=2.0, sweep_seconds=0.5, poll_seconds=0.5, max_recoveries=3)


def _effect(order: int, what: str) -> str:
    """A step's side effect: a line in a log file, so the demo can count how often each step really ran."""
    time.sleep(STEP_SECONDS)
    with open(os.environ["PGDURABLE_DEMO_LOG"], "a") as log:
        log.write(f"{order} {what}\n")
    return f"{what} done for order {order}"


@app.step()
def reserve_stock(order: int) -> str:
    return _effect(order, "reserve_stock")


@app.step()
def charge_card(order: int) -> str:
    return _effect(order, "charge_card")


@app.step()
def ship(order: int) -> str:
    return _effect(order, "ship")


@app.step()
def send_receipt(order: int) -> str:
    return _effect(order, "send_receipt")


@app.workflow(name="demo.fulfil_order")
def fulfil_order(order: int) -> list[str]:
    return [reserve_stock(order), charge_card(order), ship(order), send_receipt(order)]


STEPS = ["reserve_stock", "charge_card", "ship", "send_receipt"]


def _start_worker(env: dict[str, str], concurrency: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "pgdurable", "worker", "pgdurable.demo:app", "--concurrency", str(concurrency)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _recorded(ids: list[str]) -> dict[str, list[Any]]:
    return {i: app.steps(i) for i in ids}


def run_demo(database_url: str | None, count: int, console: Console) -> int:
    url = database_url or os.environ.get("PGDURABLE_DATABASE_URL") or os.environ.get("DATABASE_URL")
    if url is None:
        from .embedded import embedded_database_url

        url = embedded_database_url()
        console.print(f"[bold]1.[/bold] Using the embedded PostgreSQL ({url})")
    else:
        console.print("[bold]1.[/bold] Using the configured PostgreSQL")
    os.environ["PGDURABLE_DATABASE_URL"] = url  # the module's app, and the workers, use it
    run = uuid.uuid4().hex[:6]
    log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"pgdurable-demo-{run}.log"
    log_path.write_text("")
    env = {**os.environ, "PGDURABLE_DEMO_LOG": str(log_path)}

    ids = [f"demo-{run}-order-{n}" for n in range(1, count + 1)]
    for n, workflow_id in enumerate(ids, start=1):
        app.enqueue(fulfil_order, n, workflow_id=workflow_id)
    console.print(f"[bold]2.[/bold] Enqueued {count} workflows of {len(STEPS)} steps each "
                  f"({STEP_SECONDS}s per step): {', '.join(ids)}")

    first = _start_worker(env, count)
    console.print(f"[bold]3.[/bold] Started worker A (pid {first.pid})")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done = sum(len(steps) for steps in _recorded(ids).values())
        if done >= count * 2:
            break
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait()
    before = _recorded(ids)
    console.print("[bold]4.[/bold] [red]SIGKILLed worker A[/red] mid-workflow. Checkpoints so far:")
    for workflow_id in ids:
        names = [s.step_name for s in before[workflow_id]]
        console.print(f"   {workflow_id}: {len(names)}/{len(STEPS)} steps recorded {names}", soft_wrap=True)

    second = _start_worker(env, count)
    console.print(f"[bold]5.[/bold] Started worker B (pid {second.pid}): when A's 2 s leases expire it "
                  "takes the workflows over and resumes them from their checkpoints", soft_wrap=True)
    try:
        results = [app.handle(i).result(timeout=90) for i in ids]
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(timeout=30)
    after = _recorded(ids)

    runs = Counter(tuple(line.split()) for line in log_path.read_text().splitlines())
    console.print("[bold]6.[/bold] Every step, the attempt that recorded it, and how often it really ran:")
    reran_completed = 0
    for n, workflow_id in enumerate(ids, start=1):
        completed_before = {s.step_id for s in before[workflow_id]}
        for s in after[workflow_id]:
            times = runs[(str(n), s.step_name)]
            origin = "worker A" if s.recorded_by_attempt == 1 else "worker B"
            note = ""
            if s.step_id in completed_before:
                note = "recorded before the kill, not run again" if times == 1 else "[red]RAN AGAIN[/red]"
                reran_completed += times != 1
            elif times > 1:
                note = "was in flight at the kill: ran again (steps are at-least-once)"
            console.print(f"   order {n} #{s.step_id} {s.step_name:<13} by {origin}, ran {times}x  {note}",
                          soft_wrap=True)
    log_path.unlink(missing_ok=True)
    app.close()
    survived = sum(1 for steps in before.values() if 0 < len(steps) < len(STEPS))
    if reran_completed or any(len(r) != len(STEPS) for r in results):
        console.print("[bold red]✘ demo failed: a completed step ran twice or a workflow is incomplete[/bold red]")
        return 1
    console.print(f"[bold green]✔ demo succeeded:[/bold green] {count} workflows finished after their worker was "
                  f"SIGKILLed ({survived} mid-way); no step recorded before the kill ran again.", soft_wrap=True)
    return 0
