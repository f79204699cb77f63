"""Noticing a blocked event loop, and saying which code blocks it.

Async workflows and steps run on the worker's event loop, beside everything else the worker does there: its
claims, the checkpoints written for other workflows, and the heartbeat that keeps their leases. One that
blocks (``time.sleep``, a blocking HTTP client, a long computation) stops all of that; past ``lease_seconds``,
other workers take the executions over and run them again. The fencing keeps the database right, but the
side effects run twice, and nothing said why. So a daemon thread watches a pulse the loop beats a few times
a second: when the loop has not beaten for ``STALL_SECONDS`` it logs the task the loop runs (a workflow's is
named after its execution) and the loop thread's stack (the line that blocks it), and when the loop runs
again, for how long it was blocked.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback

log = logging.getLogger("pgdurable.worker")

# Far above what anything pgdurable runs on the loop takes, and far below a lease (30 s by default).
STALL_SECONDS = 2.0


class LoopWatch:
    """Made on the loop's thread; ``beat()`` runs as a task on that loop, and the watching ends with it."""

    def __init__(self, worker_id: str, lease_seconds: float) -> None:
        self.worker_id = worker_id
        self.lease_seconds = lease_seconds
        self._stall = STALL_SECONDS
        self._last = time.monotonic()
        self._loop = asyncio.get_running_loop()  # made on the loop's thread
        self._loop_thread = threading.get_ident()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="pgdurable-loop-watch", daemon=True)
        self._thread.start()

    async def beat(self) -> None:
        interval = self._stall / 8
        try:
            while True:
                self._last = time.monotonic()
                await asyncio.sleep(interval)
        finally:  # cancelled (the worker's shutdown, the loop's end): a loop that stopped beating is not stuck
            self._stopped.set()

    def _watch(self) -> None:
        blocked_since: float | None = None
        while not self._stopped.wait(self._stall / 4):
            last = self._last
            silent = time.monotonic() - last
            if silent >= self._stall and blocked_since is None:
                blocked_since = last
                log.warning(
                    "worker %s: its event loop has not run for %.1f s. Most often an async workflow or step "
                    "blocks it (time.sleep, a blocking client, a long computation: await an async API or use "
                    "asyncio.to_thread); an overloaded machine can too. Meanwhile this worker writes no claim, "
                    "checkpoint or heartbeat, and past lease_seconds (%g s) other workers take its executions "
                    "over. The loop runs %s, at:\n%s",
                    self.worker_id, silent, self.lease_seconds, self._running_task(), self._loop_stack())
            elif blocked_since is not None and last > blocked_since:
                log.warning("worker %s: its event loop runs again, after %.1f s blocked", self.worker_id,
                            last - blocked_since)
                blocked_since = None

    def _running_task(self) -> str:
        """The task the loop runs (a workflow's is named after its execution: pgdurable:<id>)."""
        task = asyncio.current_task(self._loop)  # a read of the loop's current task, safe from this thread
        return f"task {task.get_name()!r}" if task is not None else "no task (a callback)"

    def _loop_stack(self) -> str:
        frame = sys._current_frames().get(self._loop_thread)
        if frame is None:
            return "  (the loop's thread has ended)\n"
        frames = traceback.extract_stack(frame)
        # From the callback the loop runs on: the thread's start and the loop's own machinery say nothing.
        ran = [i for i, f in enumerate(frames) if f.name == "_run" and f.filename.endswith("events.py")]
        return "".join(traceback.format_list(frames[ran[-1] + 1 if ran else 0:][-25:]))
