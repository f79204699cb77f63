"""The maintenance duties on the Citus layout, one bucket per statement (worker/maintenance/buckets.py), and the
idle producer's probe pause, without a database (docs/scale-out.md, "Maintenance duties")."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import psycopg
import pytest

from pgdurable import store
from pgdurable.config import Settings
from pgdurable.telemetry import Observers
from pgdurable.worker.buckets import BucketCursor
from pgdurable.worker.maintenance import Deps
from pgdurable.worker.maintenance.buckets import PerBucket, rows


def per_bucket(answer: Any) -> tuple[PerBucket[list[int]], list[tuple[int, int]]]:
    """A PerBucket whose statements answer ``answer(bucket, size)`` (or raise it), and the calls it made."""
    made: list[tuple[int, int]] = []

    async def run(call: store.Call[Any]) -> Any:
        made.append((call.params["bucket"], call.params["limit"]))
        return answer(call.params["bucket"], call.params["limit"])

    deps = Deps(run=run, worker_id="w", settings=Settings(), observers=Observers(), buckets=lambda: (1, 2, 3))
    return PerBucket(deps, "sweep"), made


def test_a_failed_bucket_is_left_for_the_next_pass_and_a_cancelled_one_gets_a_smaller_batch() -> None:
    cancelled = {2}

    def answer(bucket: int, size: int) -> list[int]:
        if bucket in cancelled:
            raise psycopg.errors.QueryCanceled("canceling statement due to statement timeout")
        return [bucket] * size if bucket == 2 else [bucket]

    duty, made = per_bucket(answer)
    assert asyncio.run(duty.each((1, 2, 3), store.claims.sweep_bucket, rows)) == {1: [1], 3: [3]}
    assert made == [(1, 1000), (2, 1000), (3, 1000)]  # the other buckets were served after it
    assert duty.failures == 1 and duty.size(2) == 250 and duty.size(1) == 1000
    cancelled.clear()
    made.clear()
    answers = asyncio.run(duty.each((1, 2, 3), store.claims.sweep_bucket, rows))
    assert made == [(1, 1000), (2, 250), (3, 1000)] and answers[2] == [2] * 250
    assert duty.size(2) == 500 and duty.full == {2}  # a full batch: it doubles back, and may have more


def test_a_pass_in_which_no_bucket_answered_fails() -> None:
    def answer(bucket: int, size: int) -> list[int]:
        raise psycopg.errors.ConnectionFailure("connection to the remote node failed")

    duty, made = per_bucket(answer)
    with pytest.raises(psycopg.errors.ConnectionFailure):
        asyncio.run(duty.each((1, 2, 3), store.claims.sweep_bucket, rows))
    assert len(made) == 3 and duty.size(1) == 1000  # not a cancel: the batch stays


def test_a_budget_ends_the_pass_once_spent() -> None:
    duty, made = per_bucket(lambda bucket, size: [bucket] * min(size, 3))
    asyncio.run(duty.each((1, 2, 3), store.claims.sweep_bucket, rows, budget=5))
    assert made == [(1, 5), (2, 2)]


def test_a_failed_probe_is_not_made_again_for_a_while() -> None:
    now = [100.0]
    cursor = BucketCursor(tuple(range(8)), random.Random(0), clock=lambda: now[0])
    probes: list[float] = []

    async def claim_in(bucket: int, n: int) -> list[int]:
        return []

    async def probe() -> list[int]:
        probes.append(now[0])
        raise psycopg.errors.QueryCanceled("canceling statement due to statement timeout")

    assert asyncio.run(cursor.claim(claim_in, 4, probe)) == []
    assert asyncio.run(cursor.claim(claim_in, 4, probe)) == []
    assert probes == [100.0]
    now[0] += BucketCursor.SKIP_SECONDS
    asyncio.run(cursor.claim(claim_in, 4, probe))
    assert len(probes) == 2
