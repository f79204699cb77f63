"""failures.py: exceptions described as storable JSON, and rebuilt as the same type on replay."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgdurable import failures
from pgdurable.errors import DuplicateWorkflow, StepFailed
from pgdurable.serialization import storage_problem


class PlainError(Exception):
    pass


class CodedError(Exception):
    """A constructor with its own signature: cls(*args) cannot rebuild it."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(f"error {code}: {detail}")
        self.code = code
        self.detail = detail


class Outer:
    class Inner(ValueError):
        pass


class WithProperty(Exception):
    @property
    def fixed(self) -> str:
        return "constant"


class BrokenStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str for you")


def round_trip(exc: BaseException) -> BaseException:
    return failures.rebuild(json.loads(failures.encode(exc)))


# ---- describe ---------------------------------------------------------------------------------------------

def test_describe_fields() -> None:
    try:
        raise PlainError("boom", 3)
    except PlainError as exc:
        info = failures.describe(exc)
    assert info["type"] == f"{__name__}.PlainError"
    assert info["message"] == "('boom', 3)"
    assert info["args"] == ["boom", 3]
    assert "raise PlainError" in info["traceback"]
    assert "attributes" not in info


def test_builtins_are_named_without_module() -> None:
    assert failures.describe(KeyError("k"))["type"] == "KeyError"
    assert failures.type_name(Outer.Inner) == f"{__name__}.Outer.Inner"


def test_only_plain_public_attributes_are_kept() -> None:
    exc = PlainError("x")
    exc.count = 3  # type: ignore[attr-defined]
    exc.nested = {"a": [1, 2.5, None, True]}  # type: ignore[attr-defined]
    exc._private = 1  # type: ignore[attr-defined]
    exc.obj = object()  # type: ignore[attr-defined]
    exc.nan = float("nan")  # type: ignore[attr-defined]
    exc.nul = "a\x00b"  # type: ignore[attr-defined]
    assert failures.describe(exc)["attributes"] == {"count": 3, "nested": {"a": [1, 2.5, None, True]}}


def test_args_that_are_not_json_are_left_out() -> None:
    info = failures.describe(ValueError(object()))
    assert "args" not in info
    assert info["message"].startswith("<object object")
    assert "args" not in failures.describe(ValueError(float("inf")))


def test_broken_str_is_still_described() -> None:
    info = failures.describe(BrokenStr("x"))
    assert info["message"] == "<BrokenStr whose str() raised RuntimeError>"
    json.dumps(info)


# ---- storable text ----------------------------------------------------------------------------------------

def test_nul_characters_are_escaped() -> None:
    text = failures.encode(ValueError("a\x00b"))
    assert storage_problem(text) is None
    info = json.loads(text)
    assert info["message"] == "a\\x00b"
    assert "args" not in info  # the raw argument holds a NUL: not stored


def test_lone_surrogates_are_escaped() -> None:
    text = failures.encode(ValueError("bad \udc80 char"))
    assert storage_problem(text) is None
    text.encode("utf-8")  # valid UTF-8 throughout
    assert json.loads(text)["message"] == "bad \\udc80 char"


def test_message_is_capped() -> None:
    info = failures.describe(ValueError("x" * 100_000))
    assert len(info["message"]) < 64 * 1024 + 100
    assert info["message"].endswith(f"... [{100_000 - 64 * 1024} more characters]")
    assert "args" not in info  # the argument alone is over the values cap


def test_traceback_is_capped() -> None:
    info = failures.describe(ValueError("y" * 300_000))
    assert len(info["traceback"]) <= 256 * 1024 + 100
    assert "more characters]" in info["traceback"]


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=()), max_size=200))
def test_any_message_encodes_to_storable_json(message: str) -> None:
    text = failures.encode(RuntimeError(message))
    assert storage_problem(text) is None
    text.encode("utf-8")
    rebuilt = failures.rebuild(json.loads(text))
    assert type(rebuilt) is RuntimeError


# ---- rebuild ----------------------------------------------------------------------------------------------

def test_builtin_round_trip() -> None:
    rebuilt = round_trip(KeyError("missing"))
    assert type(rebuilt) is KeyError
    assert rebuilt.args == ("missing",)


def test_custom_init_round_trip_keeps_type_args_and_attributes() -> None:
    rebuilt = round_trip(CodedError(404, "not found"))
    assert type(rebuilt) is CodedError
    assert rebuilt.args == ("error 404: not found",)
    assert (rebuilt.code, rebuilt.detail) == (404, "not found")  # type: ignore[attr-defined]
    assert str(rebuilt) == "error 404: not found"


def test_pgdurable_error_round_trip() -> None:
    rebuilt = round_trip(DuplicateWorkflow("abc", "key-1"))
    assert type(rebuilt) is DuplicateWorkflow
    assert (rebuilt.existing_id, rebuilt.dedup_key) == ("abc", "key-1")  # type: ignore[attr-defined]


def test_nested_class_round_trip() -> None:
    rebuilt = round_trip(Outer.Inner("inside"))
    assert type(rebuilt) is Outer.Inner
    assert rebuilt.args == ("inside",)


