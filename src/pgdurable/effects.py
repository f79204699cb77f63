"""Effects that plans yield besides database statements (see plans.py and completions.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Invoke:
    """Call the user's code (a step's body): called by the sync driver, awaited by the async one. What it
    raises is thrown into the plan, which applies the step's retry policy."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    # Seconds the call may take (a step's timeout); past it the call fails with StepTimeout: a coroutine is
    # cancelled, a sync call (run on a thread of its own) is abandoned and its late result ignored.
    timeout: float | None = None
    # What the call is, for the StepTimeout message.
    label: str = "call"


@dataclass(frozen=True, slots=True)
class Pause:
    """Wait this long (a retry's backoff) without holding anything."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Defer:
    """Hand a step checkpoint (a ``batcher.StepWrite``) to the worker's writer without waiting for it: see
    ``ExecutionContext.defer_step``. The plan goes on at once."""

    write: Any
