"""The first hour of a newcomer (issue #15), the parts that are pure logic: arguments checked against the
workflow's annotations at enqueue, the queues a worker serves by default, App.database_url, one-line
connection errors, every client call's async twin."""

from __future__ import annotations

import dataclasses
import enum
import inspect
from datetime import date, datetime
from decimal import Decimal
from typing import Any, Literal
from uuid import UUID, uuid4

import psycopg
import pydantic
import pytest
from typing_extensions import TypedDict

import pgdurable
from pgdurable.dberrors import explain
from pgdurable.errors import ConfigurationError
from pgdurable.redaction import check_database_url
from pgdurable.serialization import JsonSerializer, SizeLimit
from pgdurable.worker import declared_queues
from pgdurable.workflows import Workflow, type_name

SERIALIZER = SizeLimit(JsonSerializer(), 1 << 20)


@dataclasses.dataclass
class Point:
    x: int
    y: int


class Model(pydantic.BaseModel):
    a: int


class Options(TypedDict):
    key: str


class Color(enum.Enum):
    RED = "red"


def typed(x: int, y: float = 0.0, s: str = "", flag: bool = False, maybe: int | None = None,
          items: list[int] | None = None, table: dict[str, int] | None = None, pair: tuple[int, str] = (1, "a"),
          point: Point | None = None, model: Model | None = None, options: Options | None = None,
          color: Color = Color.RED, when: datetime | None = None, ident: UUID | None = None,
          amount: Decimal | None = None, mode: Literal["a", "b"] = "a", anything: Any = None, loose=None,
          *rest: int, **named: str) -> None:
    return None


WORKFLOW = Workflow(typed, name="typed", queue="default", priority=0, max_recoveries=None)


def _encode(*args: Any, **kwargs: Any) -> str:
    return WORKFLOW.encode_arguments(SERIALIZER, args, kwargs)


