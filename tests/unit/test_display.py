"""display.py: reading any stored row safely: extreme times, non-finite numbers, JSON nested too deep."""

from __future__ import annotations

import copy
import json
import pickle
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgdurable import display
from pgdurable.display import ExtremeTime, TooDeep

EPOCH_2000 = datetime(2000, 1, 1, tzinfo=UTC)


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth - 1):
        value = [value]
    return value


# ---- times ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "year", "source"), [
    ("infinity", 9999, "infinity"), ("-infinity", 1, "-infinity"), ("  Infinity ", 9999, "infinity"),
    ("10000-01-01 00:00:00+00", 9999, "10000-01-01 00:00:00+00"),
    ("0044-03-15 12:00:00+00 BC", 1, "0044-03-15 12:00:00+00 BC"),
])
def test_extreme_time(text: str, year: int, source: str) -> None:
    value = display.extreme_time(text)
    assert value.year == year and value.tzinfo is UTC
    assert value.isoformat() == str(value) == source
    assert repr(value) == f"ExtremeTime({source!r})"


def test_extreme_time_compares_and_copies() -> None:
    late, early = display.extreme_time("infinity"), display.extreme_time("-infinity")
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert early < now < late
    assert copy.copy(late) is late and copy.deepcopy(late) is late
    restored = pickle.loads(pickle.dumps(late))
    assert isinstance(restored, ExtremeTime) and restored.source == "infinity"


@pytest.mark.parametrize(("text", "expected"), [
    (b"infinity", "infinity"), (b"-infinity", "-infinity"), (b"10000-01-01 00:00:00+00", "10000-01-01 00:00:00+00"),
])
def test_text_loader_falls_back_to_extreme_time(text: bytes, expected: str) -> None:
    value = display._TimestamptzLoader(1184, None).load(text)
    assert isinstance(value, ExtremeTime) and value.source == expected


def test_text_loader_keeps_ordinary_times() -> None:
    value = display._TimestamptzLoader(1184, None).load(b"2026-01-02 03:04:05+00")
    assert value == datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC) and not isinstance(value, ExtremeTime)


def binary(micros: int) -> bytes:
    return micros.to_bytes(8, "big", signed=True)


def test_binary_loader() -> None:
    loader = display._TimestamptzBinaryLoader(1184, None)
    assert loader.load(binary(2**63 - 1)).source == "infinity"  # type: ignore[attr-defined]
    assert loader.load(binary(-(2**63))).source == "-infinity"  # type: ignore[attr-defined]
    ten_thousand = (datetime(9999, 12, 31, tzinfo=UTC) - EPOCH_2000) // timedelta(microseconds=1) + 86_400_000_000
    assert loader.load(binary(ten_thousand)).source == "10000-01-01 00:00:00+00"  # type: ignore[attr-defined]
    one_bc = (datetime(1, 1, 1, tzinfo=UTC) - EPOCH_2000) // timedelta(microseconds=1) - 86_400_000_000 + 1
    assert loader.load(binary(one_bc)).source == "0001-12-31 00:00:00.000001+00 BC"  # type: ignore[attr-defined]
    assert loader.load(binary(0)) == EPOCH_2000


@settings(deadline=None)
@given(st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59)))
def test_text_of_agrees_with_python_in_range(moment: datetime) -> None:
    """The civil-from-days arithmetic used out of range gives PostgreSQL's text wherever Python can check it."""
    micros = (moment.replace(tzinfo=UTC) - EPOCH_2000) // timedelta(microseconds=1)
    clock = moment.strftime("%H:%M:%S") + (f".{moment.microsecond:06d}" if moment.microsecond else "")
    assert display._text_of(micros) == f"{moment.year:04d}-{moment.month:02d}-{moment.day:02d} {clock}+00"


@pytest.mark.parametrize(("value", "expected"), [
    (None, None), ("2026-01-02T03:04:05+00:00", datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)),
    ("infinity", "infinity"), ("-infinity", "-infinity"), ("10000-01-01T00:00:00+00:00", "10000-01-01T00:00:00+00:00"),
    ("0044-03-15 12:00:00+00 BC", "0044-03-15 12:00:00+00 BC"), ("not a time", None), ("", None),
])
def test_parse_time(value: Any, expected: Any) -> None:
    parsed = display.parse_time(value)
    if isinstance(expected, str):
        assert isinstance(parsed, ExtremeTime) and parsed.source == expected
    else:
        assert parsed == expected


