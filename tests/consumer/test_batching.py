"""The batcher's own logic, with a recording fake in place of a store (no server),
and what the batching store does with answers nobody waits for and batches
that fail, on real servers."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from semel.consumer.delivery.batching import Batcher, BatchingStore
from semel.stores.base import (
    Claim,
    ClaimRequest,
    Completion,
    DelegatingStore,
    Outcome,
    Status,
    Store,
)
from semel.stores.errors import KeyRefused, StoreUnavailable
from tests.conftest import StoreFactory
from tests.consumer.harness import eventually

pytestmark = pytest.mark.timeout(10)


class Recorder:
    """Answers each request with its key, and keeps every batch it was sent."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.gate: asyncio.Event | None = None
        self.fail: Exception | None = None

    async def send(self, requests: Sequence[ClaimRequest]) -> list[str]:
        self.batches.append([r.key for r in requests])
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        return [f"{r.key}:{r.fingerprint}" for r in requests]


def req(key: str, fp: str = "f") -> ClaimRequest:
    return ClaimRequest(key, fp)


async def test_calls_of_one_loop_turn_share_one_batch_and_keep_their_answers() -> None:
    recorder = Recorder()
    batcher: Batcher[ClaimRequest, str] = Batcher(recorder.send)
    answers = await asyncio.gather(*(batcher.submit(req(f"k{i}", str(i))) for i in range(50)))
    assert answers == [f"k{i}:{i}" for i in range(50)]
    assert recorder.batches == [[f"k{i}" for i in range(50)]]


async def test_a_lone_call_goes_out_at_once() -> None:
    recorder = Recorder()
    batcher: Batcher[ClaimRequest, str] = Batcher(recorder.send)
    assert await batcher.submit(req("only")) == "only:f"
    assert await batcher.submit(req("next")) == "next:f"
    assert recorder.batches == [["only"], ["next"]]


async def test_the_same_key_twice_waits_for_the_next_batch() -> None:
    recorder = Recorder()
    batcher: Batcher[ClaimRequest, str] = Batcher(recorder.send, in_flight=1)
    answers = await asyncio.gather(
        batcher.submit(req("a", "1")), batcher.submit(req("a", "2")), batcher.submit(req("b"))
    )
    assert list(answers) == ["a:1", "a:2", "b:f"]
    assert recorder.batches == [["a", "b"], ["a"]]


async def test_batches_are_capped_and_in_flight_is_limited() -> None:
    recorder = Recorder()
    recorder.gate = asyncio.Event()
    batcher: Batcher[ClaimRequest, str] = Batcher(recorder.send, max_batch=10, in_flight=2)
    calls = [asyncio.ensure_future(batcher.submit(req(f"k{i}"))) for i in range(35)]
    for _ in range(5):
        await asyncio.sleep(0)
    # Two batches of ten are out; the other fifteen wait for one of them.
    assert [len(b) for b in recorder.batches] == [10, 10]
    recorder.gate.set()
    assert await asyncio.gather(*calls) == [f"k{i}:f" for i in range(35)]
    assert [len(b) for b in recorder.batches] == [10, 10, 10, 5]


async def test_a_failed_batch_fails_each_of_its_callers_and_the_next_batch_goes_on() -> None:
    recorder = Recorder()
    recorder.fail = ConnectionError("store gone")
    batcher: Batcher[ClaimRequest, str] = Batcher(recorder.send)
    results = await asyncio.gather(
        batcher.submit(req("a")), batcher.submit(req("b")), return_exceptions=True
    )
    assert [type(r) for r in results] == [ConnectionError, ConnectionError]
    recorder.fail = None
    assert await batcher.submit(req("c")) == "c:f"


async def test_a_caller_cancelled_before_sending_is_left_out() -> None:
    recorder = Recorder()
    batcher: Batcher[ClaimRequest, str] = Batcher(recorder.send)
    gone = asyncio.ensure_future(batcher.submit(req("gone")))
    kept = asyncio.ensure_future(batcher.submit(req("kept")))
    await asyncio.sleep(0)  # both have submitted; the flush is scheduled, not run
    gone.cancel()
    assert await kept == "kept:f"
    assert recorder.batches == [["kept"]]


async def test_a_store_answering_the_wrong_number_fails_every_caller_never_hangs() -> None:
    async def short(requests: Sequence[ClaimRequest]) -> list[str]:
        return [r.key for r in requests][:-1]  # one answer missing: a bug in a backend

    batcher: Batcher[ClaimRequest, str] = Batcher(short)
    results = await asyncio.wait_for(
        asyncio.gather(*(batcher.submit(req(f"k{i}")) for i in range(3)), return_exceptions=True),
        5,
    )
    assert all(isinstance(result, Exception) for result in results)


class HeldClaims(DelegatingStore):
    """Holds every batch of claims until :attr:`gate` opens: a slow store."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.gate = asyncio.Event()
        self.sent = asyncio.Event()

    async def claim_many(self, requests: Sequence[ClaimRequest]) -> Sequence[Claim | KeyRefused]:
        self.sent.set()
        await self.gate.wait()
        return await self.inner.claim_many(requests)


@pytest.mark.parametrize("backend", ["postgres", "redis"])
async def test_a_claim_granted_to_a_caller_cancelled_meanwhile_is_released(
    make_store: StoreFactory,
) -> None:
    # A long lease: a claim left to it would hold the key for a minute.
    inner = await make_store(lock_ttl=60)
    held = HeldClaims(inner)
    batching = BatchingStore(held)
    caller = asyncio.ensure_future(batching.claim("k", "f"))
    await asyncio.wait_for(held.sent.wait(), 5)
    caller.cancel()  # a worker stopping while the claim is out
    held.gate.set()
    with pytest.raises(asyncio.CancelledError):
        await caller

    async def claimable() -> bool:
        return (await inner.claim("k", "f")).outcome is Outcome.CLAIMED

    await eventually(claimable, 5, "the orphaned claim released")


class PoisonedCompletion(DelegatingStore):
    """Fails every batch of completions that holds ``poisoned``, the way a statement
    past a server limit fails (classed as the store being away); records the batches."""

    def __init__(self, inner: Store, poisoned: str) -> None:
        super().__init__(inner)
        self.poisoned = poisoned
        self.batches: list[list[str]] = []

    async def complete_many(self, completions: Sequence[Completion]) -> Sequence[bool | KeyRefused]:
        self.batches.append([c.key for c in completions])
        if any(c.key == self.poisoned for c in completions):
            raise StoreUnavailable(self.backend, "program_limit_exceeded: a poisoned completion")
        return await self.inner.complete_many(completions)


@pytest.mark.parametrize("backend", ["postgres"])
async def test_one_completion_that_cannot_land_does_not_hold_the_rest_of_its_batch(
    make_store: StoreFactory,
) -> None:
    inner = await make_store()
    poisoned = PoisonedCompletion(inner, "k3")
    batching = BatchingStore(poisoned)
    fences = [(await inner.claim(f"k{i}", "f")).fence for i in range(8)]
    answers = await asyncio.gather(
        *(batching.complete(f"k{i}", fence, {"i": i}) for i, fence in enumerate(fences)),
        return_exceptions=True,
    )
    assert poisoned.batches[0] == [f"k{i}" for i in range(8)]  # sent as one batch
    assert isinstance(answers[3], StoreUnavailable)
    assert [a for i, a in enumerate(answers) if i != 3] == [True] * 7
    for i in range(8):
        record = await inner.get(f"k{i}")
        assert record is not None
        assert record.status is (Status.IN_PROGRESS if i == 3 else Status.COMPLETED)
