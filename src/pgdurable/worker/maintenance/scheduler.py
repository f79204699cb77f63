"""The scheduler: fires cron schedules, from inside every worker.

One firing pass is one short transaction: lock the due schedules (``FOR UPDATE SKIP LOCKED``), read the
database's ``now()``, enqueue one execution per due tick with the id ``sched:<name>:<tick>`` (``ON CONFLICT
(id) DO NOTHING``), and advance each schedule's ``next_fire_at`` past the ticks fired. Enqueues and advance
commit together or not at all, and the lock keeps every other worker off the schedule meanwhile, so each tick
fires exactly once however many workers run and whenever they crash. Only the database's clock decides
what is due: a worker's clock, however wrong, changes nothing but how long it sleeps between looks.

Every worker, not only the leader: firing is already exactly-once and safe everywhere (the row locks above),
a worker sleeps until the next due time so its idle cost is one indexed statement per poll interval, and each
worker must store the schedules its own code declares (``@app.scheduled``). On the leader alone, a tick due
while leadership changes hands would fire up to a poll interval late.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import psycopg

from ... import schedules, store
from ...cron import CronSchedule
from ...waiting import wait_event

if TYPE_CHECKING:
    from psycopg_pool import AsyncConnectionPool

    from ...runtime import Runtime

log = logging.getLogger("pgdurable.schedules")

# With catch_up="skip", a missed tick still fires if it is late by less than this; older ones are skipped.
MISFIRE_GRACE = timedelta(seconds=60)
# With catch_up="all", at most this many ticks of one schedule per pass; the next pass (at once) goes on.
CATCH_UP_LIMIT = 1000
# Schedules locked per pass.
_BATCH = 100
_JUST_BEFORE = timedelta(microseconds=1)
# Wake a hair after the due time, so the database finds the schedule due rather than a microsecond early.
_OVERSLEEP = 0.002


@dataclass(frozen=True)
class Plan:
    """What one pass does with one due schedule."""

    ticks: list[datetime]
    next_fire_at: datetime
    skipped: int = 0  # missed ticks dropped by catch_up="skip" (counted up to CATCH_UP_LIMIT)
    more: bool = False  # catch_up="all" hit CATCH_UP_LIMIT: still due


def plan(cron: CronSchedule, catch_up: str, next_fire_at: datetime | None, now: datetime) -> Plan:
    """The ticks to fire now: those in [next_fire_at, now], as ``catch_up`` allows, and the next fire time."""
    if next_fire_at is None:  # never planned (a row inserted by hand): start from the next tick
        return Plan([], cron.next_after(now))
    due = itertools.takewhile(lambda tick: tick <= now, cron.iter_after(next_fire_at - _JUST_BEFORE))
    if catch_up == "all":
        ticks = list(itertools.islice(due, CATCH_UP_LIMIT))
        if len(ticks) == CATCH_UP_LIMIT:
            return Plan(ticks, cron.next_after(ticks[-1]), more=True)
        return Plan(ticks, cron.next_after(now))
    oldest = now - MISFIRE_GRACE
    skipped = 0
    if next_fire_at <= oldest:
        skipped = sum(1 for _ in itertools.islice(
            itertools.takewhile(lambda tick: tick <= oldest, cron.iter_after(next_fire_at - _JUST_BEFORE)),
            CATCH_UP_LIMIT))
    ticks = cron.ticks_between(max(next_fire_at - _JUST_BEFORE, oldest), now)
    return Plan(ticks, cron.next_after(now), skipped=skipped)


def execution_id(schedule_name: str, tick: datetime) -> str:
    return f"sched:{schedule_name}:{tick.strftime('%Y-%m-%dT%H:%M:%SZ')}"


@dataclass
class Fired:
    """The outcome of one firing pass."""

    locked: int = 0  # due schedules this pass locked
    fired: list[str] = field(default_factory=list)  # execution ids of the ticks this pass fired
    enqueued: list[str] = field(default_factory=list)  # of those, the ones it created (all, unless the id was
                                                       # already taken: a next_fire_at moved back by hand)
    paused: dict[str, str] = field(default_factory=dict)  # schedule name -> why
    squatted: list[str] = field(default_factory=list)  # tick ids held by an execution no firing created
    more: bool = False  # something is still due: run another pass at once


async def fire_due(conn: psycopg.AsyncConnection[Any], *, limit: int = _BATCH) -> Fired:
    """One firing pass, inside the caller's transaction on ``conn`` (the caller commits or rolls back)."""
    outcome = Fired()
    due = await store.arun(conn, schedules.lock_due_schedules(limit))
    outcome.locked = len(due)
    if not due:
        return outcome
    ticks: list[list[str]] = []
    advanced: list[list[str | None]] = []
    invalid: list[list[str]] = []
    for schedule in due:
        name = schedule.name
        try:
            step = plan(CronSchedule(schedule.cron, schedule.timezone), schedule.catch_up, schedule.next_fire_at,
                        schedule.now)
        except Exception as exc:  # a row edited by hand into nonsense: pause it rather than fail every pass
            reason = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
            message = f"paused by a worker: cannot compute its ticks: {reason}"
            log.warning("schedule %s: %s", name, message)
            invalid.append([name, message])
            outcome.paused[name] = message
            continue
        if step.skipped:
            log.warning("schedule %s: skipped %s missed tick(s) late by more than %d s (catch_up='skip')", name,
                        f"{step.skipped}" if step.skipped < CATCH_UP_LIMIT else f"at least {CATCH_UP_LIMIT}",
                        MISFIRE_GRACE.total_seconds())
        ticks.extend([execution_id(name, tick), name, tick.isoformat()] for tick in step.ticks)
        advanced.append([name, step.next_fire_at.isoformat(),
                         step.ticks[-1].isoformat() if step.ticks else None])
        outcome.more = outcome.more or step.more
    if ticks:
        created = await store.arun(conn, schedules.enqueue_ticks(json.dumps(ticks)))
        outcome.fired = [tick[0] for tick in ticks]
        outcome.enqueued = [tick[0] for tick in ticks if tick[0] in created]
        taken = [tick for tick in ticks if tick[0] not in created]
        if taken:
            # enqueue_workflow refuses "sched:" ids, but an older version did not, and a role with the tables'
            # privileges can still write one: such a row silently takes the tick's place, so say so.
            for squatted in await store.arun(conn, schedules.squatted_ticks(json.dumps(taken))):
                log.warning("schedule %s: tick %s did not fire: its execution id is already taken by an execution "
                            "of workflow %r created at %s, which no firing of this schedule created",
                            squatted.schedule_name, squatted.execution_id, squatted.workflow_name,
                            squatted.created_at.isoformat())
                outcome.squatted.append(squatted.execution_id)
    if advanced:
        await store.arun(conn, schedules.advance_schedules(json.dumps(advanced)))
    if invalid:
        await store.arun(conn, schedules.pause_invalid_schedules(json.dumps(invalid)))
    outcome.more = outcome.more or len(due) == limit
    return outcome


