"""Upgrading from a semel whose delay queues returned messages to Q by TTL and
dead-lettering: the new worker uses those queues as they are and drains what is
in flight in them, and nobody deletes a live queue.

The earlier topology is built here from the arguments that version declared,
not from today's code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aio_pika
import pytest

from semel.consumer.names import Topology
from semel.settings import Settings
from semel.stores.base import Status, Store
from tests.consumer.conftest import ConsumerSettings, StartConsumer
from tests.consumer.harness import Broker, eventually
from tests.consumer.test_delivery import finished, runs, status_is

pytestmark = pytest.mark.timeout(90)


def earlier_delay_arguments(settings: Settings, delay: float) -> dict[str, Any]:
    """A delay queue's arguments as the earlier semel declared them."""
    arguments: dict[str, Any] = {"x-queue-type": settings.queue_type.value}
    if settings.queue_type.value == "quorum":
        arguments |= {"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"}
    return arguments | {
        "x-message-ttl": int(delay * 1000),
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": settings.queue,
    }


def earlier_work_arguments(settings: Settings) -> dict[str, Any]:
    names = Topology(settings.queue)
    arguments: dict[str, Any] = {"x-queue-type": settings.queue_type.value}
    if settings.queue_type.value == "quorum":
        arguments |= {"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"}
        arguments["x-delivery-limit"] = 100
    return arguments | {
        "x-dead-letter-exchange": names.retry_exchange,
        "x-dead-letter-routing-key": "conflict",
    }


async def declare_earlier_topology(broker: Broker, settings: Settings) -> None:
    names = Topology(settings.queue)
    channel = broker.channel
    events = await channel.declare_exchange(settings.exchange, "topic", durable=True)
    retry = await channel.declare_exchange(names.retry_exchange, "direct", durable=True)
    await channel.declare_exchange(names.dead_letter_exchange, "direct", durable=True)
    dlq = await channel.declare_queue(
        names.dead_letter_queue, durable=True, arguments={"x-queue-type": settings.queue_type.value}
    )
    await dlq.bind(names.dead_letter_exchange, "dlq")
    delays = [(names.conflict_queue, settings.conflict_delay, "conflict")]
    delays += [(names.tier_queue(d), d, f"{d:g}s") for d in settings.retry_delays]
    for name, delay, routing_key in delays:
        queue = await channel.declare_queue(
            name, durable=True, arguments=earlier_delay_arguments(settings, delay)
        )
        await queue.bind(retry, routing_key)
    work = await channel.declare_queue(
        settings.queue, durable=True, arguments=earlier_work_arguments(settings)
    )
    await work.bind(events, "#")


async def conflicts_in_flight(broker: Broker, settings: Settings, keys: list[str]) -> None:
    """In-progress conflicts as the earlier semel parked them: NACKed without
    requeue, dead-lettered by the broker into Q.retry.conflict."""
    for key in keys:
        await broker.publish(settings, {"n": 1}, key=key)
    work = await broker.channel.declare_queue(settings.queue, passive=True)
    for _ in keys:
        delivery = await work.get(no_ack=False, timeout=5)
        await delivery.nack(requeue=False)


async def retries_in_flight(broker: Broker, settings: Settings, keys: list[str]) -> None:
    """Retry copies as the earlier semel published them to its tiers."""
    retry = await broker.channel.get_exchange(Topology(settings.queue).retry_exchange)
    tier = settings.retry_delays[-1]
    for key in keys:
        message = aio_pika.Message(
            b'{"n": 1}',
            headers={"Idempotency-Key": key, "x-semel-attempts": 2},
            content_type="application/json",
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        )
        await retry.publish(message, routing_key=f"{tier:g}s")


@pytest.mark.parametrize("queue_type", ["quorum", "classic"])
async def test_an_earlier_topology_with_messages_in_flight_is_drained_without_loss(
    consumer_settings: ConsumerSettings,
    broker: Broker,
    store: Store,
    ledger: Path,
    start_consumer: StartConsumer,
    queue_type: str,
) -> None:
    # Delays long enough that the messages are still waiting when the worker starts.
    settings = consumer_settings(queue_type=queue_type, conflict_delay=3.0, retry_delays=[2, 4])
    names = Topology(settings.queue)
    await declare_earlier_topology(broker, settings)
    conflicts = [f"conflict-{n}" for n in range(10)]
    retries = [f"retry-{n}" for n in range(10)]
    await conflicts_in_flight(broker, settings, conflicts)
    await retries_in_flight(broker, settings, retries)
    assert await broker.depth(names.conflict_queue) == len(conflicts)
    assert await broker.depth(names.tier_queue(4)) == len(retries)

    # What the new worker does first: no TopologyMismatch. (Its warning is not
    # asserted: a command test run before in this process may have cached the
    # module's logger, which structlog's capture then no longer sees.)
    await broker.declare(settings)
    consumer = await start_consumer(settings)

    async def all_done() -> bool:
        keys = conflicts + retries
        return all([await status_is(store, key, Status.COMPLETED) for key in keys])

    await eventually(all_done, 30, "every key in flight completed")
    await finished(consumer, broker, settings, dead_letters=0)
    for key in conflicts + retries:
        assert len(runs(ledger, key)) == 1, key
    assert sum((await broker.depths(settings)).values()) == 0
