"""Producers: one per served queue, each claiming that queue's executions into the executor's free slots.

A producer sleeps until it is woken (a NOTIFY for its queue, a slot freed while it was waiting for room, the
poll interval as a fallback), then claims a batch. Two named helpers shape when it claims:

- the ``Debouncer`` lets wake-ups pile up for a moment while the worker is busy, so that claims come in
  batches instead of one statement per completion (an idle worker claims at once);
- the ``Backoff`` re-looks at a queue with limits in SQL after a short claim, because such a queue frees
  capacity without any NOTIFY (a concurrency slot's holder finished elsewhere, a rate window moved on).

Wake-ups cost the enqueuers (PostgreSQL serialises the commits of notifying transactions), so a producer asks
for one only when it is about to sleep: a claim that finds nothing arms its doorbell for the queue (in the
claim's own statement on a single node, a statement of its own on Citus or with queue limits), then the
producer claims once more, a millisecond later (at once on a ring: ``GAP_SECONDS``), so that nothing committed
while the bell was being armed is left behind. A claim that comes back short but found work does not arm: the
producer claims again as any busy producer does (when a slot frees, at most every ``COALESCE_SECONDS`` while
that work runs, at once once it has ended), and that claim arms if it finds nothing. (Arming in a claim that
found work put a write on the path from enqueue to start; without it, bench/compare_commits.sh gave a median
enqueue->claim p50 of 1.64 against 1.75 ms and A 689 against 610 workflows/s over six interleaved pairs: a
small gain, within this machine's noise. That next claim once skipped the debouncer: a worker kept just busy
by one client enqueuing in a loop then claimed after every freed slot, 2.2 executions a claim against about 5,
and that client, sharing two cores with those claims, made 8% fewer workflows/s (median of seven interleaved
pairs): "The claim after a claim that found work" in docs/benchmarks.md.)
When the queue ran dry and the worker completes its last execution of it, that completion arms the bell in its
own statement (``arm_with_completion``), and one claim ``GAP_SECONDS`` later closes its gap: whoever waits for
that result and enqueues again as soon as it has it then finds the bell armed. Armed by the claim after the
completion, the bell raced that enqueue, which often looked at it just before it was armed, rang nobody, and
waited for the claim closing the gap ("Arming with the completion" in docs/benchmarks.md). The next enqueue
into the queue rings the bell (one NOTIFY) and disarms it. A busy producer claims again on its own and needs no
bell. One case still escapes the bell: a transaction that looked at the bell just before it was armed and
committed after the claim closing the gap (a long application transaction, a slow commit); the sleeping
producer re-claims on a backoff (50 ms, doubling up to the poll interval while the queue stays empty, back to
50 ms after any work), so such work waits tens of milliseconds, never a whole poll interval.
A bell is worth its ring only if the worker would otherwise sleep for a while. When the claim a ring brings
finds more than the execution that rang (others were enqueued in the moment the wake-up took), enqueues come
faster than the worker wakes: armed again, its bell would be rung by the very next one, a NOTIFY and a write
in some application's transaction for every few executions. The queue is then ``HotQueue``: the producer
claims as a busy one does (``COALESCE_SECONDS`` apart) and arms nothing until the queue has stayed empty for
``HotQueue.QUIET_SECONDS``; such work waits up to one such interval, as it does for a busy worker. One client
enqueuing after each result, or enqueues paced apart, bring one execution a ring and keep their wake-ups.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg

from .. import store
from ..config import Settings
from ..waiting import wait_event
from .buckets import BucketCursor
from .executor import Executor

log = logging.getLogger("pgdurable.worker")
T = TypeVar("T")

# Claim at most this many executions per round trip.
CLAIM_BATCH = 64


class Debouncer:
    """Spaces claims at least ``interval`` apart while the worker is busy: the wake-ups that arrive within
    the interval (NOTIFYs, completions) are answered together by the next claim."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.last = 0.0

    def remaining(self) -> float:
        """How long to wait before the next claim (0 or less: claim now)."""
        return self.last + self.interval - time.monotonic()

    def fired(self) -> None:
        self.last = time.monotonic()


class Backoff:
    """A delay that starts at ``first``, doubles each time nothing comes, is capped at ``ceiling``, and is
    dropped (None) once the queue yields a full batch."""

    def __init__(self, first: float, ceiling: float) -> None:
        self.first, self.ceiling = first, ceiling
        self.delay: float | None = None

    def again(self, found_nothing: bool) -> None:
        previous = self.delay if found_nothing else None
        self.delay = min(previous * 2 if previous else self.first, self.ceiling)

    def reset(self) -> None:
        self.delay = None


