"""Wake-ups that cost only when someone sleeps. Doorbells: an enqueue notifies only when a worker sleeps on its
queue (armed its bell), once per sleep. Result waiters: a finished execution notifies only if a wait registered
it. Either way, transactions that nobody needs to hear from send no NOTIFY, whose commits PostgreSQL
serialises."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

import pgdurable
from pgdurable import channels, store
from pgdurable.completions import parse_result
from pgdurable.sqlfiles import query as _query
from tests.conftest import ThreadWorker
from tests.harness import WAIT, wait_for


def _listener(database_url: str, schema: str, *kinds: channels.Kind) -> Iterator[Callable[[], list[str]]]:
    """A connection listening on some of the schema's channels; calling what it yields returns the payloads
    that arrived."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(channels.listen(schema, *kinds))

        def received() -> list[str]:
            conn.execute("SELECT 1")  # let pending notifications in
            return [notice.payload for notice in conn.notifies(timeout=0.2)]
        yield received


@pytest.fixture
def listening(database_url: str, schema: str, db: psycopg.Connection[Any]) -> Iterator[Callable[[], list[str]]]:
    """What arrived on the work channel (doorbells)."""
    yield from _listener(database_url, schema, "work")


@pytest.fixture
def done_channel(database_url: str, schema: str, db: psycopg.Connection[Any]) -> Iterator[Callable[[], list[str]]]:
    """The ids of the finished executions whose waiters were notified (on the result channel, with the
    outcome, or on the done channel, with the id alone)."""
    for received in _listener(database_url, schema, "done", "result"):

        def ids(received: Callable[[], list[str]] = received) -> list[str]:
            return [payload if not payload.startswith("[") else parse_result(payload)[0] for payload in received()]
        yield ids


@pytest.fixture
def id_channel(database_url: str, schema: str, db: psycopg.Connection[Any]) -> Iterator[Callable[[], list[str]]]:
    """What arrived on the done channel alone (waiters of the previous release: the id)."""
    yield from _listener(database_url, schema, "done")


@pytest.fixture
def result_channel(database_url: str, schema: str, db: psycopg.Connection[Any]) -> Iterator[Callable[[], list[str]]]:
    """What arrived on the result channel (waiters handed the outcome)."""
    yield from _listener(database_url, schema, "result")


def enqueue_sql(conn: psycopg.Connection[Any], queue: str = "q", name: str = "nobody") -> None:
    conn.execute("SELECT enqueue_workflow(%s, '{}', %s)", (name, queue))


def arm(conn: psycopg.Connection[Any], worker: str, queue: str = "q") -> None:
    conn.execute("INSERT INTO worker_doorbells (queue, worker_id) VALUES (%s, %s) "
                 "ON CONFLICT (queue, worker_id) DO UPDATE SET armed = true", (queue, worker))


def armed(conn: psycopg.Connection[Any]) -> dict[tuple[str, str], bool]:
    rows = conn.execute("SELECT queue, worker_id, armed FROM worker_doorbells").fetchall()
    return {(queue, worker): is_armed for queue, worker, is_armed in rows}


def test_an_enqueue_notifies_only_while_a_bell_is_armed(db: psycopg.Connection[Any],
                                                        listening: Callable[[], list[str]]) -> None:
    enqueue_sql(db)
    assert listening() == []  # nobody sleeps on the queue: no NOTIFY, no serialised commit

    arm(db, "w1")
    arm(db, "w2")
    arm(db, "w3", queue="other")
    enqueue_sql(db)
    assert listening() == ["q"]  # one NOTIFY wakes both sleepers of q
    assert armed(db) == {("q", "w1"): False, ("q", "w2"): False, ("other", "w3"): True}

    enqueue_sql(db)
    assert listening() == []  # rung once per sleep


