"""Workflow definitions: the function, its name, defaults, and how its arguments are encoded."""

from __future__ import annotations

import functools
import hashlib
import inspect
from collections.abc import Callable
from typing import Any, Generic, ParamSpec, TypeVar

from . import limits
from .errors import ConfigurationError, SerializationError
from .serialization import Serializer, Signature

P = ParamSpec("P")
R = TypeVar("R")

# Keyword arguments that App.enqueue and App.start take for themselves.
RESERVED_KWARGS = frozenset({"workflow_id", "queue", "priority", "delay", "max_recoveries", "conn",
                             "timeout_seconds", "dedup_key", "concurrency_key", "on_duplicate", "tags",
                             "debounce_key", "debounce_seconds", "debounce_max_seconds"})


class Workflow(Generic[P, R]):
    """A registered workflow. Calling it directly runs the plain function (no durability): handy in tests.

    Run it durably with ``app.enqueue(workflow, ...)`` or ``app.start(workflow, ...)``.
    """

    def __init__(self, fn: Callable[P, R], *, name: str, queue: str, priority: int,
                 max_recoveries: int | None, timeout_seconds: float | None = None) -> None:
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
        """The stored input; SerializationError naming the argument that cannot be stored."""
        try:
            return serializer.dumps(bound)
        except SerializationError:
            for argument, value in bound.items():
                try:
                    serializer.dumps(value)
                except SerializationError as exc:
                    raise SerializationError(
                        f"argument {argument!r} of workflow {self.name!r} cannot be stored: {exc}") from None
            raise

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


def default_name(fn: Callable[..., Any]) -> str:
    """The function's qualified name, without its module: stable whether the module is imported or run as
    __main__, and readable in SQL. Pass ``name=`` when two workflows would share one."""
    qualname = str(getattr(fn, "__qualname__", None) or getattr(fn, "__name__", "workflow"))
    return qualname.rsplit("<locals>.", 1)[-1]  # functions defined inside functions: their own name
