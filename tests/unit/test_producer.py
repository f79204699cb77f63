"""The producer's claim loop (worker/producer.py) against a fake executor and a scripted database: which
statements it sends, in which order, and when it may wait."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
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


async def _claims_after_arming(claims: list[list[str]], gap_delay: float | None = None,
                               free_a_slot_after: float | None = None, idle_delay: float | None = None,
                               seen: list[Producer] | None = None, close_after: float | None = None,
                               ring_after: float | None = None,
                               after_claim: Callable[[int, Producer, list[bool]], None] | None = None,
                               stop_after: float | None = None) -> tuple[list[str], list[str]]:
    """Runs a producer whose claims return ``claims`` in turn, until it has sent every scripted claim; returns
    the names of the statements sent and the executions launched. The database's doorbell is modelled: a
    claim asked to keep it in step is named "claim+arm" when it armed it (found nothing, was not armed),
    "claim+disarm" when it disarmed it (found work, was armed), else "claim". ``after_claim(i, producer,
    bell)`` is called on the loop just after the i-th claim returned (``bell[0]``: the modelled bell). With
    ``stop_after``, the run also ends that many seconds after the last claim but one returned (to show that
    the producer sends no more)."""
    sent: list[str] = []
    executor = FakeExecutor()
    stopping = asyncio.Event()
    done = asyncio.Event()
    script = list(claims)
    bell = [False]

    async def run(call: store.Call[Any]) -> Any:
        await asyncio.sleep(0)  # what after_claim scheduled for the previous claim runs before this one
        if call.name != "claim":
            sent.append(call.name)
            return None
        if free_a_slot_after is not None and len(script) == len(claims):
            asyncio.get_running_loop().call_later(free_a_slot_after, producer.slot_freed)
        ids = script.pop(0)
        name = "claim"
        if call.params["bell"] and bell[0] == bool(ids):
            bell[0] = not ids
            name = "claim+arm" if bell[0] else "claim+disarm"
        sent.append(name)
        if name == "claim+arm" and ring_after is not None and sent.count("claim+arm") == 1:
            asyncio.get_running_loop().call_later(ring_after, producer.rung)  # a ring once the bell is armed
        if after_claim is not None:
            asyncio.get_running_loop().call_soon(after_claim, len(sent) - 1, producer, bell)
        if not script:
            done.set()
        elif stop_after is not None and len(script) == 1:
            asyncio.get_running_loop().call_later(stop_after, done.set)
        return [store.claims.Claimed(id=i, name="w", attempt=1, input="{}") for i in ids]

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
    assert producer.armed == bell[0]  # the producer's mark follows the bell
    return sent, executor.launched


def test_the_claim_that_closes_the_doorbells_gap_is_not_debounced() -> None:
    """A claim that finds nothing arms the doorbell in the same statement, and the producer claims once more
    (GAP_SECONDS later): an enqueue that committed while the bell was being armed rang nothing, and must not
    wait out the debouncer (which spaces claims while the worker is busy). A claim that found work leaves the
    bell unarmed: the next one, after that work started, arms it if it finds nothing."""
    sent, launched = asyncio.run(_claims_after_arming([["a"], [], []]))
    assert sent == ["claim", "claim+arm", "claim"]
    assert launched == ["a"]


def test_work_found_by_the_gap_closing_claim_is_launched_and_the_bell_disarmed() -> None:
    sent, launched = asyncio.run(_claims_after_arming([[], ["b"]]))
    assert sent == ["claim+arm", "claim+disarm"]
    assert launched == ["b"]


def test_a_full_batch_leaves_the_doorbell_unarmed_and_the_producer_knows_it() -> None:
    """A claim arms the bell only if it finds nothing: after a full batch the producer claims again and
    closes the gap once the queue runs dry."""
    full = [f"x{i}" for i in range(FakeExecutor.concurrency - 1)]  # one slot is busy throughout
    sent, launched = asyncio.run(_claims_after_arming([full, [], []]))
    assert sent == ["claim", "claim+arm", "claim"]
    assert launched == full


def test_after_handing_out_work_the_gap_closing_claim_waits_for_a_freed_slot() -> None:
    """When a claim found work, the next claim (which arms the bell if it finds nothing) does not compete with
    that work's first statements: it comes a moment later, or as soon as a slot is freed (here the moment is
    an hour long)."""
    sent, launched = asyncio.run(_claims_after_arming([["a"], [], []], gap_delay=3600.0,
                                                      free_a_slot_after=0.05))
    assert sent == ["claim", "claim+arm", "claim"]
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
    the moment is an hour long: only the ring can bring the closing claim within the test's deadline. The
    ring leaves the bell armed (an enqueue only reads it): the claim that finds the work disarms it, and the
    next one, finding nothing, arms it again."""
    sent, launched = asyncio.run(_claims_after_arming([[], ["b"], []], close_after=3600.0, ring_after=0.05,
                                                      gap_delay=0.01))
    assert sent == ["claim+arm", "claim+disarm", "claim+arm"]
    assert launched == ["b"]