def test_an_app_enqueue_rings_only_for_work_that_can_be_claimed_now(
        db: psycopg.Connection[Any], listening: Callable[[], list[str]]) -> None:
    """app.enqueue writes one row with a plain INSERT (not the SQL function): it rings the same bells, once per
    sleep, but not for a delayed start (the timer's UPDATE rings when it is due)."""
    def enqueue(id: str, delay: float = 0.0) -> None:
        store.run(db, store.executions.enqueue(id=id, name="n", queue="q", priority=0, input="{}",
                                               max_recoveries=5, delay=delay))

    enqueue("quiet")
    assert listening() == []
    arm(db, "w1")
    enqueue("later", delay=60)
    assert listening() == []
    assert armed(db) == {("q", "w1"): True}
    enqueue("now")
    assert listening() == ["q"]
    assert armed(db) == {("q", "w1"): False}
    enqueue("again")
    assert listening() == []
    db.execute("UPDATE workflow_executions SET available_at = now() WHERE id = 'later'")
    arm(db, "w1")
    store.run(db, store.claims.wake_due())
    assert listening() == ["q"]  # the delayed one, made due


def test_a_bulk_insert_rings_once_per_queue(db: psycopg.Connection[Any], listening: Callable[[], list[str]]) -> None:
    arm(db, "w1", "a")
    arm(db, "w2", "b")
    db.execute("SELECT count(*) FROM insert_executions_v2(%s::jsonb)",
               ('[' + ','.join(f'{{"id": "x{i}", "name": "n", "queue": "{"ab"[i % 2]}"}}' for i in range(100))
                + ']',))
    assert sorted(listening()) == ["a", "b"]


def test_enqueuers_do_not_wait_for_one_another_on_a_bell(database_url: str, schema: str,
                                                         db: psycopg.Connection[Any],
                                                         listening: Callable[[], list[str]]) -> None:
    """The first transaction to ring holds the bell until it commits; a concurrent enqueue skips it (its
    NOTIFY wakes the same workers) instead of waiting behind an application transaction that may be long."""
    arm(db, "w1")
    first = psycopg.connect(database_url)
    second = psycopg.connect(database_url)
    try:
        for conn in (first, second):
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            conn.commit()
        enqueue_sql(first)  # rings: the bell is locked until `first` ends
        second.execute("SET lock_timeout = '5s'")  # would fail with a lock timeout if it waited
        enqueue_sql(second)
        second.commit()
        assert listening() == []
        first.commit()
        assert listening() == ["q"]
    finally:
        first.close()
        second.close()
    assert db.execute("SELECT count(*) FROM workflow_executions").fetchone() == (2,)


def test_a_sleeping_worker_is_woken_by_an_enqueue_from_sql(make_app: Callable[..., pgdurable.App],
                                                          database_url: str, schema: str,
                                                          start_worker: Callable[..., ThreadWorker]) -> None:
    # Polling alone would take five minutes: only the bell can wake the worker in time.
    app = make_app(poll_seconds=300.0)
    done = threading.Event()

    @app.workflow(name="ping")
    def ping() -> str:
        done.set()
        return "pong"

    app.migrate()
    runner = start_worker(app, concurrency=2)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        wait_for(lambda: armed(conn).get(("default", runner.worker.id)), WAIT, "the worker to arm its bell")
        # Past the idle backoff's first re-checks, so that only the bell can explain a prompt start.
        wait_for(lambda: (runner.worker.producers["default"].idle.delay or 0) >= 1.0, WAIT, "a long idle backoff")
        conn.execute("SELECT enqueue_workflow('ping')")
        assert done.wait(WAIT)
        wait_for(lambda: armed(conn).get(("default", runner.worker.id)), WAIT, "the bell armed again")
    runner.stop()
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        assert armed(conn) == {}  # a stopped worker takes its bells with it


def test_a_completion_arms_the_bell_given_in_its_own_statement(db: psycopg.Connection[Any]) -> None:
    """write_completions arms the doorbells it is given (a worker finishing its last execution of a queue that
    ran dry) in the statement that finishes the executions: whoever sees the result sees the bell armed."""
    enqueue_sql(db, name="n")
    [claimed] = store.run(db, store.claims.claim(queue="q", names=["n"], owner="w1", lease=30, limit=1, version="v"))
    arm(db, "w1")
    enqueue_sql(db)  # rings: disarmed
    assert armed(db) == {("q", "w1"): False}
    rows = f'[["{claimed.id}", {claimed.attempt}, "succeeded", 1, null]]'
    written = store.run(db, store.checkpoints.write_completions(rows, '[["w1", "q"], ["w1", "fresh"]]'))
    assert written == {(claimed.id, claimed.attempt, None)}
    assert armed(db) == {("q", "w1"): True, ("fresh", "w1"): True}  # a bell not yet there is installed armed
    assert store.run(db, store.checkpoints.write_completions("[]")) == set()  # no bells: none touched
    assert armed(db) == {("q", "w1"): True, ("fresh", "w1"): True}


