"""Shift this Python process's wall clock by PGDURABLE_TEST_CLOCK_SKEW seconds (tests only).

Put this directory first on PYTHONPATH: Python imports ``sitecustomize`` at start-up, before any other
module, so every later ``time.time()`` and ``datetime.now()`` in the process reads the shifted clock.
Monotonic clocks are left alone, as a real wrong wall clock leaves them.
"""

import datetime as _datetime
import os
import time as _time

_skew = float(os.environ.get("PGDURABLE_TEST_CLOCK_SKEW", "0") or 0)

if _skew:
    _real_time, _real_time_ns = _time.time, _time.time_ns
    _time.time = lambda: _real_time() + _skew
    _time.time_ns = lambda: _real_time_ns() + int(_skew * 1e9)
    _offset = _datetime.timedelta(seconds=_skew)

    class _SkewedDatetime(_datetime.datetime):
        @classmethod
        def now(cls, tz=None):  # type: ignore[no-untyped-def]
            return _datetime.datetime.fromtimestamp(_real_time(), tz) + _offset

        @classmethod
        def utcnow(cls):  # type: ignore[no-untyped-def]
            return _datetime.datetime.now(_datetime.UTC).replace(tzinfo=None) + _offset

    _datetime.datetime = _SkewedDatetime  # type: ignore[misc]
