"""serialization.py: what jsonb can store (storage_problem), byte sizes, SizeLimit, typed Signature round trips."""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import math
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID, uuid4

import pydantic
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from pgdurable.errors import SerializationError
from pgdurable.serialization import MAX_DEPTH, JsonSerializer, Signature, SizeLimit, storage_problem, utf8_size

JSON = JsonSerializer()


# ---- storage_problem: examples ----------------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    '{"a": 1}', '"plain"', "[]", '"NaN"', '"Infinity and beyond"', '"\\\\u0000"', '"\\\\\\\\u0000"',
    '"\\ud83d\\ude00"', '"\\uD83D\\uDE00"', '"\\\\ud800"', '"caf\\u00e9"', "1e400", '"\\u0001"',
])
def test_storable(text: str) -> None:
    assert storage_problem(text) is None


@pytest.mark.parametrize(("text", "reason"), [
    ('"\\u0000"', "NUL"),
    ('{"k": "a\\u0000b"}', "NUL"),
    ('"\\\\\\u0000"', "NUL"),  # an escaped backslash, then a NUL escape
    ('"\\\\\\\\\\u0000"', "NUL"),
    ("NaN", "NaN"),
    ("[1, Infinity]", "NaN and infinite"),
    ('{"x": -Infinity}', "NaN and infinite"),
    ('"\\ud83d"', "surrogate"),
    ('"\\ude00\\ud83d"', "surrogate"),
    ('"\\uDC80 tail"', "surrogate"),
    ('"\\ud83d\\u0041"', "surrogate"),
    ("[" * (MAX_DEPTH + 2) + "]" * (MAX_DEPTH + 2), "nested more than"),
    ('{"a":' * (MAX_DEPTH + 1) + "1" + "}" * (MAX_DEPTH + 1), "nested more than"),
])
def test_not_storable(text: str, reason: str) -> None:
    problem = storage_problem(text)
    assert problem is not None and reason in problem


@pytest.mark.parametrize("depth", range(MAX_DEPTH - 3, MAX_DEPTH + 4))
@pytest.mark.parametrize("shape", ["array", "object", "scalar-in-array"])
def test_depth_limit_agrees_with_the_typed_decoder(depth: int, shape: str) -> None:
    """What is refused is exactly what pydantic's JSON parser (the typed decoder) could not read back."""
    text = {"array": "[" * depth + "]" * depth,
            "object": '{"a":' * depth + "1" + "}" * depth,
            "scalar-in-array": "[" * depth + "1" + "]" * depth}[shape]
    try:
        TypeAdapter(Any).validate_json(text)
        readable = True
    except pydantic.ValidationError:
        readable = False
    assert (storage_problem(text) is None) == readable
    if depth <= MAX_DEPTH:
        assert readable


def test_many_brackets_inside_strings_are_fine() -> None:
    assert storage_problem(json.dumps(["[" * 500, "{" * 500])) is None


# ---- storage_problem: properties --------------------------------------------------------------------------

# Characters that make the escapes interesting: backslashes and the letters of \u0000 and \udXXX, NUL, both
# halves of a surrogate pair and a lone one, non-ASCII, and the letters of NaN and Infinity.
TRICKY = st.lists(st.sampled_from(["\\", "u", "0", "d", "8", "3", "D", "\x00", "\ud83d", "\ude00", "\udc80",
                                   "a", "é", "😀", '"', "NaN", "Infinity", "\\u0000", "\\ud83d"]),
                  max_size=10).map("".join)
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**63), st.floats(), TRICKY)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                      st.dictionaries(TRICKY, inner, max_size=4)),
                      max_leaves=8)


def _lone_surrogate(s: str) -> bool:
    i = 0
    while i < len(s):
        c = ord(s[i])
        if 0xD800 <= c <= 0xDBFF and i + 1 < len(s) and 0xDC00 <= ord(s[i + 1]) <= 0xDFFF:
            i += 2
            continue
        if 0xD800 <= c <= 0xDFFF:
            return True
        i += 1
    return False


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [k, *_strings(v)]]
    return []


def _non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, list):
        return any(_non_finite(v) for v in value)
    if isinstance(value, dict):
        return any(_non_finite(v) for v in value.values())
    return False


@settings(max_examples=150, deadline=None)
@given(VALUES)
def test_storage_problem_follows_postgresqls_jsonb_rules(value: Any) -> None:
    """jsonb refuses \\u0000, lone UTF-16 surrogate escapes and NaN/Infinity (not JSON); nothing else here."""
    strings = _strings(value)
    expected = (any("\x00" in s for s in strings) or any(_lone_surrogate(s) for s in strings)
                or _non_finite(value))
    assert (storage_problem(json.dumps(value)) is not None) == expected