def test_a_worker_finishing_its_last_execution_has_armed_its_bell_by_the_time_the_result_shows(
        make_app: Callable[..., pgdurable.App], database_url: str, schema: str,
        start_worker: Callable[..., ThreadWorker]) -> None:
    """The caller who enqueues again as soon as it has a result must find the bell armed, or its enqueue rings
    nobody (and waits for the claim that closes the gap). Each look reads the status and the bell in one
    snapshot; every look that shows the execution finished must show the bell armed."""
    app = make_app(poll_seconds=300.0)

    @app.workflow(name="ping")
    def ping() -> str:
        return "pong"

    app.migrate()
    runner = start_worker(app, concurrency=2)
    look = sql.SQL("SELECT e.status, (SELECT armed FROM {s}.worker_doorbells WHERE queue = 'default' "
                   "AND worker_id = %s) FROM {s}.workflow_executions e WHERE e.id = %s"
                   ).format(s=sql.Identifier(schema))
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        wait_for(lambda: armed(conn).get(("default", runner.worker.id)), WAIT, "the worker to arm its bell")
        for i in range(5):
            conn.execute("SELECT enqueue_workflow('ping', '{}', 'default', %s)", (f"p{i}",))  # rings, disarms
            deadline = time.monotonic() + WAIT
            while True:
                status, is_armed = conn.execute(look, (runner.worker.id, f"p{i}")).fetchone()
                if status == "succeeded":
                    assert is_armed, f"p{i} finished before the worker's bell was armed"
                    break
                assert time.monotonic() < deadline, f"p{i} did not finish"
    runner.stop()


def test_a_worker_whose_ring_brings_a_burst_claims_without_a_bell_until_its_queue_is_quiet(
        make_app: Callable[..., pgdurable.App], database_url: str, schema: str,
        start_worker: Callable[..., ThreadWorker], listening: Callable[[], list[str]]) -> None:
    """The claim a ring brings finds more than the execution that rang (a transaction enqueued five): the
    queue is hot, and the worker claims on its own instead of arming its bell, so the next enqueue sends no
    NOTIFY and still runs (polls are five minutes apart, the idle backoff is past a second: only the hot
    queue's claims can find it). Once the queue has stayed quiet (at once here; an hour until then), the bell
    is armed again and the next enqueue rings it."""
    app = make_app(poll_seconds=300.0)
    ran: list[str] = []
    finished = threading.Condition()

    @app.workflow(name="ping")
    def ping(n: int) -> None:
        with finished:
            ran.append(str(n))
            finished.notify_all()

    def ran_all(*numbers: int) -> None:
        with finished:
            assert finished.wait_for(lambda: all(str(n) in ran for n in numbers), WAIT), ran

    app.migrate()
    runner = start_worker(app, concurrency=8)
    producer = runner.worker.producers["default"]
    producer.hot.QUIET_SECONDS = 3600.0
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        wait_for(lambda: armed(conn).get(("default", runner.worker.id)), WAIT, "the worker to arm its bell")
        wait_for(lambda: (producer.idle.delay or 0) >= 1.0, WAIT, "a long idle backoff")
        conn.execute("SELECT enqueue_workflow('ping', jsonb_build_object('n', n)) FROM generate_series(1, 5) n")
        ran_all(1, 2, 3, 4, 5)
        assert listening() == ["default"]  # one ring for the five
        assert producer.hot.polling

        conn.execute("SELECT enqueue_workflow('ping', '{\"n\": 6}')")
        ran_all(6)
        assert listening() == []  # found by the hot queue's claims, with no NOTIFY
        assert not armed(conn)[("default", runner.worker.id)]

        producer.hot.QUIET_SECONDS = 0.0
        wait_for(lambda: armed(conn).get(("default", runner.worker.id)), WAIT, "the bell armed again")
        assert not producer.hot.polling
        conn.execute("SELECT enqueue_workflow('ping', '{\"n\": 7}')")
        ran_all(7)
        assert listening() == ["default"]
    runner.stop()


