"""Where a producer claims next on a schema with the Citus layout (docs/scale-out.md, "Claims").

Every claim names one bucket, so that it is routed to the one node holding it (a claim across shards cannot
lock rows). A ``BucketCursor`` rotates over the buckets, starting at a random one so that workers spread out,
and moves on after every claim whatever it found, so that a bucket with a backlog cannot keep the others
waiting (priority is exact within a bucket, approximate across buckets). A claim that finds less than it asked
for goes on to the next bucket at once, up to ``BUDGET`` buckets a round; a round that found nothing at all
asks which buckets have work (one look across the shards, without locks) and claims there.

A bucket whose claim fails (its worker node is down, say: Citus refuses every statement that touches it) is
skipped for ``SKIP_SECONDS`` while the others keep being served; what the round claimed elsewhere is kept. A
round in which every claim failed raises the last error, for the producer's own back-off. A probe that failed
is not made again for ``SKIP_SECONDS`` either: it reads every shard over several connections per node, which
Citus drops when the statement is cancelled, so under a short ``statement_timeout`` each new try would pay
for them all again and fail again.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import psycopg

log = logging.getLogger("pgdurable.worker")

T = TypeVar("T")


class BucketCursor:
    # Buckets a round may visit before it asks where the work is (a routed claim of an empty bucket costs
    # about as much as one tenth of that look across 32 shards).
    BUDGET = 4
    # How long a bucket whose claim failed is left out of the rotation.
    SKIP_SECONDS = 1.0

    def __init__(self, buckets: Sequence[int], rng: random.Random | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not buckets:
            raise ValueError("a Citus layout has at least one bucket")
        self.buckets = tuple(buckets)
        self.position = (rng or random.Random()).randrange(len(self.buckets))
        self._clock = clock
        # bucket -> until when it is skipped
        self.skipped: dict[int, float] = {}
        self.probe_skipped_until = 0.0

    def next(self) -> int:
        """The bucket to claim in now (the next one not skipped, if any is not); the cursor moves past it."""
        now = self._clock()
        for _ in range(len(self.buckets)):
            bucket = self.buckets[self.position]
            self.position = (self.position + 1) % len(self.buckets)
            if self.skipped.get(bucket, 0.0) <= now:
                return bucket
        return bucket  # every bucket is skipped: try the next one anyway

    async def claim(self, claim_in: Callable[[int, int], Awaitable[list[T]]], limit: int,
                    probe: Callable[[], Awaitable[list[int]]]) -> list[T]:
        """Up to ``limit`` claimed: ``claim_in(bucket, n)`` claims at most n in one bucket, ``probe()`` names
        the buckets that have work."""
        claimed: list[T] = []
        failed: psycopg.Error | None = None
        answered = 0

        async def one(bucket: int) -> None:
            nonlocal failed, answered
            try:
                claimed.extend(await claim_in(bucket, limit - len(claimed)))
            except psycopg.Error as exc:
                failed = exc
                self.skipped[bucket] = self._clock() + self.SKIP_SECONDS
                log.warning("claim in bucket %d failed (%s); skipping it for %g s", bucket, _first_line(exc),
                            self.SKIP_SECONDS)
            else:
                answered += 1
                self.skipped.pop(bucket, None)

        for _ in range(min(self.BUDGET, len(self.buckets))):
            await one(self.next())
            if len(claimed) >= limit:
                return claimed
        if not claimed and self.probe_skipped_until <= self._clock():
            try:
                named = await probe()
            except psycopg.Error as exc:  # it reads every shard: refused while a node is down
                failed, named = failed or exc, []
                self.probe_skipped_until = self._clock() + self.SKIP_SECONDS
            for bucket in named:
                if self.skipped.get(bucket, 0.0) <= self._clock():
                    await one(bucket)
                    if len(claimed) >= limit:
                        break
        if failed is not None and not answered:
            raise failed
        return claimed


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
