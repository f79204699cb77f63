"""Workflow definitions: the function, its name, defaults, and how its arguments are encoded."""

from __future__ import annotations

import functools
import hashlib
import inspect
import re
from collections.abc import Callable, Mapping
from typing import Any, Generic, ParamSpec, TypeVar

from . import limits
from .errors import ConfigurationError, SerializationError
from .serialization import JsonSerializer, Serializer, Signature

P = ParamSpec("P")
R = TypeVar("R")

# Keyword arguments that App.enqueue and App.start take for themselves.
RESERVED_KWARGS = frozenset({"workflow_id", "queue", "priority", "delay", "max_recoveries", "conn",
                             "timeout_seconds", "dedup_key", "concurrency_key", "on_duplicate", "tags",
                             "debounce_key", "debounce_seconds", "debounce_max_seconds"})


def refuse_generator(fn: Callable[..., Any], kind: str, name: str) -> None:
    """A generator function's call returns a generator, which cannot be stored: say so at the decorator, not
    when the first run fails to record it."""
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        what = "its result" if kind == "workflow" else "its output, the checkpoint,"
        raise ConfigurationError(
            f"{kind} {name!r} is a generator function ({'async def' if inspect.isasyncgenfunction(fn) else 'def'} "
            f"with yield): {what} is the value it returns, stored as JSON. Return a list; a workflow can also "
            "hand out values as they come with pgdurable.write_stream(key, value)")


