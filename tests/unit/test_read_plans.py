"""The drivers of waits and reads outside workflows (completions.read_sync / read_async, wait_sync /
wait_async) and the stream reader's plan (streams.py) they run, against a fake database and listener: values
handed out in order, every subscription ended, errors thrown into the plan."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator
from types import SimpleNamespace
from typing import Any

import pytest

from pgdurable import store, streams
from pgdurable.client import WorkflowHandle
from pgdurable.completions import Carried, Emit, Listen, Nap, parse_result, read_async, read_sync, wait_async, wait_sync
from pgdurable.errors import WorkflowNotFound
from pgdurable.serialization import JsonSerializer
from pgdurable.store.messaging import StreamRead


class FakeListener:
    """Subscriptions by key; ``notify`` wakes them as a NOTIFY would."""

    def __init__(self) -> None:
        self.subscribed: list[str] = []
        self.live: dict[int, tuple[str, Callable[[Any], None]]] = {}
        self.listening = True

    def subscribe(self, key: str, wake: Callable[[Any], None]) -> Callable[[], None]:
        self.subscribed.append(key)
        token = len(self.subscribed)
        self.live[token] = (key, wake)
        return lambda: self.live.pop(token)

    def notify(self, outcome: Any = None) -> None:
        for _, wake in list(self.live.values()):
            wake(outcome)


class FakeDatabase:
    """Answers each statement by name from a script; after each, notifies (a write committed during the
    look), so that a nap ends at once."""

    def __init__(self, listener: FakeListener, answers: dict[str, list[Any]]) -> None:
        self.listener, self.answers = listener, answers
        self.calls: list[store.Call[Any]] = []

    def run(self, call: store.Call[Any]) -> Any:
        self.calls.append(call)
        answer = self.answers[call.name].pop(0)
        self.listener.notify()
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def arun(self, call: store.Call[Any]) -> Any:
        return self.run(call)


def _plan() -> Generator[Any, Any, str]:
    yield Listen("a")
    yield Listen("b")
    first = yield store.executions.get_status("e")
    yield Emit([1, 2])
    yield Nap(30.0)  # woken by the fake's notification, not after 30 s
    try:
        yield store.executions.get_status("e")
    except RuntimeError as lost:
        yield Emit([3])
        return f"{first} then {lost}"
    return "unreachable"


def _fakes() -> tuple[FakeListener, FakeDatabase]:
    listener = FakeListener()
    return listener, FakeDatabase(listener, {"get_status": ["running", RuntimeError("connection lost")]})


def test_a_read_hands_out_the_values_in_order_and_ends_every_subscription() -> None:
    listener, db = _fakes()
    assert list(read_sync(db, listener, _plan())) == [1, 2, 3]
    assert listener.subscribed == ["a", "b"] and listener.live == {}


def test_a_read_left_early_ends_every_subscription() -> None:
    listener, db = _fakes()
    reader = read_sync(db, listener, _plan())
    assert next(reader) == 1
    assert len(listener.live) == 2
    reader.close()
    assert listener.live == {}


def test_a_wait_returns_the_plans_value_and_a_failed_statement_is_thrown_into_the_plan() -> None:
    listener, db = _fakes()
    assert wait_sync(db, listener, _plan()) == "running then connection lost"
    assert listener.live == {}


def test_the_async_drivers_do_the_same() -> None:
    async def both() -> tuple[list[Any], str]:
        listener, db = _fakes()
        values = [value async for value in read_async(db, listener, _plan())]
        assert listener.live == {}
        listener, db = _fakes()
        outcome = await wait_async(db, listener, _plan())
        assert listener.live == {}
        return values, outcome

    assert asyncio.run(both()) == ([1, 2, 3], "running then connection lost")


def _runtime(reads: list[Any]) -> Any:
    listener = FakeListener()
    # The reader registers the execution as awaited first (its completion then notifies): one status.
    answers = {"await_status": [("running", None, None)], "read_stream": reads}
    return SimpleNamespace(db=FakeDatabase(listener, answers), completions=listener, serializer=JsonSerializer())


def test_a_stream_is_read_after_the_last_value_seen_until_its_close() -> None:
    runtime = _runtime([StreamRead(True, False, [(1, '"a"'), (2, '{"n":2}')], False),
                        StreamRead(True, False, [], False),  # nothing new: nap until notified
                        StreamRead(True, False, [(5, '"c"')], True)])
    assert list(streams.read_stream(runtime, "e", "tokens")) == ["a", {"n": 2}, "c"]
    assert [call.name for call in runtime.db.calls] == ["await_status", "read_stream", "read_stream", "read_stream"]
    assert [call.params["after"] for call in runtime.db.calls[1:]] == [-1, 2, 2]
    assert runtime.completions.subscribed == ["event:e", "e"] and runtime.completions.live == {}


def test_a_full_batch_is_followed_by_another_look_even_once_the_execution_ended() -> None:
    full = [(i, str(i)) for i in range(1, 501)]
    runtime = _runtime([StreamRead(True, True, full, False), StreamRead(True, True, [(501, "501")], False)])
    assert list(streams.read_stream(runtime, "e", "k")) == list(range(1, 502))


def test_reading_the_stream_of_no_execution_fails() -> None:
    runtime = _runtime([StreamRead(False, True, [], False)])
    with pytest.raises(WorkflowNotFound):
        list(streams.read_stream(runtime, "nobody", "k"))
    assert runtime.completions.live == {}


# ---- a result wait handed the outcome by the completion's notification ----------------------------------------

class NotifyingDatabase(FakeDatabase):
    """After each statement, notifies with the next of ``carried`` (None: a notification without the outcome)."""

    def __init__(self, listener: FakeListener, answers: dict[str, list[Any]], carried: list[Any]) -> None:
        super().__init__(listener, answers)
        self.carried = carried

    def run(self, call: store.Call[Any]) -> Any:
        self.calls.append(call)
        answer = self.answers[call.name].pop(0)
        self.listener.notify(self.carried.pop(0))
        return answer


def _handle(db: FakeDatabase) -> WorkflowHandle[Any]:
    runtime = SimpleNamespace(db=db, completions=db.listener, serializer=JsonSerializer())
    return WorkflowHandle(runtime, "e")  # type: ignore[arg-type]


# A look's snapshot (pg_snapshot's text): transactions below 100 had ended, 100-104 had not begun, 101 ran.
SEEN = "100:105:101"


def test_a_result_wait_takes_the_outcome_the_notification_carried_without_reading() -> None:
    listener = FakeListener()
    db = NotifyingDatabase(listener, {"await_status": [("running", None, None, SEEN)]},
                           [Carried(("succeeded", '{"n": 1}', None), 101)])  # committed after the look
    assert _handle(db)._decode(wait_sync(db, listener, _handle(db)._finished(None))) == {"n": 1}
    assert [call.name for call in db.calls] == ["await_status"]


@pytest.mark.parametrize("carried", [None, Carried(("failed", None, '{"type": "Old"}'), 99),
                                     Carried(("failed", None, '{"type": "Old"}'), 100)])
def test_a_result_wait_reads_the_outcome_when_the_notification_did_not_carry_its_own(carried: Any) -> None:
    """No outcome carried (too long for a payload), or one committed before the look that registered the
    wait (an earlier run's, before a resume, whose notification reached the listener late): read."""
    listener = FakeListener()
    db = NotifyingDatabase(listener, {"await_status": [("enqueued", None, None, SEEN)],
                                      "get_status": [("succeeded", "2", None)]},
                           [carried, None])
    handle = _handle(db)
    assert asyncio.run(wait_async(db, listener, handle._finished(None))) == ("succeeded", "2", None)
    assert [call.name for call in db.calls] == ["await_status", "get_status"]


@pytest.mark.parametrize(("xid", "after"), [(99, False), (100, False), (101, True), (102, False), (104, False),
                                            (105, True), (7000, True)])
def test_an_outcome_counts_only_if_committed_after_the_look(xid: int, after: bool) -> None:
    assert Carried(("succeeded", None, None), xid).sent_after("100:105:101,103") is after
    assert not Carried(("succeeded", None, None), xid).sent_after(None)


@pytest.mark.parametrize(("payload", "expected"), [
    ('["e-1", "succeeded", "7"]\n{"a": [1, "x\\ny"]}',
     ("e-1", Carried(("succeeded", '{"a": [1, "x\\ny"]}', None), 7))),
    ('["e\\n\\"2", "succeeded", "8"]\n', ('e\n"2', Carried(("succeeded", None, None), 8))),
    ('["e3", "failed", "9"]\n{"type": "KeyError"}', ("e3", Carried(("failed", None, '{"type": "KeyError"}'), 9))),
    ('["e4", "cancelled", "10"]\n', ("e4", Carried(("cancelled", None, None), 10))),
    ('["e5"]', ("e5", None)),  # too long for a payload: the waiter reads it
])
def test_a_result_notification_is_parsed_into_the_id_and_the_outcome_as_a_read_returns_it(
        payload: str, expected: tuple[str, Any]) -> None:
    assert parse_result(payload) == expected