class HotQueue:
    """Whether the producer polls its queue instead of arming the bell (see the module's docstring): set by
    a ring whose claim found more than one execution, ended once claims have found nothing for
    ``QUIET_SECONDS``. (bench/costs.py's sleeping worker follows the same rule.)"""

    QUIET_SECONDS = 0.02

    def __init__(self) -> None:
        self.polling = False
        self._empty_since: float | None = None

    def claimed(self, found: int, after_ring: bool, now: float) -> None:
        """A claim found ``found`` executions, ``after_ring`` if a ring was heard since the previous claim."""
        if after_ring and found > 1:
            self.polling = True
        if found or not self.polling:
            self._empty_since = None
        elif self._empty_since is None:
            self._empty_since = now
        elif now - self._empty_since >= self.QUIET_SECONDS:
            self.polling, self._empty_since = False, None


class Producer:
    """Claims one queue's executions for a worker (plain claims, or policy claims on a queue with limits)."""

    # While busy, claims at most this often when few slots are free or the queue keeps running dry.
    COALESCE_SECONDS = 0.005
    # After a short policy claim, look again this soon (doubling while nothing comes).
    POLICY_RECHECK_SECONDS = 0.01
    # Asleep with its doorbell armed, look again this soon (doubling while nothing comes): catches the work
    # of a transaction that looked at the bell just before it was armed (see the module's docstring).
    IDLE_RECHECK_SECONDS = 0.05
    # Once its bell is armed, the claim that closes the gap comes this much later (at once on a ring): the
    # enqueue racing the arming (it looked at the bell just before it was armed) has then, most of the time,
    # committed, and that claim finds it. Sent at once, the claim lost that race in 5-7% of the round trips
    # of bench/throughput.py --parts C (2,000 each), which then waited for the idle re-check (p99 53 ms);
    # 1 ms later, 0.05-0.2% did (p99 4.6-6.0 ms), with p50 and p90 unchanged; 3 ms made p90 6 ms.
    GAP_SECONDS = 0.001

    def __init__(self, queue: str, *, worker_id: str, names: list[str], version: str, settings: Settings,
                 executor: Executor, policies: Callable[[], dict[str, store.queues.QueuePolicy]],
                 run: Callable[[store.Call[Any]], Awaitable[Any]], stopping: asyncio.Event,
                 buckets: Callable[[], tuple[int, ...] | None] = lambda: None) -> None:
        self.queue = queue
        self.worker_id = worker_id
        self.names = names
        self.version = version
        self.settings = settings
        self.executor = executor
        self.policies = policies
        self._run = run
        self._stopping = stopping
        self.debouncer = Debouncer(self.COALESCE_SECONDS)
        self.recheck = Backoff(self.POLICY_RECHECK_SECONDS, settings.poll_seconds)
        self.idle = Backoff(self.IDLE_RECHECK_SECONDS, settings.poll_seconds)
        # Whether this worker's doorbell for the queue is armed (as far as it knows: a NOTIFY for the queue
        # means some enqueue disarmed it).
        self.armed = False
        # The bell was armed by the completion of this worker's last execution of the queue (arm_with_completion)
        # at gap_from (monotonic), and no claim has looked at the queue since: the next claim, GAP_SECONDS after
        # that (at once on a ring), closes the gap.
        self.gap_open = False
        self.gap_from = 0.0
        # Whether the last claim came back short (the queue ran dry as far as this producer could see); how
        # many claims were sent and rings heard (whether one came while a completion was arming the bell).
        self.last_was_short = False
        self.claims = 0
        self.rings = 0
        self.hot = HotQueue()
        self._wake = asyncio.Event()
        # Waiting for room (no free slot, or the last claim filled its batch): a freed slot wakes it.
        self.hungry = True
        # The Citus layout's buckets (known once the worker connected): claims go one bucket at a time.
        self._buckets = buckets
        self._cursor: BucketCursor | None = None

    def wake(self) -> None:
        self._wake.set()

    def rung(self) -> None:
        """A NOTIFY for the queue: its doorbells were rung (disarmed); wake up."""
        self.armed = False
        self.rings += 1
        self._wake.set()

    def slot_freed(self) -> None:
        if self.hungry:
            self._wake.set()

    def _arms_in_claim(self, policy: store.queues.QueuePolicy | None) -> bool:
        """Whether this queue's claim arms the bell itself (a single node, no limits claimed in SQL)."""
        return not (policy is not None and policy.claims_in_sql) and self._buckets() is None

    def arm_with_completion(self) -> Callable[[bool], None] | None:
        """The worker is about to complete its last running execution of this queue. If the queue ran dry (and
        claims arm the bell here), that completion arms the bell in its own statement, so that it is armed
        before anyone hears of the result. Returns what to call with whether the completion committed, or
        None if it arms nothing. It arms even if the producer believes its bell armed: an enqueue may have
        rung it (disarmed it) and been claimed before its NOTIFY arrived here; on an armed bell the arming
        writes nothing."""
        if (not self.last_was_short or self._stopping.is_set() or self.hot.polling
                or not self._arms_in_claim(self.policies().get(self.queue))):
            return None
        claims, rings = self.claims, self.rings

        def written(committed: bool) -> None:
            # A claim sent meanwhile decides the mark (it arms the bell itself if it finds nothing), and a ring
            # heard meanwhile disarmed the bell again: marked armed then, nobody would ring it any more.
            if committed and self.claims == claims and self.rings == rings:
                self.armed = self.gap_open = True
                self.gap_from = time.monotonic()
        return written

    async def _sleep(self, seconds: float) -> None:
        await wait_event(self._wake, seconds)

    async def run(self) -> None:
        executor = self.executor
        batch_floor = max(1, executor.concurrency // 4)
        # Set after arming the doorbell: the claim that closes the gap before the bell is not debounced, or
        # an enqueue that commits in that gap would wait out the debouncer (a floor under every round trip).
        closing_gap = False
        # Whether a claim found work since the producer last slept with its bell armed: the idle re-check
        # starts again from its first, short delay after every burst of work, and doubles only while the
        # queue stays empty (else an enqueue that escaped the bell could wait out a whole poll interval).
        found_since_sleep = False
        lost_connections = 0
        rings_at_claim = self.rings
        while not self._stopping.is_set():
            # Clear before claiming: a NOTIFY that arrives during the claim still wakes the next wait.
            self._wake.clear()
            if self.gap_open and self.armed:
                # A completion armed the bell: an enqueue in flight as it committed may have looked at the bell
                # before; claim once that has committed (a ring, which disarms the bell, brings the claim at once).
                pause = self.gap_from + self.GAP_SECONDS - time.monotonic()
                if pause > 0:
                    await self._sleep(pause)
                    continue
                closing_gap = True
            limit = min(executor.free(), CLAIM_BATCH)
            if limit > 0 and executor.busy() and (limit < batch_floor or self.last_was_short) and not closing_gap:
                pause = self.debouncer.remaining()
                if pause > 0:
                    await asyncio.sleep(pause)
                    continue
            policy = self.policies().get(self.queue)
            if limit > 0 and policy is not None and policy.worker_concurrency is not None:
                limit = min(limit, policy.worker_concurrency - executor.count(self.queue))
            if limit <= 0:
                self.hungry = True
                await self._sleep(self.settings.poll_seconds)
                continue
            closing_gap = False
            self.debouncer.fired()
            started = time.monotonic()
            in_sql = policy is not None and policy.claims_in_sql
            claim = store.claims.claim_with_policy if in_sql else store.claims.claim
            # A plain claim on a single node arms the doorbell itself if it finds nothing, saving the
            # arming statement's round trip and commit. Marked armed first, for the reason given in _arm.
            arming = not self.armed and not self.hot.polling and self._arms_in_claim(policy)
            if arming:
                self.armed = True
            gap_open, self.gap_open = self.gap_open, False
            self.claims += 1
            after_ring, rings_at_claim = self.rings != rings_at_claim, self.rings
            executor.reserved += limit  # until the claimed are running: other producers see them taken
            retry, claimed = 0.0, list[store.claims.Claimed]()
            try:
                try:
                    claimed = await self._claim(claim, limit, arming)
                except psycopg.OperationalError as exc:
                    # A lost connection (server restart, terminated backend): the pool drops it, and others
                    # it holds may be dead too. Retry soon, backing off while the server stays away.
                    lost_connections += 1
                    log.warning("worker %s: claim failed (%s); retrying", self.worker_id, exc)
                    retry = min(0.05 * 2 ** (lost_connections - 1), 1.0)
                except Exception:
                    log.exception("worker %s: claim failed; retrying", self.worker_id)
                    retry = 1.0
                else:
                    if executor.observers:
                        executor.observers.claimed(self.queue, len(claimed), time.monotonic() - started)
                    self.last_was_short = len(claimed) < limit
                    found_since_sleep = found_since_sleep or bool(claimed)
                    self.hot.claimed(len(claimed), after_ring, time.monotonic())
                    lost_connections = 0
                    if arming and claimed:
                        self.armed = False  # found work: the statement left the bell as it was
                    if in_sql:
                        if self.last_was_short:
                            self.recheck.again(found_nothing=not claimed)
                        else:
                            self.recheck.reset()
                    if claimed and not await executor.launch(claimed, self.queue, self._run):
                        retry = 1.0  # as after a failed claim
            finally:
                executor.reserved -= limit
                if arming and retry:
                    self.armed = False  # the claim failed, and its arming with it
            if retry:
                self.gap_open = self.gap_open or gap_open  # nothing looked at the queue
                await asyncio.sleep(retry)
                continue
            if claimed and not self.last_was_short:
                self.hungry = True
                self.idle.reset()
                continue  # there may be more waiting
            self.hungry = False
            if self.hot.polling:
                # Enqueues come faster than a wake-up: claim again as a busy producer does (a freed slot wakes
                # it while it has work, the debouncer spacing those claims) rather than arm a bell the next
                # enqueue would ring at once.
                self.hungry = bool(claimed)
                await self._sleep(self.COALESCE_SECONDS)
                continue
            if arming:
                if claimed:
                    # Found work, so the statement armed nothing and there is no gap to close: claim again as a
                    # busy producer does (debounced while that work runs; a freed slot or a ring wakes it).
                    self.hungry = True
                    await self._sleep(self.COALESCE_SECONDS)
                else:
                    # Armed: claim once more, as the gap's closing claim (what committed while the bell was
                    # being armed rang nothing).
                    closing_gap = True
                    await self._sleep(self.GAP_SECONDS)
                continue
            if not self.armed:
                if await self._arm():
                    closing_gap = True
                    await self._sleep(self.GAP_SECONDS)
                    continue  # claim once more: what committed before the bell was armed rang nothing
            else:
                self.idle.again(found_nothing=not found_since_sleep)
                found_since_sleep = False
            poll = self.settings.poll_seconds
            await self._sleep(min(poll, self.recheck.delay or poll, self.idle.delay or poll))

    async def _claim(self, claim: Callable[..., store.Call[list[store.claims.Claimed]]],
                     limit: int, arm: bool = False) -> list[store.claims.Claimed]:
        def call(n: int, bucket: int | None = None) -> store.Call[list[store.claims.Claimed]]:
            return claim(queue=self.queue, names=self.names, owner=self.worker_id, lease=self.settings.lease_seconds,
                         limit=n, version=self.version, adopt=self.settings.adopt_after_seconds,
                         **({} if bucket is None else {"bucket": bucket}), **({"arm": True} if arm else {}))

        if self._cursor is None:
            buckets = self._buckets()
            if buckets is None:
                return list(await self._run(call(limit)))
            self._cursor = BucketCursor(buckets)

        async def claim_in(bucket: int, n: int) -> list[store.claims.Claimed]:
            return list(await self._run(call(n, bucket)))

        async def probe() -> list[int]:
            return list(await self._run(store.claims.claimable_buckets(queue=self.queue, names=self.names)))

        return await self._cursor.claim(claim_in, limit, probe)

    async def _arm(self) -> bool:
        # Marked armed before the statement: an enqueue may ring the bell as soon as the statement commits,
        # and its NOTIFY may be handled (rung() clears the mark) before the statement returns here. Marked
        # after, that ring would be forgotten: the producer would believe its bell armed while nobody could
        # ring it again, and each wake-up would wait for the idle re-check (50 ms) until the next NOTIFY.
        self.armed = True
        try:
            await self._run(store.workers.arm_doorbell(id=self.worker_id, queue=self.queue))
        except Exception as exc:  # the poll (and the next round) still find the work
            self.armed = False
            log.warning("worker %s: could not arm the doorbell of queue %s (%s)", self.worker_id, self.queue, exc)
            return False
        return True