@pytest.mark.parametrize(("args", "kwargs"), [
    ((1,), {}), ((1,), {"y": 2}), ((1,), {"y": 2.5}), ((1,), {"maybe": None}), ((1,), {"maybe": 3}),
    ((1,), {"items": [1, 2]}), ((1,), {"items": (1, 2)}), ((1,), {"table": {"a": 1}}), ((1,), {"pair": (2, "b")}),
    ((1,), {"point": Point(1, 2)}), ((1,), {"point": {"x": 1, "y": 2}}), ((1,), {"model": Model(a=1)}),
    ((1,), {"model": {"a": 1}}), ((1,), {"options": {"key": "v"}}), ((1,), {"color": Color.RED}),
    ((1,), {"when": datetime.now()}), ((1,), {"ident": uuid4()}), ((1,), {"amount": Decimal("1.5")}),
    ((1,), {"mode": "b"}), ((1,), {"anything": {1, 2}}), ((1,), {"loose": {"any": ["json"]}}),
    ((1, 2.0, "", False, None, None, None, (1, "a"), None, None, None, Color.RED, None, None, None, "a", None,
      None, 7, 8), {"extra": "x"}),
])
def test_arguments_that_match_the_annotations_are_accepted(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    _encode(*args, **kwargs)


@pytest.mark.parametrize(("args", "kwargs", "error", "parameter", "expected", "got"), [
    (("abc",), {}, TypeError, "x", "int", "str 'abc'"),
    (({1, 2},), {}, TypeError, "x", "int", "set {1, 2}"),
    ((Decimal("2"),), {}, TypeError, "x", "int", "Decimal"),
    (("7",), {}, TypeError, "x", "int", "str '7'"),
    ((True,), {}, TypeError, "x", "int", "bool True"),
    ((1.5,), {}, TypeError, "x", "int", "float 1.5"),
    ((1,), {"y": "2"}, TypeError, "y", "float", "str '2'"),
    ((1,), {"s": 3}, TypeError, "s", "str", "int 3"),
    ((1,), {"flag": 1}, TypeError, "flag", "bool", "int 1"),
    ((1,), {"maybe": "x"}, TypeError, "maybe", "int | None", "str 'x'"),
    ((1,), {"items": [1, "x"]}, TypeError, "items", "list[int] | None", "items[1]"),
    ((1,), {"table": {"a": "b"}}, TypeError, "table", "dict[str, int] | None", "table.a"),
    ((1,), {"point": {"x": "a", "y": 2}}, TypeError, "point", "Point | None", "point.x"),
    ((1,), {"options": {"key": 1}}, TypeError, "options", "Options | None", "options.key"),
    ((1,), {"when": date(2026, 1, 1)}, TypeError, "when", "datetime | None", "date"),
    ((1,), {"color": "blue"}, ValueError, "color", "Color", "str 'blue'"),
    ((1,), {"mode": "c"}, ValueError, "mode", "Literal['a', 'b']", "str 'c'"),
    ((1, 2.0, "", False, None, None, None, (1, "a"), None, None, None, Color.RED, None, None, None, "a", None,
      None, "seven"), {}, TypeError, "rest", "tuple[int, ...]", "rest[0]"),
    ((1,), {"extra": 3}, TypeError, "named", "dict[str, str]", "named.extra"),
])
def test_arguments_of_the_wrong_type_are_refused_naming_workflow_parameter_expected_and_got(
        args: tuple[Any, ...], kwargs: dict[str, Any], error: type[Exception], parameter: str, expected: str,
        got: str) -> None:
    with pytest.raises(error) as raised:
        _encode(*args, **kwargs)
    message = str(raised.value)
    assert "workflow 'typed'" in message and f"argument {parameter!r}" in message, message
    assert f"must be {expected}," in message and got in message, message


def test_unannotated_and_any_workflows_take_anything_json_can_store() -> None:
    def loose(a, b: Any = None):  # type: ignore[no-untyped-def]
        return None

    workflow = Workflow(loose, name="loose", queue="default", priority=0, max_recoveries=None)
    assert not workflow.signature.typed
    workflow.encode_arguments(SERIALIZER, ("7", {1, 2}), {})
    workflow.encode_arguments(SERIALIZER, (Decimal("1.5"),), {"b": [1, "x"]})


def test_a_custom_serializer_is_not_second_guessed() -> None:
    class Text:
        def dumps(self, value: Any) -> str:
            return JsonSerializer().dumps({k: str(v) for k, v in value.items()})

        def loads(self, text: str, type_hint: Any = Any) -> Any:
            return JsonSerializer().loads(text)

    WORKFLOW.encode_arguments(SizeLimit(Text(), 1 << 20), ("not an int",), {})


def test_type_names_read_as_source() -> None:
    assert [type_name(h) for h in (int, list[int], int | None, Point | None, dict[str, Point], Any)] == [
        "int", "list[int]", "int | None", "Point | None", "dict[str, Point]", "Any"]


def test_a_worker_without_queues_serves_every_queue_its_app_declares() -> None:
    app = pgdurable.App("postgresql://nobody@127.0.0.1:1/none", schema="unit_queues")
    app.queue("tenants", concurrency=2)

    @app.workflow(queue="reports")
    def report() -> None:
        return None

    @app.workflow()
    def plain() -> None:
        return None

    @app.scheduled("@daily", queue="nightly")
    @app.workflow(queue="reports")
    def rollup() -> None:
        return None

    assert declared_queues(app.runtime) == {"default", "tenants", "reports", "nightly"}
    assert app.worker().queues == ["default", "nightly", "reports", "tenants"]
    assert app.worker(queues=["only"]).queues == ["only"]


def test_database_url_is_usable_and_its_repr_masks_the_password() -> None:
    url = "postgresql://app:S3cretPw@127.0.0.1:1/shop"
    app = pgdurable.App(url, schema="unit_url")
    assert "(not connected yet)" in repr(app)
    assert app.database_url == url and str(app.database_url) == url
    assert "S3cretPw" not in repr(app.database_url) and "***" in repr(app.database_url)
    assert "S3cretPw" not in repr(app) and "127.0.0.1:1/shop" in repr(app)


@pytest.mark.parametrize(("url", "says"), [
    ("mysql://root:S3cretPw@db/shop", "its scheme is 'mysql'"),
    ("localhost:5432/shop", "it has no scheme"),
    ("app:S3cretPw@localhost/shop", "it has no scheme"),
])
def test_urls_that_are_not_postgresql_urls_are_named_so(url: str, says: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        check_database_url(url)
    assert says in str(raised.value) and "malformed" in str(raised.value)
    assert "S3cretPw" not in str(raised.value)


def test_connection_errors_name_the_server_and_the_case() -> None:
    refused = psycopg.OperationalError(
        'connection failed: connection to server at "10.1.2.3", port 6543 failed: Connection refused\n'
        "\tIs the server running on that host and accepting TCP/IP connections?")
    problem = explain(refused)
    assert problem.kind == "unreachable" and not problem.permanent
    assert problem.message == "cannot reach a PostgreSQL server at 10.1.2.3:6543: Connection refused"

    missing = psycopg.OperationalError(
        'connection failed: connection to server at "127.0.0.1", port 5432 failed: FATAL:  database "shop" does '
        "not exist")
    problem = explain(missing, "postgresql://app:S3cretPw@127.0.0.1:5432/shop")
    assert problem.kind == "missing_database" and problem.permanent
    assert 'database "shop" does not exist on the server at 127.0.0.1:5432' in problem.message
    assert "createdb -h 127.0.0.1 -p 5432 -U app shop" in problem.message and "S3cretPw" not in problem.message

    refused_login = psycopg.OperationalError(
        'connection failed: connection to server at "127.0.0.1", port 5432 failed: FATAL:  password '
        'authentication failed for user "app"')
    problem = explain(refused_login)
    assert problem.kind == "credentials" and "refused these credentials" in problem.message

    unresolved = psycopg.OperationalError("failed to resolve host 'db.invalid': [Errno -2] Name or service not known")
    problem = explain(unresolved, "postgresql://app@db.invalid/shop")
    assert problem.kind == "unreachable" and "db.invalid:5432" in problem.message


# Methods that are not client calls (registration, configuration, running a worker in this process).
_NOT_CALLS = {"workflow", "step", "transaction", "queue", "scheduled", "observe", "handle", "worker", "run_worker",
              "close"}


def _is_async(method: Any) -> bool:
    """A coroutine function, or one that returns an async iterator (read_stream_async)."""
    return method is not None and (inspect.iscoroutinefunction(method) or inspect.isasyncgenfunction(method)
                                   or "AsyncIterator" in str(inspect.signature(method).return_annotation))


def test_every_client_call_has_an_async_twin() -> None:
    for cls in (pgdurable.App, pgdurable.WorkflowHandle):
        calls = [name for name, member in inspect.getmembers(cls, inspect.isfunction)
                 if not name.startswith("_") and not name.endswith("_async") and name not in _NOT_CALLS
                 and not inspect.iscoroutinefunction(member)]
        missing = [name for name in calls if not _is_async(getattr(cls, f"{name}_async", None))]
        assert not missing, f"{cls.__name__} has no async form of {missing}"


def test_optional_submodules_are_reachable_from_the_package() -> None:
    assert pgdurable.metrics.PrometheusMetrics is not None
    with pytest.raises(AttributeError):
        _ = pgdurable.no_such_thing  # type: ignore[attr-defined]


def test_the_next_start_forgets_users_of_the_embedded_server_that_were_killed(tmp_path: Any) -> None:
    import json
    import os
    import subprocess
    import sys

    from pgdurable.embedded_watch import forget_dead_users

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # reaped: its pid runs no more, as a SIGKILLed user's
    users = tmp_path / ".handle_pids.json"
    users.write_text(json.dumps([gone.pid, os.getpid()]))
    assert forget_dead_users(tmp_path) == [os.getpid()]
    assert json.loads(users.read_text()) == [os.getpid()]  # so this process, exiting last, stops the server


@pytest.mark.parametrize(("detail", "schema", "ours"), [
    ('relation "workflow_executions" does not exist', "shop", True),
    ('relation "shop.workers" does not exist', "shop", True),
    ('schema "shop" does not exist', "shop", True),
    ("function shop.enqueue_workflow(unknown, jsonb) does not exist", "shop", True),
    ('column "lease_seconds" of relation "workers" does not exist', "shop", True),
    ('relation "billing.invoices" does not exist', "shop", False),  # the application's own table
    ('relation "invoices" does not exist', "shop", False),
    ('relation "other.workers" does not exist', "shop", False),  # another schema's
    ('schema "billing" does not exist', "shop", False),
    ("column new.nope does not exist", "shop", False),  # a table binding's condition
])
def test_only_missing_objects_of_pgdurable_mean_it_is_not_installed(detail: str, schema: str, ours: bool) -> None:
    from pgdurable import store

    assert store.calls._names_own_object(detail, schema) is ours
