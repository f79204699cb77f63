"""Cron expressions evaluated in an IANA time zone: validation, and the instants (UTC) at which they fire.

A tick is a wall-clock time in the schedule's zone that the expression matches. Around daylight saving time
changes pgdurable follows cron's usual rules:

- A schedule that runs every hour (its hour field matches all 24 hours, like ``*/5 * * * *``) follows
  elapsed time: in the hour repeated when clocks go back it fires in both passes, and the wall times
  skipped when clocks go forward do not exist, so they do not fire.
- A schedule for given hours (``30 2 * * *``) fires once per wall time: a repeated time fires the first
  time only, and a time skipped when clocks go forward fires at the moment of the jump.

croniter matches the expression against naive wall times; this module maps them to instants itself (rather
than relying on croniter's own time zone arithmetic) so that the rules above hold in every zone.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, CroniterError, croniter

_ALIASES = frozenset({"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"})
# croniter's random (R) and hashed (H) fields: a schedule's ticks must not depend on who computes them.
_RANDOM_OR_HASHED = re.compile(r"(?<![a-z])[hr](?![a-z])", re.IGNORECASE)
_SECOND = timedelta(seconds=1)
# No tick within this long after a given instant means the expression never fires (like "0 0 31 2 *").
_HORIZON = timedelta(days=366 * 100)


class CronSchedule:
    """A validated cron expression in a time zone. Raises ``ValueError`` with a clear message if either is bad.

    Five fields (minute hour day-of-month month day-of-week), six with seconds first
    (second minute hour day-of-month month day-of-week), or one of @yearly, @monthly, @weekly, @daily,
    @hourly. Day and month names (MON, JAN) and croniter's L, W and # forms are accepted.
    """

    def __init__(self, expression: str, timezone: str = "UTC") -> None:
        if not isinstance(expression, str) or not isinstance(timezone, str):
            raise ValueError("the cron expression and the time zone must be strings")
        self.expression = " ".join(expression.split())
        fields = self.expression.split(" ")
        if self.expression.startswith("@"):
            if self.expression.lower() not in _ALIASES:
                raise ValueError(f"invalid cron expression {expression!r}: unknown alias; use one of "
                                 + ", ".join(sorted(_ALIASES)))
        elif len(fields) not in (5, 6):
            raise ValueError(
                f"invalid cron expression {expression!r}: expected 5 fields (minute hour day-of-month month "
                "day-of-week) or 6 with seconds first (second minute hour day-of-month month day-of-week), "
                f"got {len(fields) if self.expression else 0}")
        if _RANDOM_OR_HASHED.search(self.expression):
            raise ValueError(f"invalid cron expression {expression!r}: random (R) and hashed (H) fields are "
                             "not supported")
        self._seconds_first = len(fields) == 6
        try:
            expanded, _ = croniter.expand(self.expression, second_at_beginning=self._seconds_first)
        except (CroniterError, ValueError, TypeError, KeyError, IndexError) as exc:
            raise ValueError(f"invalid cron expression {expression!r}: {exc}") from None
        hours = expanded[1]
        # Runs every hour: follows elapsed time across daylight saving changes (see the module docstring).
        self.every_hour = hours == ["*"] or len(set(hours)) == 24
        self.timezone = timezone
        self.zone = _zone(timezone)

    def __repr__(self) -> str:
        return f"CronSchedule({self.expression!r}, {self.timezone!r})"

    # -- ticks --------------------------------------------------------------------------------------------

    def next_after(self, instant: datetime) -> datetime:
        """The first tick strictly after ``instant``, in UTC. ``ValueError`` if the expression never fires."""
        for tick in self.iter_after(instant):
            return tick
        raise ValueError(f"cron expression {self.expression!r} never fires")

    def iter_after(self, instant: datetime) -> Iterator[datetime]:
        """Every tick strictly after ``instant``, in order, in UTC (lazily; stops after a century without one)."""
        start = _utc(instant)
        limit = start + _HORIZON
        # Look ahead in windows that double while empty (sparse expressions), starting from a guess: how far
        # the next matching wall time is.
        span = max(_SECOND, self._guess(start))
        while start < limit:
            end = min(start + span, limit)
            ticks = self.ticks_between(start, end)
            yield from ticks
            if not ticks and self._naive_after(start.replace(tzinfo=None) - timedelta(days=2)) is None:
                return  # no matching wall time at all from here on
            start, span = end, span * 2

    def ticks_between(self, after: datetime, until: datetime) -> list[datetime]:
        """The ticks ``t`` with ``after < t <= until``, sorted, in UTC."""
        after, until = _utc(after), _utc(until)
        if until <= after:
            return []
        offsets = self._offsets(after - _SECOND, until)
        # Every wall time whose instant can fall in the window, given the offsets in force across it.
        first = after.replace(tzinfo=None) + min(offsets) - _SECOND
        last = until.replace(tzinfo=None) + max(offsets)
        found: set[datetime] = set()
        walls = croniter(self.expression, first, second_at_beginning=self._seconds_first)
        while True:
            try:
                wall = walls.get_next(datetime)
            except CroniterBadDateError:
                break
            if wall > last:
                break
            found.update(t for t in self._instants(wall) if after < t <= until)
        return sorted(found)

    # -- wall times to instants ---------------------------------------------------------------------------

    def _instants(self, wall: datetime) -> list[datetime]:
        """The instants at which the matching naive wall time ``wall`` fires (none, one, or two)."""
        first = wall.replace(tzinfo=self.zone).astimezone(UTC)  # fold=0: the earlier reading
        second = wall.replace(tzinfo=self.zone, fold=1).astimezone(UTC)
        if first == second:
            return [first]
        if first.astimezone(self.zone).replace(tzinfo=None) == wall:  # happens twice: clocks went back
            return [first, second] if self.every_hour else [first]
        # Does not exist: clocks jumped over it. fold=0 reads it with the offset before the jump, fold=1 with
        # the one after, so the jump lies between the two readings.
        if self.every_hour:
            return []
        return [self._jump(min(first, second), max(first, second))]

    def _jump(self, before: datetime, after: datetime) -> datetime:
        """The first second at which the offset in force at ``after`` starts (a transition in between)."""
        target = self._offset(after)
        while after - before > _SECOND:
            middle = before + (after - before) // 2
            middle = middle.replace(microsecond=0)
            if middle <= before:
                break
            if self._offset(middle) == target:
                after = middle
            else:
                before = middle
        return after

    def _offset(self, instant: datetime) -> timedelta:
        offset = instant.astimezone(self.zone).utcoffset()
        assert offset is not None
        return offset

    def _offsets(self, start: datetime, end: datetime) -> set[timedelta]:
        """The UTC offsets in force between two instants, sampled finely enough for real-world zones."""
        step = max(timedelta(hours=1), (end - start) / 2000)
        found = {self._offset(start), self._offset(end)}
        probe = start + step
        while probe < end:
            found.add(self._offset(probe))
            probe += step
        return found

    def _naive_after(self, wall: datetime) -> datetime | None:
        try:
            return croniter(self.expression, wall, second_at_beginning=self._seconds_first).get_next(datetime)
        except CroniterBadDateError:
            return None

    def _guess(self, start: datetime) -> timedelta:
        wall = start.astimezone(self.zone).replace(tzinfo=None)
        following = self._naive_after(wall)
        return following - wall if following is not None else _SECOND


def _zone(name: str) -> tzinfo:
    if not name:
        raise ValueError("the time zone must not be empty; use an IANA name such as 'UTC' or 'Europe/Paris'")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValueError(f"unknown time zone {name!r}: use an IANA name such as 'UTC', 'Europe/Paris' or "
                         "'America/New_York'") from None


def _utc(instant: datetime) -> datetime:
    if instant.tzinfo is None:
        raise ValueError("instants must be timezone-aware datetimes")
    return instant.astimezone(UTC)
