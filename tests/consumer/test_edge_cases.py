"""Outcomes that need one store or one setting: results that cannot be kept,
handler timeouts, classic queues, a dead letter the broker cannot route, concurrency."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from semel.consumer.broker.settle import UNCONFIRMED_PAUSE
from semel.consumer.names import DLQ_ROUTING_KEY, H_ATTEMPTS, H_ERROR, Topology
from semel.settings import Settings
from semel.stores.base import Status, Store
from tests.consumer.conftest import ConsumerSettings, StartConsumer
from tests.consumer.handlers import read_ledger
from tests.consumer.harness import Broker, eventually
from tests.consumer.sampler import sampling
from tests.consumer.test_delivery import finished, runs, settle_all, status_is
from tests.consumer.test_faults import all_completed

pytestmark = pytest.mark.timeout(60)


async def test_a_handler_past_its_timeout_is_a_failed_attempt(
    consumer_settings: ConsumerSettings,
    broker: Broker,
    store: Store,
    ledger: Path,
    start_consumer: StartConsumer,
) -> None:
    settings = consumer_settings(handler_timeout=0.3, max_attempts=2)
    consumer = await start_consumer(settings)
    await broker.publish(settings, {"sleep": 5}, key="slow")
    await settle_all(broker, settings, dead_letters=1)
    await finished(consumer, broker, settings, dead_letters=1)
    assert [r["attempt"] for r in runs(ledger, "slow")] == [1, 2]
    assert runs(ledger, "slow", "end") == []  # cancelled both times
    assert await status_is(store, "slow", Status.FAILED)
    (letter,) = await broker.dead_letters(settings)
    assert (letter.reason, letter.headers[H_ATTEMPTS]) == ("max-attempts", 2)
    assert letter.headers[H_ERROR] == "HandlerTimeout: handler ran longer than 0.3s"


async def test_classic_queues_retry_conflict_and_dead_letter_too(
    consumer_settings: ConsumerSettings,
    broker: Broker,
    store: Store,
    ledger: Path,
    start_consumer: StartConsumer,
) -> None:
    settings = consumer_settings(queue_type="classic")
    names = Topology(settings.queue)
    consumer = await start_consumer(settings)
    async with sampling(settings) as sampler:
        for _ in range(3):
            await broker.publish(settings, {"sleep": 0.8}, key="busy")
        await broker.publish(settings, {"fail_until": 1}, key="flaky")
        await broker.publish(settings, {"permanent": "no"}, key="declined")
        await settle_all(broker, settings, dead_letters=1)
        await eventually(lambda: status_is(store, "busy", Status.COMPLETED), what="busy done")
        await eventually(lambda: status_is(store, "flaky", Status.COMPLETED), what="flaky done")
        await settle_all(broker, settings, dead_letters=1)
    await finished(consumer, broker, settings, dead_letters=1)
    assert len(runs(ledger, "busy")) == 1
    assert [r["attempt"] for r in runs(ledger, "flaky")] == [1, 2]
    assert sampler.saw(names.conflict_queue) >= 1
    assert sampler.saw(names.tier_queue(settings.retry_delays[0])) >= 1
    declared = await broker.channel.declare_queue(settings.queue, passive=True)
    assert declared.declaration_result.message_count == 0


async def test_an_unroutable_copy_never_acks_the_original(
    settings: Settings, broker: Broker, start_consumer: StartConsumer
) -> None:
    names = Topology(settings.queue)
    consumer = await start_consumer(settings)
    dlq = await broker.channel.declare_queue(names.dead_letter_queue, passive=True)
    await dlq.unbind(names.dead_letter_exchange, DLQ_ROUTING_KEY)  # dead letters go nowhere
    await broker.publish(settings, b"not json", key="bad")

    async def in_flight() -> bool:
        return await broker.depth(settings.queue) == 0

    await eventually(in_flight, what="delivered")
    await asyncio.sleep(UNCONFIRMED_PAUSE * 2)  # returned at least once meanwhile
    assert await consumer.finish() == 0

    # Still in the work queue: not acknowledged, not lost, not dead-lettered.
    # A quorum queue takes it back a moment after the channel's close: polled.
    async def handed_back() -> bool:
        return await broker.depth(settings.queue) == 1

    await eventually(handed_back, what="handed back")
    assert await broker.depth(names.dead_letter_queue) == 0

    await dlq.bind(names.dead_letter_exchange, DLQ_ROUTING_KEY)
    consumer = await start_consumer(settings)
    await settle_all(broker, settings, dead_letters=1)
    await finished(consumer, broker, settings, dead_letters=1)
    (letter,) = await broker.dead_letters(settings)
    assert (letter.reason, letter.key) == ("malformed-body", "bad")


async def test_deliveries_run_concurrently_up_to_the_prefetch(
    consumer_settings: ConsumerSettings,
    broker: Broker,
    store: Store,
    ledger: Path,
    start_consumer: StartConsumer,
) -> None:
    settings = consumer_settings(prefetch=3)
    consumer = await start_consumer(settings)
    keys = [f"k-{i}" for i in range(7)]
    for key in keys:
        await broker.publish(settings, {"sleep": 0.4}, key=key)
    await eventually(lambda: all_completed(store, keys), 20, "every key completed")
    await finished(consumer, broker, settings, dead_letters=0)

    events = sorted(read_ledger(ledger), key=lambda e: (e["t"], e["event"] == "start"))
    running = peak = 0
    for event in events:
        running += 1 if event["event"] == "start" else -1
        peak = max(peak, running)
    assert peak == settings.prefetch


@pytest.mark.parametrize(
    ("key_source", "good", "bad", "reason"),
    [
        # aiormq gives every message without an id a random one, so a message_id
        # source can only see an invalid id from this producer, never a missing one.
        ("message_id", {"message_id": "m-7"}, {"message_id": "m\t7"}, "invalid-key"),
        ("body:order.id", {"body": {"order": {"id": "m-7"}}}, {}, "missing-key"),
    ],
)
async def test_other_key_sources(
    consumer_settings: ConsumerSettings,
    broker: Broker,
    store: Store,
    ledger: Path,
    start_consumer: StartConsumer,
    key_source: str,
    good: dict[str, Any],
    bad: dict[str, Any],
    reason: str,
) -> None:
    settings = consumer_settings(key_source=key_source)
    consumer = await start_consumer(settings)
    for _ in range(2):
        await broker.publish(settings, **({"body": {"n": 1}} | good))
    await broker.publish(settings, **({"body": {"n": 2}} | bad))
    await settle_all(broker, settings, dead_letters=1)
    await finished(consumer, broker, settings, dead_letters=1)
    assert len(runs(ledger, "m-7")) == 1
    assert await status_is(store, "m-7", Status.COMPLETED)
    (letter,) = await broker.dead_letters(settings)
    assert letter.reason == reason