def test_work_that_slipped_past_the_bell_is_found_by_the_idle_backoff(
        make_app: Callable[..., pgdurable.App], database_url: str, schema: str,
        start_worker: Callable[..., ThreadWorker]) -> None:
    """A transaction that looked at the bell before the worker armed it, and commits after the worker's last
    claim, rings nothing; the sleeping worker's backoff re-claim finds its work, well before a poll."""
    app = make_app(poll_seconds=300.0)
    done = threading.Event()

    @app.workflow(name="late")
    def late() -> None:
        done.set()

    app.migrate()
    with psycopg.connect(database_url) as slow:
        slow.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        slow.execute("SELECT enqueue_workflow('late')")  # no bell armed yet: rings nobody
        runner = start_worker(app, concurrency=2)
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            wait_for(lambda: armed(conn).get(("default", runner.worker.id)), WAIT, "the worker to arm its bell")
        slow.commit()
    assert done.wait(WAIT)


# ---- result waiters: a finished execution notifies only if someone waits for it ------------------------------

def finish(conn: psycopg.Connection[Any], execution_id: str) -> None:
    conn.execute("UPDATE workflow_executions SET status = 'succeeded', output = '1' WHERE id = %s", (execution_id,))


def test_only_an_awaited_execution_notifies_when_it_finishes(db: psycopg.Connection[Any],
                                                             done_channel: Callable[[], list[str]]) -> None:
    db.execute("SELECT enqueue_workflow('nobody', '{}', 'q', 'alone')")
    db.execute("SELECT enqueue_workflow('nobody', '{}', 'q', 'awaited')")
    status, output, error, seen = db.execute(_query(store.executions.await_status("awaited").name),
                                             {"id": "awaited"}).fetchone()
    assert (status, output, error) == ("enqueued", None, None) and seen.count(":") == 2  # the look's snapshot
    assert db.execute("SELECT execution_id FROM awaited_executions").fetchall() == [("awaited",)]
    finish(db, "alone")
    assert done_channel() == []  # nobody waits: no NOTIFY, no serialised commit
    finish(db, "awaited")
    assert done_channel() == ["awaited"]
    assert db.execute("SELECT count(*) FROM awaited_executions").fetchone() == (0,)
    # A finished execution is not registered: its waiter already has the outcome.
    assert db.execute(_query("await_status"), {"id": "alone"}).fetchone() == ("succeeded", 1, None, None)
    assert db.execute("SELECT count(*) FROM awaited_executions").fetchone() == (0,)


