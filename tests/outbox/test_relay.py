"""A relay on the real servers: woken by NOTIFY (and only by the sweep without it), its
listener outliving a lost connection, stable message ids, per-key order around a
refused row, the purge of sent rows, a missing table stopping start-up."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import psycopg
import pytest
from aio_pika.abc import AbstractConnection
from psycopg import sql

from semel import Semel
from semel.consumer.names import IDEMPOTENCY_HEADER
from semel.consumer.outbox.relay import Relay
from semel.consumer.outbox.runner import RelayOptions, RunningRelay, running_relay
from semel.consumer.outbox.source import PostgresOutbox, open_outbox
from semel.consumer.outbox.writer import OutboxWriter
from semel.stores.errors import StoreMisconfigured
from semel.stores.postgres.outbox import Ordering, OutboxMessage
from tests.conftest import SettingsFactory
from tests.outbox.conftest import count_rows, eventually, received, stage_one
from tests.transactional.conftest import Downstream

pytestmark = pytest.mark.timeout(60)

LONG_SWEEP = 60.0  # only a notification can wake a relay in time


@pytest.fixture
async def source(postgres_server: str, table: str) -> AsyncIterator[PostgresOutbox]:
    opened = await open_outbox(dsn=postgres_server, table=table, retention=0.5)
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
async def broker(rabbitmq_server: str) -> AsyncIterator[AbstractConnection]:
    connection = await aio_pika.connect_robust(rabbitmq_server)
    try:
        yield connection
    finally:
        await connection.close()


@contextlib.asynccontextmanager
async def relay_of(
    source: PostgresOutbox, broker: AbstractConnection, **options: Any
) -> AsyncIterator[RunningRelay]:
    async with running_relay(source, broker, RelayOptions(source.outbox.table, **options)) as r:
        if r.listener is not None:
            await asyncio.wait_for(r.listener.listening.wait(), 10)
        await asyncio.sleep(0.2)  # its first pass is done: idle now
        yield r


async def test_a_notification_wakes_the_relay(
    postgres_server: str,
    source: PostgresOutbox,
    broker: AbstractConnection,
    writer: OutboxWriter,
    downstream: Downstream,
) -> None:
    async with relay_of(source, broker, dsn=postgres_server, sweep=LONG_SWEEP):
        started = time.monotonic()
        message_id = await stage_one(postgres_server, writer, "k")
        [message] = await received(downstream, 1, within=3.0)
        assert time.monotonic() - started < 3.0
    assert message.message_id == message_id
    assert message.headers[IDEMPOTENCY_HEADER] == "k"
    assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT


async def test_without_listen_the_sweep_finds_the_row(
    postgres_server: str,
    source: PostgresOutbox,
    broker: AbstractConnection,
    writer: OutboxWriter,
    downstream: Downstream,
    db: psycopg.AsyncConnection[Any],
    table: str,
) -> None:
    async with relay_of(source, broker, dsn=None, sweep=3.0) as running:
        assert running.listener is None
        await stage_one(postgres_server, writer, "k")
        await asyncio.sleep(1.0)
        assert await count_rows(db, table, "sent_at IS NULL") == 1  # nothing woke it
        await received(downstream, 1, within=4.0)


async def test_the_listener_survives_its_backend_terminated(
    postgres_server: str,
    source: PostgresOutbox,
    broker: AbstractConnection,
    writer: OutboxWriter,
    downstream: Downstream,
    db: psycopg.AsyncConnection[Any],
) -> None:
    async with relay_of(source, broker, dsn=postgres_server, sweep=LONG_SWEEP) as running:
        listener = running.listener
        assert listener is not None
        assert listener.pid is not None
        first = listener.pid
        await db.execute("SELECT pg_terminate_backend(%s)", (first,))

        async def listening_again() -> bool:
            return listener.listening.is_set() and listener.pid not in (None, first)

        await eventually(listening_again, 10.0, "the listener listening again")
        await stage_one(postgres_server, writer, "after")
        [message] = await received(downstream, 1, within=3.0)
    assert message.headers[IDEMPOTENCY_HEADER] == "after"


async def test_the_engine_relays_and_purges_what_it_sent(
    postgres_server: str,
    outbox_settings: SettingsFactory,
    downstream: Downstream,
    db: psycopg.AsyncConnection[Any],
    table: str,
) -> None:
    engine = Semel(outbox_settings(retention=1.0, lock_ttl=1.0))
    async with engine.relay():
        ids = [await stage_one(postgres_server, engine.outbox, f"k{i}") for i in range(3)]
        messages = await received(downstream, 3, within=5.0)
        assert [m.message_id for m in messages] == ids

        async def purged() -> bool:
            return await count_rows(db, table) == 0

        await eventually(purged, 10.0, "sent rows purged after retention", step=0.2)


async def test_a_missing_table_stops_start_up(
    postgres_server: str, broker: AbstractConnection, run_id: str
) -> None:
    missing = await open_outbox(dsn=postgres_server, table=f"t_{run_id}_never", retention=1.0)
    try:
        with pytest.raises(StoreMisconfigured, match="run `semel migrate`"):
            async with running_relay(missing, broker, RelayOptions(f"t_{run_id}_never")):
                pass
    finally:
        await missing.close()


async def test_a_row_is_published_again_under_the_same_id_after_a_crash(
    postgres_server: str,
    source: PostgresOutbox,
    broker: AbstractConnection,
    writer: OutboxWriter,
    downstream: Downstream,
) -> None:
    message_id = await stage_one(postgres_server, writer, "k")
    channel = await broker.channel(publisher_confirms=True, on_return_raises=True)
    relay = Relay(source, channel)

    async def publish_then_die(rows: list[OutboxMessage]) -> dict[int, str | None]:
        await relay._publish(rows)
        raise ConnectionError("killed between the confirm and the commit")

    with pytest.raises(ConnectionError):
        await source.relay(10, publish_then_die)
    assert await relay.relay_once() == 1
    copies = await received(downstream, 2, within=3.0)
    assert [m.message_id for m in copies] == [message_id, message_id]
    await channel.close()


@pytest.mark.parametrize("ordering", list(Ordering))
async def test_a_refused_row_blocks_its_key_in_per_key_order_only(
    ordering: Ordering,
    postgres_server: str,
    source: PostgresOutbox,
    broker: AbstractConnection,
    writer: OutboxWriter,
    downstream: Downstream,
    db: psycopg.AsyncConnection[Any],
    table: str,
) -> None:
    blocked = await stage_one(postgres_server, writer, "k1", routing_key="nowhere", group="k")
    after = await stage_one(postgres_server, writer, "k2", group="k")
    other = await stage_one(postgres_server, writer, "j1", group="j")
    channel = await broker.channel(publisher_confirms=True, on_return_raises=True)
    relay = Relay(source, channel, ordering=ordering)
    await relay.relay_once()
    first = [m.message_id for m in await downstream.drain()]
    if ordering is Ordering.OLDEST_FIRST:
        assert set(first) == {after, other}  # k2 overtook the refused k1
        return
    assert first == [other]
    assert await relay.relay_once() == 0  # k1 waits out its back-off, k2 waits for k1
    # The operator binds the routing key; the back-off ends.
    queue = await downstream.channel.get_queue(downstream.queue)
    await queue.bind(downstream.exchange, "nowhere")
    await db.execute(sql.SQL("UPDATE {} SET next_attempt_at = now()").format(sql.Identifier(table)))
    await relay.relay_once()
    assert [m.message_id for m in await downstream.drain()] == [blocked, after]
    await channel.close()
