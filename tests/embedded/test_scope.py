"""``async with semel.process(message) as run:`` in a plain aio-pika callback, on the
real broker and stores: the worker's outcomes, the block as the handler."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aio_pika
import pytest
from aio_pika.abc import AbstractIncomingMessage

from semel.consumer import PermanentError
from semel.consumer.embedded import Semel
from semel.consumer.embedded.scope import Run
from semel.consumer.names import H_KEY, H_REASON, Topology
from semel.settings import Settings
from tests.consumer.harness import Broker, eventually
from tests.embedded.test_faststream import counted, take_over

pytestmark = pytest.mark.timeout(90)
each_store = pytest.mark.parametrize("backend", ["sqlite", "redis", "postgres"], indirect=True)


@dataclass
class Callback:
    """The application's own consumer: what each block saw, and how it ended."""

    seen: list[dict[str, Any]] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    running: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)


@pytest.fixture
async def callback(semel: Semel, broker: Broker, settings: Settings) -> AsyncIterator[Callback]:
    """An aio-pika consumer of the test's queue whose callback uses the scope."""
    await broker.declare(settings)  # the application's queue (semel's arguments, as it happens)
    seen = Callback()
    connection = await aio_pika.connect(settings.amqp_url)
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=8)
    queue = await channel.get_queue(settings.queue)

    async def on_message(message: AbstractIncomingMessage) -> None:
        async with semel.process(message, queue=settings.queue) as run:
            seen.runs.append(run)
            if run.skipped:
                return
            seen.seen.append({"key": run.key, "fence": run.fence, "attempt": run.attempt})
            seen.running.set()
            body = run.body
            if body.get("hold"):
                try:
                    await seen.release.wait()
                except asyncio.CancelledError:
                    seen.cancelled.set()
                    raise
            if body.get("permanent"):
                raise PermanentError("refused for good")
            if run.attempt <= body.get("fail", 0):
                raise RuntimeError(f"attempt {run.attempt} failed")
            run.result = {"charged": body.get("n")}

    tag = await queue.consume(on_message)
    try:
        yield seen
    finally:
        await queue.cancel(tag)
        await connection.close()


async def returned(broker: Broker, queue: str) -> bool:
    return await broker.depth(queue) == 1


def keys(callback: Callback) -> list[str]:
    return [entry["key"] for entry in callback.seen]


@each_store
async def test_the_block_runs_once_per_key_and_skips_duplicates(
    callback: Callback, broker: Broker, settings: Settings, store: Any
) -> None:
    async def settled(count: int) -> None:
        async def done() -> bool:
            runs = callback.runs
            return len(runs) == count and all(run.decision is not None for run in runs)

        await eventually(done, 20, f"{count} deliveries settled")

    await broker.publish(settings, {"n": 1}, key="a")
    await settled(1)
    for n, key in [(1, "a"), (2, "b")]:  # a again once a completed: a duplicate
        await broker.publish(settings, {"n": n}, key=key)
    await settled(3)
    assert sorted(keys(callback)) == ["a", "b"]
    outcomes = sorted(str(run.outcome) for run in callback.runs)
    assert outcomes == ["completed", "completed", "duplicate"]
    record = await store.get("a")
    assert record.result == {"charged": 1}  # what the block set as run.result


@each_store
async def test_a_failing_block_is_retried_then_dead_lettered(
    callback: Callback, broker: Broker, settings: Settings
) -> None:
    await broker.publish(settings, {"n": 1, "fail": 1}, key="once")
    await broker.publish(settings, {"n": 2, "fail": 99}, key="never")
    await broker.publish(settings, {"n": 3, "permanent": True}, key="refused")

    async def letters_out() -> bool:
        return await broker.depth(Topology(settings.queue).dead_letter_queue) == 2

    await eventually(letters_out, 30, "two dead letters")
    attempts = sorted((e["key"], e["attempt"]) for e in callback.seen)
    assert attempts == [("never", 1), ("never", 2), ("never", 3), ("once", 1), ("once", 2),
                        ("refused", 1)]  # fmt: skip
    reasons = {d.headers[H_KEY]: d.headers[H_REASON] for d in await broker.dead_letters(settings)}
    assert reasons == {"never": "max-attempts", "refused": "permanent-error"}


@each_store
async def test_an_in_progress_copy_is_parked_and_comes_back_a_duplicate(
    callback: Callback, broker: Broker, settings: Settings, semel: Semel
) -> None:
    await broker.publish(settings, {"n": 1, "hold": True}, key="slow")
    await asyncio.wait_for(callback.running.wait(), 10)
    await broker.publish(settings, {"n": 1, "hold": True}, key="slow")
    await eventually(lambda: counted(semel, "conflict", 1), 10, "the copy parked")
    callback.release.set()
    await eventually(lambda: counted(semel, "duplicate", 1), 10, "the copy ACKed as a duplicate")
    assert keys(callback) == ["slow"]


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
async def test_a_lost_lease_cancels_the_block(
    callback: Callback, broker: Broker, settings: Settings, semel: Semel
) -> None:
    await broker.publish(settings, {"n": 1, "hold": True}, key="held")
    await asyncio.wait_for(callback.running.wait(), 10)
    await take_over(settings, "held")
    await asyncio.wait_for(callback.cancelled.wait(), settings.lock_ttl)
    await eventually(lambda: counted(semel, "conflict", 1), 10, "parked as a conflict")
    run = callback.runs[0]
    assert run.outcome == "lease-lost"
    assert await broker.dead_letters(settings) == []


@each_store
async def test_a_block_cut_short_by_the_application_releases_its_key(
    semel: Semel, broker: Broker, settings: Settings, store: Any
) -> None:
    """The application cancels its own callback (it is stopping): the claim is
    released at once and the message handed back, not left to its lease."""
    await broker.declare(settings)
    await broker.publish(settings, {"n": 1}, key="cut")
    connection = await aio_pika.connect(settings.amqp_url)
    channel = await connection.channel()
    queue = await channel.get_queue(settings.queue)
    message = await queue.get(timeout=5)
    entered = asyncio.Event()

    async def block() -> None:
        async with semel.process(message, queue=settings.queue):
            entered.set()
            await asyncio.sleep(60)

    task = asyncio.create_task(block())
    await asyncio.wait_for(entered.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # Handed back while the application's connection stays open.
    await eventually(lambda: returned(broker, settings.queue), 10, "the message handed back")
    claim = await store.claim("cut", (await store.get("cut")).fingerprint)
    assert claim.outcome.value == "claimed"  # released, not held until its lease ran out
    await connection.close()
