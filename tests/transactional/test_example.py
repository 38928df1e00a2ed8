"""The example handler of transactional mode, run by the consumer on the real servers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from psycopg import AsyncConnection

from examples.transactional_orders import SCHEMA
from semel.stores.base import Status
from tests.conftest import SettingsFactory, open_store
from tests.consumer.harness import Broker, InProcessConsumer, eventually
from tests.consumer.test_delivery import finished, settle_all, status_is
from tests.transactional.conftest import Downstream

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def example_tables(db: AsyncConnection[Any]) -> AsyncIterator[None]:
    await db.execute(SCHEMA)
    yield
    await db.execute("DROP TABLE example_payments, example_orders")


async def test_a_paid_order_is_recorded_and_announced_once(
    consumer_settings_tx: SettingsFactory,
    broker: Broker,
    downstream: Downstream,
    db: AsyncConnection[Any],
    example_tables: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("EXAMPLE_SHIPPING_EXCHANGE", downstream.exchange)
    settings = consumer_settings_tx(handler="examples.transactional_orders:order_paid")
    store = await open_store(settings)
    consumer = await InProcessConsumer(settings).start(broker, settings)
    try:
        paid = {"order_id": "A-1001", "amount": 4200, "currency": "EUR"}
        for _ in range(3):
            await broker.publish(settings, paid, key="pay-A-1001")
        await broker.publish(settings, {"amount": 1}, key="pay-broken")
        await eventually(lambda: status_is(store, "pay-A-1001", Status.COMPLETED))
        await settle_all(broker, settings, dead_letters=1)
        await finished(consumer, broker, settings, dead_letters=1)
        record = await store.get("pay-A-1001")
    finally:
        await store.close()
    assert record is not None
    cur = await db.execute("SELECT order_id, amount, idempotency_key FROM example_payments")
    assert await cur.fetchall() == [("A-1001", 4200, "pay-A-1001")]
    cur = await db.execute("SELECT status FROM example_orders")
    assert await cur.fetchall() == [("paid",)]
    (message,) = await downstream.drain()
    assert message.message_id == record.result["shipping_message"]
    assert message.routing_key == "order.ready-to-ship"
