"""Crashes in the middle of waits: real worker processes are SIGKILLed at random while workflows sleep,
receive messages, start and await children and publish events. Nothing is lost, no effect is applied
twice, every message is received exactly once, and each wait resumes on another worker."""

from __future__ import annotations

import random
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from psycopg import sql

import pgdurable
from tests.apps import waiting
from tests.harness import WAIT, WorkerHarness, wait_for


@pytest.fixture
def harness(database_url: str, schema: str, spawn_worker: Callable[..., Any], tmp_path: Path,
            make_app: Callable[..., pgdurable.App]) -> Iterator[WorkerHarness]:
    effects_schema = f"w_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(database_url, autocommit=True) as db:
        waiting.create(db, effects_schema)
        client = make_app(app_version="waiting-test")
        wf = SimpleNamespace(**dict(zip(("napper", "listener", "kid", "family", "limited_job"),
                                        waiting.define(client), strict=True)))
        client.migrate()
        db.execute(sql.SQL("SET search_path = {}, {}").format(sql.Identifier(schema),
                                                              sql.Identifier(effects_schema)))
        h = WorkerHarness(spawn_worker, "tests.apps.waiting:app", tmp_path, db, client, wf)
        h.env = {"WAITING_SCHEMA": effects_schema}  # type: ignore[attr-defined]
        try:
            yield h
        finally:
            db.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(effects_schema)))


def test_sigkill_during_sleeps_receives_and_child_waits_loses_and_duplicates_nothing(
        harness: WorkerHarness) -> None:
    h, wf, client = harness, harness.wf, harness.client
    env = h.env  # type: ignore[attr-defined]
    slots = [h.start(("-c", "8"), env, wait=True) for _ in range(2)]
    rounds = 20
    handles = {}
    for n in range(rounds):
        handles[f"nap-{n}"] = client.enqueue(wf.napper, n, workflow_id=f"nap-{n}")
        handles[f"listen-{n}"] = client.enqueue(wf.listener, n, workflow_id=f"listen-{n}")
        handles[f"family-{n}"] = client.enqueue(wf.family, n, workflow_id=f"family-{n}")

    stop = threading.Event()

    def send_messages() -> None:  # messages trickle in while workers die
        for k in range(2):
            for n in range(rounds):
                if stop.is_set():
                    return
                client.send(f"listen-{n}", f"m{k}", topic="in", idempotency_key=f"{n}-{k}")
                time.sleep(random.uniform(0.05, 0.25))

    sender = threading.Thread(target=send_messages)
    sender.start()
    kills, rng = 0, random.Random(7)
    deadline = time.monotonic() + 6.0
    while time.monotonic() < deadline:
        time.sleep(rng.uniform(0.3, 0.7))
        victim = rng.randrange(len(slots))
        slots[victim].send_signal(signal.SIGKILL)
        slots[victim].wait()
        kills += 1
        slots[victim] = h.start(("-c", "8"), env, wait=False)
    stop.set()
    sender.join()
    for n in range(rounds):  # resend everything: idempotency keys make the repeats no-ops
        for k in range(2):
            client.send(f"listen-{n}", f"m{k}", topic="in", idempotency_key=f"{n}-{k}")

    for n in range(rounds):
        assert handles[f"nap-{n}"].result(timeout=WAIT) == [f"before-{n}", *(f"after-{n}-{i}" for i in range(3))]
        assert handles[f"listen-{n}"].result(timeout=WAIT) == ["m0", "m1"]
        assert handles[f"family-{n}"].result(timeout=WAIT) == [n * 10, n * 10 + 1, n * 10 + 2]
        assert client.get_event(f"listen-{n}", "heard") == ["m0", "m1"]
    effects = h.rows("SELECT label, count(*) FROM effects WHERE label NOT LIKE 'limited-%%' GROUP BY label")
    counts = dict(effects)
    expected = {f"{kind}-{n}" for n in range(rounds) for kind in ("before", "heard", "family")}
    expected |= {f"after-{n}-{i}" for n in range(rounds) for i in range(3)}
    expected |= {f"kid-{n}-{i}" for n in range(rounds) for i in range(3)}
    assert set(counts) == expected
    assert [label for label, count in counts.items() if count != 1] == []  # exactly once, despite the kills
    consumed = h.rows("SELECT destination_id, count(*) FILTER (WHERE consumed_at IS NOT NULL), count(*) "
                      "FROM workflow_messages GROUP BY destination_id")
    assert all(c == 2 and total == 2 for _, c, total in consumed) and len(consumed) == rounds
    assert h.scalar("SELECT count(*) FROM workflow_executions WHERE status <> 'succeeded'") == 0
    recovered = h.scalar("SELECT count(*) FROM workflow_executions WHERE recoveries > 0")
    print(f"{kills} SIGKILLs; {recovered} executions recovered from a dead worker; "
          f"{h.scalar('SELECT count(*) FROM workflow_executions')} executions in all")
    assert kills >= 5


def test_a_killed_worker_holding_global_slots_gives_them_back(harness: WorkerHarness) -> None:
    h, wf, client = harness, harness.wf, harness.client
    env = h.env  # type: ignore[attr-defined]
    workers = [h.start(("-c", "4", "--queue", "limited"), env, wait=True) for _ in range(2)]
    handles = [client.enqueue(wf.limited_job, n) for n in range(12)]
    # Kill a worker that holds a slot (owner ids are host:pid:nonce).
    owner = wait_for(lambda: h.scalar("SELECT owner_id FROM workflow_executions WHERE queue = 'limited' "
                                      "AND status = 'running' LIMIT 1"), WAIT, "a limited job to be running")
    victim = next(w for w in workers if w.pid == int(owner.split(":")[1]))
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert [x.result(timeout=WAIT) for x in handles] == [f"limited-{n}" for n in range(12)]
    rows = h.rows("SELECT label, started, finished FROM effects WHERE label LIKE 'limited-%%' ORDER BY started")
    assert sorted(r[0] for r in rows) == sorted(f"limited-{n}" for n in range(12))  # each once (kill rolled back)
    events = sorted([(r[1], 1) for r in rows] + [(r[2], -1) for r in rows])
    running = peak = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    assert peak <= 2  # never more than the limit, also while the dead worker's slot was held
    assert h.scalar("SELECT count(*) FROM workflow_executions WHERE queue = 'limited' AND recoveries > 0") >= 1