def test_the_completion_hands_the_outcome_to_a_waiter_that_asked_for_it(
        db: psycopg.Connection[Any], result_channel: Callable[[], list[str]],
        id_channel: Callable[[], list[str]]) -> None:
    """A registration of await_execution_v2(id, true) is notified on the result channel with the outcome as
    stored (a read would return the same); one of the previous release's await_execution_v1 on the done
    channel with the id; an outcome too long for a NOTIFY payload is left for the waiter to read."""
    ids = ["ok", 'quote"and\nnewline', "none", "failed", "big", "old", "both"]
    for id_ in ids:
        db.execute("SELECT enqueue_workflow('nobody', '{}', 'q', %s)", (id_,))
    looks = {}
    for id_ in ids:
        if id_ != "old":
            looks[id_] = db.execute("SELECT seen::text FROM await_execution_v2(%s, true)", (id_,)).fetchone()[0]
        if id_ in ("old", "both"):
            db.execute("SELECT * FROM await_execution_v1(%s)", (id_,))
    big = {"text": "é" * 5000}  # 10,000 bytes in UTF-8
    outputs = {"ok": {"n": [1, 2.5, "x\ny"]}, 'quote"and\nnewline': "ünïcode", "big": big, "old": 1, "both": 2}
    for id_, output in outputs.items():
        db.execute("UPDATE workflow_executions SET status = 'succeeded', output = %s WHERE id = %s",
                   (Jsonb(output), id_))
    db.execute("UPDATE workflow_executions SET status = 'succeeded', output = NULL WHERE id = 'none'")
    db.execute("""UPDATE workflow_executions SET status = 'failed', error = '{"type": "E", "message": "m"}'"""
               " WHERE id = 'failed'")
    carried = {parse_result(payload)[0]: parse_result(payload)[1] for payload in result_channel()}
    read = {id_: db.execute("SELECT status, output::text, error::text FROM workflow_executions WHERE id = %s",
                            (id_,)).fetchone() for id_ in ids}  # as the engine reads jsonb: its text
    assert carried.pop("big") is None
    assert {id_: c.outcome for id_, c in carried.items() if c is not None} == {
        id_: read[id_] for id_ in ("ok", 'quote"and\nnewline', "none", "failed", "both")}
    assert carried["none"].outcome == ("succeeded", None, None)
    assert carried["failed"].outcome == ("failed", None, '{"type": "E", "message": "m"}')
    assert all(c.sent_after(looks[id_]) for id_, c in carried.items())  # each committed after its wait's look
    assert sorted(id_channel()) == ["both", "old"]
    assert db.execute("SELECT count(*) FROM awaited_executions").fetchone() == (0,)
    # Run again (as a resume does) and waited for anew: the first run's notification, were it to reach a
    # listener only now, is older than this wait's look, and its outcome is not taken.
    db.execute("UPDATE workflow_executions SET status = 'enqueued', output = NULL WHERE id = 'ok'")
    again = db.execute("SELECT seen::text FROM await_execution_v2('ok', true)").fetchone()[0]
    assert not carried["ok"].sent_after(again)


def test_a_registration_and_a_completion_in_flight_are_ordered(database_url: str, schema: str,
                                                               db: psycopg.Connection[Any],
                                                               done_channel: Callable[[], list[str]]) -> None:
    """Either the wait sees the finished status or the completion sees the registration: never neither."""
    db.execute("SELECT enqueue_workflow('nobody', '{}', 'q', 'first-completer')")
    db.execute("SELECT enqueue_workflow('nobody', '{}', 'q', 'first-waiter')")
    completer = psycopg.connect(database_url)
    waiter = psycopg.connect(database_url)
    try:
        for conn in (completer, waiter):
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            conn.commit()
        # The completion is in flight: the registration waits for it, then reads the finished status.
        finish(completer, "first-completer")
        seen: list[Any] = []
        looking = threading.Thread(target=lambda: seen.append(
            waiter.execute(_query("await_status"), {"id": "first-completer"}).fetchone()))
        looking.start()
        looking.join(0.5)
        assert looking.is_alive()  # blocked on the completion's registration lock
        completer.commit()
        looking.join(WAIT)
        waiter.commit()
        assert [row[:3] for row in seen] == [("succeeded", 1, None)]
        assert db.execute("SELECT count(*) FROM awaited_executions").fetchone() == (0,)
        # The registration is in flight: the completion waits for it, then sees it and notifies.
        assert waiter.execute(_query("await_status"), {"id": "first-waiter"}).fetchone()[0] == "enqueued"
        finishing = threading.Thread(target=lambda: (finish(completer, "first-waiter"), completer.commit()))
        finishing.start()
        finishing.join(0.5)
        assert finishing.is_alive()  # blocked on the registration's lock
        waiter.commit()
        finishing.join(WAIT)
        assert not finishing.is_alive()
        assert "first-waiter" in done_channel()
    finally:
        completer.close()
        waiter.close()


def test_a_claim_takes_work_whose_waiter_is_registering(database_url: str, schema: str,
                                                       db: psycopg.Connection[Any]) -> None:
    """A result wait registering an enqueued execution (app.enqueue(...) then result()) is still open; the
    claim that the enqueue's own wake-up caused must not pass over that row (the registration locks no row)."""
    db.execute("SELECT enqueue_workflow('flow', '{}', 'q', 'awaited-at-once')")
    waiter = psycopg.connect(database_url)
    try:
        waiter.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        waiter.commit()
        assert waiter.execute(_query("await_status"), {"id": "awaited-at-once"}).fetchone()[0] == "enqueued"
        # The registration is still open (its lock held) while the worker claims.
        claim = store.claims.claim(queue="q", names=["flow"], owner="w1", lease=60.0, limit=5, version="v1")
        claimed = store.run(db, claim)
        assert [c.id for c in claimed] == ["awaited-at-once"]
        waiter.commit()
    finally:
        waiter.close()
    assert db.execute("SELECT execution_id FROM awaited_executions").fetchall() == [("awaited-at-once",)]


