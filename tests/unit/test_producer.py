"""The producer's claim loop (worker/producer.py) against a fake executor and a scripted database: which
statements it sends, in which order, and when it may wait."""

from __future__ import annotations

import asyncio
from typing import Any

from pgdurable import store
from pgdurable.config import Settings
from pgdurable.worker.producer import Producer


class FakeExecutor:
    """One workflow stays running throughout (the worker is busy), so the debouncer applies to claims."""

    concurrency = 64
    observers = None

    def __init__(self) -> None:
        self.running: dict[str, Any] = {"busy": object()}
        self.reserved = 0
        self.launched: list[str] = []

    def free(self) -> int:
        return self.concurrency - len(self.running) - self.reserved

    def count(self, queue: str) -> int:
        return 0

    async def launch(self, claimed: list[store.claims.Claimed], queue: str, run: Any) -> bool:
        self.launched += [c.id for c in claimed]
        return True


async def _claims_after_arming(claims: list[list[str]], ring_while_arming: bool = False,
                               gap_delay: float | None = None, free_a_slot_after: float | None = None,
                               idle_delay: float | None = None, seen: list[Producer] | None = None,
                               close_after: float | None = None, ring_after: float | None = None,
                               ) -> tuple[list[str], list[str]]:
    """Runs a producer whose claims return ``claims`` in turn, until it has sent every scripted claim; returns
    the names of the statements sent ("claim+arm" for a claim asked to arm the doorbell if it finds nothing)
    and the executions launched."""
    sent: list[str] = []
    executor = FakeExecutor()
    stopping = asyncio.Event()
    done = asyncio.Event()
    script = list(claims)

    async def run(call: store.Call[Any]) -> Any:
        arming = call.name == "claim" and call.params["arm"]
        sent.append("claim+arm" if arming else call.name)
        if arming and ring_while_arming and sent.count("claim+arm") == 1:
            producer.rung()  # an enqueue rang the bell, and its NOTIFY arrived before the statement returned
        if arming and ring_after is not None and sent.count("claim+arm") == 1:
            asyncio.get_running_loop().call_later(ring_after, producer.rung)  # a ring once the bell is armed
        if call.name == "claim":
            if free_a_slot_after is not None and len(script) == len(claims):
                asyncio.get_running_loop().call_later(free_a_slot_after, producer.slot_freed)
            ids = script.pop(0)
            if not script:
                done.set()
            return [store.claims.Claimed(id=i, name="w", attempt=1, input="{}") for i in ids]
        return None

    producer = Producer("q", worker_id="w1", names=["w"], version="v", settings=Settings(poll_seconds=3600),
                        executor=executor, policies=dict, run=run,  # type: ignore[arg-type]
                        stopping=stopping)
    # A debouncer of an hour: any claim it delays would never come within the test's deadline.
    producer.debouncer.interval = 3600.0
    if gap_delay is not None:
        producer.COALESCE_SECONDS = gap_delay
    if close_after is not None:
        producer.GAP_SECONDS = close_after
    producer.idle.delay = idle_delay
    if seen is not None:
        seen.append(producer)
    task = asyncio.create_task(producer.run())
    try:
        await asyncio.wait_for(done.wait(), timeout=60)
    finally:
        stopping.set()
        producer.wake()
        task.cancel()
    return sent, executor.launched


def test_the_claim_that_closes_the_doorbells_gap_is_not_debounced() -> None:
    """A claim that finds nothing arms the doorbell in the same statement, and the producer claims once more
    (GAP_SECONDS later): an enqueue that committed while the bell was being armed rang nothing, and must not
    wait out the debouncer (which spaces claims while the worker is busy). A claim that found work leaves the
    bell alone: the next one, after that work started, asks again."""
    sent, launched = asyncio.run(_claims_after_arming([["a"], [], []]))
    assert sent == ["claim+arm", "claim+arm", "claim"]
    assert launched == ["a"]


def test_work_found_by_the_gap_closing_claim_is_launched() -> None:
    sent, launched = asyncio.run(_claims_after_arming([[], ["b"]]))
    assert sent == ["claim+arm", "claim"]
    assert launched == ["b"]


def test_a_ring_heard_before_the_arming_claim_returns_is_not_forgotten() -> None:
    """The NOTIFY of an enqueue that rang the bell just armed can be handled before the arming claim returns:
    the producer must then know its bell is no longer armed, and arm it again before sleeping (else nobody
    could wake it: each enqueue would wait for the idle re-check)."""
    sent, launched = asyncio.run(_claims_after_arming([[], [], []], ring_while_arming=True))
    assert sent[:3] == ["claim+arm", "claim+arm", "claim"]
    assert launched == []


def test_a_full_batch_leaves_the_doorbell_unarmed_and_the_producer_knows_it() -> None:
    """A claim asked to arm arms only if it finds nothing: after a full batch the producer claims again,
    still asking to arm, and closes the gap once the queue runs dry."""
    full = [f"x{i}" for i in range(FakeExecutor.concurrency - 1)]  # one slot is busy throughout
    sent, launched = asyncio.run(_claims_after_arming([full, [], []]))
    assert sent == ["claim+arm", "claim+arm", "claim"]
    assert launched == full


def test_after_handing_out_work_the_gap_closing_claim_waits_for_a_freed_slot() -> None:
    """When a claim found work, the next claim (which arms the bell if it finds nothing) does not compete with
    that work's first statements: it comes a moment later, or as soon as a slot is freed (here the moment is
    an hour long)."""
    sent, launched = asyncio.run(_claims_after_arming([["a"], [], []], gap_delay=3600.0,
                                                      free_a_slot_after=0.05))
    assert sent == ["claim+arm", "claim+arm", "claim"]
    assert launched == ["a"]


def test_the_idle_recheck_starts_short_again_after_work() -> None:
    """Asleep with its bell armed, the producer re-claims on a backoff that doubles while the queue stays
    empty. After work was found it must start again from its first delay: else an enqueue that escaped the
    bell (see the producer's docstring) would wait out the grown delay, up to a whole poll interval."""
    seen: list[Producer] = []
    asyncio.run(_claims_after_arming([["a"], [], []], idle_delay=1.6, seen=seen))
    [producer] = seen
    assert producer.idle.delay == Producer.IDLE_RECHECK_SECONDS


def test_the_gap_closing_claim_comes_a_moment_after_the_arming_or_at_once_on_a_ring() -> None:
    """After the bell is armed, the claim that closes the gap waits GAP_SECONDS, so that an enqueue racing the
    arming has committed when it looks; a ring (an enqueue that saw the bell armed) sends it at once. Here
    the moment is an hour long: only the ring can bring the closing claim within the test's deadline."""
    sent, launched = asyncio.run(_claims_after_arming([[], ["b"]], close_after=3600.0, ring_after=0.05))
    assert sent == ["claim+arm", "claim+arm"]  # the ring disarmed the bell: the next claim arms again
    assert launched == ["b"]