@settings(max_examples=80, deadline=None)
@given(VALUES)
def test_raw_text_leaves_surrogates_to_utf8_size(value: Any) -> None:
    """Unescaped text (ensure_ascii=False): NUL and NaN are still caught; a raw lone surrogate is not valid
    UTF-8 (nor is any raw surrogate code point), which utf8_size (and so SizeLimit) refuses."""
    text = json.dumps(value, ensure_ascii=False)
    strings = _strings(value)
    nul_or_nan = any("\x00" in s for s in strings) or _non_finite(value)
    # Unescaped, even two surrogate code points in a row are not UTF-8 (only their \u escapes pair up).
    if not any(0xD800 <= ord(c) <= 0xDFFF for s in strings for c in s):
        assert (storage_problem(text) is not None) == nul_or_nan
    else:
        with pytest.raises(SerializationError, match="surrogate"):
            utf8_size(text)
        with pytest.raises(SerializationError):
            SizeLimit(JSON, 10**6).check(text)


def test_storage_problem_on_raw_lone_surrogate_returns_a_reason() -> None:
    assert storage_problem('{"\ud83dNaN": null}') is not None


# ---- utf8_size and SizeLimit ------------------------------------------------------------------------------

def test_utf8_size() -> None:
    assert utf8_size("") == 0
    assert utf8_size("abc") == 3
    assert utf8_size("é") == 2
    assert utf8_size("€") == 3
    assert utf8_size("😀") == 4
    with pytest.raises(SerializationError, match="at character 2"):
        utf8_size("ab\udc80")


@settings(deadline=None)
@given(st.text(max_size=50))
def test_utf8_size_is_the_encoded_length(text: str) -> None:
    assert utf8_size(text) == len(text.encode("utf-8"))


def test_size_limit_counts_bytes_not_characters() -> None:
    limit = SizeLimit(JSON, 1024)
    assert limit.dumps("a" * 1022) == '"' + "a" * 1022 + '"'  # exactly 1024 bytes
    with pytest.raises(SerializationError, match="exceeds the limit"):
        limit.dumps("a" * 1023)
    assert limit.dumps("é" * 511)  # 1022 bytes + 2 quotes, in 513 characters
    with pytest.raises(SerializationError, match="exceeds the limit"):
        limit.dumps("é" * 512)
    with pytest.raises(SerializationError, match="exceeds the limit"):
        limit.check("😀" * 300)  # 300 characters, 1200 bytes


def test_size_limit_refuses_what_jsonb_cannot_store() -> None:
    limit = SizeLimit(JSON, 10**6)
    for value in (float("nan"), float("inf"), "a\x00b", {"k": [float("-inf")]}):
        with pytest.raises(SerializationError, match="cannot be stored"):
            limit.dumps(value)
    nested: Any = 1
    for _ in range(MAX_DEPTH + 5):
        nested = [nested]
    with pytest.raises(SerializationError, match="nested more than"):
        limit.dumps(nested)
    with pytest.raises(SerializationError):
        limit.dumps("\udc80")  # the JSON encoder refuses it first


def test_size_limit_loads_delegates() -> None:
    limit = SizeLimit(JSON, 2048)
    assert limit.loads('"2026-01-02T03:04:05+00:00"', datetime) == datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


@settings(max_examples=120, deadline=None)
@given(VALUES)
def test_whatever_size_limit_accepts_round_trips(value: Any) -> None:
    limit = SizeLimit(JSON, 4096)
    try:
        text = limit.dumps(value)
    except SerializationError:
        return
    assert storage_problem(text) is None
    assert len(text.encode("utf-8")) <= 4096
    assert limit.loads(text) == value
    assert limit.loads(text, Any) == value


# ---- JsonSerializer ---------------------------------------------------------------------------------------

@dataclasses.dataclass
class Point:
    x: int
    y: int


class Model(pydantic.BaseModel):
    name: str
    when: datetime


def test_typed_loads() -> None:
    when = datetime(2026, 1, 2, tzinfo=UTC)
    ident = uuid4()
    cases: list[tuple[Any, Any]] = [
        (when, datetime), (date(2026, 1, 2), date), (ident, UUID), (Decimal("1.10"), Decimal),
        (b"\x00\xffbytes", bytes), ((1, "a"), tuple[int, str]), (Point(1, 2), Point),
        (Model(name="n", when=when), Model), ({"a": [ident]}, dict[str, list[UUID]]),
        (timedelta(seconds=90), timedelta), (None, int | None),
    ]
    for value, hint in cases:
        assert JSON.loads(JSON.dumps(value), hint) == value


def test_untyped_loads_is_plain_json() -> None:
    assert JSON.loads(JSON.dumps(b"hi")) == "aGk="
    assert JSON.loads('{"a": [1, 2.5]}') == {"a": [1, 2.5]}


def test_encode_and_decode_errors_are_serialization_errors() -> None:
    with pytest.raises(SerializationError, match="cannot encode object"):
        JSON.dumps(object())
    with pytest.raises(SerializationError, match="cannot decode payload"):
        JSON.loads('"not a date"', datetime)


# ---- Signature --------------------------------------------------------------------------------------------

def typed(when: datetime, ids: tuple[UUID, ...], amount: Decimal, blob: bytes, point: Point,
          model: Model, /, *rest: int, flag: bool = False, **extra: float) -> None:
    pass


