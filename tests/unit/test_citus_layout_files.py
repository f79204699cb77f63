"""The Citus layout's files and the producer's rotation over buckets, without a database (docs/scale-out.md)."""

from __future__ import annotations

import asyncio
import random
import re

import psycopg
import pytest

from pgdurable import citus
from pgdurable.config import Settings
from pgdurable.errors import ConfigurationError
from pgdurable.sqlfiles import citus_migrations, citus_queries, migrations, queries, query
from pgdurable.worker.buckets import BucketCursor


def test_every_single_node_migration_from_the_layout_on_has_a_citus_script() -> None:
    layout_from = citus_migrations()[0][0]
    single = {version for version, _, _ in migrations()}
    assert layout_from in single
    # the first script is the layout itself (it covers every migration before it); each later single-node
    # migration must say what it means on Citus, if only with an empty script
    assert {version for version in single if version >= layout_from} == {v for v, _, _ in citus_migrations()}


# Citus versions that aggregate over every shard: they need no bucket, and must not lock or write.
ACROSS_SHARDS = {"queue_depths", "dash_queues", "test_clock_idle_until"}


def test_citus_queries_override_single_node_ones_and_name_their_bucket() -> None:
    overrides = citus_queries()
    assert {"claim", "write_steps", "write_completions", "heartbeat", "suspend", "receive"} <= set(overrides)
    for name, text in overrides.items():
        assert name in queries()
        assert query(name, citus=True) == text and query(name) == queries()[name]
        touched = re.findall(r"\b(?:FROM|JOIN|UPDATE|INTO)\s+(workflow_executions|operation_outputs|workflow_messages"
                             r"|workflow_events|workflow_streams|awaited_executions)\b", text)
        if name in ACROSS_SHARDS:  # a count over every shard: reads only, locks nothing
            assert not re.search(r"\b(FOR (UPDATE|SHARE)|UPDATE|DELETE|INSERT)\b", text), name
        elif touched:
            assert "bucket" in text, f"{name} touches {touched} without naming a bucket"


def test_the_setting() -> None:
    assert citus.mode(None) in citus.MODES
    assert citus.mode("ON") == "on"
    with pytest.raises(ConfigurationError):
        citus.mode("sometimes")
    with pytest.raises(ConfigurationError):
        Settings(citus="maybe")


def test_the_cursor_starts_anywhere_and_moves_on_after_every_claim() -> None:
    buckets = tuple(range(10, 42))
    starts = {BucketCursor(buckets, random.Random(seed)).next() for seed in range(200)}
    assert len(starts) > 20  # workers spread out
    cursor = BucketCursor(buckets, random.Random(1))
    first = cursor.position
    visited = [cursor.next() for _ in range(64)]
    assert visited == [buckets[(first + i) % 32] for i in range(64)]


def test_a_full_bucket_cannot_keep_the_others_waiting() -> None:
    backlog = {b: 100 for b in range(8)}  # every bucket has more than one claim takes
    cursor = BucketCursor(tuple(backlog), random.Random(3))
    served: list[int] = []

    async def claim_in(bucket: int, n: int) -> list[int]:
        taken = min(n, backlog[bucket])
        backlog[bucket] -= taken
        served.append(bucket)
        return [bucket] * taken

    async def probe() -> list[int]:
        raise AssertionError("a round that claims something does not probe")

    for _ in range(16):
        assert len(asyncio.run(cursor.claim(claim_in, 5, probe))) == 5
    assert sorted(served) == sorted(list(range(8)) * 2)  # one claim per bucket per turn, in rotation


def test_short_claims_go_on_within_the_budget_then_ask_where_the_work_is() -> None:
    work = {7: 3}
    cursor = BucketCursor(tuple(range(16)), random.Random(5))
    cursor.position = 0
    visited: list[int] = []

    async def claim_in(bucket: int, n: int) -> list[int]:
        visited.append(bucket)
        taken = min(n, work.get(bucket, 0))
        work[bucket] = work.get(bucket, 0) - taken
        return [bucket] * taken

    async def probe() -> list[int]:
        return [b for b, left in work.items() if left > 0]

    assert asyncio.run(cursor.claim(claim_in, 10, probe)) == [7, 7, 7]
    assert visited == [0, 1, 2, 3, 7]  # the budget of empty buckets, then the one the probe named
    assert asyncio.run(cursor.claim(claim_in, 10, probe)) == []
    assert cursor.position == 8


def test_a_bucket_whose_claim_fails_is_skipped_and_the_others_are_served() -> None:
    now = [100.0]
    cursor = BucketCursor(tuple(range(6)), random.Random(0), clock=lambda: now[0])
    cursor.position = 0
    down = {1, 3, 5}  # the buckets of a worker node that is down
    visited: list[int] = []

    async def claim_in(bucket: int, n: int) -> list[int]:
        visited.append(bucket)
        if bucket in down:
            raise psycopg.errors.ConnectionFailure("connection to the remote node failed")
        return [bucket]

    async def probe() -> list[int]:
        raise psycopg.errors.ConnectionFailure("a look across every shard fails too")

    assert asyncio.run(cursor.claim(claim_in, 10, probe)) == [0, 2]  # what was claimed elsewhere is kept
    assert visited == [0, 1, 2, 3] and set(cursor.skipped) == {1, 3}
    visited.clear()
    assert asyncio.run(cursor.claim(claim_in, 10, probe)) == [4, 0, 2]  # 5 failed; 1 and 3 are skipped
    assert visited == [4, 5, 0, 2]
    now[0] += BucketCursor.SKIP_SECONDS + 1
    down.clear()
    visited.clear()
    asyncio.run(cursor.claim(claim_in, 10, probe))
    assert visited == [3, 4, 5, 0]  # back in the rotation once the skip ran out

    cursor.skipped.clear()
    down.update(range(6))
    with pytest.raises(psycopg.errors.ConnectionFailure):  # nothing answered: the producer backs off
        asyncio.run(cursor.claim(claim_in, 10, probe))
