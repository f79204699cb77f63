"""Reading any stored row safely, for the read paths (``pgdurable status``, ``workflows list/show``, the
dashboard): times PostgreSQL can hold but Python cannot (``infinity``, ``-infinity``, years past 9999 or before
1), non-finite numbers, and JSON nested deeper than Python can decode or draw. None of these may crash a read
path: old rows and hand-written SQL can hold them whatever enqueue validates.

- ``register_loaders`` makes a connection load such times as ``ExtremeTime``: a ``datetime`` clamped to
  ``datetime.max`` / ``datetime.min`` (so comparisons and arithmetic work) that remembers PostgreSQL's text.
- ``load_json`` decodes stored JSON, refusing values nested deeper than ``MAX_DEPTH`` (``TooDeep``) instead
  of raising RecursionError later; ``json_or_note`` returns a short note in their place.
- ``plain`` turns a value into what ``json.dumps`` writes as strict JSON.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, tzinfo
from typing import Any

import psycopg
from psycopg.adapt import AdaptersMap
from psycopg.types.datetime import TimestamptzBinaryLoader, TimestamptzLoader

# Stored JSON nested deeper than this is not decoded for display (RecursionError in json, templates, rich).
MAX_DEPTH = 100


class ExtremeTime(datetime):
    """A time PostgreSQL holds but ``datetime`` cannot: clamped to ``datetime.max`` (infinity, after 9999)
    or ``datetime.min`` (-infinity, before year 1); ``source`` is PostgreSQL's text of it."""

    source: str

    def isoformat(self, sep: str = "T", timespec: str = "auto") -> str:
        return self.source

    def __str__(self) -> str:
        return self.source

    def __repr__(self) -> str:
        return f"ExtremeTime({self.source!r})"

    def __reduce__(self) -> Any:
        return (extreme_time, (self.source,))

    def __reduce_ex__(self, protocol: Any) -> Any:
        return (extreme_time, (self.source,))

    def __copy__(self) -> ExtremeTime:
        return self

    def __deepcopy__(self, memo: Any) -> ExtremeTime:
        return self


def extreme_time(text: str) -> ExtremeTime:
    """The ExtremeTime for PostgreSQL's text of a time out of ``datetime``'s range."""
    text = text.strip()
    lowered = text.lower()
    early = lowered.startswith("-") or lowered.endswith(" bc")
    limit = datetime.min if early else datetime.max
    value = ExtremeTime(limit.year, limit.month, limit.day, limit.hour, limit.minute, limit.second,
                        limit.microsecond, tzinfo=UTC)
    value.source = "-infinity" if lowered == "-infinity" else "infinity" if lowered == "infinity" else text
    return value


class _TimestamptzLoader(TimestamptzLoader):
    def load(self, data: Any) -> datetime:
        try:
            return super().load(data)
        except psycopg.DataError:
            return extreme_time(bytes(data).decode("utf-8", "replace"))


class _TimestamptzBinaryLoader(TimestamptzBinaryLoader):
    def load(self, data: Any) -> datetime:
        try:
            return super().load(data)
        except psycopg.DataError:
            micros = int.from_bytes(bytes(data), "big", signed=True)
            if micros == 2**63 - 1:
                return extreme_time("infinity")
            if micros == -(2**63):
                return extreme_time("-infinity")
            return extreme_time(_text_of(micros))


def _text_of(micros: int) -> str:
    """PostgreSQL's text of a binary timestamptz (microseconds since 2000-01-01 UTC) out of datetime's range."""
    days, rest = divmod(micros, 86_400_000_000)
    z = days + 10_957 + 719_468  # days since 0000-03-01 (civil_from_days, proleptic Gregorian)
    era = z // 146_097
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day, month = doy - (153 * mp + 2) // 5 + 1, mp + 3 if mp < 10 else mp - 9
    year = yoe + era * 400 + (month <= 2)
    seconds, us = divmod(rest, 1_000_000)
    clock = f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" + (f".{us:06d}" if us else "")
    if year <= 0:
        return f"{1 - year:04d}-{month:02d}-{day:02d} {clock}+00 BC"
    return f"{year:04d}-{month:02d}-{day:02d} {clock}+00"


