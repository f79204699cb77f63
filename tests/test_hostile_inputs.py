"""Property-based: hostile inputs, step outputs, errors and enqueue options, run beside innocent workflows on a
real worker. Whatever Hypothesis generates, every innocent workflow succeeds, every hostile one is refused at
enqueue with a clear error or ends with its own outcome (never dead-lettered, never stuck), the worker stays
alive, and the CLI and every dashboard page still answer.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any

# Imported here, not lazily by @given inside the test: once in CI, compiling it there (pytest rewrites a
# plugin's modules) failed with CPython 3.11's "AST constructor recursion depth mismatch" SystemError.
import hypothesis.internal.conjecture.optimiser  # noqa: F401
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import pgdurable
from pgdurable.cli import cli
from pgdurable.errors import PgDurableError, SerializationError

# Values Hypothesis builds live here; a workflow's input carries only the token, so that values that cannot
# even be stored reach the step that returns or raises them (the worker runs in this process).
POOL: dict[str, Any] = {}
_tokens = itertools.count()

# The clear errors an enqueue may refuse hostile options or arguments with.
REFUSALS = (ValueError, TypeError, SerializationError, PgDurableError)

hostile_text = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=40) | st.sampled_from(
    ["\x00", "a\x00b", "\ud800", "\udfff x", "💥" * 10, "'; DROP TABLE workflow_executions; --", "\u202e", ""])
hostile_float = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(
    [float("nan"), float("inf"), float("-inf"), 1e300, -0.0, 5e-324])
leaves = (st.none() | st.booleans() | st.integers() | st.integers(min_value=2 ** 63, max_value=2 ** 70)
          | hostile_float | hostile_text)
hostile_value = st.recursive(leaves, lambda inner: st.lists(inner, max_size=4)
                             | st.dictionaries(hostile_text, inner, max_size=4), max_leaves=12)


def _nested(levels: int) -> Any:
    value: Any = "bottom"
    for _ in range(levels):
        value = [value]
    return value


deep_value = st.integers(min_value=150, max_value=3000).map(_nested)
any_value = hostile_value | deep_value
hostile_args = st.lists(any_value, max_size=3)


def _stash(value: Any) -> str:
    token = f"v{next(_tokens)}"
    POOL[token] = value
    return token


def _json_equal(a: Any, b: Any) -> bool:
    """Equal as JSON: tuples are lists, and a number is equal to the same number read back (jsonb keeps numbers
    as decimals, so 1e300 comes back as an integer of 301 digits)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b if isinstance(a, int) and isinstance(b, int) else float(a) == float(b)
    if isinstance(a, list | tuple) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    return bool(a == b)


