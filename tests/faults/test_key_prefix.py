"""Keys are namespaced by ``SEMEL_KEY_PREFIX``: two services sharing one store never collide.

Two consumers, each with its own queue bound to one exchange and its own key
prefix, on the same store: one event with one key runs once in each service.
With the same prefix the second service takes the key for a duplicate, which
is what the prefix is there to prevent.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from semel.consumer.broker.topology import queue_specs
from semel.consumer.names import Topology
from semel.consumer.plan import topology_of
from semel.settings import Settings
from semel.stores.base import Status, Store
from tests.conftest import open_store
from tests.consumer.conftest import CONSUMER_BACKENDS, ConsumerSettings, StartConsumer
from tests.consumer.handlers import read_ledger
from tests.consumer.harness import Broker, eventually

pytestmark = pytest.mark.timeout(60)


async def delete_queues(broker: Broker, settings: Settings) -> None:
    channel = await broker.connection.channel()
    names = Topology(settings.queue)
    for spec in queue_specs(topology_of(settings)):
        await channel.queue_delete(spec.name)
    for exchange in (names.retry_exchange, names.dead_letter_exchange):
        await channel.exchange_delete(exchange)
    await channel.close()


@pytest.mark.parametrize("backend", CONSUMER_BACKENDS)
@pytest.mark.parametrize("shared_prefix", [False, True], ids=["two-prefixes", "one-prefix"])
async def test_two_services_sharing_a_store_run_the_same_key_once_each(
    consumer_settings: ConsumerSettings,
    broker: Broker,
    ledger: Path,
    start_consumer: StartConsumer,
    shared_prefix: bool,
) -> None:
    unique = consumer_settings().key_prefix  # the stores outlive the test
    billing = consumer_settings(key_prefix=f"{unique}-billing")
    shipping = consumer_settings(
        key_prefix=billing.key_prefix if shared_prefix else f"{unique}-shipping",
        queue=f"{billing.queue}.shipping",
    )
    stores: list[Store] = []
    try:
        for service in (billing, shipping):
            await start_consumer(service)
            stores.append(await open_store(service))
        # One event, bound to both services' queues through the shared exchange.
        await broker.publish(billing, {"order_id": 7}, key="order-7")

        async def both_done() -> bool:
            records = [await store.get("order-7") for store in stores]
            return all(r is not None and r.status is Status.COMPLETED for r in records)

        await eventually(both_done, 20, "order-7 completed for both services")
        depths = tuple(
            name
            for service in (billing, shipping)
            for name in (service.queue, Topology(service.queue).conflict_queue)
        )
        await eventually(lambda: _all_empty(broker, depths), 20, "both services settled their copy")
    finally:
        for store in stores:
            await store.close()
        await delete_queues(broker, shipping)

    runs = [e for e in read_ledger(ledger) if e["event"] == "start" and e["key"] == "order-7"]
    assert len(runs) == (1 if shared_prefix else 2)


async def _all_empty(broker: Broker, queues: tuple[str, ...]) -> bool:
    return all([await broker.depth(queue) == 0 for queue in queues])
