"""The fault-injection checker's judgement of a debounced burst (bench/chaos.py ``burst_outcome``).

A burst whose enqueues were interrupted for longer than the debounce window (a retry across a server
restart) may rightly make two executions: the first started before the rest of the burst arrived. The
checker must accept that, and only that, and still check every execution's arguments and result.
"""

from __future__ import annotations

from bench import chaos, chaos_app


def _burst_item(burst: tuple[int, ...] = (10, 11, 12)) -> chaos.Item:
    return chaos.Item("plan-000001-debounced", "debounced", {"pause": 0.0}, "succeeded",
                      chaos_app.expected_debounced(burst[-1]), history=("chaos.settle",), burst=burst)


def test_one_execution_is_the_item_with_the_last_arguments() -> None:
    checked, extra = chaos.burst_outcome(_burst_item(), [("e1", 12)], splits=0)
    assert extra == 0
    assert [(i.id, i.result) for i in checked] == [("e1", chaos_app.expected_debounced(12))]


def test_a_second_execution_without_a_pause_ran_the_burst_twice() -> None:
    checked, extra = chaos.burst_outcome(_burst_item(), [("e1", 11), ("e2", 12)], splits=0)
    assert extra == 1
    assert [i.id for i in checked] == ["e1", "e2"]


def test_a_pause_allows_an_earlier_execution_checked_with_its_own_arguments() -> None:
    checked, extra = chaos.burst_outcome(_burst_item(), [("e1", 11), ("e2", 12)], splits=1)
    assert extra == 0
    earlier, last = checked
    assert (earlier.id, earlier.result, earlier.burst) == ("e1", chaos_app.expected_debounced(11), ())
    assert (last.id, last.result) == ("e2", chaos_app.expected_debounced(12))


def test_an_earlier_execution_with_arguments_outside_the_burst_cannot_pass() -> None:
    checked, extra = chaos.burst_outcome(_burst_item(), [("e1", 99), ("e2", 12)], splits=1)
    assert extra == 0
    assert checked[0].result == "arguments outside the burst"
    assert checked[0].result != chaos_app.expected_debounced(99)


def test_more_executions_than_pauses_count_as_duplicates() -> None:
    checked, extra = chaos.burst_outcome(_burst_item(), [("e1", 10), ("e2", 11), ("e3", 12)], splits=1)
    assert extra == 1
    assert len(checked) == 3