@pytest.mark.timeout(600)
def test_hostile_values_never_hurt_other_work(make_app: Callable[..., pgdurable.App], database_url: str,
                                              schema: str, start_worker: Callable[..., Any]) -> None:
    # Every hostile execution must fail on its first attempt (no recovery). A lease long enough that a
    # heavily loaded machine cannot let it lapse between heartbeats keeps a recovery from meaning anything else.
    app = make_app(lease_seconds=15.0)

    @app.step(max_attempts=1)
    def produce(token: str) -> Any:
        return POOL[token]

    @app.step(max_attempts=1)
    def explode(token: str) -> None:
        message, args = POOL[token]
        raise RuntimeError(message, *args)

    @app.workflow()
    def hostile_output(token: str) -> str:
        produce(token)
        return "stored"

    @app.workflow()
    def hostile_result(token: str) -> Any:
        return POOL[token]

    @app.workflow()
    def hostile_error(token: str) -> None:
        explode(token)

    @app.workflow()
    def echo(value: Any) -> Any:
        return value

    @app.workflow()
    def innocent(n: int) -> int:
        produce(_stash(n))
        return n

    app.migrate()
    runner = start_worker(app, concurrency=16)
    innocents: list[tuple[int, Any]] = []
    hostile: list[tuple[str, Any, Any]] = []  # (kind, handle, what it should return if it succeeds)
    refused: list[BaseException] = []

    def beside_an_innocent() -> None:
        n = len(innocents)
        innocents.append((n, app.enqueue(innocent, n)))

    fast = settings(max_examples=40, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

    @fast
    @given(value=any_value)
    def outputs(value: Any) -> None:
        beside_an_innocent()
        hostile.append(("output", app.enqueue(hostile_output, _stash(value)), "stored"))
        hostile.append(("result", app.enqueue(hostile_result, _stash(value)), value))

    @fast
    @given(message=hostile_text, args=hostile_args)
    def errors(message: str, args: list[Any]) -> None:
        beside_an_innocent()
        hostile.append(("error", app.enqueue(hostile_error, _stash((message, args))), None))

    @fast
    @given(value=any_value,
           timeout=st.none() | hostile_float,
           delay=st.sampled_from([0.0, 0.01]) | hostile_float.filter(lambda d: not 0 < d < 1e9),
           priority=st.none() | st.integers(min_value=-2 ** 40, max_value=2 ** 40),
           workflow_id=st.none() | hostile_text,
           dedup_key=st.none() | hostile_text,
           concurrency_key=st.none() | hostile_text,
           queue=st.none() | st.sampled_from(["default", "", "no spaces", "x" * 101, "ünïcode"]))
    def options(value: Any, timeout: float | None, delay: float, priority: int | None, workflow_id: str | None,
                dedup_key: str | None, concurrency_key: str | None, queue: str | None) -> None:
        beside_an_innocent()
        try:
            handle = app.enqueue(echo, value, timeout_seconds=timeout, delay=delay, priority=priority,
                                 workflow_id=workflow_id, dedup_key=dedup_key, concurrency_key=concurrency_key,
                                 queue=queue)
        except REFUSALS as exc:
            refused.append(exc)
            return
        if (queue or "default") == "default" and handle.workflow_id not in {h.workflow_id for _, h, _ in hostile}:
            hostile.append(("enqueue", handle, value))

    outputs()
    errors()
    options()

    for n, handle in innocents:
        assert handle.result(timeout=120) == n
    refused_by_storage = 0
    for kind, handle, expected in hostile:
        try:
            value = handle.result(timeout=120)
        except pgdurable.WorkflowFailed as failed:
            refused_by_storage += failed.type == "pgdurable.errors.SerializationError"
            row = app.get(handle.workflow_id)
            assert row is not None and row.status == "failed" and row.recoveries == 0, (kind, row)
            allowed = {"output": {"pgdurable.errors.SerializationError"},
                       "result": {"pgdurable.errors.SerializationError"},
                       "error": {"RuntimeError"},
                       "enqueue": {"pgdurable.WorkflowTimeout", "pgdurable.errors.WorkflowTimeout"}}[kind]
            assert failed.type in allowed or "timeout" in failed.type.lower(), (kind, failed)
            continue
        assert kind != "error", "a step that raises cannot succeed"
        assert _json_equal(expected, value) or kind == "output", (kind, expected, value)
    for exc in refused:
        assert str(exc), "a refusal must say why"
    # Not vacuous: unstorable values did reach the worker, and hostile options were refused at enqueue.
    assert refused_by_storage > 0 and refused

    assert runner.thread.is_alive(), "the worker died"
    _read_paths_answer(app, database_url, schema, [h.workflow_id for _, h, _ in hostile[:30]])


def _read_paths_answer(app: pgdurable.App, database_url: str, schema: str, ids: list[str]) -> None:
    cli_runner = CliRunner()
    options = ["--database-url", database_url, "--schema", schema]
    for args in (["status"], ["status", "--json"], ["workflows", "list"], ["workflows", "list", "--json"],
                 *(["workflows", "show", i] for i in ids[:10])):
        result = cli_runner.invoke(cli, [*args, *options])
        # 0, or 1 for status when there is something to look at (failed executions); never a crash.
        assert result.exit_code in (0, 1) and (result.exception is None or isinstance(result.exception, SystemExit)), (
            args, result.exit_code, result.output[-2000:])
        if "--json" in args:
            json.loads(result.output)

    pytest.importorskip("starlette")
    from tests.test_dashboard import client

    browser = client(app)
    for path in ("/", "/workflows", "/workflows?status=failed", "/metrics", "/schedules",
                 *(f"/workflow?id={i}" for i in ids)):
        page = browser.get(path)
        assert page.status_code == 200, (path, page.status_code, page.text[:500])