def test_the_completion_of_the_last_execution_arms_the_bell_and_one_claim_closes_the_gap() -> None:
    """Once the queue ran dry, the completion of the worker's last execution of it arms the bell in its own
    transaction (so that whoever hears of the result and enqueues again rings it). The slot it frees sends no
    claim at once: one claim, GAP_SECONDS later, closes the gap (an enqueue in flight as the completion
    committed may have looked at the bell before), and finding nothing it leaves the bell armed. Here the
    idle re-check is an hour away: without that claim the script would never end."""
    def complete(i: int, producer: Producer, bell: list[bool]) -> None:
        if i == 0:
            written = producer.arm_with_completion()
            assert written is not None
            bell[0] = True  # the completion's statement armed it
            written(True)
            producer.slot_freed()

    seen: list[Producer] = []
    sent, launched = asyncio.run(_claims_after_arming([["a"], [], []], gap_delay=3600.0, idle_delay=3600.0,
                                                      after_claim=complete, seen=seen, stop_after=2))
    assert sent == ["claim", "claim"]
    assert launched == ["a"]
    assert seen[0].armed and not seen[0].gap_open


def test_a_ring_sends_the_gap_closing_claim_at_once() -> None:
    def complete(i: int, producer: Producer, bell: list[bool]) -> None:
        if i == 0:
            producer.GAP_SECONDS = 3600.0
            written = producer.arm_with_completion()
            assert written is not None
            bell[0] = True
            written(True)
            producer.slot_freed()
            asyncio.get_running_loop().call_later(0.05, producer.rung)

    sent, launched = asyncio.run(_claims_after_arming([["a"], ["b"]], gap_delay=3600.0, after_claim=complete))
    assert sent == ["claim", "claim+disarm"]
    assert launched == ["a", "b"]


def test_a_completion_arms_nothing_unless_the_queue_ran_dry_and_the_bell_is_unarmed() -> None:
    answers: list[bool] = []

    def ask(i: int, producer: Producer, bell: list[bool]) -> None:
        answers.append(producer.arm_with_completion() is not None)

    full = [f"x{i}" for i in range(FakeExecutor.concurrency - 1)]
    asyncio.run(_claims_after_arming([full, ["a"], [], []], gap_delay=0.01, after_claim=ask))
    # after a full batch: more may wait; after a short one: yes; once armed (by the claims): no
    assert answers == [False, True, False, False]


def test_a_claim_sent_while_a_completion_arms_decides_the_mark() -> None:
    """A claim sent after the completion decided to arm, and before it committed, kept the bell in step with
    what it found: the completion's callback then leaves the producer's mark alone."""
    pending: list[Any] = []

    def around(i: int, producer: Producer, bell: list[bool]) -> None:
        if i == 0:
            pending.append(producer.arm_with_completion())
            producer.slot_freed()  # the next claim (which finds work) goes out before the completion commits
        elif i == 1:
            pending[0](True)  # committed before that claim's disarming: the claim's result stands

    sent, launched = asyncio.run(_claims_after_arming([["a"], ["b"], [], []], gap_delay=0.01, after_claim=around))
    assert sent[:3] == ["claim", "claim", "claim+arm"]
    assert launched == ["a", "b"]