@pytest.mark.parametrize("outcome", ["small", "toasted"])
def test_racing_registrations_and_completions_never_lose_a_wake_up(database_url: str, schema: str,
                                                                  db: psycopg.Connection[Any],
                                                                  done_channel: Callable[[], list[str]],
                                                                  outcome: str) -> None:
    """Registrations and completions (from enqueued and from running) sent at the same moment, many times:
    every wait either reads the finished status or is notified. A lost wake-up would leave a waiter asleep
    until its re-check. "toasted": each completion stores an outcome too long to keep in the row, so every
    completing UPDATE takes heap_update's path that marks the old row locked and lets go of its page while it
    stores the outcome out of line (the window in which PostgreSQL 15 loses a concurrent FOR KEY SHARE)."""
    n = 150
    # Random hex does not compress: 6,000 bytes are stored out of line.
    output = '"1"' if outcome == "small" else '"' + random.Random(7).randbytes(3000).hex() + '"'

    ids = [f"race-{i}" for i in range(n)]
    # The waiter starts up to 0.6 ms after the completer: sometimes before, sometimes during, sometimes after it.
    lags = [random.Random(i).uniform(0, 0.0006) for i in range(n)]
    for i, id_ in enumerate(ids):
        db.execute("SELECT enqueue_workflow('flow', '{}', 'q', %s)", (id_,))
        if i % 2:  # half finish from running (a claim first), half straight from enqueued
            db.execute("UPDATE workflow_executions SET status = 'running', owner_id = 'w', "
                       "lease_expires = now() + interval '1 hour' WHERE id = %s", (id_,))
    completer = psycopg.connect(database_url, autocommit=True)
    waiter = psycopg.connect(database_url, autocommit=True)
    seen: dict[str, str] = {}
    try:
        for conn in (completer, waiter):
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        start = threading.Barrier(2)

        def complete() -> None:
            for id_ in ids:
                start.wait(WAIT)
                completer.execute("UPDATE workflow_executions SET status = 'succeeded', output = %s::jsonb, "
                                  "owner_id = NULL, lease_expires = NULL WHERE id = %s", (output, id_))

        completing = threading.Thread(target=complete)
        completing.start()
        for id_, lag in zip(ids, lags, strict=True):
            start.wait(WAIT)
            time.sleep(lag)
            row = waiter.execute(_query("await_status"), {"id": id_}).fetchone()
            assert row is not None
            seen[id_] = row[0]
        completing.join(WAIT)
    finally:
        completer.close()
        waiter.close()
    unfinished = {id_ for id_, status in seen.items() if status != "succeeded"}
    notified: set[str] = set()
    deadline = time.monotonic() + WAIT
    while not unfinished <= notified and time.monotonic() < deadline:
        notified.update(done_channel())
    # A failure says which side lost the wake-up: a registration still there was made after the completion
    # looked (the SQL's ordering failed); none left means the completion deleted it, and its NOTIFY went missing.
    missed = sorted(unfinished - notified)
    left = db.execute("SELECT execution_id, carry_result FROM awaited_executions ORDER BY 1").fetchall()
    statuses = db.execute("SELECT id, status FROM workflow_executions WHERE id = ANY(%s) ORDER BY 1",
                          (missed,)).fetchall()
    assert not missed and not left, (f"{len(missed)} of {len(unfinished)} waits that saw their execution "
                                     f"unfinished were not notified: {statuses}; registrations left: {left}")


