"""limits.py: every bound, its accepted and refused values."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgdurable import limits
from pgdurable.errors import ConfigurationError
from pgdurable.limits import MAX_SECONDS
from pgdurable.workflows import Workflow

INT4 = 2**31
NOT_NUMBERS = [None, "1", b"1", [1], True, False, 1j]
NOT_FINITE = [math.inf, -math.inf, math.nan]


# ---- seconds ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [0.001, 1, 2.5, MAX_SECONDS, float(MAX_SECONDS)])
def test_timeout_accepts(value: Any) -> None:
    assert limits.timeout_seconds(value) == float(value)
    assert isinstance(limits.timeout_seconds(value), float)


def test_timeout_none_is_no_timeout() -> None:
    assert limits.timeout_seconds(None) is None


@pytest.mark.parametrize("value", [0, 0.0, -1, MAX_SECONDS + 1, MAX_SECONDS + 0.5, 10**400, *NOT_FINITE])
def test_timeout_refuses_out_of_range(value: Any) -> None:
    with pytest.raises((ValueError, OverflowError)):
        limits.timeout_seconds(value)


def test_huge_int_is_refused_as_a_value_error() -> None:
    """An int too large for a float is refused like any other out-of-range number (not OverflowError)."""
    with pytest.raises(ValueError):
        limits.timeout_seconds(10**400)
    with pytest.raises(ValueError):
        limits.delay_seconds(10**400)


@pytest.mark.parametrize("value", [v for v in NOT_NUMBERS if v is not None])
def test_timeout_refuses_non_numbers(value: Any) -> None:
    with pytest.raises(TypeError, match="must be a number of seconds"):
        limits.timeout_seconds(value, "my_timeout")


def test_messages_name_the_argument() -> None:
    with pytest.raises(ValueError, match=r"^deadline must be"):
        limits.timeout_seconds(-1, "deadline")
    with pytest.raises(ValueError, match=r"^wait must be"):
        limits.delay_seconds(-1, "wait")


@pytest.mark.parametrize("value", [0, 0.0, 1, 0.5, MAX_SECONDS])
def test_delay_accepts(value: Any) -> None:
    assert limits.delay_seconds(value) == float(value)


@pytest.mark.parametrize("value", [-0.001, -1, MAX_SECONDS + 1, *NOT_FINITE])
def test_delay_refuses_out_of_range(value: Any) -> None:
    with pytest.raises(ValueError):
        limits.delay_seconds(value)


@pytest.mark.parametrize("value", NOT_NUMBERS)
def test_delay_refuses_non_numbers(value: Any) -> None:
    with pytest.raises(TypeError):
        limits.delay_seconds(value)


@pytest.mark.parametrize("value", [0.001, 60, MAX_SECONDS])
def test_rate_period_accepts(value: Any) -> None:
    assert limits.rate_period(value) == float(value)


@pytest.mark.parametrize("value", [0, -1, MAX_SECONDS + 1, *NOT_FINITE])
def test_rate_period_refuses(value: Any) -> None:
    with pytest.raises(ValueError, match="rate_period"):
        limits.rate_period(value)
    with pytest.raises(TypeError):
        limits.rate_period("60")


@settings(deadline=None)
@given(st.floats())
def test_seconds_bounds_property(value: float) -> None:
    in_timeout = math.isfinite(value) and 0 < value <= MAX_SECONDS
    in_delay = math.isfinite(value) and 0 <= value <= MAX_SECONDS
    for check, ok in ((limits.timeout_seconds, in_timeout), (limits.delay_seconds, in_delay),
                      (limits.rate_period, in_timeout)):
        if ok:
            assert check(value) == value
        else:
            with pytest.raises(ValueError):
                check(value)


# ---- integers ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [0, 1, -1, INT4 - 1, -INT4])
def test_priority_accepts_int4(value: int) -> None:
    assert limits.priority(value) == value


@pytest.mark.parametrize("value", [INT4, -INT4 - 1, 1.0, "1", None, True, False])
def test_priority_refuses(value: Any) -> None:
    with pytest.raises(ValueError, match="priority"):
        limits.priority(value)


@pytest.mark.parametrize("value", [0, 5, INT4 - 1])
def test_max_recoveries_accepts(value: int) -> None:
    assert limits.max_recoveries(value) == value


@pytest.mark.parametrize("value", [-1, INT4, 1.0, None, True])
def test_max_recoveries_refuses(value: Any) -> None:
    with pytest.raises(ValueError, match="max_recoveries"):
        limits.max_recoveries(value)


# ---- names, keys and ids ----------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["default", "a", "Q_1.two:three-4", "x" * 100])
def test_queue_name_accepts(value: str) -> None:
    assert limits.queue_name(value) == value


@pytest.mark.parametrize("value", ["", "x" * 101, "has space", "slash/", "é", "a\x00", "a\n", None, 5])
def test_queue_name_refuses(value: Any) -> None:
    with pytest.raises(ValueError, match="queue name"):
        limits.queue_name(value)


@pytest.mark.parametrize("value", ["k", "x" * 200, "émoji 😀", "spaces and\nnewlines", "sched-ish"])
def test_key_accepts(value: str) -> None:
    assert limits.key(value, "dedup_key") == value


@pytest.mark.parametrize(("value", "error", "match"), [
    ("", ValueError, "1 to 200"),
    ("x" * 201, ValueError, "1 to 200"),
    ("a\x00b", ValueError, "NUL"),
    ("a\udc80", ValueError, "surrogate"),
    (5, TypeError, "must be a string"),
    (None, TypeError, "must be a string"),
    (b"bytes", TypeError, "must be a string"),
])
def test_key_refuses(value: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        limits.key(value, "dedup_key")


def test_workflow_id() -> None:
    assert limits.workflow_id("order-1") == "order-1"
    assert limits.workflow_id("schedule:x") == "schedule:x"
    with pytest.raises(ValueError, match="reserved"):
        limits.workflow_id(limits.RESERVED_ID_PREFIX + "nightly")
    with pytest.raises(ValueError, match="1 to 200"):
        limits.workflow_id("")
    with pytest.raises(TypeError):
        limits.workflow_id(7)


@settings(deadline=None)
@given(st.text(max_size=250))
def test_key_property(value: str) -> None:
    ok = 1 <= len(value) <= 200 and "\x00" not in value
    if ok:
        assert limits.key(value, "k") == value
    else:
        with pytest.raises(ValueError):
            limits.key(value, "k")


# ---- tags and debounce ------------------------------------------------------------------------------------

def test_tags_accepts_string_dicts_and_treats_empty_as_none() -> None:
    assert limits.tags(None) is None and limits.tags({}) is None
    tags = {f"k{i}": "v" * limits.MAX_TAG_VALUE for i in range(limits.MAX_TAGS)}
    assert limits.tags(tags) == tags
    assert limits.tags({"k" * limits.MAX_TAG_KEY: ""}) == {"k" * limits.MAX_TAG_KEY: ""}


@pytest.mark.parametrize(("value", "error"), [
    ({"a": 1}, TypeError), ({1: "a"}, TypeError), ("a=b", TypeError), ([("a", "b")], TypeError),
    ({"": "a"}, ValueError), ({"k" * 101: "a"}, ValueError), ({"a": "v" * 201}, ValueError),
    ({str(i): "" for i in range(33)}, ValueError), ({"a": "\x00"}, ValueError), ({"a": "\ud800"}, ValueError),
])
def test_tags_refuses_what_cannot_be_searched_or_stored(value: Any, error: type) -> None:
    with pytest.raises(error):
        limits.tags(value)


def test_debounce_options() -> None:
    assert limits.debounce(None, None, None) is None
    assert limits.debounce("k", 5, None) == ("k", 5.0, None)
    assert limits.debounce("k", 0, 60) == ("k", 0.0, 60.0)
    for key, seconds, longest in (("k", None, None), (None, 1, None), (None, None, 5), ("", 1, None),
                                  ("k", -1, None), ("k", 1, math.inf), ("k", MAX_SECONDS + 1, None)):
        with pytest.raises(ValueError):
            limits.debounce(key, seconds, longest)
    with pytest.raises(TypeError):
        limits.debounce("k", "5", None)


def test_enqueue_options_are_reserved_parameter_names() -> None:
    for name in ("tags", "debounce_key", "debounce_seconds", "debounce_max_seconds"):
        namespace: dict[str, Any] = {}
        exec(f"def wf({name}): pass", namespace)  # a function with that parameter name
        with pytest.raises(ConfigurationError, match="rename them"):
            Workflow(namespace["wf"], name="wf", queue="default", priority=0, max_recoveries=None)
