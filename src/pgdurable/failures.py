"""Exceptions as JSON: what is stored for a failed step or workflow, and how a replay raises it again."""

from __future__ import annotations

import builtins
import importlib
import json
import traceback
from typing import Any

from .errors import StepFailed


def describe(exc: BaseException) -> dict[str, Any]:
    """type (importable name), message, traceback, and the constructor args when they are plain JSON."""
    cls = type(exc)
    qualified = cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    info: dict[str, Any] = {
        "type": qualified,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(exc)),
    }
    try:
        json.dumps(exc.args)
        info["args"] = list(exc.args)
    except (TypeError, ValueError):
        pass
    return info


def _resolve(name: str) -> type[BaseException] | None:
    module_name, _, attr = name.rpartition(".")
    try:
        if not module_name:
            found = getattr(builtins, attr, None)
        else:
            found = importlib.import_module(module_name)
            for part in attr.split("."):
                found = getattr(found, part)
    except (ImportError, AttributeError):
        # the qualname may itself contain dots (nested classes): try shorter module paths
        head, _, tail = module_name.rpartition(".")
        if not head:
            return None
        return _resolve_nested(head, f"{tail}.{attr}")
    if isinstance(found, type) and issubclass(found, BaseException):
        return found
    return None


def _resolve_nested(module_name: str, qualname: str) -> type[BaseException] | None:
    try:
        found: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        return None
    return found if isinstance(found, type) and issubclass(found, BaseException) else None


def rebuild(info: dict[str, Any]) -> BaseException:
    """The recorded exception, rebuilt as its original type when possible, else ``StepFailed``."""
    cls = _resolve(str(info.get("type", "")))
    if cls is not None and issubclass(cls, Exception):
        try:
            args = info.get("args", [info.get("message", "")])
            return cls(*args)
        except Exception:
            pass
    return StepFailed(info)