def test_a_wait_that_registers_between_a_completions_update_and_its_trigger_is_notified(
        database_url: str, schema: str, db: psycopg.Connection[Any], done_channel: Callable[[], list[str]]) -> None:
    """The narrowest window of the race above, held open on purpose: the completion has updated the row (the
    wait still reads it unfinished) but its trigger has not yet looked for registrations. The wait holds the
    registration lock of the id's bucket exclusively until it commits, so the trigger, which takes that lock
    shared, waits for the registration, then sees it and notifies."""
    db.execute("SELECT enqueue_workflow('flow', '{}', 'q', 'x')")
    # A trigger that fires after the update and before the engine's (triggers fire in name order), and holds
    # the completion there until the test lets go of an advisory lock.
    db.execute("CREATE FUNCTION hold_completion() RETURNS trigger LANGUAGE plpgsql AS "
               "$$ BEGIN PERFORM pg_advisory_xact_lock(7001); RETURN NULL; END $$")
    db.execute("CREATE TRIGGER workflow_executions_a_hold AFTER UPDATE OF status ON workflow_executions "
               "FOR EACH ROW WHEN (NEW.status = 'succeeded') EXECUTE FUNCTION hold_completion()")
    completer = psycopg.connect(database_url, autocommit=True)
    waiter = psycopg.connect(database_url, autocommit=True)
    try:
        for conn in (completer, waiter):
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        completer_pid = completer.info.backend_pid
        db.execute("SELECT pg_advisory_lock(7001)")
        completing = threading.Thread(target=lambda: completer.execute(
            "UPDATE workflow_executions SET status = 'succeeded', output = '1' WHERE id = 'x'"))
        completing.start()

        def completer_waits_for(objsubid: int) -> bool:
            # The test's hold is a one-key advisory lock (objsubid 1); the registration lock has two keys (2).
            row = db.execute("SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted AND locktype = 'advisory'"
                             " AND objsubid = %s", (completer_pid, objsubid)).fetchone()
            return row == (1,)

        wait_for(lambda: completer_waits_for(1), WAIT, "the completion to stop inside its update")
        with waiter.transaction():  # the registration stays uncommitted while the completion goes on
            row = waiter.execute(_query("await_status"), {"id": "x"}).fetchone()
            assert row is not None and row[0] == "enqueued"  # the update is not committed: unfinished
            db.execute("SELECT pg_advisory_unlock(7001)")
            # The engine's trigger now takes the registration lock (shared): it waits for this registration.
            wait_for(lambda: completer_waits_for(2), WAIT, "the completion's trigger to wait for the registration")
        completing.join(WAIT)
        assert not completing.is_alive()
    finally:
        completer.close()
        waiter.close()
    wait_for(lambda: "x" in done_channel(), WAIT, "the completion to notify the registered wait")
    assert db.execute("SELECT count(*) FROM awaited_executions").fetchone() == (0,)


def test_one_statement_finishes_more_executions_than_the_lock_table_holds(db: psycopg.Connection[Any],
                                                                          done_channel: Callable[[], list[str]]
                                                                          ) -> None:
    """A completion takes the registration lock of its id's bucket (1,024 of them), not of its id: a bulk
    cancel of 20,000 executions, well past what the lock table of a default server holds (64 locks per
    connection), holds at most 1,024 locks and succeeds; a wait registered on one of them is notified."""
    db.execute("SELECT enqueue_workflow('flow', '{}', 'q', 'bulk-' || g) FROM generate_series(1, 20000) AS g")
    assert db.execute(_query("await_status"), {"id": "bulk-7"}).fetchone()[0] == "enqueued"
    updated = db.execute("UPDATE workflow_executions SET status = 'cancelled', completed_at = now() "
                         "WHERE status = 'enqueued'").rowcount
    assert updated == 20000
    wait_for(lambda: "bulk-7" in done_channel(), WAIT, "the bulk completion to notify the registered wait")
    assert db.execute("SELECT count(*) FROM awaited_executions").fetchone() == (0,)


def wait_registered(app: pgdurable.App, count: int, what: str) -> None:
    """Wait until ``count`` executions are registered as awaited (the waits are asleep or about to be)."""
    with psycopg.connect(app.database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(app.schema)))
        wait_for(lambda: conn.execute("SELECT count(*) FROM awaited_executions").fetchone() == (count,), WAIT, what)


