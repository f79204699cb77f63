"""Waiting and stopping in asyncio without losing a cancellation.

On Python 3.11, ``asyncio.wait_for(aw, t)`` returns normally when the task is cancelled in the same loop
iteration that ``aw`` completes: the cancellation is swallowed. A worker loop written as
``while True: ... wait_for(wake.wait(), t)`` then never sees its cancellation and a stopping worker waits for
it forever. ``asyncio.timeout`` counts cancellations and re-raises the one it did not cause itself, so our own
waits use it (``wait_event``). Code we do not own still has the pattern: psycopg_pool waits for a free
connection with ``wait_for``, and at shutdown one cancelled task returning its connection hands it to another
cancelled task in that very iteration. So tasks are stopped with ``cancel_and_wait``, which cancels again
whatever is still running.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any


async def wait_event(event: asyncio.Event, seconds: float) -> bool:
    """Wait until ``event`` is set or ``seconds`` have passed; return whether it was set."""
    try:
        async with asyncio.timeout(max(seconds, 0.0)):
            await event.wait()
    except TimeoutError:
        return event.is_set()
    return True


async def cancel_and_wait(tasks: Iterable[asyncio.Task[Any]], *, every: float = 0.2,
                          patience: float | None = None) -> set[asyncio.Task[Any]]:
    """Cancel ``tasks`` and wait until they have ended, cancelling again every ``every`` seconds any that
    swallowed the cancellation and runs on; give up after ``patience`` seconds (None: never). Returns the
    tasks still running. Their outcomes are retrieved (no "exception was never retrieved" noise)."""
    tasks = list(tasks)
    loop = asyncio.get_running_loop()
    deadline = None if patience is None else loop.time() + patience
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        wait = every if deadline is None else max(0.0, min(every, deadline - loop.time()))
        _, pending = await asyncio.wait(pending, timeout=wait)
        if deadline is not None and loop.time() >= deadline:
            break
    for task in tasks:
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: the caller stops them, their errors were logged where they arose
    return pending