def test_read_only_property_does_not_break_rebuild() -> None:
    info = failures.describe(WithProperty("p"))
    info["attributes"] = {"fixed": "other", "extra": 1}
    rebuilt = failures.rebuild(info)
    assert type(rebuilt) is WithProperty
    assert rebuilt.fixed == "constant"  # type: ignore[attr-defined]
    assert rebuilt.extra == 1  # type: ignore[attr-defined]


def test_oserror_keeps_its_errno() -> None:
    rebuilt = round_trip(FileNotFoundError(2, "No such file"))
    assert type(rebuilt) is FileNotFoundError
    assert rebuilt.errno == 2  # type: ignore[attr-defined]


def test_local_class_is_step_failed() -> None:
    class Local(Exception):
        pass
    rebuilt = round_trip(Local("here"))
    assert isinstance(rebuilt, StepFailed)
    assert "Local" in str(rebuilt) and "here" in str(rebuilt)
    assert rebuilt.error["message"] == "here"


@pytest.mark.parametrize("name", [
    "antigravity.Boom",  # importing it would open a web browser
    "this.Error",  # importing it would print the Zen of Python
    "pgdurable_unit_never_imported.module.Error",
    "http.server.HTTPError",
])
def test_module_named_in_a_row_is_never_imported(name: str) -> None:
    module = name.rsplit(".", 1)[0]
    top = name.split(".")[0]
    was_loaded = {m for m in (module, top) if m in sys.modules}
    rebuilt = failures.rebuild({"type": name, "message": "m", "args": ["m"]})
    assert isinstance(rebuilt, StepFailed)
    assert {m for m in (module, top) if m in sys.modules} == was_loaded


@pytest.mark.parametrize("name", ["", ".", "a..b", ".ValueError", "ValueError.", "int", "os.path", "print",
                                  "KeyboardInterrupt", "SystemExit", "GeneratorExit", "BaseException",
                                  "builtins.NotAClass", "sys.exit", f"{__name__}.round_trip"])
def test_names_that_are_not_exception_classes(name: str) -> None:
    assert failures.resolve(name) is None
    assert isinstance(failures.rebuild({"type": name, "message": "x"}), StepFailed)


def test_resolve_uses_the_longest_imported_module_prefix() -> None:
    assert failures.resolve(f"{__name__}.Outer.Inner") is Outer.Inner
    assert failures.resolve("json.JSONDecodeError") is json.JSONDecodeError
    assert failures.resolve("json.decoder.JSONDecodeError") is json.JSONDecodeError
    assert failures.resolve("ValueError") is ValueError


@pytest.mark.parametrize("info", [
    {},
    {"type": 5},
    {"type": "ValueError", "args": "not a list"},
    {"type": "ValueError"},
    {"type": "UnicodeDecodeError", "args": [1]},  # its constructor refuses these args
    {"type": "ValueError", "attributes": ["not", "a", "dict"]},
])
def test_rebuild_never_raises_on_odd_rows(info: dict[str, Any]) -> None:
    rebuilt = failures.rebuild(info)
    assert isinstance(rebuilt, BaseException)
    assert isinstance(rebuilt, Exception)


def test_rebuild_missing_args_uses_message() -> None:
    rebuilt = failures.rebuild({"type": "ValueError", "message": "from message"})
    assert type(rebuilt) is ValueError and rebuilt.args == ("from message",)
    rebuilt = failures.rebuild({"type": "ValueError", "args": "scalar"})
    assert rebuilt.args == ("scalar",)


# ---- recordable -------------------------------------------------------------------------------------------

def test_recordable_keeps_a_rebuildable_exception() -> None:
    exc = CodedError(1, "d")
    text, raised = failures.recordable(exc)
    assert raised is exc
    assert json.loads(text)["type"] == f"{__name__}.CodedError"


def test_recordable_raises_what_a_replay_will_raise() -> None:
    class Local(Exception):
        pass
    exc = Local("gone")
    text, raised = failures.recordable(exc)
    assert isinstance(raised, StepFailed)
    assert raised.__cause__ is exc
    replayed = failures.rebuild(json.loads(text))
    assert type(replayed) is type(raised)
    assert str(replayed) == str(raised)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from([ValueError, KeyError, RuntimeError, PlainError, Outer.Inner, TimeoutError]),
       st.lists(st.one_of(st.none(), st.booleans(), st.integers(-2**53, 2**53),
                          st.text(alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)),
                                  max_size=20),
                          st.floats(allow_nan=False, allow_infinity=False)), max_size=4))
def test_recordable_agrees_with_rebuild(cls: type[Exception], args: list[Any]) -> None:
    """Storable arguments (no NUL; st.characters excludes surrogates) come back as they were."""
    exc = cls(*args)
    text, raised = failures.recordable(exc)
    replayed = failures.rebuild(json.loads(text))
    assert type(replayed) is type(raised) is cls
    assert replayed.args == exc.args


@pytest.mark.parametrize("argument", ["a\x00b", "\udc80", "z" * (70 * 1024)])
def test_first_run_and_replay_see_the_same_args(argument: str) -> None:
    text, raised = failures.recordable(ValueError(argument))
    replayed = failures.rebuild(json.loads(text))
    assert replayed.args == raised.args