def test_a_result_wait_is_woken_by_the_completion(make_app: Callable[..., pgdurable.App],
                                                  start_worker: Callable[..., ThreadWorker],
                                                  done_channel: Callable[[], list[str]]) -> None:
    app = make_app()
    release = threading.Event()

    @app.workflow(name="slow")
    def slow() -> str:
        release.wait(WAIT)
        return "done"

    @app.workflow(name="quick")
    def quick() -> str:
        return "done"

    start_worker(app, concurrency=4)
    unawaited = app.enqueue(quick)
    wait_for(lambda: getattr(app.get(unawaited.workflow_id), "status", None) == "succeeded", WAIT,
             "the unawaited execution to finish")
    handle = app.enqueue(slow)
    waiting = threading.Thread(target=lambda: handle.result(timeout=WAIT))
    waiting.start()
    wait_registered(app, 1, "the wait to register")
    release.set()
    waiting.join(WAIT)
    assert not waiting.is_alive()
    assert done_channel() == [handle.workflow_id]  # the awaited one notified; the unawaited one did not


def test_a_stream_reader_is_woken_when_its_workflow_ends_without_closing_the_stream(
        make_app: Callable[..., pgdurable.App], start_worker: Callable[..., ThreadWorker],
        done_channel: Callable[[], list[str]]) -> None:
    app = make_app()
    release = threading.Event()

    @app.workflow(name="open_stream")
    def open_stream() -> None:
        pgdurable.write_stream("out", 1)
        release.wait(WAIT)  # ends without close_stream

    start_worker(app, concurrency=2)
    handle = app.enqueue(open_stream)
    read: list[Any] = []
    reader = threading.Thread(target=lambda: read.extend(app.read_stream(handle.workflow_id, "out")))
    reader.start()
    wait_registered(app, 1, "the reader to register the execution")
    release.set()
    reader.join(WAIT)
    assert not reader.is_alive() and read == [1]
    assert handle.workflow_id in done_channel()  # the end of the workflow woke the reader


def test_result_waits_get_every_kind_of_outcome_from_a_worker(make_app: Callable[..., pgdurable.App],
                                                              start_worker: Callable[..., ThreadWorker]) -> None:
    """Outcomes handed over in the notification (small ones, None, failures) and one too long for it (read
    after the notification), to sync and async waits started before the workflows finish."""
    app = make_app()
    release = threading.Event()

    @app.workflow(name="answer")
    def answer(kind: str) -> Any:
        release.wait(WAIT)
        if kind == "fail":
            raise ValueError("no ünïcode luck")
        return {"small": {"n": [1, 2.5, "x\ny"]}, "none": None, "big": "é" * 6000}[kind]

    start_worker(app, concurrency=8)
    kinds = ["small", "none", "big", "fail"]
    handles = {kind: app.enqueue(answer, kind) for kind in kinds}
    seen: dict[str, Any] = {}

    def wait(kind: str) -> None:
        try:
            seen[kind] = handles[kind].result(timeout=WAIT)
        except pgdurable.WorkflowFailed as failed:
            seen[kind] = failed

    async def wait_async(kind: str) -> Any:
        try:
            return await handles[kind].result_async(timeout=WAIT)
        except pgdurable.WorkflowFailed as failed:
            return failed

    waiting = [threading.Thread(target=wait, args=(kind,)) for kind in kinds]
    for thread in waiting:
        thread.start()
    seen_async: list[Any] = []
    waiting_async = threading.Thread(target=lambda: seen_async.extend(asyncio.run(_gather(wait_async, kinds))))
    waiting_async.start()
    wait_registered(app, 4, "the waits to register")
    release.set()
    for thread in [*waiting, waiting_async]:
        thread.join(WAIT)
        assert not thread.is_alive()
    for outcomes in (seen, dict(zip(kinds, seen_async, strict=True))):
        assert outcomes["small"] == {"n": [1, 2.5, "x\ny"]}
        assert outcomes["none"] is None
        assert outcomes["big"] == "é" * 6000
        assert isinstance(outcomes["fail"], pgdurable.WorkflowFailed)
        assert "no ünïcode luck" in str(outcomes["fail"])


async def _gather(wait: Callable[[str], Any], kinds: list[str]) -> list[Any]:
    return list(await asyncio.gather(*(wait(kind) for kind in kinds)))
