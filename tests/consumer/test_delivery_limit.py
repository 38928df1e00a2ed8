"""The broker's delivery limit never costs a message, on RabbitMQ 3.x and 4.x alike.

RabbitMQ 4.0 gives every quorum queue a delivery limit of 20 and counts each
return (a requeue, a nack, a closed channel) against it. Past it, a message
of the work queue is dead-lettered to ``Q.retry.conflict``, and on its way
back to ``Q`` the broker finds a dead-letter cycle with no rejection in it and
drops the message. These tests return deliveries far more often than that,
and run in both broker lanes (``--rabbitmq 3`` / ``--rabbitmq 4``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import structlog

from semel.consumer.broker.topology import queue_specs
from semel.consumer.errors import TopologyMismatch
from semel.consumer.names import DELIVERY_LIMIT, RETURNS_BEFORE_DETOUR, Topology
from semel.consumer.plan import topology_of
from semel.consumer.runtime import supervise
from semel.settings import Settings
from semel.stores.base import Outcome, Status, Store
from tests.conftest import Rabbitmqctl, open_store
from tests.consumer.conftest import ConsumerSettings, StartConsumer
from tests.consumer.faults import FaultyStore
from tests.consumer.harness import Broker, eventually
from tests.consumer.test_delivery import finished, runs, status_is

pytestmark = pytest.mark.timeout(120)

OUTAGE_CLAIMS = 30  # failed claims of one key: each one hands its delivery back


async def test_a_store_outage_longer_than_the_broker_limit_loses_nothing(
    consumer_settings: ConsumerSettings,
    broker: Broker,
    store: Store,
    ledger: Path,
    start_consumer: StartConsumer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The store answers pings but not claims, so the worker resumes at once
    # and gets the same deliveries back again and again.
    monkeypatch.setattr(supervise, "PROBE_BACKOFF", (0.01, 0.05))
    settings = consumer_settings(conflict_delay=0.2)
    faulty = FaultyStore(await open_store(settings))
    keys = ["outage-a", "outage-b"]
    faulty.failing_claims = dict.fromkeys(keys, OUTAGE_CLAIMS)
    consumer = await start_consumer(settings, faulty)
    try:
        for key in keys:
            await broker.publish(settings, {"n": 1}, key=key)

        async def all_done() -> bool:
            return all([await status_is(store, key, Status.COMPLETED) for key in keys])

        await eventually(all_done, 90, "every key completed after the outage")
        await finished(consumer, broker, settings, dead_letters=0)
    finally:
        await faulty.close()
    for key in keys:
        assert faulty.claims[key].count(None) == OUTAGE_CLAIMS, key
        assert len(runs(ledger, key)) == 1, key


async def test_a_key_in_conflict_30_times_is_neither_dropped_nor_dead_lettered(
    consumer_settings: ConsumerSettings,
    broker: Broker,
    store: Store,
    ledger: Path,
    start_consumer: StartConsumer,
) -> None:
    settings = consumer_settings(conflict_delay=0.05, lock_ttl=3.0, handler_timeout=30.0)
    counting = FaultyStore(await open_store(settings))
    consumer = await start_consumer(settings, counting)
    try:
        await broker.publish(settings, {"sleep": 12}, key="held")  # holds the key
        await eventually(lambda: status_is(store, "held", Status.IN_PROGRESS), 10, "held claimed")
        await broker.publish(settings, {"sleep": 12}, key="held")  # a copy: conflicts

        async def conflicts() -> bool:
            return counting.claims["held"].count(Outcome.IN_PROGRESS) >= 30

        await eventually(conflicts, 30, "30 conflicts while the key is held")
        await eventually(lambda: status_is(store, "held", Status.COMPLETED), 30, "held completed")

        async def acked_as_duplicate() -> bool:
            # The copy comes back from the conflict queue once more, and is a
            # duplicate: answered by the store, or by the worker's cache of the
            # keys it completed (then it is not claimed again).
            if counting.claims["held"][-1] is Outcome.DUPLICATE:
                return True
            cached = consumer.container.metrics().registry.get_sample_value(
                "semel_duplicates_cached_total"
            )
            return cached == 1

        await eventually(acked_as_duplicate, 15, "the copy acked as a duplicate")
        await finished(consumer, broker, settings, dead_letters=0)
    finally:
        await counting.close()
    assert len(runs(ledger, "held")) == 1


async def test_a_delivery_returned_too_often_takes_the_conflict_queue_and_runs_once(
    consumer_settings: ConsumerSettings,
    broker: Broker,
    store: Store,
    ledger: Path,
    start_consumer: StartConsumer,
) -> None:
    """Returns semel never sees (a consumer that dies with the delivery in
    hand, here a raw consumer that returns it) bring the count to the detour."""
    settings = consumer_settings()
    await broker.declare(settings)
    await broker.publish(settings, {"n": 1}, key="worn")
    returned = await broker.return_times(settings.queue, RETURNS_BEFORE_DETOUR)
    assert returned == RETURNS_BEFORE_DETOUR
    consumer = await start_consumer(settings)
    await eventually(lambda: status_is(store, "worn", Status.COMPLETED), 30, "worn completed")
    await finished(consumer, broker, settings, dead_letters=0)
    assert len(runs(ledger, "worn")) == 1
    conflict_queue = Topology(settings.queue).conflict_queue
    assert await broker.depth(conflict_queue) == 0


async def queue_arguments(rabbitmqctl: Rabbitmqctl, queue: str) -> dict[str, object]:
    out = await rabbitmqctl("list_queues", "name", "arguments", "--formatter", "json")
    listed = json.loads(out)
    (row,) = [q for q in listed if q["name"] == queue]
    return {name: value for name, _type, value in row["arguments"]}


async def test_the_work_queue_declares_its_delivery_limit(
    consumer_settings: ConsumerSettings, broker: Broker, rabbitmqctl: Rabbitmqctl
) -> None:
    settings = consumer_settings()
    await broker.declare(settings)
    arguments = await queue_arguments(rabbitmqctl, settings.queue)
    assert arguments["x-delivery-limit"] == DELIVERY_LIMIT
    names = Topology(settings.queue)
    # Delay queues too: a worker holding their messages until due may die.
    arguments = await queue_arguments(rabbitmqctl, names.conflict_queue)
    assert arguments["x-delivery-limit"] == DELIVERY_LIMIT
    assert "x-delivery-limit" not in await queue_arguments(rabbitmqctl, names.dead_letter_queue)


def earlier_work_queue(settings: Settings, **changed: Any) -> dict[str, Any]:
    """The work queue's arguments as a version without the delivery limit declared them."""
    (work, *_) = queue_specs(topology_of(settings))
    arguments = {k: v for k, v in work.arguments.items() if k != "x-delivery-limit"}
    return arguments | changed


async def test_a_work_queue_declared_without_a_limit_is_used_as_it_is(
    consumer_settings: ConsumerSettings, broker: Broker, rabbitmqctl: Rabbitmqctl
) -> None:
    settings = consumer_settings()
    channel = await broker.connection.channel()
    earlier = earlier_work_queue(settings)
    await channel.declare_queue(settings.queue, durable=True, arguments=earlier)
    with structlog.testing.capture_logs() as logs:
        await broker.declare(settings)  # no TopologyMismatch
    assert "x-delivery-limit" not in await queue_arguments(rabbitmqctl, settings.queue)
    (warning,) = [e for e in logs if e["log_level"] == "warning"]
    assert warning["queue"] == settings.queue
    assert "delivery limit" in warning["event"]


async def test_a_work_queue_without_a_limit_and_another_difference_is_refused(
    consumer_settings: ConsumerSettings, broker: Broker
) -> None:
    settings = consumer_settings()
    channel = await broker.connection.channel()
    other = earlier_work_queue(settings, **{"x-dead-letter-routing-key": "elsewhere"})
    await channel.declare_queue(settings.queue, durable=True, arguments=other)
    with pytest.raises(TopologyMismatch, match="x-dead-letter-routing-key"):
        await broker.declare(settings)
