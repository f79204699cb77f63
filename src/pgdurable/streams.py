"""Reading the streams workflows write (``pgdurable.write_stream``): values in order as they arrive, woken by
NOTIFY through the App's listener thread (a stream write notifies like an event; a finished execution
notifies its completion), until the stream is closed or its workflow ends.

One cursor decides what a look at the stream means; the sync and the async iterator only differ in how
they wait between looks.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any

from . import limits, store
from .completions import event_key
from .context import current
from .errors import ConfigurationError, WorkflowNotFound

if TYPE_CHECKING:
    from .runtime import Runtime

# Look again even without a notification this often: a safety net (a lost listener connection), not the
# latency.
_RECHECK_SECONDS = 5.0
# Values fetched per look.
_BATCH = 500


class _Cursor:
    """Where a reader is in one stream, and what each look at it means."""

    def __init__(self, runtime: Runtime, execution_id: str, key: str) -> None:
        if current() is not None:
            raise ConfigurationError("read_stream reads from outside workflows (a workflow's reads would not "
                                     "replay the same)")
        limits.key(key, "stream key")
        self.runtime, self.execution_id, self.key = runtime, execution_id, key
        self.after = -1

    def call(self) -> store.Call[store.messaging.StreamRead]:
        return store.messaging.read_stream(id=self.execution_id, key=self.key, after=self.after, limit=_BATCH)

    def take(self, read: store.messaging.StreamRead) -> tuple[list[Any], bool, bool]:
        """(the new values decoded, whether the stream is over, whether to look again at once)."""
        if not read.exists:
            raise WorkflowNotFound(self.execution_id)
        if read.values:
            self.after = read.values[-1][0]
        values = [self.runtime.serializer.loads(text, Any) for _, text in read.values]
        full = len(read.values) >= _BATCH and not read.closed
        return values, read.closed or (read.ended and not full), full

    def wakers(self) -> tuple[str, str]:
        """What wakes a reader: a write to the execution's streams or events, and its completion."""
        return event_key(self.execution_id), self.execution_id


def read_stream(runtime: Runtime, execution_id: str, key: str) -> Iterator[Any]:
    """Checked now (a bad key, a call from a workflow), read as the iteration goes."""
    return _read(_Cursor(runtime, execution_id, key))


def read_stream_async(runtime: Runtime, execution_id: str, key: str) -> AsyncIterator[Any]:
    return _read_async(_Cursor(runtime, execution_id, key))


def _read(cursor: _Cursor) -> Iterator[Any]:
    runtime = cursor.runtime
    woken = threading.Event()
    unsubscribes = [runtime.completions.subscribe(k, woken.set) for k in cursor.wakers()]
    try:
        while True:
            woken.clear()  # before the look: a write committed during it wakes the next wait
            values, over, again = cursor.take(runtime.db.run(cursor.call()))
            yield from values
            if over:
                return
            if not again:
                woken.wait(_RECHECK_SECONDS)
    finally:
        _unsubscribe(unsubscribes)


async def _read_async(cursor: _Cursor) -> AsyncIterator[Any]:
    runtime = cursor.runtime
    loop = asyncio.get_running_loop()
    woken = asyncio.Event()

    def wake() -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            loop.call_soon_threadsafe(woken.set)

    unsubscribes = [await asyncio.to_thread(runtime.completions.subscribe, k, wake) for k in cursor.wakers()]
    try:
        while True:
            woken.clear()
            values, over, again = cursor.take(await runtime.db.arun(cursor.call()))
            for value in values:
                yield value
            if over:
                return
            if not again:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken.wait(), _RECHECK_SECONDS)
    finally:
        _unsubscribe(unsubscribes)


def _unsubscribe(unsubscribes: list[Callable[[], None]]) -> None:
    for unsubscribe in unsubscribes:
        unsubscribe()
