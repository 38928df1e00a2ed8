"""The batcher's own logic, with a recording fake in place of a store (no server)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from consumer.delivery.batching import Batcher
from stores.base import ClaimRequest

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
