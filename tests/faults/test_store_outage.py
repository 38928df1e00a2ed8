"""A handler that finished while the store was away must not run again.

A handler returns during a store outage longer than its lease: its
``complete`` cannot be written. Handing the message back would let the
redelivery take the expired claim over and run the handler a second time.
The completion is fenced, so the worker keeps retrying it until the store
answers: written late it either lands (no one took over) or is refused
(someone did).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from semel.stores.base import Status, Store
from semel.stores.postgres.store import POOL_TIMEOUT
from tests.consumer.conftest import ConsumerSettings, StartConsumer
from tests.consumer.handlers import read_ledger
from tests.consumer.harness import Broker, TcpProxy, eventually
from tests.consumer.test_faults import through_proxy
from tests.servers import free_port

pytestmark = pytest.mark.timeout(60)


def events(ledger: Path, key: str, event: str) -> int:
    return sum(1 for e in read_ledger(ledger) if e["key"] == key and e["event"] == event)


@pytest.mark.parametrize("backend", ["postgres", "redis", "dynamodb-dynalite"])
async def test_a_completion_held_up_by_an_outage_longer_than_the_lease_is_written_later(
    consumer_settings: ConsumerSettings,
    broker: Broker,
    store: Store,
    ledger: Path,
    start_consumer: StartConsumer,
) -> None:
    base = consumer_settings()
    port = free_port()
    target, overrides = through_proxy(base, port)
    proxy = await TcpProxy(target, port).start()
    settings = consumer_settings(**overrides)
    try:
        consumer = await start_consumer(settings)
        # Shorter than a heartbeat interval: only the completion meets the outage.
        await broker.publish(settings, {"sleep": settings.lock_ttl / 5}, key="held")

        async def started() -> bool:
            return events(ledger, "held", "start") == 1

        await eventually(started, what="'held' running")
        await proxy.cut()

        async def returned() -> bool:
            return events(ledger, "held", "end") >= 1

        await eventually(returned, what="'held' returned")
        # The outage itself: longer than the lease, so the claim has expired when it
        # ends, and than the PostgreSQL pool's wait, which would otherwise ride it out.
        await asyncio.sleep(max(settings.lock_ttl * 2, POOL_TIMEOUT + 1))
        await proxy.start()

        async def completed() -> bool:
            record = await store.get("held")
            return record is not None and record.status is Status.COMPLETED

        await eventually(completed, 30, "'held' completed")
        assert await consumer.finish() == 0
    finally:
        await proxy.cut()

    assert events(ledger, "held", "start") == 1
