"""Cron schedules: tick arithmetic in time zones, firing exactly once across workers and crashes, catch-up
after downtime, pause/resume, invalid definitions and rows, and the command line. Real PostgreSQL, real
workers (in-process threads, and real processes in one test)."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import signal
import statistics
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest
from psycopg import sql
from typer.testing import CliRunner

import pgdurable
from pgdurable.cli import cli
from pgdurable.cli._common import console
from pgdurable.cron import CronSchedule
from pgdurable.db import aconfigure
from pgdurable.sqlfiles import migrations
from pgdurable.worker.maintenance.scheduler import fire_due
from tests.harness import WAIT, wait_for, wait_listening

PARIS = "Europe/Paris"




def _ticks(db: psycopg.Connection[Any], schedule: str) -> list[datetime]:
    """The ticks of ``schedule`` that were enqueued, from their execution ids, in order."""
    prefix = f"sched:{schedule}:"
    rows = db.execute("SELECT id FROM workflow_executions WHERE starts_with(id, %s)", (prefix,)).fetchall()
    return sorted(datetime.strptime(row[0][len(prefix):], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC) for row in rows)


def _contiguous(ticks: list[datetime], step: timedelta) -> bool:
    return all(b - a == step for a, b in itertools.pairwise(ticks))


def _utc(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


# -- tick arithmetic (no database) ------------------------------------------------------------------------

def test_ticks_follow_the_time_zone_across_daylight_saving_changes() -> None:
    # A given hour: the skipped 02:30 fires at the jump (03:00 CEST); the repeated 02:30 fires once.
    daily = CronSchedule("30 2 * * *", PARIS)
    assert daily.ticks_between(_utc("2024-03-30T12:00Z"), _utc("2024-04-01T12:00Z")) == [
        _utc("2024-03-31T03:00+02:00"), _utc("2024-04-01T02:30+02:00")]
    assert daily.ticks_between(_utc("2024-10-26T12:00Z"), _utc("2024-10-28T12:00Z")) == [
        _utc("2024-10-27T02:30+02:00"), _utc("2024-10-28T02:30+01:00")]
    # Every hour: elapsed time. No tick in the skipped hour; both passes of the repeated one; even spacing.
    half_hourly = CronSchedule("*/30 * * * *", PARIS)
    spring = half_hourly.ticks_between(_utc("2024-03-31T00:00Z"), _utc("2024-03-31T02:00Z"))
    assert [t.astimezone(ZoneInfo(PARIS)).strftime("%H:%M") for t in spring] == ["01:30", "03:00", "03:30", "04:00"]
    autumn = half_hourly.ticks_between(_utc("2024-10-26T23:00Z"), _utc("2024-10-27T03:00Z"))
    assert len(autumn) == 8 and _contiguous(autumn, timedelta(minutes=30))
    assert [t.astimezone(ZoneInfo(PARIS)).strftime("%H:%M") for t in autumn][1:5] == [
        "02:00", "02:30", "02:00", "02:30"]
    # A 30-minute shift (Lord Howe): every 10 minutes stays every 10 minutes of elapsed time.
    lord_howe = CronSchedule("*/10 * * * *", "Australia/Lord_Howe")
    around = lord_howe.ticks_between(_utc("2024-04-06T14:00Z"), _utc("2024-04-06T16:00Z"))
    assert len(around) == 12 and _contiguous(around, timedelta(minutes=10))
    # Weekdays at 09:00 New York: from Friday evening to Monday 09:00 EST, then after the March change, EDT.
    weekdays = CronSchedule("0 9 * * MON-FRI", "America/New_York")
    assert weekdays.next_after(_utc("2024-03-01T23:00Z")) == _utc("2024-03-04T14:00Z")
    assert weekdays.next_after(_utc("2024-03-08T23:00Z")) == _utc("2024-03-11T13:00Z")
    # Six fields: seconds first. Aliases.
    assert CronSchedule("*/15 * * * * *").next_after(_utc("2024-01-01T00:00:01Z")) == _utc("2024-01-01T00:00:15Z")
    assert CronSchedule("@hourly", PARIS).next_after(_utc("2024-01-01T00:10Z")) == _utc("2024-01-01T01:00Z")
    every_second = CronSchedule("* * * * * *", PARIS)  # across the autumn change: every second of elapsed time
    seconds = every_second.ticks_between(_utc("2024-10-27T00:59:00Z"), _utc("2024-10-27T01:01:00Z"))
    assert len(seconds) == 120 and _contiguous(seconds, timedelta(seconds=1))


@pytest.mark.parametrize(("cron", "timezone", "message"), [
    ("garbage", "UTC", "expected 5 fields"),
    ("61 * * * *", "UTC", "invalid cron expression"),
    ("* * * * * * *", "UTC", "expected 5 fields"),
    ("*/0 * * * *", "UTC", "invalid cron expression"),
    ("H * * * *", "UTC", "hashed (H)"),
    ("@reboot", "UTC", "unknown alias"),
    ("0 0 31 2 *", "UTC", "never fires"),
    ("* * * * *", "Mars/Olympus_Mons", "unknown time zone 'Mars/Olympus_Mons'"),
    ("* * * * *", "", "time zone must not be empty"),
    ("* * * * *", "../etc/passwd", "unknown time zone"),
])
def test_invalid_cron_or_time_zone_is_rejected_at_creation(app: pgdurable.App, db: psycopg.Connection[Any],
                                                           cron: str, timezone: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        app.schedule("bad", "some.workflow", cron, timezone=timezone)
    assert db.execute("SELECT count(*) FROM schedules").fetchone() == (0,)


def test_invalid_definitions_are_rejected_at_creation(app: pgdurable.App, db: psycopg.Connection[Any]) -> None:
    @app.workflow()
    def report(title: str, scheduled_at: datetime) -> str:
        return title

    @app.workflow()
    def plain(n: int) -> int:
        return n

    with pytest.raises(pgdurable.SerializationError, match="argument 'title'"):
        app.schedule("s", report, "* * * * *", args={"title": object()})
    with pytest.raises(pgdurable.SerializationError):
        app.schedule("s", "elsewhere.workflow", "* * * * *", args={"x": object()})
    with pytest.raises(TypeError, match="arguments do not fit workflow 'plain'"):
        app.schedule("s", plain, "* * * * *", args={"m": 1})
    with pytest.raises(TypeError, match="arguments do not fit workflow 'report'"):
        app.schedule("s", report, "* * * * *")  # title is missing
    with pytest.raises(TypeError, match="no parameter 'scheduled_at'"):
        app.schedule("s", plain, "* * * * *", args={"n": 1}, pass_scheduled_at=True)
    with pytest.raises(ValueError, match="must not hold 'scheduled_at'"):
        app.schedule("s", report, "* * * * *", args={"title": "t", "scheduled_at": "x"})
    with pytest.raises(ValueError, match="schedule name"):
        app.schedule("no spaces", plain, "* * * * *", args={"n": 1})
    with pytest.raises(ValueError, match="catch_up"):
        app.schedule("s", plain, "* * * * *", args={"n": 1}, catch_up="some")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="queue"):
        app.schedule("s", plain, "* * * * *", args={"n": 1}, queue="a b")
    with pytest.raises(ValueError, match="invalid cron expression"):
        app.scheduled("not cron")(plain)
    with pytest.raises(TypeError, match=r"above @app\.workflow"):
        app.scheduled("* * * * *")(lambda: None)  # type: ignore[type-var]
    assert db.execute("SELECT count(*) FROM schedules").fetchone() == (0,)

    # Valid: stored with the arguments encoded as an enqueue would, the tick time passed by default.
    stored = app.schedule("daily-report", report, "0 7 * * *", timezone=PARIS, args={"title": "sales"})
    assert (stored.workflow_name, stored.args, stored.pass_scheduled_at, stored.catch_up, stored.paused) == (
        "report", {"title": "sales"}, True, "skip", False)
    assert stored.next_fire_at is not None
    assert stored.next_fire_at.astimezone(ZoneInfo(PARIS)).strftime("%H:%M") == "07:00"
    db_now = db.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    assert stored.next_fire_at == CronSchedule("0 7 * * *", PARIS).next_after(db_now)


# -- firing -----------------------------------------------------------------------------------------------

def test_every_second_fires_each_tick_once_with_three_workers(make_app: Callable[..., pgdurable.App],
                                                              db: psycopg.Connection[Any], schema: str,
                                                              start_worker: Callable[..., Any]) -> None:
    # Workers that poll only hourly: every tick that fires was fired by the scheduler's own timer.
    app = make_app(poll_seconds=3600.0)
    db.execute("CREATE TABLE effects (tick timestamptz NOT NULL, worker_pid int)")  # no unique key on purpose

    @app.transaction()
    def record(conn: psycopg.Connection[Any], tick: datetime) -> None:
        conn.execute(sql.SQL("INSERT INTO {}.effects (tick) VALUES (%s)").format(sql.Identifier(schema)), (tick,))

    @app.workflow()
    def every_second(label: str, scheduled_at: datetime) -> str:
        record(scheduled_at)
        return f"{label}@{scheduled_at.isoformat()}"

    app.schedule("per-second", every_second, "* * * * * *", args={"label": "x"})
    workers = [start_worker(app) for _ in range(3)]
    wait_listening(app, 3)  # (the ticks' executions are claimed on their NOTIFY)
    wait_for(lambda: db.execute("SELECT count(*) FROM workflow_executions WHERE status = 'succeeded'")
             .fetchone()[0] >= 6, WAIT, "six ticks to run")  # type: ignore[index]
    for worker in workers:
        worker.stop()

    ticks = _ticks(db, "per-second")
    assert len(ticks) >= 6 and _contiguous(ticks, timedelta(seconds=1)), ticks
    effects = Counter(row[0] for row in db.execute("SELECT tick FROM effects"))
    outputs = dict(db.execute("SELECT id, output #>> '{}' FROM workflow_executions WHERE status = 'succeeded'"))
    assert effects and set(effects.values()) == {1}  # each tick's workflow applied its effect once
    for tick in effects:
        assert outputs[f"sched:per-second:{tick:%Y-%m-%dT%H:%M:%SZ}"] == f"x@{tick.isoformat()}"
    # On time: how late each execution was created after its tick, by the database's clock.
    lateness = [row[0] for row in db.execute(
        "SELECT extract(epoch FROM created_at) - extract(epoch FROM (input ->> 'scheduled_at')::timestamptz) "
        "FROM workflow_executions ORDER BY id")][1:]  # the first tick may predate the workers' start
    logging.getLogger("tests").info("tick lateness: median %.1f ms, max %.1f ms",
                                    statistics.median(lateness) * 1000, max(lateness) * 1000)
    assert min(lateness) >= 0  # never early
    # Tens of ms in practice. The bound is the period: a tick is typically fired before the next one is due,
    # which leaves a loaded machine ample room.
    assert statistics.median(lateness) < 1.0


def test_worker_processes_fire_each_tick_once_even_when_one_is_killed(
        spawn_worker: Callable[..., subprocess.Popen[bytes]], db: psycopg.Connection[Any]) -> None:
    procs = [spawn_worker("tests.apps.scheduled:app", "-c", "4") for _ in range(3)]
    wait_for(lambda: len(_ticks(db, "every-second")) >= 3, WAIT, "three ticks from the worker processes")
    procs[0].send_signal(signal.SIGKILL)  # mid-whatever: firing, running, idle
    procs[0].wait()
    seen = len(_ticks(db, "every-second"))
    wait_for(lambda: len(_ticks(db, "every-second")) >= seen + 3, WAIT, "three more ticks after the kill")
    # Whatever the killed worker held is swept back after its lease and finishes on a survivor.
    wait_for(lambda: db.execute("SELECT count(*) FROM workflow_executions WHERE status <> 'succeeded' "
                                "AND created_at < now() - interval '1 second'").fetchone()[0] == 0,  # type: ignore[index]
             WAIT, "the killed worker's executions to finish elsewhere")
    for proc in procs[1:]:
        proc.send_signal(signal.SIGTERM)
    for proc in procs[1:]:
        assert proc.wait(timeout=WAIT) == 0

    row = db.execute("SELECT workflow_name, cron, catch_up, paused FROM schedules WHERE name = 'every-second'")
    assert row.fetchone() == ("scheduled.tick", "* * * * * *", "all", False)  # declared by the decorator
    ticks = _ticks(db, "every-second")
    assert _contiguous(ticks, timedelta(seconds=1)), ticks  # none missed, none doubled
    outputs = db.execute("SELECT id, output #>> '{}' FROM workflow_executions WHERE status = 'succeeded'")
    for execution_id, output in outputs:  # each execution ran with its own tick's time
        assert execution_id == f"sched:every-second:{_utc(output):%Y-%m-%dT%H:%M:%SZ}"
    lateness = [row[0] for row in db.execute(
        "SELECT extract(epoch FROM created_at) - extract(epoch FROM (input ->> 'scheduled_at')::timestamptz) "
        "FROM workflow_executions ORDER BY id")][1:]  # the first tick may predate the workers' start
    assert min(lateness) >= 0 and statistics.median(lateness) < 1.0  # never early; on time (within the period)


async def test_concurrent_firing_transactions_never_double_a_tick(app: pgdurable.App, db: psycopg.Connection[Any],
                                                                  database_url: str, schema: str) -> None:
    app.schedule("fast", "elsewhere.workflow", "* * * * * *", queue="nobody", catch_up="all")
    db.execute("UPDATE schedules SET next_fire_at = now() - interval '5 seconds'")

    async def connect() -> psycopg.AsyncConnection[Any]:
        conn = await psycopg.AsyncConnection.connect(database_url, autocommit=True)
        await aconfigure(conn, schema)
        return conn

    first, second, third, admin = [await connect() for _ in range(4)]
    try:
        # Two firing transactions at once: the second skips the schedule the first holds.
        async with first.transaction():
            by_first = await fire_due(first)
            assert len(by_first.fired) >= 5 and by_first.enqueued == by_first.fired
            async with second.transaction():
                by_second = await fire_due(second)
            assert (by_second.locked, by_second.fired) == (0, [])
        async with second.transaction():  # after the first committed: nothing it fired is due any more
            assert not set((await fire_due(second)).fired) & set(by_first.fired)

        # A firing transaction whose session dies before it commits (a worker killed mid-pass) fires nothing;
        # the next pass fires those ticks, once.
        await asyncio.sleep(1.1)  # a new tick is due
        await third.execute("BEGIN")
        lost = await fire_due(third)
        assert lost.enqueued
        await admin.execute("SELECT pg_terminate_backend(%s)", (third.info.backend_pid,))
        with pytest.raises(psycopg.OperationalError):
            await third.execute("COMMIT")
        assert not db.execute("SELECT count(*) FROM workflow_executions WHERE id = ANY(%s)",
                              (lost.enqueued,)).fetchone()[0]  # type: ignore[index]
        async with second.transaction():
            again = await fire_due(second)
        assert set(lost.enqueued) <= set(again.enqueued)

        # Many firers racing in a loop: every tick is fired by exactly one of them, and none is missed.
        firers = [await connect() for _ in range(5)]
        fired: list[str] = []

        async def race(conn: psycopg.AsyncConnection[Any]) -> None:
            deadline = time.monotonic() + WAIT
            while len(fired) < 3:  # a few ticks coming due while five firers race for each
                assert time.monotonic() < deadline, f"only {len(fired)} ticks fired in {WAIT:.0f} s"
                async with conn.transaction():
                    fired.extend((await fire_due(conn)).fired)
                await asyncio.sleep(0.002)

        await asyncio.gather(*(race(conn) for conn in firers))
        for conn in firers:
            await conn.close()
        assert len(fired) >= 3 and len(fired) == len(set(fired))
    finally:
        for conn in (first, second, third, admin):
            await conn.close()
    ticks = _ticks(db, "fast")
    assert _contiguous(ticks, timedelta(seconds=1)), ticks


def test_catch_up_after_downtime_skip_versus_all(app: pgdurable.App, db: psycopg.Connection[Any],
                                                 start_worker: Callable[..., Any],
                                                 caplog: pytest.LogCaptureFixture) -> None:
    # Executions go to a queue nobody serves, so they stay visible as enqueued.
    for name, catch_up in (("minutely-skip", "skip"), ("minutely-all", "all")):
        app.schedule(name, "elsewhere.report", "* * * * *", queue="nobody", catch_up=catch_up)  # type: ignore[arg-type]
    app.schedule("secondly-all", "elsewhere.report", "* * * * * *", queue="nobody", catch_up="all")
    # The workers were down: the minutely schedules last fired 10 minutes ago, the per-second one 1500 s ago.
    [missed_from] = db.execute(
        "UPDATE schedules SET next_fire_at = date_trunc('minute', now()) - interval '10 minutes' "
        "WHERE name LIKE 'minutely-%%' RETURNING next_fire_at").fetchone() or [None]  # type: ignore[misc]
    db.execute("UPDATE schedules SET next_fire_at = date_trunc('second', now()) - interval '1500 seconds' "
               "WHERE name = 'secondly-all'")
    with caplog.at_level(logging.WARNING, logger="pgdurable.schedules"):
        start_worker(app)
        wait_for(lambda: db.execute("SELECT bool_and(next_fire_at > now()) FROM schedules").fetchone()[0], WAIT,
                 "every schedule to catch up")  # type: ignore[index]
    fired_at = db.execute("SELECT now()").fetchone()[0]  # type: ignore[index]

    # Every missed minute (10, or 11 if a minute began since), up to the current one.
    every = _ticks(db, "minutely-all")
    assert every[0] == missed_from and len(every) >= 11 and _contiguous(every, timedelta(minutes=1))
    assert fired_at - timedelta(minutes=1) < every[-1] <= fired_at
    # Only the ticks late by less than the 60 s grace: the last missed one, and the next if a minute began
    # while the worker caught up (a loaded machine).
    skipped = _ticks(db, "minutely-skip")
    assert 1 <= len(skipped) <= 2 and skipped == every[-len(skipped):], (skipped, every)
    assert f"skipped {len(every) - len(skipped)} missed tick(s) late by more than 60 s" in caplog.text
    per_second = _ticks(db, "secondly-all")  # 1500+ ticks: more than one pass (1000 at most per pass)
    assert len(per_second) >= 1500 and _contiguous(per_second, timedelta(seconds=1))


def test_pause_and_resume(app: pgdurable.App, db: psycopg.Connection[Any],
                          start_worker: Callable[..., Any]) -> None:
    @app.workflow()
    def beat(scheduled_at: datetime) -> None:
        pass

    app.schedule("beat", beat, "* * * * * *")
    app.schedule("witness", beat, "* * * * * *")  # never paused: shows the passes that would have fired "beat"
    start_worker(app)
    wait_for(lambda: len(_ticks(db, "beat")) >= 2, WAIT, "two ticks")
    assert app.pause_schedule("beat")
    paused_at = db.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    before = _ticks(db, "beat")
    # Two ticks of the witness due after the pause: passes that found "beat" due too (without the pause)
    wait_for(lambda: len([t for t in _ticks(db, "witness") if t > paused_at]) >= 2, WAIT,
             "two witness ticks after the pause")
    assert _ticks(db, "beat") == before  # a pause commits after any pass holding the row: nothing fires after
    assert app.get_schedule("beat").paused  # type: ignore[union-attr]

    assert app.resume_schedule("beat")
    resumed_at = db.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    wait_for(lambda: len(_ticks(db, "beat")) >= len(before) + 2, WAIT, "two ticks after resuming")
    after = [t for t in _ticks(db, "beat") if t not in before]
    assert after[0] > resumed_at - timedelta(seconds=1)  # the ticks missed while paused did not fire
    assert not [t for t in after if paused_at < t < resumed_at - timedelta(seconds=1)]
    assert not app.pause_schedule("nope") and not app.resume_schedule("nope")
    assert app.unschedule("witness")
    assert app.unschedule("beat") and not app.unschedule("beat")
    assert app.list_schedules() == []


def test_a_row_edited_into_garbage_is_paused_and_the_worker_keeps_working(
        app: pgdurable.App, db: psycopg.Connection[Any], start_worker: Callable[..., Any],
        caplog: pytest.LogCaptureFixture) -> None:
    @app.workflow()
    def job(n: int) -> int:
        return n * 2

    app.schedule("good", job, "* * * * * *", args={"n": 1})
    app.schedule("bad-cron", job, "* * * * * *", args={"n": 2})
    db.execute("UPDATE schedules SET cron = 'every full moon' WHERE name = 'bad-cron'")
    # Written by plain SQL, without next_fire_at: a worker plans it (here, into a pause).
    db.execute("INSERT INTO schedules (name, workflow_name, cron, timezone, args) "
               "VALUES ('bad-zone', 'job', '* * * * *', 'Mars/Olympus_Mons', '{\"n\": 3}')")
    db.execute("INSERT INTO schedules (name, workflow_name, cron, args) VALUES ('by-sql', 'job', '* * * * * *', "
               "'{\"n\": 4}')")
    with caplog.at_level(logging.WARNING, logger="pgdurable.schedules"):
        start_worker(app)
        wait_for(lambda: db.execute("SELECT count(*) FROM schedules WHERE paused").fetchone()[0] == 2, WAIT,
                 "both invalid schedules to be paused")  # type: ignore[index]
    errors = dict(db.execute("SELECT name, last_error FROM schedules WHERE paused"))
    assert "invalid cron expression 'every full moon'" in errors["bad-cron"]
    assert "unknown time zone 'Mars/Olympus_Mons'" in errors["bad-zone"]
    assert "schedule bad-cron: paused by a worker" in caplog.text

    # The worker goes on: the good schedule keeps firing, enqueued work runs.
    seen = len(_ticks(db, "good"))
    assert app.enqueue(job, 21).result(timeout=WAIT) == 42
    wait_for(lambda: len(_ticks(db, "good")) >= seen + 2, WAIT, "the good schedule to keep firing")
    wait_for(lambda: _ticks(db, "by-sql"), WAIT, "the schedule inserted by SQL to fire")
    assert not _ticks(db, "bad-cron") and not _ticks(db, "bad-zone")

    # It cannot be resumed as it is; redefining it with a valid expression brings it back.
    with pytest.raises(ValueError, match="cannot be resumed: invalid cron expression"):
        app.resume_schedule("bad-cron")
    fixed = app.schedule("bad-cron", job, "* * * * * *", args={"n": 2})
    assert not fixed.paused and fixed.last_error is None
    wait_for(lambda: _ticks(db, "bad-cron"), WAIT, "the redefined schedule to fire")


def test_declared_schedules_are_stored_when_a_worker_starts(app: pgdurable.App, db: psycopg.Connection[Any],
                                                             start_worker: Callable[..., Any]) -> None:
    @app.scheduled("0 6 1 1 *", timezone=PARIS, args={"year_end": True})
    @app.workflow()
    def new_year(year_end: bool, scheduled_at: datetime) -> None:
        pass

    with pytest.raises(ValueError, match="declared twice"):
        app.scheduled("0 7 * * *", args={"year_end": False})(new_year)
    assert app.list_schedules() == []  # declared only: stored by a worker
    worker = start_worker(app)
    stored = wait_for(lambda: app.get_schedule("new_year"), WAIT, "the worker to store the declared schedule")
    assert (stored.cron, stored.timezone, stored.args, stored.pass_scheduled_at) == (
        "0 6 1 1 *", PARIS, {"year_end": True}, True)
    assert stored.next_fire_at.astimezone(ZoneInfo(PARIS)).strftime("%m-%d %H:%M") == "01-01 06:00"
    worker.stop()

    # A restart redefines it unchanged: no write at all. An operator's pause survives it.
    assert app.pause_schedule("new_year")
    paused = app.get_schedule("new_year")
    worker = start_worker(app)
    wait_for(lambda: worker.worker.scheduler is not None and worker.worker.scheduler._declared, WAIT,
             "the restarted worker to declare its schedules")
    worker.stop()
    assert app.get_schedule("new_year") == paused
    # A changed timetable moves the next tick; a changed argument alone keeps it.
    moved = app.schedule("new_year", new_year, "0 6 2 1 *", timezone=PARIS, args={"year_end": True})
    assert moved.next_fire_at != stored.next_fire_at and moved.paused
    kept = app.schedule("new_year", new_year, "0 6 2 1 *", timezone=PARIS, args={"year_end": False})
    assert kept.next_fire_at == moved.next_fire_at and kept.args == {"year_end": False}


def test_a_new_schedule_wakes_running_workers(make_app: Callable[..., pgdurable.App], db: psycopg.Connection[Any],
                                              start_worker: Callable[..., Any]) -> None:
    app = make_app(poll_seconds=3600.0)  # without the NOTIFY, the workers would look an hour later
    workers = [start_worker(app), start_worker(app)]
    # each scheduler has made its first pass (it declares first): from then on it sleeps, found nothing due
    wait_for(lambda: all(w.worker.scheduler is not None and w.worker.scheduler._declared for w in workers), WAIT,
             "both schedulers to start")
    wait_listening(app, 2)
    created = app.schedule("soon", "elsewhere.workflow", "* * * * * *", queue="nobody")
    wait_for(lambda: _ticks(db, "soon"), WAIT, "the first tick of a schedule created while workers sleep")
    assert created.next_fire_at is not None and _ticks(db, "soon")[0] == created.next_fire_at


def test_worker_roles_granted_before_the_upgrade_may_fire_schedules(database_url: str, schema: str) -> None:
    role = f"worker_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(role)))
        try:
            with conn.transaction():  # a schema at version 2, its worker role granted, then upgraded
                conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
                conn.execute(sql.SQL("SET LOCAL search_path TO {}, pg_temp").format(sql.Identifier(schema)))
                for version, _, text in migrations():
                    if version <= 2:
                        conn.execute(text)
                conn.execute("SELECT grant_worker_role(%s)", (role,))
                [text_4] = [text for version, _, text in migrations() if version == 4]
                conn.execute(text_4)
                granted = conn.execute("SELECT has_table_privilege(%s, 'schedules', 'SELECT, INSERT, UPDATE, DELETE')",
                                       (role,)).fetchone()
            assert granted == (True,)
        finally:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


# -- command line -----------------------------------------------------------------------------------------

def test_cli_schedules(app: pgdurable.App, db: psycopg.Connection[Any], database_url: str, schema: str,
                       monkeypatch: pytest.MonkeyPatch) -> None:
    # The CLI's console reads its width once, when it is imported: under pytest-xdist that is 80 columns, too
    # narrow for the table's "nightly" to survive. The width is set here rather than through COLUMNS.
    monkeypatch.setattr(console, "width", 250)

    def run(*args: str) -> Any:
        return CliRunner().invoke(cli, ["schedules", *args, "--database-url", database_url, "--schema", schema])

    made = run("create", "nightly", "reports.nightly", "30 2 * * *", "--tz", PARIS, "--args", '{"kind": "full"}',
               "--catch-up", "all", "--queue", "reports", "--json")
    assert made.exit_code == 0, made.output
    assert json.loads(made.output)["next_fire_at"]
    listed = run("list", "--json")
    assert listed.exit_code == 0, listed.output
    [row] = json.loads(listed.output)
    assert {k: row[k] for k in ("name", "workflow_name", "cron", "timezone", "queue", "args", "catch_up",
                                "paused")} == {
        "name": "nightly", "workflow_name": "reports.nightly", "cron": "30 2 * * *", "timezone": PARIS,
        "queue": "reports", "args": {"kind": "full"}, "catch_up": "all", "paused": False}
    assert run("pause", "nightly").exit_code == 0
    assert app.get_schedule("nightly").paused  # type: ignore[union-attr]
    table = run("list")
    assert table.exit_code == 0 and "nightly" in table.output and "paused" in table.output
    assert run("resume", "nightly").exit_code == 0
    assert not app.get_schedule("nightly").paused  # type: ignore[union-attr]

    bad = run("create", "x", "wf", "*/5 * * *")
    assert bad.exit_code == 2 and "expected 5 fields" in bad.output
    zone = run("create", "x", "wf", "*/5 * * * *", "--tz", "Nowhere/Special")
    assert zone.exit_code == 2 and "unknown time zone 'Nowhere/Special'" in zone.output
    args = run("create", "x", "wf", "*/5 * * * *", "--args", "[1, 2]")
    assert args.exit_code == 2 and "JSON object" in args.output
    for command in ("pause", "resume", "delete"):
        missing = run(command, "no-such")
        assert missing.exit_code == 1 and "no schedule named no-such" in missing.output
    assert run("delete", "nightly").exit_code == 0
    assert json.loads(run("list", "--json").output) == []
