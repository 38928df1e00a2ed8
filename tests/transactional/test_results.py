"""A transactional handler's result that is not JSON as it is: stored in its JSON
form with the work it committed, never rolled back or dead-lettered."""

from __future__ import annotations

from typing import Any

import pytest
from psycopg import AsyncConnection

from semel.stores.base import Status, Store
from tests.conftest import SettingsFactory, open_store
from tests.consumer.harness import Broker, InProcessConsumer, eventually
from tests.consumer.test_delivery import finished, settle_all, status_is
from tests.transactional.conftest import Downstream, rows

pytestmark = pytest.mark.timeout(60)


async def test_a_decimal_and_a_datetime_are_stored_with_the_committed_work(
    consumer_settings_tx: SettingsFactory,
    broker: Broker,
    downstream: Downstream,
    db: AsyncConnection[Any],
    business_table: str,
) -> None:
    settings = consumer_settings_tx(handler="tests.transactional.handlers:record_order_priced")
    store: Store = await open_store(settings)
    try:
        consumer = await InProcessConsumer(settings).start(broker, settings)
        body = {"table": business_table, "exchange": downstream.exchange}
        await broker.publish(settings, body, key="k")
        await eventually(lambda: status_is(store, "k", Status.COMPLETED), 10, "'k' completed")
        await settle_all(broker, settings, dead_letters=0)
        await finished(consumer, broker, settings, dead_letters=0)
        record = await store.get("k")
        assert record is not None
        at = "2026-01-02T00:00:00+00:00"
        assert record.result == {"recorded": "k", "total": "9.99", "at": at}
        assert [r[0] for r in await rows(db, "SELECT key FROM {}", business_table)] == ["k"]
        assert len(await downstream.drain()) == 1
    finally:
        await store.close()
