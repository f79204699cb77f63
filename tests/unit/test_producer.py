"""The producer's claim loop (worker/producer.py) against a fake executor and a scripted database: which
statements it sends, in which order, and when it may wait."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from pgdurable import store
from pgdurable.config import Settings
from pgdurable.worker.producer import HotQueue, Producer


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

    def busy(self) -> bool:
        return bool(self.running)

    def count(self, queue: str) -> int:
        return 0

    async def launch(self, claimed: list[store.claims.Claimed], queue: str, run: Any) -> bool:
        self.launched += [c.id for c in claimed]
        return True


async def _claims_after_arming(claims: list[list[str]], ring_while_arming: bool = False,
                               gap_delay: float | None = None, free_a_slot_after: float | None = None,
                               idle_delay: float | None = None, seen: list[Producer] | None = None,
                               close_after: float | None = None, ring_after: float | None = None,
                               after_claim: Callable[[int, Producer], None] | None = None,
                               stop_after: float | None = None, debounce: float = 3600.0,
                               quiet: float | None = None) -> tuple[list[str], list[str]]:
    """Runs a producer whose claims return ``claims`` in turn, until it has sent every scripted claim; returns
    the names of the statements sent ("claim+arm" for a claim asked to arm the doorbell if it finds nothing)
    and the executions launched. ``after_claim(i, producer)`` is called on the loop once the producer has
    handled the i-th claim's result. With ``stop_after``, the run also ends that many seconds after the last
    claim but one returned (to show that the producer sends no more). ``debounce``: the debouncer's interval,
    by default an hour (any claim it delays would never come within the test's deadline). ``quiet``: how long
a hot queue must stay empty before the producer arms its bell again (HotQueue.QUIET_SECONDS)."""
    sent: list[str] = []
    executor = FakeExecutor()
    stopping = asyncio.Event()
    done = asyncio.Event()
    script = list(claims)

    async def run(call: store.Call[Any]) -> Any:
        await asyncio.sleep(0)  # what after_claim scheduled for the previous claim runs before this one
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
            if after_claim is not None:
                asyncio.get_running_loop().call_soon(after_claim, len(claims) - len(script) - 1, producer)
            if not script:
                done.set()
            elif stop_after is not None and len(script) == 1:
                asyncio.get_running_loop().call_later(stop_after, done.set)
            return [store.claims.Claimed(id=i, name="w", attempt=1, input="{}") for i in ids]
        return None

    producer = Producer("q", worker_id="w1", names=["w"], version="v", settings=Settings(poll_seconds=3600),
                        executor=executor, policies=dict, run=run,  # type: ignore[arg-type]
                        stopping=stopping)
    producer.debouncer.interval = debounce
    if gap_delay is not None:
        producer.COALESCE_SECONDS = gap_delay
    if close_after is not None:
        producer.GAP_SECONDS = close_after
    producer.idle.delay = idle_delay
    if quiet is not None:
        producer.hot.QUIET_SECONDS = quiet
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
    wait out the debouncer (which spaces claims while the worker is busy; an hour here)."""
    sent, launched = asyncio.run(_claims_after_arming([[], []]))
    assert sent == ["claim+arm", "claim"]
    assert launched == []


def test_after_a_claim_that_found_work_the_next_one_asks_to_arm_again() -> None:
    """A claim that found work leaves the bell alone: the next one (debounced like any busy producer's claim,
    a moment here) asks to arm again, and closes the gap once it armed."""
    sent, launched = asyncio.run(_claims_after_arming([["a"], [], []], debounce=0.01))
    assert sent == ["claim+arm", "claim+arm", "claim"]
    assert launched == ["a"]


def test_a_busy_producer_that_found_work_claims_again_only_when_the_debouncer_lets_it() -> None:
    """No bell is armed after a claim that found work, so nothing needs the next claim soon: while that work
    runs, a freed slot brings it only once the debouncer allows (an hour here), as for any busy producer.
    Sent at once on every freed slot, those claims took 2.2 executions each against about 5 beside one client
    enqueuing in a loop, and cost that client 8% of its workflows/s (docs/benchmarks.md)."""
    sent, launched = asyncio.run(_claims_after_arming([["a"], ["b"]], free_a_slot_after=0.05, stop_after=1.0))
    assert sent == ["claim+arm"]
    assert launched == ["a"]


def test_a_producer_whose_work_ended_claims_again_at_once() -> None:
    """Once the work it found has ended (the worker is idle), the slot it frees brings the next claim at
    once: the debouncer spaces only a busy worker's claims."""
    def work_ends(i: int, producer: Producer) -> None:
        if i == 0:
            producer.executor.running.clear()  # type: ignore[attr-defined]
            producer.slot_freed()

    sent, launched = asyncio.run(_claims_after_arming([["a"], ["b"]], gap_delay=3600.0, after_claim=work_ends))
    assert sent == ["claim+arm", "claim+arm"]
    assert launched == ["a", "b"]


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


def test_after_handing_out_work_the_next_claim_waits_for_a_freed_slot() -> None:
    """When a claim found work, the next claim (which arms the bell if it finds nothing) does not compete with
    that work's first statements: it comes a moment later, or as soon as a slot is freed (here the moment is
    an hour long, the debouncer's interval a moment)."""
    sent, launched = asyncio.run(_claims_after_arming([["a"], [], []], gap_delay=3600.0,
                                                      free_a_slot_after=0.05, debounce=0.01))
    assert sent == ["claim+arm", "claim+arm", "claim"]
    assert launched == ["a"]


def test_the_idle_recheck_starts_short_again_after_work() -> None:
    """Asleep with its bell armed, the producer re-claims on a backoff that doubles while the queue stays
    empty. After work was found it must start again from its first delay: else an enqueue that escaped the
    bell (see the producer's docstring) would wait out the grown delay, up to a whole poll interval."""
    seen: list[Producer] = []
    asyncio.run(_claims_after_arming([["a"], [], []], idle_delay=1.6, seen=seen, debounce=0.01))
    [producer] = seen
    assert producer.idle.delay == Producer.IDLE_RECHECK_SECONDS


def test_the_gap_closing_claim_comes_a_moment_after_the_arming_or_at_once_on_a_ring() -> None:
    """After the bell is armed, the claim that closes the gap waits GAP_SECONDS, so that an enqueue racing the
    arming has committed when it looks; a ring (an enqueue that saw the bell armed) sends it at once. Here
    the moment is an hour long: only the ring can bring the closing claim within the test's deadline."""
    sent, launched = asyncio.run(_claims_after_arming([[], ["b"]], close_after=3600.0, ring_after=0.05))
    assert sent == ["claim+arm", "claim+arm"]  # the ring disarmed the bell: the next claim arms again
    assert launched == ["b"]


def _completion_arms(producer: Producer, gap: float | None = None, idle: bool = False) -> None:
    """What the executor does as it completes the producer's last running execution: ask, write (here at
    once: the completion committed, arming the bell), tell, and free the slot (with ``idle``, the worker
    then runs nothing more)."""
    if gap is not None:
        producer.GAP_SECONDS = gap
    written = producer.arm_with_completion()
    assert written is not None
    written(True)
    if idle:
        producer.executor.running.clear()  # type: ignore[attr-defined]
    producer.slot_freed()


def test_the_completion_of_the_last_execution_arms_the_bell_and_one_claim_closes_the_gap() -> None:
    """Once the queue ran dry, the completion of the worker's last execution of it arms the bell in its own
    transaction (so that whoever hears of the result and enqueues again rings it). The slot it frees sends no
    claim at once: one claim, GAP_SECONDS later, closes the gap (an enqueue in flight as the completion
    committed may have looked at the bell before), need not arm, and is not debounced (an hour here) although
    other work still runs; finding nothing leaves the producer asleep."""
    seen: list[Producer] = []
    sent, launched = asyncio.run(_claims_after_arming(
        [["a"], [], []], gap_delay=3600.0, idle_delay=3600.0, seen=seen, stop_after=2.0,
        after_claim=lambda i, producer: _completion_arms(producer) if i == 0 else None))
    assert sent == ["claim+arm", "claim"]
    assert launched == ["a"]
    assert seen[0].armed and not seen[0].gap_open


def test_a_ring_sends_the_gap_closing_claim_at_once() -> None:
    """The ring disarmed the bell: the claim it brings (at once, not GAP_SECONDS later) arms it again."""
    def complete_then_ring(i: int, producer: Producer) -> None:
        if i == 0:
            _completion_arms(producer, gap=3600.0, idle=True)
            asyncio.get_running_loop().call_later(0.05, producer.rung)

    sent, launched = asyncio.run(_claims_after_arming([["a"], ["b"]], gap_delay=3600.0,
                                                      after_claim=complete_then_ring))
    assert sent == ["claim+arm", "claim+arm"]
    assert launched == ["a", "b"]


def test_a_completion_arms_the_bell_only_once_the_queue_ran_dry() -> None:
    """Even when the producer believes its bell armed: an enqueue may have rung (disarmed) it and been claimed
    before its NOTIFY arrived (then that execution's completion must arm the bell again)."""
    answers: list[bool] = []
    full = [f"x{i}" for i in range(FakeExecutor.concurrency - 1)]
    asyncio.run(_claims_after_arming([full, ["a"], [], []], gap_delay=0.01, debounce=0.01,
                                     after_claim=lambda i, p: answers.append(p.arm_with_completion() is not None)))
    # after a full batch more may wait; after a short one, or once the claims armed the bell, yes
    assert answers == [False, True, True, True]


def test_a_claim_or_a_ring_while_a_completion_arms_decides_the_mark() -> None:
    """A claim sent after the completion decided to arm, and before it committed, arms the bell itself if it
    finds nothing; a ring heard meanwhile disarmed the bell again. Either way the completion's word is not
    the last: marked armed after the ring, the producer would sleep with a bell nobody can ring."""
    pending: list[Any] = []
    marks: list[bool] = []

    def claim_meanwhile(i: int, producer: Producer) -> None:
        if i == 0:
            pending.append(producer.arm_with_completion())
            producer.slot_freed()  # the next claim (which finds work) goes out before the completion commits
        elif i == 1:
            pending[0](True)
            marks.append(producer.armed)

    sent, launched = asyncio.run(_claims_after_arming([["a"], ["b"], [], []], gap_delay=0.01, debounce=0.01,
                                                      after_claim=claim_meanwhile))
    assert sent[:3] == ["claim+arm", "claim+arm", "claim+arm"]
    assert launched == ["a", "b"] and marks == [False]

    def ring_meanwhile(i: int, producer: Producer) -> None:
        if i == 0:
            written = producer.arm_with_completion()
            assert written is not None
            producer.rung()
            written(True)
            marks.append(producer.armed)

    sent, launched = asyncio.run(_claims_after_arming([["a"], [], []], gap_delay=3600.0, debounce=0.01,
                                                      after_claim=ring_meanwhile))
    assert sent == ["claim+arm", "claim+arm", "claim"]
    assert marks == [False, False]


def test_a_ring_whose_claim_finds_more_than_one_execution_makes_the_producer_poll_instead_of_arming() -> None:
    """Others were enqueued while the ring's wake-up took: enqueues come faster than the worker wakes, and a
    bell armed again would be rung by the very next one. The producer claims as a busy one does (a moment
    apart here), asking to arm nothing, for as long as the queue has not stayed quiet (an hour here); no
    completion arms the bell meanwhile either."""
    completion_arms: list[bool] = []

    def after(i: int, producer: Producer) -> None:
        if i >= 1:
            completion_arms.append(producer.arm_with_completion() is not None)

    sent, launched = asyncio.run(_claims_after_arming(
        [[], ["a", "b"], ["c"], [], []], ring_after=0.0, close_after=3600.0, gap_delay=0.001, debounce=0.001,
        quiet=3600.0, after_claim=after))
    assert sent == ["claim+arm", "claim+arm", "claim", "claim", "claim"]
    assert launched == ["a", "b", "c"]
    assert completion_arms == [False, False, False, False]


def test_a_hot_queue_that_stayed_quiet_gets_its_bell_armed_again() -> None:
    """Once claims have found nothing for HotQueue.QUIET_SECONDS (at once here), the producer arms its bell and
    closes the gap as after any arming, and sleeps until the next ring."""
    sent, launched = asyncio.run(_claims_after_arming(
        [[], ["a", "b"], [], [], []], ring_after=0.0, close_after=0.001, gap_delay=0.001, debounce=0.001,
        quiet=0.0))
    assert sent == ["claim+arm", "claim+arm", "claim", "claim", "arm_doorbell", "claim"]
    assert launched == ["a", "b"]


def test_a_ring_that_brings_one_execution_keeps_the_bell() -> None:
    """One client enqueuing after each result, or enqueues paced apart, bring one execution a ring: the next
    claim asks to arm again, as before any ring."""
    sent, launched = asyncio.run(_claims_after_arming(
        [[], ["a"], [], []], ring_after=0.0, close_after=0.001, gap_delay=0.001, debounce=0.001, quiet=3600.0))
    assert sent == ["claim+arm", "claim+arm", "claim+arm", "claim"]
    assert launched == ["a"]


def test_a_hot_queue_is_set_by_a_busy_ring_and_ended_by_quiet() -> None:
    hot = HotQueue()
    hot.claimed(5, after_ring=False, now=0.0)
    assert not hot.polling  # work found without a ring: a busy producer, bell or not
    hot.claimed(1, after_ring=True, now=0.0)
    assert not hot.polling  # the ring's own execution only
    hot.claimed(2, after_ring=True, now=0.0)
    assert hot.polling
    hot.claimed(0, after_ring=False, now=1.0)
    hot.claimed(0, after_ring=False, now=1.0 + HotQueue.QUIET_SECONDS / 2)
    hot.claimed(3, after_ring=False, now=1.0 + HotQueue.QUIET_SECONDS)  # work again: the quiet starts over
    hot.claimed(0, after_ring=False, now=2.0)
    assert hot.polling
    hot.claimed(0, after_ring=False, now=2.0 + HotQueue.QUIET_SECONDS)
    assert not hot.polling
