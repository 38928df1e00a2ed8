"""Transactional deliveries through the whole consumer (in process, real servers):
failed attempts leave nothing behind, duplicates re-publish nothing, and a
consumer that cannot work in this mode says so at start-up."""

from __future__ import annotations

from typing import Any

import pytest
from psycopg import AsyncConnection, sql

from semel.consumer.delivery.message import fingerprint
from semel.consumer.errors import SemelError
from semel.consumer.names import Topology
from semel.settings import ConfigError, load_settings
from semel.stores.base import Status, Store
from tests.conftest import SettingsFactory, open_store
from tests.consumer.harness import Broker, InProcessConsumer, eventually
from tests.consumer.sampler import sampling
from tests.consumer.test_delivery import finished, settle_all, status_is
from tests.transactional.conftest import Downstream, rows

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def store(consumer_settings_tx: SettingsFactory) -> Any:
    opened = await open_store(consumer_settings_tx())
    try:
        yield opened
    finally:
        await opened.close()


def order(downstream: Downstream, business_table: str, **extra: Any) -> dict[str, Any]:
    return {"table": business_table, "exchange": downstream.exchange} | extra


async def start(settings: Any, broker: Broker) -> InProcessConsumer:
    return await InProcessConsumer(settings).start(broker, settings)


async def rows_of(db: AsyncConnection[Any], table: str) -> list[str]:
    return [r[0] for r in await rows(db, "SELECT key FROM {} ORDER BY id", table)]


async def test_a_duplicate_of_a_completed_key_publishes_nothing(
    consumer_settings_tx: SettingsFactory,
    broker: Broker,
    store: Store,
    downstream: Downstream,
    db: AsyncConnection[Any],
    business_table: str,
) -> None:
    settings = consumer_settings_tx()
    consumer = await start(settings, broker)
    body = order(downstream, business_table)
    await broker.publish(settings, body, key="k")
    await eventually(lambda: status_is(store, "k", Status.COMPLETED), what="'k' completed")
    await broker.publish(settings, body, key="k")  # a late copy
    await broker.publish(settings, body, key="k")
    await settle_all(broker, settings, dead_letters=0)
    await finished(consumer, broker, settings, dead_letters=0)
    assert await rows_of(db, business_table) == ["k"]
    messages = await downstream.drain()
    assert len(messages) == 1
    assert len(await rows(db, "SELECT id FROM {}", settings.outbox_table)) == 1


async def test_failed_attempts_leave_no_rows_and_no_messages(
    consumer_settings_tx: SettingsFactory,
    broker: Broker,
    store: Store,
    downstream: Downstream,
    db: AsyncConnection[Any],
    business_table: str,
) -> None:
    settings = consumer_settings_tx()
    consumer = await start(settings, broker)
    await broker.publish(settings, order(downstream, business_table, fail_until=2), key="retried")
    await broker.publish(settings, order(downstream, business_table, permanent="no"), key="dead")
    await eventually(lambda: status_is(store, "retried", Status.COMPLETED), what="retried done")
    await settle_all(broker, settings, dead_letters=1)
    await finished(consumer, broker, settings, dead_letters=1)
    assert await rows_of(db, business_table) == ["retried"]  # attempts 1 and 2 rolled back
    assert len(await downstream.drain()) == 1  # staged by each attempt, committed by one
    record = await store.get("dead")
    assert record is not None
    assert record.status is Status.FAILED
    (letter,) = await broker.dead_letters(settings)
    assert letter.reason == "permanent-error"


async def test_a_plain_function_handler_is_refused_at_start_up(
    consumer_settings_tx: SettingsFactory, broker: Broker
) -> None:
    settings = consumer_settings_tx(handler="tests.transactional.handlers:plain")
    consumer = InProcessConsumer(settings)
    with pytest.raises(SemelError) as info:
        await consumer.start(broker, settings)
    assert info.value.exit_code == 2
    assert str(info.value) == "SEMEL_TRANSACTIONAL: the handler must be an async function"


async def test_a_missing_outbox_table_is_reported_at_start_up(
    consumer_settings_tx: SettingsFactory, broker: Broker
) -> None:
    settings = consumer_settings_tx(outbox_table="t_never_migrated_outbox")
    consumer = InProcessConsumer(settings)
    with pytest.raises(SemelError) as info:
        await consumer.start(broker, settings)
    assert info.value.exit_code == 2
    assert "semel migrate" in str(info.value)
    assert await broker.depth(Topology(settings.queue).dead_letter_queue) == 0


def test_transactional_mode_needs_the_postgres_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEMEL_TRANSACTIONAL", "true")
    monkeypatch.setenv("SEMEL_STORE", "redis")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert (
        str(info.value) == "SEMEL_TRANSACTIONAL: needs SEMEL_STORE=postgres (SEMEL_STORE is redis)"
    )


async def test_a_delivery_meeting_a_locked_key_row_waits_in_the_conflict_queue(
    consumer_settings_tx: SettingsFactory,
    broker: Broker,
    store: Store,
    downstream: Downstream,
    db: AsyncConnection[Any],
    business_table: str,
) -> None:
    settings = consumer_settings_tx(conflict_delay=3.0)
    body = order(downstream, business_table)
    claim = await store.claim("k", fingerprint(body))
    assert await store.release("k", claim.fence)  # claimable, but its row is locked below
    consumer = await start(settings, broker)
    conflicts = Topology(settings.queue).conflict_queue
    async with sampling(settings) as sampler, db.transaction():
        table = sql.Identifier(settings.postgres_table)
        lock = sql.SQL("SELECT 1 FROM {} WHERE key = %s FOR UPDATE").format(table)
        await db.execute(lock, (store.config.namespaced("k"),))
        await broker.publish(settings, body, key="k")

        # A worker takes it from the conflict queue at once and holds it until due.
        async def parked() -> bool:
            return sampler.saw(conflicts) >= 1

        await eventually(parked, 5, "the delivery parked in the conflict queue")
    await eventually(lambda: status_is(store, "k", Status.COMPLETED), 10, "'k' completed later")
    await settle_all(broker, settings, dead_letters=0)
    await finished(consumer, broker, settings, dead_letters=0)
    assert await rows_of(db, business_table) == ["k"]
