"""A pgdurable app with a timed step, for a test that kills a worker process while the step runs.

Served by ``python -m pgdurable worker tests.apps.timeouts:app`` (the ``spawn_worker`` fixture). The step
appends "<pid> begin" to TIMEOUTS_EFFECTS when it starts; while the file TIMEOUTS_HANG exists, it then hangs
(a long sleep its timeout ends), else it returns at once and appends "<pid> end".
"""

from __future__ import annotations

import os
import time

import pgdurable

app = pgdurable.App(lease_seconds=2.0, poll_seconds=0.5, sweep_seconds=0.3, shutdown_grace_seconds=1.0)


def _note(text: str) -> None:
    fd = os.open(os.environ["TIMEOUTS_EFFECTS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{os.getpid()} {text}\n".encode())
    finally:
        os.close(fd)


@app.step(timeout=60.0, max_attempts=3, interval=0.1)
def slow_part(n: int) -> int:
    _note("begin")
    if os.path.exists(os.environ["TIMEOUTS_HANG"]):
        time.sleep(120)
    _note("end")
    return n + 1


@app.workflow()
def timed(n: int) -> int:
    return slow_part(n) * 2