def register_loaders(adapters: AdaptersMap) -> None:
    """Load every timestamptz, whatever its value: out-of-range ones as ExtremeTime instead of DataError."""
    adapters.register_loader("timestamptz", _TimestamptzLoader)
    adapters.register_loader("timestamptz", _TimestamptzBinaryLoader)


def parse_time(value: Any) -> datetime | None:
    """A time from JSON text (``to_jsonb`` of a row): ISO 8601, ``infinity``, a year past 9999, a BC date."""
    if value is None or isinstance(value, datetime):
        return value
    text = str(value)
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        pass
    lowered = text.strip().lower()
    if lowered.endswith("infinity") or lowered.endswith(" bc") or (lowered[:5].isdigit() and "-" in lowered):
        return extreme_time(text)
    return None


def format_time(value: datetime | None, tz: tzinfo | None = UTC, pattern: str = "%Y-%m-%d %H:%M:%S") -> str:
    """``value`` in ``tz`` (None: local time); an ExtremeTime as PostgreSQL writes it."""
    if value is None:
        return ""
    if isinstance(value, ExtremeTime):
        return value.source
    try:
        return value.astimezone(tz).strftime(pattern)
    except (OverflowError, ValueError):  # near datetime.max/min, another zone can be out of range
        return value.isoformat()


def number(value: Any) -> Any:
    """A non-finite float as the string PostgreSQL's to_jsonb writes (NaN, Infinity, -Infinity)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    return value


def plain(value: Any) -> Any:
    """A value ``json.dumps(..., allow_nan=False)`` accepts: times as ISO text (ExtremeTime as PostgreSQL's
    text), non-finite floats as strings."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, float):
        return number(value)
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


# ---- JSON -------------------------------------------------------------------------------------------------


class TooDeep(ValueError):
    """Stored JSON nested deeper than MAX_DEPTH levels."""


def depth_within(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``value`` (decoded JSON) nests at most ``limit`` levels (checked without recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        elif not isinstance(item, list):
            continue
        if depth > limit:
            return False
        stack.extend((child, depth + 1) for child in item if isinstance(child, dict | list))
    return True


def load_json(text: str | bytes) -> Any:
    """Decode stored JSON. Raises TooDeep for values nested deeper than MAX_DEPTH, ValueError for text that
    is not JSON (a cut preview)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    try:
        value = json.loads(text)
    except RecursionError:
        raise TooDeep(f"nested too deeply to show (over {MAX_DEPTH} levels)") from None
    if (text.count("[") + text.count("{") > MAX_DEPTH) and not depth_within(value):
        raise TooDeep(f"nested too deeply to show (over {MAX_DEPTH} levels)")
    return value


def json_or_note(text: str | bytes | None) -> Any:
    """Decoded JSON, or for a value that cannot be shown a note object saying why (and its size)."""
    if text is None:
        return None
    try:
        return load_json(text)
    except TooDeep as exc:
        return {"unreadable": f"stored JSON {exc}", "bytes": len(text.encode() if isinstance(text, str) else text)}
    except ValueError:
        return {"unreadable": "not JSON", "text": str(text)[:200]}


def dumps(value: Any, **options: Any) -> str:
    """``json.dumps`` of a decoded value that never raises: non-finite numbers as strings, too-deep values as
    a note."""
    try:
        return json.dumps(plain(value), allow_nan=False, **options)
    except (RecursionError, ValueError, TypeError):
        return json.dumps({"unreadable": f"nested too deeply to show (over {MAX_DEPTH} levels)"})


def error_fields(text: str | bytes | None) -> dict[str, Any] | None:
    """A stored error as ``{"type", "message", "traceback"}`` strings, whatever JSON it is (an object with
    other types, a list, a string, a value nested too deeply)."""
    if text is None:
        return None
    try:
        value = load_json(text)
    except ValueError as exc:
        return {"type": "", "message": f"(stored error {exc})" if isinstance(exc, TooDeep) else str(text)[:2000],
                "traceback": ""}
    if not isinstance(value, dict):
        return {"type": "", "message": value if isinstance(value, str) else dumps(value), "traceback": ""}
    return {key: _text(value.get(key)) for key in ("type", "message", "traceback")}


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else dumps(value)