class Scheduler:
    """A worker's firing loop: sleeps until the earliest schedule is due (by the database's clock, at most
    ``poll_seconds``, woken early by a NOTIFY when schedules change), then fires a pass."""

    def __init__(self, runtime: Runtime, pool: AsyncConnectionPool[Any], worker_id: str) -> None:
        self.runtime = runtime
        self.pool = pool
        self.worker_id = worker_id
        self.poll_seconds = runtime.settings.poll_seconds
        self._wake = asyncio.Event()
        self._declared = False
        self._declare_at = 0.0  # monotonic time of the next attempt to store the declared schedules
        self._contended = 0

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        failures = 0
        while True:
            self._wake.clear()  # before looking: a NOTIFY that arrives meanwhile still wakes the next wait
            if not self._declared and time.monotonic() >= self._declare_at:
                await self._declare()
            try:
                delay = await self._pass()
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures = min(failures + 1, 6)
                log.warning("worker %s: firing schedules failed (%s); retrying", self.worker_id, exc)
                delay = 0.05 * 2.0 ** failures
            if delay > 0:
                await wait_event(self._wake, delay)

    async def _pass(self) -> float:
        """Fire what is due; return how long to sleep before the next pass."""
        async with self.pool.connection() as conn:
            wait: float | None = await store.arun(conn, schedules.seconds_until_due())
            if wait is None:
                return self.poll_seconds
            if wait > 0:
                return min(wait + _OVERSLEEP, self.poll_seconds)
            async with conn.transaction():
                fired = await fire_due(conn)
        if fired.enqueued:
            log.debug("worker %s: fired %s", self.worker_id, ", ".join(fired.enqueued))
        if not fired.locked:
            # Due, but locked: another worker is firing it (done in a moment), or a session holds its row.
            # Look again soon, backing off, rather than spin.
            self._contended = min(self._contended + 1, 10)
            return min(0.005 * 2.0 ** self._contended, self.poll_seconds)
        self._contended = 0
        return 0.0

    async def _declare(self) -> None:
        """Store the schedules declared with @app.scheduled (created, or redefined where they changed). On
        failure, firing goes on and this is tried again a little later."""
        try:
            async with self.pool.connection() as conn:
                for definition in self.runtime.declared_schedules.values():
                    async with conn.transaction():
                        now = await store.arun(conn, schedules.database_now())
                        await store.arun(conn, schedules.upsert_schedule(definition,
                                                                         definition.cron.next_after(now)))
        except Exception as exc:
            log.warning("worker %s: could not store the declared schedules (%s); retrying", self.worker_id, exc)
            self._declare_at = time.monotonic() + 5.0
            return
        self._declared = True
        if self.runtime.declared_schedules:
            log.info("worker %s: declared schedules %s", self.worker_id,
                     ", ".join(sorted(self.runtime.declared_schedules)))