def test_signature_typed_round_trip() -> None:
    sig = Signature(typed)
    when = datetime(2026, 3, 29, 1, 30, tzinfo=UTC)
    args = (when, (uuid4(), uuid4()), Decimal("12.50"), b"\x01\x02", Point(3, 4), Model(name="m", when=when), 7, 8)
    kwargs = {"flag": True, "ratio": 0.5}
    text = sig.encode_input(JSON, args, kwargs)
    decoded_args, decoded_kwargs = sig.decode_input(SizeLimit(JSON, 10**6), text)
    assert tuple(decoded_args) == args
    assert decoded_kwargs == kwargs
    assert isinstance(decoded_args[1], tuple) and isinstance(decoded_args[1][0], UUID)


def defaults(a: int, b: int = 2, c: int = 3, *, d: int = 4) -> None:
    pass


def test_signature_defaults_left_out_stay_defaults() -> None:
    sig = Signature(defaults)
    text = sig.encode_input(JSON, (1,), {"c": 30})
    assert json.loads(text) == {"a": 1, "c": 30}
    args, kwargs = sig.decode_input(JSON, text)
    assert (args, kwargs) == ([1], {"c": 30})  # c after a missing b: by name
    defaults(*args, **kwargs)


def test_signature_bind_refuses_what_does_not_fit() -> None:
    sig = Signature(defaults)
    with pytest.raises(TypeError):
        sig.bind((), {})
    with pytest.raises(TypeError):
        sig.bind((1, 2, 3, 4), {})
    with pytest.raises(TypeError):
        sig.bind((1,), {"nope": 1})


def positional_only(a: int, b: int = 2, /) -> None:
    pass


def plain(a: int, b: int) -> None:
    pass


@pytest.mark.parametrize("fn", [defaults, positional_only, plain, typed])
@pytest.mark.parametrize(("args", "kwargs"), [
    ((), {}), ((1,), {}), ((1, 2), {}), ((1, 2, 3), {}), ((1, 2, 3, 4), {}), ((1,), {"b": 5}), ((), {"a": 1}),
    ((1, 2), {"a": 1}), ((1, 2), {"nope": 1}),
])
def test_signature_bind_gives_what_inspect_gives(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Every parameter given by position binds without inspect (a fast path): the same names and values, and
    the same TypeError for what does not fit, as inspect.Signature.bind."""
    try:
        expected: dict[str, Any] | None = dict(inspect.signature(fn).bind(*args, **kwargs).arguments)
    except TypeError:
        expected = None
    if expected is None:
        with pytest.raises(TypeError):
            Signature(fn).bind(args, kwargs)
    else:
        assert Signature(fn).bind(args, kwargs) == expected


@pytest.mark.parametrize(("text", "match"), [
    ('{"a": 1, "zzz": 2}', "does not take"),
    ("[1, 2]", "cannot decode workflow input|must be an object"),
    ('{"a": "not an int"}', "cannot decode workflow input"),
])
def test_decode_input_refuses_bad_input(text: str, match: str) -> None:
    with pytest.raises(SerializationError, match=match):
        Signature(defaults).decode_input(JSON, text)


class Upper:
    """A custom serializer: decode_input goes through its loads, untyped."""

    def dumps(self, value: Any) -> str:
        return json.dumps(value).upper()

    def loads(self, text: str, type_hint: Any = Any) -> Any:
        return json.loads(text.lower())


def test_decode_input_with_a_custom_serializer() -> None:
    sig = Signature(defaults)
    assert sig.decode_input(Upper(), sig.encode_input(Upper(), (1, 2), {"d": 5})) == ([1, 2], {"d": 5})
    with pytest.raises(SerializationError, match="must be an object"):
        sig.decode_input(Upper(), "[1]")


def test_unresolvable_hints_fall_back_to_plain_json(caplog: pytest.LogCaptureFixture) -> None:
    def fn(x: NoSuchType) -> OtherMissing:  # type: ignore[name-defined] # noqa: F821
        pass
    with caplog.at_level(logging.WARNING, logger="pgdurable"):
        sig = Signature(fn)
    assert "cannot resolve the type hints" in caplog.text
    assert sig.return_hint is Any and sig.param_hints == {"x": Any}
    assert sig.decode_input(JSON, '{"x": {"k": 1}}') == ([{"k": 1}], {})


def test_var_hints() -> None:
    def fn(*a: int, **k: str) -> int:
        return 0
    sig = Signature(fn)
    assert sig.param_hints == {"a": tuple[int, ...], "k": dict[str, str]}
    assert sig.return_hint is int


@settings(max_examples=100, deadline=None)
@given(a=st.integers(-2**63, 2**63), b=st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=20),
       c=st.lists(st.floats(allow_nan=False, allow_infinity=False)), when=st.datetimes(timezones=st.just(UTC)))
def test_signature_round_trip_property(a: int, b: str, c: list[float], when: datetime) -> None:
    def fn(a: int, b: str, c: list[float], when: datetime) -> None:
        pass
    assume("\x00" not in b)
    sig = Signature(fn)
    text = sig.encode_input(SizeLimit(JSON, 10**6), (a, b), {"c": c, "when": when})
    assert sig.decode_input(JSON, text) == ([a, b, c, when], {})
