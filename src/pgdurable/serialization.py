"""Payload encoding. JSON by default, so state stays readable in SQL; typed decoding from annotations.

Values are encoded as plain JSON (datetimes as ISO strings, UUIDs and Decimals as strings, bytes as base64,
dataclasses and pydantic models as objects). On the way back they are rebuilt as the types the function's
signature names, so ``def f(when: datetime, ids: tuple[UUID, ...])`` receives a datetime and UUIDs.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import re
from functools import lru_cache
from typing import Any, Protocol, get_type_hints

import pydantic
from pydantic import ConfigDict, TypeAdapter
from pydantic_core import PydanticSerializationError, from_json, to_json
from typing_extensions import TypedDict

from .errors import SerializationError

_BYTES_AS_BASE64 = ConfigDict(val_json_bytes="base64", ser_json_bytes="base64")


class Serializer(Protocol):
    """Turns values into the text stored in ``jsonb`` columns and back. Plug your own into ``App``."""

    def dumps(self, value: Any) -> str: ...

    def loads(self, text: str, type_hint: Any = Any) -> Any: ...


def _has_own_config(hint: Any) -> bool:
    return dataclasses.is_dataclass(hint) or (
        isinstance(hint, type) and issubclass(hint, pydantic.BaseModel)
    )


@lru_cache(maxsize=1024)
def _adapter(hint: Any) -> TypeAdapter[Any]:
    if _has_own_config(hint):
        return TypeAdapter(hint)
    return TypeAdapter(hint, config=_BYTES_AS_BASE64)


class JsonSerializer:
    """The default: JSON text, decoded with pydantic against the expected type."""

    def dumps(self, value: Any) -> str:
        try:
            return to_json(value, bytes_mode="base64").decode()
        except PydanticSerializationError as exc:
            raise SerializationError(f"cannot encode {type(value).__name__} as JSON: {exc}") from None

    def loads(self, text: str, type_hint: Any = Any) -> Any:
        if type_hint is Any or type_hint is inspect.Parameter.empty:
            return json.loads(text)
        try:
            return _adapter(type_hint).validate_json(text)
        except pydantic.ValidationError as exc:
            raise SerializationError(f"cannot decode payload as {type_hint!r}: {exc}") from None


# What PostgreSQL's jsonb and the typed decoder (pydantic's JSON parser) can take back. Nesting deeper than
# the decoder's limit could be stored but never read again, so it is refused when written.
MAX_DEPTH = 200
# A JSON \u0000 escape (an odd number of backslashes before it): jsonb cannot store NUL characters.
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def storage_problem(text: str) -> str | None:
    """Why this JSON text could not be stored in ``jsonb`` and read back, or None when it can.

    The common payload passes on a few substring scans; only a suspicious one is parsed again.
    """
    if "\\u0000" in text and _NUL_ESCAPE.search(text):
        return "it contains a NUL character (\\u0000), which PostgreSQL cannot store in jsonb"
    if (text.count("[") + text.count("{") > MAX_DEPTH or "NaN" in text or "Infinity" in text
            or "\\ud" in text or "\\uD" in text):
        try:
            from_json(text, allow_inf_nan=False)
        except TypeError:  # raw (unescaped) surrogates: not even text pydantic can read
            return "it contains a lone UTF-16 surrogate, which is not valid UTF-8"
        except ValueError as exc:
            detail = str(exc)
            if "recursion limit" in detail:
                return f"it is nested more than {MAX_DEPTH} levels deep"
            if "hex escape" in detail or "surrogate" in detail:
                return f"it contains a lone UTF-16 surrogate ({detail})"
            return f"it is not valid JSON: NaN and infinite numbers have no JSON form ({detail})"
    return None


def utf8_size(text: str) -> int:
    """The size of ``text`` in UTF-8; SerializationError if it cannot be encoded (lone surrogates)."""
    if text.isascii():
        return len(text)
    try:
        return len(text.encode())
    except UnicodeEncodeError as exc:
        raise SerializationError(f"payload contains a lone UTF-16 surrogate at character {exc.start}, "
                                 "which is not valid UTF-8") from None


class SizeLimit:
    """Wraps a serializer: refuses, with a clear error and whatever the format, payloads PostgreSQL would
    refuse (NaN, NUL characters, lone surrogates, nesting too deep to read back) and payloads larger than
    ``max_bytes`` of UTF-8.

    Inputs, step outputs and results all live in hot rows; a payload of tens of megabytes belongs in a
    table of its own (or object storage), with its key passed instead.
    """

    def __init__(self, inner: Serializer, max_bytes: int) -> None:
        self.inner = inner
        self.max_bytes = max_bytes

    def dumps(self, value: Any) -> str:
        text = self.inner.dumps(value)
        self.check(text)
        return text

    def check(self, text: str) -> None:
        # Cheap first: a text of N characters holds at most 4N bytes of UTF-8.
        size = len(text) if len(text) > self.max_bytes else utf8_size(text)
        if size > self.max_bytes:
            raise SerializationError(
                f"payload of {size / 1048576:.1f} MiB exceeds the limit of {self.max_bytes / 1048576:.1f} MiB "
                "(App(max_payload_bytes=...)); store large data elsewhere and pass its key")
        problem = storage_problem(text)
        if problem is not None:
            raise SerializationError(f"payload cannot be stored: {problem}")

    def loads(self, text: str, type_hint: Any = Any) -> Any:
        return self.inner.loads(text, type_hint)


def _typed_dict(name: str, fields: dict[str, Any], *, total: bool = True) -> Any:
    """A TypedDict class made at run time (the functional form, which type checkers only take literally)."""
    factory: Any = TypedDict
    return factory(name, fields, total=total)


class Signature:
    """A function's parameters and return type, for encoding its arguments by name and decoding results."""

    def __init__(self, fn: Any) -> None:
        self.signature = inspect.signature(fn)
        try:
            hints = get_type_hints(fn)
        except Exception as exc:  # unresolvable forward references: fall back to untyped JSON
            logging.getLogger("pgdurable").warning(
                "pgdurable: cannot resolve the type hints of %s (%s); its payloads decode as plain JSON",
                getattr(fn, "__qualname__", fn), exc)
            hints = {}
        self.return_hint: Any = hints.get("return", Any)
        self.param_hints: dict[str, Any] = {}
        for name, param in self.signature.parameters.items():
            hint = hints.get(name, Any)
            if param.kind is inspect.Parameter.VAR_POSITIONAL:
                hint = tuple[hint, ...]  # type: ignore[valid-type]
            elif param.kind is inspect.Parameter.VAR_KEYWORD:
                hint = dict[str, hint]  # type: ignore[valid-type]
            self.param_hints[name] = hint
        # Whether any parameter is annotated with something narrower than Any.
        self.typed = any(hint is not Any for hint in self.param_hints.values())
        # The parameters' names when each can be given by position and none collects the rest: then a call
        # that gives every one by position binds without inspect (the common enqueue, at a fifth of the cost).
        plain = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        params = self.signature.parameters.values()
        self._positional: tuple[str, ...] | None = (
            tuple(p.name for p in params) if all(p.kind in plain for p in params) else None)

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """Arguments by parameter name; raises TypeError at once if they do not fit the signature."""
        names = self._positional
        if names is not None and not kwargs and len(args) == len(names):
            return dict(zip(names, args, strict=True))
        bound = self.signature.bind(*args, **kwargs)
        return dict(bound.arguments)

    def encode_input(self, serializer: Serializer, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        return serializer.dumps(self.bind(args, kwargs))

    @property
    def _input_type(self) -> Any:
        typed: Any = self.__dict__.get("_input_type_cache")
        if typed is None:
            # One TypedDict of all parameters, so the whole input is validated in a single JSON parse.
            typed = _typed_dict("Arguments", dict(self.param_hints), total=False)
            # Unknown keys are kept (not dropped), so that decode_input names them instead of ignoring them.
            typed.__pydantic_config__ = ConfigDict(**_BYTES_AS_BASE64, extra="allow")
            self.__dict__["_input_type_cache"] = typed
        return typed

    @property
    def _input_adapter(self) -> TypeAdapter[Any]:
        adapter: TypeAdapter[Any] | None = self.__dict__.get("_input_adapter_cache")
        if adapter is None:
            adapter = TypeAdapter(self._input_type)
            self.__dict__["_input_adapter_cache"] = adapter
        return adapter

    def input_errors(self, text: str) -> list[Any]:
        """What is wrong with stored input ``text`` for these parameters, in strict mode (pydantic's error
        details; empty when nothing is). Strict, so that what passes is exactly what the parameters say ("7"
        is no int, 1.5 no int, True no int), and always decodes where it runs (lax mode accepts more)."""
        try:
            self._input_adapter.validate_json(text, strict=True)
        except pydantic.ValidationError as exc:
            return list(exc.errors(include_url=False))
        return []

    def rows_errors(self, rows: str) -> list[Any]:
        """``input_errors`` for a JSON array of {"id": ..., "input": ...} rows (a bulk enqueue's), at once."""
        adapter: TypeAdapter[Any] | None = self.__dict__.get("_rows_adapter_cache")
        if adapter is None:
            row = _typed_dict("Row", {"id": str, "input": self._input_type})
            adapter = TypeAdapter(list[row])  # type: ignore[valid-type]
            self.__dict__["_rows_adapter_cache"] = adapter
        try:
            adapter.validate_json(rows, strict=True)
        except pydantic.ValidationError as exc:
            return list(exc.errors(include_url=False))
        return []

    def decode_input(self, serializer: Serializer, text: str) -> tuple[list[Any], dict[str, Any]]:
        """Rebuild call arguments from stored input, typed by the signature."""
        if isinstance(serializer, SizeLimit):
            serializer = serializer.inner
        if isinstance(serializer, JsonSerializer):
            try:
                raw = self._input_adapter.validate_json(text)
            except pydantic.ValidationError as exc:
                raise SerializationError(f"cannot decode workflow input {text[:200]}: {exc}") from None
        else:
            raw = serializer.loads(text)
        if not isinstance(raw, dict):
            raise SerializationError(f"workflow input must be an object of arguments, got {text[:200]}")
        unknown = set(raw) - set(self.signature.parameters)
        if unknown:
            raise SerializationError(f"workflow input has arguments the function does not take: {sorted(unknown)}")
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        positional = True  # positional until the first parameter left to its default
        for name, param in self.signature.parameters.items():
            if param.kind is inspect.Parameter.VAR_POSITIONAL:
                if positional:
                    args.extend(raw.get(name, ()))
                continue
            if param.kind is inspect.Parameter.VAR_KEYWORD:
                kwargs.update(raw.get(name, {}))
                continue
            if name not in raw:
                positional = False
                continue
            is_positional = param.kind in (inspect.Parameter.POSITIONAL_ONLY,
                                           inspect.Parameter.POSITIONAL_OR_KEYWORD)
            if positional and is_positional:
                args.append(raw[name])
            else:
                kwargs[name] = raw[name]
        return args, kwargs
