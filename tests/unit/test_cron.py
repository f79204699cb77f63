"""cron.py: parsing, next ticks, daylight saving time transitions, bad expressions."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgdurable.cron import CronSchedule


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


# ---- parsing ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("expression", [
    "* * * * *", "*/5 * * * *", "0 9 * * MON-FRI", "0 0 1 JAN *", "30 2 * * *", "0 0 L * *",
    "0 0 * * 5#3", "15 * * * * *", "@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight",
    "@hourly", "@DAILY", "  0   3  * * *  ",
])
def test_valid_expressions(expression: str) -> None:
    schedule = CronSchedule(expression, "Europe/Paris")
    assert schedule.expression == " ".join(expression.split())
    assert schedule.next_after(utc(2026, 1, 1)) > utc(2026, 1, 1)


@pytest.mark.parametrize(("expression", "message"), [
    ("", "expected 5 fields"),
    ("* * * *", "got 4"),
    ("* * * * * * *", "got 7"),
    ("61 * * * *", "invalid cron expression"),
    ("* 24 * * *", "invalid cron expression"),
    ("* * 32 * *", "invalid cron expression"),
    ("* * * 13 *", "invalid cron expression"),
    ("a b c d e", "invalid cron expression"),
    ("@fortnightly", "unknown alias"),
    ("H * * * *", "random (R) and hashed (H)"),
    ("0 R * * *", "random (R) and hashed (H)"),
    ("0 h * * *", "random (R) and hashed (H)"),
])
def test_bad_expressions_raise_value_error(expression: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        CronSchedule(expression)


@pytest.mark.parametrize("zone", ["", "Mars/Olympus_Mons", "../../etc/passwd", "Europe/"])
def test_bad_time_zones(zone: str) -> None:
    with pytest.raises(ValueError, match="time zone"):
        CronSchedule("* * * * *", zone)


@pytest.mark.parametrize(("expression", "zone"), [(None, "UTC"), ("* * * * *", None), (5, "UTC")])
def test_non_strings_are_refused(expression: object, zone: object) -> None:
    with pytest.raises(ValueError, match="must be strings"):
        CronSchedule(expression, zone)  # type: ignore[arg-type]


def test_every_hour_classification() -> None:
    assert CronSchedule("*/5 * * * *").every_hour
    assert CronSchedule("0 0-23 * * *").every_hour
    assert CronSchedule("@hourly").every_hour
    assert not CronSchedule("30 2 * * *").every_hour
    assert not CronSchedule("0 0-22 * * *").every_hour
    assert not CronSchedule("@daily").every_hour


def test_repr() -> None:
    assert repr(CronSchedule("@daily", "Asia/Tokyo")) == "CronSchedule('@daily', 'Asia/Tokyo')"


# ---- ticks ------------------------------------------------------------------------------------------------

def test_next_after_is_strictly_after() -> None:
    schedule = CronSchedule("0 * * * *")
    assert schedule.next_after(utc(2026, 5, 1, 10)) == utc(2026, 5, 1, 11)
    assert schedule.next_after(utc(2026, 5, 1, 10, 0, 0) - timedelta(microseconds=1)) == utc(2026, 5, 1, 10)


def test_ticks_in_the_schedules_zone_returned_in_utc() -> None:
    tick = CronSchedule("0 9 * * *", "Asia/Tokyo").next_after(utc(2026, 4, 30, 12))
    assert tick == utc(2026, 5, 1, 0)  # 09:00 JST
    assert tick.tzinfo is UTC


def test_seconds_field() -> None:
    schedule = CronSchedule("*/15 * * * * *")
    ticks = list(_take(schedule.iter_after(utc(2026, 1, 1)), 4))
    assert ticks == [utc(2026, 1, 1, 0, 0, s) for s in (15, 30, 45)] + [utc(2026, 1, 1, 0, 1, 0)]


def test_day_of_week_names() -> None:
    ticks = list(_take(CronSchedule("0 12 * * MON").iter_after(utc(2026, 6, 1)), 3))  # 2026-06-01 is a Monday
    assert ticks == [utc(2026, 6, 1, 12), utc(2026, 6, 8, 12), utc(2026, 6, 15, 12)]


def test_sparse_expression_leap_day() -> None:
    assert CronSchedule("0 0 29 2 *").next_after(utc(2026, 3, 1)) == utc(2028, 2, 29)


def test_never_firing_expression() -> None:
    schedule = CronSchedule("0 0 31 2 *")
    with pytest.raises(ValueError, match="never fires"):
        schedule.next_after(utc(2026, 1, 1))
    assert list(schedule.iter_after(utc(2026, 1, 1))) == []


def test_naive_instants_are_refused() -> None:
    schedule = CronSchedule("* * * * *")
    with pytest.raises(ValueError, match="timezone-aware"):
        schedule.next_after(datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="timezone-aware"):
        schedule.ticks_between(datetime(2026, 1, 1), utc(2026, 1, 2))


def test_ticks_between_bounds() -> None:
    schedule = CronSchedule("0 * * * *")
    assert schedule.ticks_between(utc(2026, 1, 1, 1), utc(2026, 1, 1, 3)) == [utc(2026, 1, 1, 2),
                                                                              utc(2026, 1, 1, 3)]
    assert schedule.ticks_between(utc(2026, 1, 1, 3), utc(2026, 1, 1, 1)) == []
    assert schedule.ticks_between(utc(2026, 1, 1, 3), utc(2026, 1, 1, 3)) == []


# ---- daylight saving time (Europe/Paris 2026: forward 29 March 02:00 -> 03:00, back 25 October 03:00 -> 02:00)

PARIS = "Europe/Paris"


def test_given_hour_skipped_fires_at_the_jump() -> None:
    # 02:30 does not exist on 29 March: it fires when the clocks jump, 03:00 CEST = 01:00 UTC.
    ticks = CronSchedule("30 2 * * *", PARIS).ticks_between(utc(2026, 3, 28, 12), utc(2026, 3, 30, 12))
    assert ticks == [utc(2026, 3, 29, 1, 0), utc(2026, 3, 30, 0, 30)]


def test_given_hour_repeated_fires_once() -> None:
    # 02:30 happens twice on 25 October: 00:30 UTC (CEST) and 01:30 UTC (CET); it fires the first time only.
    ticks = CronSchedule("30 2 * * *", PARIS).ticks_between(utc(2026, 10, 24, 12), utc(2026, 10, 26, 12))
    assert ticks == [utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)]


def test_every_hour_follows_elapsed_time_when_clocks_go_back() -> None:
    ticks = CronSchedule("*/30 * * * *", PARIS).ticks_between(utc(2026, 10, 24, 23, 59), utc(2026, 10, 25, 2))
    assert ticks == [utc(2026, 10, 25, 0, 0) + timedelta(minutes=30 * i) for i in range(5)]


def test_every_hour_skips_nonexistent_times_when_clocks_go_forward() -> None:
    ticks = CronSchedule("*/30 * * * *", PARIS).ticks_between(utc(2026, 3, 28, 23, 59), utc(2026, 3, 29, 1, 30))
    # 01:00 and 01:30 CET, then 03:00 and 03:30 CEST: the 02:xx wall times never existed.
    assert ticks == [utc(2026, 3, 29, 0, 0), utc(2026, 3, 29, 0, 30), utc(2026, 3, 29, 1, 0), utc(2026, 3, 29, 1, 30)]
    local = [t.astimezone(ZoneInfo(PARIS)).strftime("%H:%M") for t in ticks]
    assert local == ["01:00", "01:30", "03:00", "03:30"]


@pytest.mark.parametrize("zone", ["Europe/Paris", "America/New_York", "Australia/Lord_Howe", "America/Santiago"])
@pytest.mark.parametrize("window", [(utc(2026, 3, 1), utc(2026, 4, 10)), (utc(2026, 9, 1), utc(2026, 11, 5))])
def test_every_hour_ticks_are_evenly_spaced_across_transitions(zone: str, window: tuple[datetime, datetime]) -> None:
    ticks = CronSchedule("0 * * * *", zone).ticks_between(*window)
    assert len(ticks) > 24 * 30
    gaps = {b - a for a, b in itertools.pairwise(ticks)}
    if zone == "Australia/Lord_Howe":  # a half-hour shift: the hour marks move by 30 minutes
        assert gaps <= {timedelta(minutes=30), timedelta(hours=1), timedelta(minutes=90)}
    else:
        assert gaps == {timedelta(hours=1)}


@pytest.mark.parametrize("zone", ["Europe/Paris", "America/New_York", "Australia/Lord_Howe", "America/Santiago"])
@pytest.mark.parametrize("expression", ["30 2 * * *", "0 0 * * *", "59 1 * * *"])
def test_given_hour_fires_exactly_once_per_local_day(zone: str, expression: str) -> None:
    ticks = CronSchedule(expression, zone).ticks_between(utc(2026, 1, 1), utc(2027, 1, 1))
    days = [t.astimezone(ZoneInfo(zone)).date() for t in ticks]
    assert len(days) == len(set(days))
    assert len(days) >= 364
    assert ticks == sorted(ticks)


@settings(max_examples=40, deadline=None)
@given(start=st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2060, 1, 1), timezones=st.just(UTC)),
       zone=st.sampled_from(["UTC", "Europe/Paris", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe"]),
       expression=st.sampled_from(["*/7 * * * *", "0 3 * * *", "30 2 * * SUN", "0 0 1 * *", "15 */2 * * *"]))
def test_next_after_agrees_with_ticks_between(start: datetime, zone: str, expression: str) -> None:
    schedule = CronSchedule(expression, zone)
    first = schedule.next_after(start)
    assert first > start
    assert schedule.ticks_between(start, first) == [first]
    assert schedule.ticks_between(start, first - timedelta(seconds=1)) == []
    assert schedule.next_after(first) > first


def test_iter_after_is_ordered_and_unique() -> None:
    ticks = list(_take(CronSchedule("*/20 * * * *", PARIS).iter_after(utc(2026, 10, 24, 22)), 20))
    assert ticks == sorted(set(ticks))
    assert all(b - a == timedelta(minutes=20) for a, b in itertools.pairwise(ticks))


def _take(iterator: object, n: int) -> list[datetime]:
    out: list[datetime] = []
    for tick in iterator:  # type: ignore[attr-defined]
        out.append(tick)
        if len(out) == n:
            break
    return out