def test_parse_time_passes_datetimes_through() -> None:
    now = datetime.now(UTC)
    assert display.parse_time(now) is now


def test_format_time() -> None:
    assert display.format_time(None) == ""
    assert display.format_time(datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)) == "2026-01-02 03:04:05"
    plus_two = timezone(timedelta(hours=2))
    assert display.format_time(datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), plus_two) == "2026-01-02 05:04:05"
    assert display.format_time(display.extreme_time("infinity"), plus_two) == "infinity"
    near_max = datetime(9999, 12, 31, 23, 0, tzinfo=UTC)
    assert display.format_time(near_max, plus_two) == near_max.isoformat()  # out of range in that zone


# ---- numbers and plain values -----------------------------------------------------------------------------

def test_number_and_plain() -> None:
    assert [display.number(v) for v in (float("nan"), float("inf"), float("-inf"), 1.5, 3)] == [
        "NaN", "Infinity", "-Infinity", 1.5, 3]
    value = {"t": datetime(2026, 1, 1, tzinfo=UTC), 1: [float("inf"), (1, "x")], "x": display.extreme_time("infinity")}
    assert display.plain(value) == {"t": "2026-01-01T00:00:00+00:00", "1": ["Infinity", [1, "x"]], "x": "infinity"}
    json.dumps(display.plain(value), allow_nan=False)


# ---- JSON -------------------------------------------------------------------------------------------------

def test_depth_within() -> None:
    assert display.depth_within(nested(display.MAX_DEPTH))
    assert not display.depth_within(nested(display.MAX_DEPTH + 2))
    assert display.depth_within({"a": {"b": [1]}}, 3)
    assert not display.depth_within({"a": {"b": [[1]]}}, 3)
    assert display.depth_within(5, 0)


def test_load_json() -> None:
    assert display.load_json('{"a": [1]}') == {"a": [1]}
    assert display.load_json(b'[1, "\xc3\xa9"]') == [1, "é"]
    with pytest.raises(TooDeep):
        display.load_json(json.dumps(nested(display.MAX_DEPTH + 5)))
    with pytest.raises(TooDeep):
        display.load_json("[" * 100_000 + "]" * 100_000)  # deeper than Python's recursion limit
    with pytest.raises(ValueError):
        display.load_json('{"cut": ')
    assert display.load_json(json.dumps(["[" * 500])) == ["[" * 500]


def test_json_or_note() -> None:
    assert display.json_or_note(None) is None
    assert display.json_or_note("[1]") == [1]
    deep = "[" * 300 + "]" * 300
    assert display.json_or_note(deep) == {"unreadable": "stored JSON nested too deeply to show (over 100 levels)",
                                          "bytes": 600}
    assert display.json_or_note("not json") == {"unreadable": "not JSON", "text": "not json"}


def test_dumps_never_raises() -> None:
    assert display.dumps({"a": float("nan")}) == '{"a": "NaN"}'
    assert "unreadable" in display.dumps(nested(5000))
    assert display.dumps({"b": 1, "a": 2}, sort_keys=True) == '{"a": 2, "b": 1}'


@pytest.mark.parametrize(("text", "expected"), [
    (None, None),
    ('{"type": "E", "message": "m", "traceback": "t"}', {"type": "E", "message": "m", "traceback": "t"}),
    ('{"type": 5, "message": ["x"]}', {"type": "5", "message": '["x"]', "traceback": ""}),
    ('"just text"', {"type": "", "message": "just text", "traceback": ""}),
    ("[1, 2]", {"type": "", "message": "[1, 2]", "traceback": ""}),
    ("not json", {"type": "", "message": "not json", "traceback": ""}),
    ("[" * 300 + "]" * 300, {"type": "", "message": "(stored error nested too deeply to show (over 100 levels))",
                             "traceback": ""}),
])
def test_error_fields(text: str | None, expected: dict[str, str] | None) -> None:
    assert display.error_fields(text) == expected
