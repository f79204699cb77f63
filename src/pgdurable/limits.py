"""Bounds on the times an execution is created with, checked before anything is written.

The SQL API (``enqueue_workflow``) and the table's CHECK constraints enforce the same bounds, so a value
that passes here is one every later statement (claim, timer, deadlines, read paths) can compute with.
"""

from __future__ import annotations

import math
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
    seconds = float(value)  # an int too large for a float raises OverflowError: refuse it the same way
    if not math.isfinite(seconds):
        raise ValueError(f"{what} must be a finite number of seconds, not {value!r}")
    return seconds