class Workflow(Generic[P, R]):
    """A registered workflow. Calling it directly runs the plain function (no durability): handy in tests.

    Run it durably with ``app.enqueue(workflow, ...)`` or ``app.start(workflow, ...)``.
    """

    def __init__(self, fn: Callable[P, R], *, name: str, queue: str, priority: int,
                 max_recoveries: int | None, timeout_seconds: float | None = None) -> None:
        refuse_generator(fn, "workflow", name)
        clash = RESERVED_KWARGS & set(inspect.signature(fn).parameters)
        if clash:
            raise ConfigurationError(
                f"workflow {name!r} has parameters named {sorted(clash)}, which app.enqueue() uses for its "
                "own options; rename them")
        self.fn = fn
        self.name = name
        self.queue = limits.queue_name(queue)
        self.priority = limits.priority(priority)
        self.max_recoveries = None if max_recoveries is None else limits.max_recoveries(max_recoveries)
        self.timeout_seconds = limits.timeout_seconds(timeout_seconds)
        self.is_async = inspect.iscoroutinefunction(fn)
        self.signature = Signature(fn)
        functools.update_wrapper(self, fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<pgdurable workflow {self.name!r} queue={self.queue!r}>"

    # -- arguments: bound by parameter name, encoded as the stored input --------------------------------

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        try:
            return self.signature.bind(args, kwargs)
        except TypeError as exc:
            raise TypeError(f"arguments do not fit workflow {self.name!r}: {exc}") from None

    def encode_bound(self, serializer: Serializer, bound: dict[str, Any]) -> str:
        """The stored input; SerializationError naming the argument that cannot be stored, TypeError or
        ValueError naming the one that does not match its annotation."""
        try:
            text = serializer.dumps(bound)
        except SerializationError:
            for argument, value in bound.items():
                try:
                    serializer.dumps(value)
                except SerializationError as exc:
                    raise SerializationError(
                        f"argument {argument!r} of workflow {self.name!r} cannot be stored: {exc}") from None
            raise
        if self.checks_types(serializer):
            errors = self.signature.input_errors(text)
            if errors:
                raise self.argument_error(errors[0], bound)
        return text

    def checks_types(self, serializer: Serializer) -> bool:
        """Arguments are checked against the annotations when the worker decodes them by the annotations:
        with the JSON serializer, for a workflow with annotated parameters."""
        inner = getattr(serializer, "inner", serializer)  # serialization.SizeLimit wraps the real one
        return isinstance(inner, JsonSerializer) and self.signature.typed

    def argument_error(self, error: Mapping[str, Any], bound: Mapping[str, Any]) -> TypeError | ValueError:
        """The error for one pydantic error detail about the stored input: which parameter, what its
        annotation expects, what was given (and where inside it, for a nested value)."""
        location = tuple(error.get("loc", ()))
        parameter = str(location[0]) if location else "?"
        inside = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in location[1:])
        given = bound.get(parameter, error.get("input"))
        expected = type_name(self.signature.param_hints.get(parameter, Any))
        message = (f"workflow {self.name!r}: argument {parameter!r} must be {expected}, got "
                   f"{type(given).__name__} {_short(given)}")
        if inside:
            message += f" ({parameter}{inside}: {error.get('msg', 'invalid')})"
        kind = str(error.get("type", ""))
        value_problem = kind in ("literal_error", "enum", "value_error", "assertion_error") or kind.startswith(
            ("greater_than", "less_than", "too_", "string_too", "string_pattern", "multiple_of"))
        return ValueError(message) if value_problem else TypeError(message)

    def encode_arguments(self, serializer: Serializer, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        return self.encode_bound(serializer, self.bind(args, kwargs))


class Registry:
    """Workflows by name. Names must be unique: they are what the database stores."""

    def __init__(self) -> None:
        self.workflows: dict[str, Workflow[Any, Any]] = {}
        self.steps: set[str] = set()

    def add(self, workflow: Workflow[Any, Any]) -> None:
        existing = self.workflows.get(workflow.name)
        if existing is not None and existing.fn is not workflow.fn:
            raise ConfigurationError(
                f"two workflows are registered under the name {workflow.name!r}; give one of them "
                "@app.workflow(name=...)")
        self.workflows[workflow.name] = workflow

    def get(self, name: str) -> Workflow[Any, Any] | None:
        return self.workflows.get(name)

    def resolve(self, workflow: Workflow[..., Any] | str) -> Workflow[..., Any] | None:
        """The registered definition of a workflow given as itself or by name (None: a name defined elsewhere)."""
        if isinstance(workflow, Workflow):
            if self.get(workflow.name) is not workflow:
                raise ConfigurationError(f"workflow {workflow.name!r} is registered on another App")
            return workflow
        if isinstance(workflow, str):
            return self.get(workflow)
        raise TypeError(f"expected a workflow registered with @app.workflow or its name, got {workflow!r}")

    def names(self) -> list[str]:
        return sorted(self.workflows)

    def fingerprint(self) -> str:
        """A default application version: a hash of the registered workflows' names and source code. It is
        stable across restarts and machines, and changes when a workflow's code changes (not when a
        dependency does). Set ``app_version`` explicitly to control it (see README: Versioning)."""
        digest = hashlib.sha256()
        for name in self.names():
            fn = self.workflows[name].fn
            try:
                source = inspect.getsource(fn)
            except (OSError, TypeError):  # no source at hand (a REPL, a frozen app): its name must do
                source = getattr(fn, "__qualname__", name)
            digest.update(name.encode() + b"\0" + source.encode() + b"\0")
        return digest.hexdigest()[:12]


_MODULE_PREFIX = re.compile(r"(?<![\w.'\"])(?:[A-Za-z_]\w*\.)+(?=[A-Za-z_])")


def type_name(hint: Any) -> str:
    """An annotation as its source would write it: int, list[int], int | None, Order."""
    if hint is Any:
        return "Any"
    if isinstance(hint, type) and not getattr(hint, "__args__", None):
        return hint.__qualname__
    return _MODULE_PREFIX.sub("", repr(hint))  # typing.Optional[shop.Order] -> Optional[Order]


def _short(value: Any, width: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def default_name(fn: Callable[..., Any]) -> str:
    """The function's qualified name, without its module: stable whether the module is imported or run as
    __main__, and readable in SQL. Pass ``name=`` when two workflows would share one."""
    qualname = str(getattr(fn, "__qualname__", None) or getattr(fn, "__name__", "workflow"))
    return qualname.rsplit("<locals>.", 1)[-1]  # functions defined inside functions: their own name
