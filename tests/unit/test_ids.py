"""The execution ids the engine chooses: UUIDv7 (RFC 9562), ordered by the millisecond they were made in."""

from __future__ import annotations

import os
import threading
import time
import uuid

import pytest

from pgdurable import ids


def millis_of(text: str) -> int:
    return uuid.UUID(text).int >> 80


def test_an_id_is_a_version_7_uuid_in_its_canonical_text_form() -> None:
    made = ids.new_execution_id()
    parsed = uuid.UUID(made)
    assert str(parsed) == made
    assert parsed.version == 7
    assert parsed.variant == uuid.RFC_4122


def test_an_id_begins_with_the_unix_milliseconds_it_was_made_in(monkeypatch: pytest.MonkeyPatch) -> None:
    at_ns = 1_796_000_000_123_456_789  # 2026-11-30
    monkeypatch.setattr(time, "time_ns", lambda: at_ns)
    assert millis_of(ids.new_execution_id()) == at_ns // 1_000_000


def test_ids_of_later_milliseconds_sort_after_earlier_ones_as_text(monkeypatch: pytest.MonkeyPatch) -> None:
    made = []
    for millis in (1_796_000_000_000, 1_796_000_000_001, 1_796_000_000_999, 1_796_000_060_000):
        monkeypatch.setattr(time, "time_ns", lambda millis=millis: millis * 1_000_000 + 999_999)
        made += [ids.new_execution_id() for _ in range(50)]
    by_millis = sorted(made, key=millis_of)
    assert [millis_of(i) for i in sorted(made)] == [millis_of(i) for i in by_millis]


def test_ids_of_one_millisecond_differ_in_their_random_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "time_ns", lambda: 1_796_000_000_000_000_000)
    made = {ids.new_execution_id() for _ in range(20_000)}
    assert len(made) == 20_000
    assert {millis_of(i) for i in made} == {1_796_000_000_000}
    assert {uuid.UUID(i).version for i in made} == {7}


def test_threads_never_share_random_bits() -> None:
    made: list[list[str]] = [[] for _ in range(8)]

    def make(into: list[str]) -> None:
        into.extend(ids.new_execution_id() for _ in range(5_000))

    threads = [threading.Thread(target=make, args=(into,)) for into in made]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [i[14:] for into in made for i in into]  # the random part, after the milliseconds and version
    assert len(set(every)) == len(every) == 40_000


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_does_not_repeat_its_parents_ids() -> None:
    ids.new_execution_id()  # the parent holds a block of random bytes, part used
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        os.close(reader)
        os.write(writer, ",".join(ids.new_execution_id()[14:] for _ in range(100)).encode())
        os._exit(0)
    os.close(writer)
    with os.fdopen(reader) as pipe:
        child = set(pipe.read().split(","))
    os.waitpid(pid, 0)
    parent = {ids.new_execution_id()[14:] for _ in range(100)}
    assert len(child) == 100 and not child & parent
