"""The maintenance duties on a schema with the Citus layout: one bucket per statement (docs/scale-out.md,
"Maintenance duties").

On a single node each duty is one statement. On Citus a statement over every bucket lasts as long as 32 routed
statements and more, so a ``statement_timeout`` or a cancel cut it off every time and no bucket was ever served.
So a duty calls its per-bucket function bucket after bucket, each call one statement of at most ``size(b)``
executions. A bucket whose statement fails (cancelled, timed out, its worker node down) is left for the next
pass while the others are served, as the producer skips a bucket it cannot claim in. A cancelled or timed-out
statement also makes that bucket's batch four times smaller (down to one execution), so that work that cannot
finish within the timeout in one statement still moves on; each full batch doubles it again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import psycopg

from ... import store
from . import Deps

log = logging.getLogger("pgdurable.worker")

T = TypeVar("T")


class PerBucket(Generic[T]):
    # The batch of one statement, at most: the single-node statements' LIMIT.
    LARGEST = 1000

    def __init__(self, deps: Deps, what: str) -> None:
        self.deps = deps
        self.what = what
        self.sizes: dict[int, int] = {}  # bucket -> its batch, where smaller than LARGEST
        self.failures = 0  # statements that failed, for tests and debugging
        self.full: set[int] = set()  # the buckets of the last pass whose batch came back full (may have more)

    def size(self, bucket: int) -> int:
        return self.sizes.get(bucket, self.LARGEST)

    async def each(self, buckets: Sequence[int], call: Callable[[int, int], store.Call[T]],
                   done: Callable[[T], int], budget: int | None = None) -> dict[int, T]:
        """``call(bucket, size)`` in each bucket in turn; the answers of the buckets that answered. ``done``
        says how many executions an answer handled (as many as the batch: there may be more); ``budget``, how
        many the pass may handle in all (the buckets after it is spent are not visited). Raises the last error
        when no bucket answered."""
        answers: dict[int, T] = {}
        failed: list[int] = []
        error: psycopg.Error | None = None
        handled = 0
        self.full = set()
        for bucket in buckets:
            if budget is not None and handled >= budget:
                break
            size = self.size(bucket) if budget is None else min(self.size(bucket), budget - handled)
            try:
                answer = await self.deps.run(call(bucket, size))
            except psycopg.Error as exc:
                self.failures += 1
                failed.append(bucket)
                error = exc
                if isinstance(exc, psycopg.errors.QueryCanceled) and size > 1:
                    self.sizes[bucket] = max(1, size // 4)
                continue
            answers[bucket] = answer
            handled += done(answer)
            if done(answer) >= size:
                self.full.add(bucket)
                if size == self.size(bucket) < self.LARGEST:
                    self.sizes[bucket] = min(self.LARGEST, size * 2)
        if error is not None:
            if not answers:
                raise error
            log.warning("worker %s: %s failed in %d of %d buckets (%s); they are left for the next pass",
                        self.deps.worker_id, self.what, len(failed), len(buckets), _first_line(error))
        return answers


def rows(answer: Any) -> int:
    """``done`` for an answer that is a list of the executions handled."""
    return len(answer)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
