"""Exceptions as JSON: what is stored for a failed step or workflow, and how a replay raises it again.

Two promises meet here. Whatever an exception holds (NUL characters, lone surrogates, NaN arguments, a
megabyte of message), its description can always be stored, so one odd error never poisons a batch of
writes. And a replay raises what the first run raised: the same type, arguments and attributes, so that
``except MyError`` takes the same branch. Types are looked up only among classes this process has already
imported (builtins, pgdurable, the application's modules): a module name read from a row is never imported.
"""

from __future__ import annotations

import builtins
import json
import sys
import traceback
from typing import Any

from .errors import StepFailed
from .serialization import storage_problem

# Caps on what an error description stores: enough to debug, never enough to blow a row's size budget.
_MAX_MESSAGE = 64 * 1024
_MAX_TRACEBACK = 256 * 1024
_MAX_VALUES = 64 * 1024


def describe(exc: BaseException) -> dict[str, Any]:
    """type (qualified name), message, traceback, and the constructor args and instance attributes that
    are plain JSON. Every string is made storable (NUL and lone surrogates escaped, length capped)."""
    cls = type(exc)
    info: dict[str, Any] = {
        "type": type_name(cls),
        "message": _storable_text(_safe_str(exc), _MAX_MESSAGE),
        "traceback": _storable_text("".join(traceback.format_exception(exc)), _MAX_TRACEBACK),
    }
    args = list(exc.args)
    if _is_plain_json(args):
        info["args"] = args
    attributes = {name: value for name, value in getattr(exc, "__dict__", {}).items()
                  if isinstance(name, str) and not name.startswith("_") and _is_plain_json(value)}
    if attributes and _is_plain_json(attributes):
        info["attributes"] = attributes
    return info


def encode(exc: BaseException) -> str:
    """The stored JSON text of ``describe(exc)``."""
    return json.dumps(describe(exc))


def recordable(exc: BaseException) -> tuple[str, BaseException]:
    """The error text to record for ``exc``, and the exception the first run should raise so that it is
    the one a replay will raise: ``exc`` itself when its type can be rebuilt, else the ``StepFailed`` a
    replay gets (caused by ``exc``)."""
    info = describe(exc)
    replayed = rebuild(info)
    if type(replayed) is type(exc) and _same_args(replayed, exc):
        return json.dumps(info), exc
    replayed.__cause__ = exc
    return json.dumps(info), replayed


def _same_args(a: BaseException, b: BaseException) -> bool:
    try:
        return bool(a.args == b.args)
    except Exception:  # arguments whose == raises: not the same, as far as a replay can tell
        return False


def type_name(cls: type[BaseException]) -> str:
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def resolve(name: str) -> type[Exception] | None:
    """The exception class a stored type name names, among classes already imported; never imports."""
    parts = name.split(".")
    if not name or not all(parts):
        return None
    if len(parts) == 1:
        found: Any = getattr(builtins, name, None)
        return found if _is_exception_class(found) else None
    # "pkg.module.Outer.Inner": the module is the longest prefix this process has imported.
    for split in range(len(parts) - 1, 0, -1):
        module = sys.modules.get(".".join(parts[:split]))
        if module is None:
            continue
        found = module
        for part in parts[split:]:
            found = getattr(found, part, None)
            if found is None:
                break
        if _is_exception_class(found):
            return found  # type: ignore[no-any-return]
    return None


def rebuild(info: dict[str, Any]) -> BaseException:
    """The recorded exception, rebuilt as its original type with its arguments and attributes when that type
    is known here, else ``StepFailed``."""
    cls = resolve(str(info.get("type", "")))
    if cls is None:
        return StepFailed(info)
    args = info.get("args", [info.get("message", "")])
    if not isinstance(args, list):
        args = [args]
    exc: BaseException
    try:
        exc = cls(*args)
        if type(exc) is not cls:  # OSError(errno, ...) picks a subclass: keep the recorded type
            raise TypeError
    except Exception:
        # A constructor with its own signature: build the instance without running it, as pickle cannot.
        try:
            exc = cls.__new__(cls, *args)
        except Exception:
            return StepFailed(info)
    exc.args = tuple(args)
    attributes = info.get("attributes")
    if isinstance(attributes, dict):
        for name, value in attributes.items():
            try:
                setattr(exc, name, value)
            except Exception:  # a read-only property: the constructor has set it
                continue
    return exc


def _is_exception_class(found: Any) -> bool:
    return isinstance(found, type) and issubclass(found, Exception)


def _safe_str(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception as failure:  # a broken __str__ must not stop the error from being recorded
        return f"<{type(exc).__name__} whose str() raised {type(failure).__name__}>"


def _storable_text(text: str, limit: int) -> str:
    if len(text) > limit:
        text = text[:limit] + f"... [{len(text) - limit} more characters]"
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    if not text.isascii():
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")  # lone surrogates as \udXXX
    return text


def _is_plain_json(value: Any) -> bool:
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return False
    return len(text) <= _MAX_VALUES and storage_problem(text) is None
