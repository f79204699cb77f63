"""Bounds on the times an execution is created with, checked before anything is written.

The SQL API (``enqueue_workflow``) and the table's CHECK constraints enforce the same bounds, so a value
that passes here is one every later statement (claim, timer, deadlines, read paths) can compute with.
"""

from __future__ import annotations

import math
import re
from typing import Any

# Ten years: far beyond any real timeout or delay, far below anything that overflows a timestamp.
MAX_SECONDS = 10 * 365 * 24 * 3600


def timeout_seconds(value: Any, what: str = "timeout_seconds") -> float | None:
    """None, or a finite number of seconds in (0, MAX_SECONDS]."""
    if value is None:
        return None
    seconds = _number(value, what)
    if not 0 < seconds <= MAX_SECONDS:
        raise ValueError(f"{what} must be a finite number of seconds above 0 and at most {MAX_SECONDS:,} "
                         f"(10 years), not {value!r}")
    return seconds


def delay_seconds(value: Any, what: str = "delay") -> float:
    """A finite number of seconds in [0, MAX_SECONDS]."""
    seconds = _number(value, what)
    if not 0 <= seconds <= MAX_SECONDS:
        raise ValueError(f"{what} must be a finite number of seconds from 0 to {MAX_SECONDS:,} (10 years), "
                         f"not {value!r}")
    return seconds


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} must be a number of seconds, not {type(value).__name__}")
    try:
        seconds = float(value)
    except OverflowError:  # an int too large for a float: as out of range as any other
        raise ValueError(f"{what} must be a finite number of seconds, not an integer of {len(str(value))} "
                         "digits") from None
    if not math.isfinite(seconds):
        raise ValueError(f"{what} must be a finite number of seconds, not {value!r}")
    return seconds


_INT4 = 2 ** 31
# Queue and schedule names (the tables' CHECKs say the same).
NAME = re.compile(r"[A-Za-z0-9_.:-]{1,100}")


def priority(value: Any) -> int:
    """An integer PostgreSQL's ``integer`` column holds."""
    if isinstance(value, bool) or not isinstance(value, int) or not -_INT4 <= value < _INT4:
        raise ValueError(f"priority must be an integer from {-_INT4:,} to {_INT4 - 1:,}, not {value!r}")
    return value


def max_recoveries(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < _INT4:
        raise ValueError(f"max_recoveries must be an integer from 0 to {_INT4 - 1:,}, not {value!r}")
    return value


def queue_name(value: Any) -> str:
    if not isinstance(value, str) or not NAME.fullmatch(value):
        raise ValueError(f"queue name {value!r} is not valid: 1 to 100 letters, digits, or _ . : -")
    return value


def key(value: Any, what: str) -> str:
    """A caller-chosen id or key: 1 to 200 characters of text PostgreSQL can store."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a string, not {type(value).__name__}")
    if not 1 <= len(value) <= 200:
        raise ValueError(f"{what} must be 1 to 200 characters")
    if "\x00" in value:
        raise ValueError(f"{what} must not contain NUL characters (PostgreSQL cannot store them)")
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError:
            raise ValueError(f"{what} contains a lone UTF-16 surrogate, which is not valid UTF-8") from None
    return value


# Ids of schedule ticks: only the scheduler creates them (so nobody can squat a tick and suppress it).
RESERVED_ID_PREFIX = "sched:"


def workflow_id(value: Any) -> str:
    """A caller-chosen execution id: a key, and not in the scheduler's reserved namespace."""
    key(value, "workflow_id")
    if value.startswith(RESERVED_ID_PREFIX):
        raise ValueError(f"workflow_id {value!r}: ids starting with {RESERVED_ID_PREFIX!r} are reserved for "
                         "schedule ticks")
    return str(value)


def rate_period(value: Any) -> float:
    seconds = _number(value, "rate_period")
    if not 0 < seconds <= MAX_SECONDS:
        raise ValueError(f"rate_period must be a finite number of seconds above 0 and at most {MAX_SECONDS:,} "
                         f"(10 years), not {value!r}")
    return seconds


# Tags: searchable labels of an execution (enqueue_workflow checks the same bounds).
MAX_TAGS = 32
MAX_TAG_KEY = 100
MAX_TAG_VALUE = 200


def tags(value: Any) -> dict[str, str] | None:
    """None, or a dict of at most MAX_TAGS string keys (1 to MAX_TAG_KEY characters) and string values (at
    most MAX_TAG_VALUE characters) that PostgreSQL can store. An empty dict is None (no tags)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise TypeError(f"tags must be a dict of strings, like {{'customer': '42'}}, not {type(value).__name__}")
    if len(value) > MAX_TAGS:
        raise ValueError(f"at most {MAX_TAGS} tags, not {len(value)}")
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(f"tag {k!r}: keys and values must be strings (tags are text: str(42) -> '42'), "
                            f"not {type(k).__name__}: {type(v).__name__}")
        if not 1 <= len(k) <= MAX_TAG_KEY:
            raise ValueError(f"tag key {k[:50]!r}: must be 1 to {MAX_TAG_KEY} characters")
        if len(v) > MAX_TAG_VALUE:
            raise ValueError(f"tag {k!r}: the value must be at most {MAX_TAG_VALUE} characters, not {len(v)}")
        for text in (k, v):
            _storable(text, f"tag {k[:50]!r}")
    return dict(value) or None


def _storable(text: str, what: str) -> None:
    if "\x00" in text:
        raise ValueError(f"{what} must not contain NUL characters (PostgreSQL cannot store them)")
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:
            raise ValueError(f"{what} contains a lone UTF-16 surrogate, which is not valid UTF-8") from None


def debounce(key_value: Any, seconds: Any, max_seconds: Any) -> tuple[str, float, float | None] | None:
    """None (not debounced), or (key, seconds, max_seconds) checked: a key, seconds in [0, MAX_SECONDS],
    and max_seconds None or in [0, MAX_SECONDS]."""
    if key_value is None:
        if seconds is not None or max_seconds is not None:
            raise ValueError("debounce_seconds and debounce_max_seconds need a debounce_key")
        return None
    key(key_value, "debounce_key")
    if seconds is None:
        raise ValueError("a debounce_key needs debounce_seconds (how long to wait for the next enqueue)")
    wait = delay_seconds(seconds, "debounce_seconds")
    longest = None if max_seconds is None else delay_seconds(max_seconds, "debounce_max_seconds")
    return key_value, wait, longest
