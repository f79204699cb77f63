"""steps.py: the retry policy of a step."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pgdurable
from pgdurable.errors import ConfigurationError, LeaseLost, NonDeterminismError, SerializationError
from pgdurable.steps import RetryPolicy


class Transient(Exception):
    pass


class Permanent(Exception):
    pass


class VeryPermanent(Permanent):
    pass


def test_default_schedule() -> None:
    policy = RetryPolicy()
    assert [policy.retries(Transient(), n) for n in (1, 2, 3)] == [0.5, 1.0, None]


def test_exponential_backoff_capped_by_max_interval() -> None:
    policy = RetryPolicy(max_attempts=6, interval=10, backoff=10, max_interval=60)
    assert [policy.retries(Transient(), n) for n in range(1, 7)] == [10.0, 60.0, 60.0, 60.0, 60.0, None]


def test_constant_interval() -> None:
    policy = RetryPolicy(max_attempts=4, interval=2, backoff=1)
    assert [policy.retries(Transient(), n) for n in range(1, 5)] == [2.0, 2.0, 2.0, None]


def test_single_attempt_never_retries() -> None:
    assert RetryPolicy(max_attempts=1).retries(Transient(), 1) is None


def test_no_retry_types_and_their_subclasses_fail_at_once() -> None:
    policy = RetryPolicy(max_attempts=5, no_retry=(Permanent,))
    assert policy.retries(Permanent(), 1) is None
    assert policy.retries(VeryPermanent(), 1) is None
    assert policy.retries(Transient(), 1) == 0.5


@pytest.mark.parametrize("exc", [LeaseLost("x"), NonDeterminismError("x"), SerializationError("x")])
def test_engine_errors_are_never_retried(exc: Exception) -> None:
    assert RetryPolicy(max_attempts=10).retries(exc, 1) is None


def test_delays_are_floats() -> None:
    delay = RetryPolicy(interval=1, backoff=2).retries(Transient(), 2)
    assert isinstance(delay, float) and delay == 2.0


@pytest.mark.parametrize("kwargs", [{"max_attempts": 0}, {"max_attempts": -1}, {"interval": -0.1},
                                    {"backoff": 0.99}, {"backoff": 0}])
def test_invalid_policies(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("kwargs", [{"max_interval": -1.0}, {"interval": math.nan}])
def test_policies_that_give_unusable_delays_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


@settings(deadline=None)
@given(max_attempts=st.integers(1, 30), interval=st.floats(0, 100), backoff=st.floats(1, 10),
       max_interval=st.floats(0, 1000))
def test_delays_never_decrease_and_never_exceed_the_cap(max_attempts: int, interval: float, backoff: float,
                                                        max_interval: float) -> None:
    policy = RetryPolicy(max_attempts=max_attempts, interval=interval, backoff=backoff, max_interval=max_interval)
    delays = [policy.retries(Transient(), n) for n in range(1, max_attempts + 1)]
    assert delays[-1] is None
    finite = [d for d in delays if d is not None]
    assert len(finite) == max_attempts - 1
    assert all(0 <= d <= max_interval for d in finite)
    assert finite == sorted(finite)


@pytest.mark.parametrize("kind", ["workflow", "step", "transaction"])
def test_generator_functions_are_refused_where_they_are_declared(kind: str) -> None:
    """Their call returns a generator, which no checkpoint or result can store: once, the first run failed."""
    app = pgdurable.App("postgresql://nowhere.invalid/db")  # declaring connects to nothing
    declare = getattr(app, kind)()

    def numbers(conn: object = None) -> Iterator[int]:
        yield 1

    async def numbers_async(conn: object = None) -> AsyncIterator[int]:
        yield 1

    with pytest.raises(ConfigurationError, match=r"'numbers' is a generator function \(def with yield\)"):
        declare(numbers)
    with pytest.raises(ConfigurationError, match=r"'numbers_async' is a generator function \(async def with"):
        declare(numbers_async)
    assert app.registry.get("numbers") is None
