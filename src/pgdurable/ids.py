"""Execution ids the engine chooses when the caller gives none: UUIDv7 (RFC 9562), as text.

Why time-ordered: the id is the primary key of ``workflow_executions`` and the first column of
``operation_outputs``'s. With random ids (UUIDv4) every new execution, and every new row version a claim or a
completion writes, lands on a random leaf of those B-trees; once the history outgrows the buffer cache, each
one is a page read, a dirtied page and, after every checkpoint, a full page image in the WAL. The first 48 bits
of a UUIDv7 are the Unix time in milliseconds, so new executions land together on the right edge of the
indexes, however long the history. The SQL function ``new_execution_id()`` (migration 0023) makes the same ids
for ``enqueue_workflow``.
"""

from __future__ import annotations

import os
import threading
import time

_RANDOM_74 = (1 << 74) - 1
# Random bytes are read from the operating system a block at a time, for 409 ids: os.urandom is a system call,
# and one per id cost an enqueue about 5 us of client CPU on this project's benchmark machine (py-spy). Each
# thread has its own block, so two threads never take the same bytes; a forked child drops what it
# inherited (the parent goes on with the same block), by the generation counter below.
_BLOCK = 10 * 409
_generation = 0
_local = threading.local()


def _forked() -> None:
    global _generation
    _generation += 1


os.register_at_fork(after_in_child=_forked)


def _random_10() -> bytes:
    """Ten bytes from the operating system's CSPRNG, never handed out twice in one process."""
    local = _local
    block: bytes | None = getattr(local, "block", None)
    at: int = getattr(local, "at", _BLOCK)
    if block is None or at >= _BLOCK or local.generation != _generation:
        block, at = os.urandom(_BLOCK), 0
        local.block, local.generation = block, _generation
    local.at = at + 10
    return block[at:at + 10]


def new_execution_id() -> str:
    """A new UUIDv7 string: 48 bits of Unix milliseconds, the version (7), 74 random bits around the variant."""
    millis = time.time_ns() // 1_000_000 & 0xFFFF_FFFF_FFFF
    rand = int.from_bytes(_random_10(), "big") & _RANDOM_74
    rand_a, rand_b = rand >> 62, rand & ((1 << 62) - 1)
    # Formatted by hand: uuid.UUID(int=...) checks and converts again what is built right here (a third of
    # the function's time).
    h = f"{millis << 80 | 0x7 << 76 | rand_a << 64 | 0b10 << 62 | rand_b:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
