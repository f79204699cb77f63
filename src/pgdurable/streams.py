"""Reading the streams workflows write (``pgdurable.write_stream``): values in order as they arrive, woken by
NOTIFY through the App's listener thread (a stream write notifies like an event; a finished execution
notifies the readers that registered it), until the stream is closed or its workflow ends.

A read is one plan, run by the two drivers of completions.py (read_sync, read_async) as the waits are.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Generator, Iterator
from typing import TYPE_CHECKING, Any

from . import limits, store
from .completions import Emit, Listen, Nap, event_key, read_async, read_sync
from .context import current
from .errors import ConfigurationError, WorkflowNotFound

if TYPE_CHECKING:
    from .runtime import Runtime

# Look again even without a notification this often: a safety net (a lost listener connection), not the
# latency.
_RECHECK_SECONDS = 5.0
# Values fetched per look.
_BATCH = 500


def read_stream(runtime: Runtime, execution_id: str, key: str) -> Iterator[Any]:
    """Checked now (a bad key, a call from a workflow), read as the iteration goes."""
    _check(key)
    return read_sync(runtime.db, runtime.completions, _read(runtime, execution_id, key))


def read_stream_async(runtime: Runtime, execution_id: str, key: str) -> AsyncIterator[Any]:
    _check(key)
    return read_async(runtime.db, runtime.completions, _read(runtime, execution_id, key))


def _check(key: str) -> None:
    if current() is not None:
        raise ConfigurationError("read_stream reads from outside workflows (a workflow's reads would not "
                                 "replay the same)")
    limits.key(key, "stream key")


def _read(runtime: Runtime, execution_id: str, key: str) -> Generator[Any, Any, None]:
    """The stream's values in order (one plan, both drivers): listen for writes to the execution's streams
    and events and for its completion, then look; emit what is new; if the batch was not full, nap until
    notified (a write during a look wakes the nap that follows it) or the re-check interval; until the
    stream is closed or its execution has ended."""
    yield Listen(event_key(execution_id))
    yield Listen(execution_id)
    # Registered as awaited: its completion notifies only then (a stream left open ends with its workflow).
    yield store.executions.await_status(execution_id)
    after = -1
    while True:
        read: store.messaging.StreamRead = yield store.messaging.read_stream(id=execution_id, key=key, after=after,
                                                                            limit=_BATCH)
        if not read.exists:
            raise WorkflowNotFound(execution_id)
        if read.values:
            after = read.values[-1][0]
            yield Emit([runtime.serializer.loads(text, Any) for _, text in read.values])
        full = len(read.values) >= _BATCH and not read.closed
        if read.closed or (read.ended and not full):
            return
        if not full:
            yield Nap(_RECHECK_SECONDS)
