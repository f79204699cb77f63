"""The exit watchdog of a worker process: a stop that does not end in time is reported, then forced.

A graceful stop gives running workflows ``shutdown_grace_seconds``, then releases what is left and closes the
worker's sessions, which takes well under a second when the database answers. Should any of it hang (a
statement the server never answers, a task that swallows its cancellation, a thread the interpreter would
join at exit), the process would never exit and whoever stopped it (systemd, Kubernetes, a deploy script)
could only wait or SIGKILL it without knowing why. So a process started by ``run_until_stopped`` keeps a daemon
thread that, ``shutdown_patience_seconds`` past the grace period, logs the stack of every thread and every asyncio
task (what the stop waits on), then exits with status 1. Nothing is lost by it: whatever the worker still
owned comes back to the queue when its leases expire, as after a crash.
"""

from __future__ import annotations

import asyncio
import faulthandler
import logging
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("pgdurable.worker")

EXIT_STATUS = 1


class ExitWatchdog:
    """Arm it when a stop is asked for; if the process is still there ``grace + patience`` seconds later, it
    logs where every thread and task stands and ends the process."""

    def __init__(self, loop: asyncio.AbstractEventLoop, grace: float, patience: float,
                 exit: Callable[[int], None] = os._exit) -> None:
        self.loop = loop
        self.limit = grace + patience
        self._exit = exit
        self._armed = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="pgdurable-exit-watchdog", daemon=True)
        self._thread.start()

    def arm(self) -> None:
        """A stop was asked for: the clock starts (a second call changes nothing)."""
        self._armed.set()

    def _watch(self) -> None:
        self._armed.wait()
        time.sleep(self.limit)  # the process exits meanwhile, this daemon thread with it
        log.error("worker did not finish stopping within %g s of the stop; where it stands:\n%s\n%s"
                  "exiting with status %d (its executions resume elsewhere once their leases expire)",
                  self.limit, _thread_stacks(), self._task_stacks(), EXIT_STATUS)
        for handler in logging.getLogger().handlers:
            handler.flush()
        sys.stdout.flush()
        sys.stderr.flush()
        self._exit(EXIT_STATUS)

    def _task_stacks(self) -> str:
        """Every asyncio task's chain of awaits, read on the loop's own thread; if the loop does not run (a
        blocking call on it, whose stack the threads' dump shows), says so."""
        taken: list[str] = []
        done = threading.Event()

        def take() -> None:
            taken.extend(_awaits(task) for task in asyncio.all_tasks(self.loop))
            done.set()

        try:
            self.loop.call_soon_threadsafe(take)
        except RuntimeError:  # the loop is closed
            return "the event loop is closed\n"
        if not done.wait(2.0):
            return "the event loop did not run for 2 s (the threads' stacks show what blocks it)\n"
        return "".join(sorted(taken)) or "no asyncio task is left\n"


def _awaits(task: asyncio.Task[Any]) -> str:
    """A task and what it awaits, outermost first (a suspended task's own stack shows one frame only)."""
    lines = [f"Task {task.get_name()!r}{' (cancelling)' if task.cancelling() else ''} awaits:\n"]
    awaited: Any = task.get_coro()
    for _ in range(30):  # a chain of coroutines, ended by a future or a plain generator
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
        if frame is None:
            break
        code = frame.f_code
        lines.append(f'  File "{code.co_filename}", line {frame.f_lineno}, in {code.co_name}\n')
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
    return "".join(lines)


def _thread_stacks() -> str:
    """Every thread's Python stack (faulthandler writes to a file descriptor: a temporary file, which, unlike a
    pipe, cannot fill up and block the dump)."""
    try:
        with tempfile.TemporaryFile("w+") as dump:
            faulthandler.dump_traceback(file=dump, all_threads=True)
            dump.seek(0)
            return dump.read()
    except OSError as exc:
        return f"(could not dump the threads' stacks: {exc})\n"
