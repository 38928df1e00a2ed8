"""The outbox relay on the real servers: confirmed, marked sent once, never twice
across relays, refused rows set aside, a crash before the commit re-sends with the same id."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel
from psycopg import AsyncConnection

from semel.consumer.names import IDEMPOTENCY_HEADER
from semel.consumer.outbox.relay import Relay
from semel.stores.base import JSON
from semel.stores.postgres.outbox import Outbox, OutboxMessage
from semel.stores.postgres.transactional import TransactionalStore
from tests.conftest import StoreFactory
from tests.transactional.conftest import Downstream, rows

pytestmark = pytest.mark.timeout(60)

FP = "f" * 64


@pytest.fixture
async def relay_channel(rabbitmq_server: str) -> AsyncIterator[AbstractChannel]:
    connection = await aio_pika.connect_robust(rabbitmq_server)
    try:
        yield await connection.channel(publisher_confirms=True, on_return_raises=True)
    finally:
        await connection.close()


async def commit_messages(
    store: TransactionalStore, key: str, exchange: str, routing_keys: list[str]
) -> list[str]:
    """Claim ``key`` and commit a unit that staged one message per routing key."""
    claim = await store.claim(key, FP)
    ids: list[str] = []

    async def work(conn: AsyncConnection[Any], outbox: Outbox) -> JSON:
        for n, routing_key in enumerate(routing_keys):
            ids.append(outbox.stage(exchange, routing_key, {"key": key, "n": n}, {"x-n": n}))
        return None

    await store.run_unit(key, claim.fence, work)
    return ids


async def test_a_pass_publishes_persistent_messages_with_stable_ids_and_marks_them_sent(
    make_store: StoreFactory, relay_channel: AbstractChannel, downstream: Downstream
) -> None:
    store = await make_store()
    assert isinstance(store, TransactionalStore)
    ids = await commit_messages(store, "k", downstream.exchange, ["order.a", "order.b"])
    assert await Relay(store, relay_channel).relay_once() == 2
    assert await store.unsent() == 0
    messages = await downstream.drain()
    assert [m.message_id for m in messages] == ids  # in commit order
    for n, message in enumerate(messages):
        assert message.headers[IDEMPOTENCY_HEADER] == message.message_id
        assert message.headers["x-n"] == n
        assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
        assert message.content_type == "application/json"
        assert message.body == b'{"key":"k","n":%d}' % n
    assert await Relay(store, relay_channel).relay_once() == 0  # nothing is sent twice


async def test_relays_of_several_processes_never_send_a_row_twice(
    make_store: StoreFactory, relay_channel: AbstractChannel, downstream: Downstream
) -> None:
    stores = [await make_store() for _ in range(3)]
    assert all(isinstance(s, TransactionalStore) for s in stores)
    first = stores[0]
    assert isinstance(first, TransactionalStore)
    for i in range(20):
        await commit_messages(first, f"k{i}", downstream.exchange, ["order.x"] * 10)
    relays = [Relay(s, relay_channel, batch=7) for s in stores if isinstance(s, TransactionalStore)]

    async def drain(relay: Relay) -> int:
        taken = 0
        while batch := await relay.relay_once():
            taken += batch
        return taken

    taken = await asyncio.gather(*(drain(relay) for relay in relays))
    assert sum(taken) == 200
    assert all(t > 0 for t in taken), taken  # they really ran side by side
    copies = Counter(m.message_id for m in await downstream.drain())
    assert len(copies) == 200
    assert set(copies.values()) == {1}


async def test_a_refused_message_waits_and_the_others_go(
    make_store: StoreFactory,
    relay_channel: AbstractChannel,
    downstream: Downstream,
    db: AsyncConnection[Any],
    outbox_table: str,
) -> None:
    store = await make_store()
    assert isinstance(store, TransactionalStore)
    await commit_messages(store, "k", downstream.exchange, ["order.ok", "nowhere", "order.ok"])
    assert await Relay(store, relay_channel).relay_once() == 3
    assert len(await downstream.drain()) == 2
    state = await rows(
        db,
        "SELECT routing_key, attempts, last_error, sent_at IS NOT NULL,"
        " next_attempt_at > now() FROM {} ORDER BY id",
        outbox_table,
    )
    assert state[1][:2] == ("nowhere", 1)
    assert "unroutable" in state[1][2]
    assert state[1][3:] == (False, True)  # unsent, and backing off
    assert [s[3] for s in (state[0], state[2])] == [True, True]
    assert await Relay(store, relay_channel).relay_once() == 0  # not due yet
    assert await store.unsent() == 1


async def test_a_missing_exchange_is_refused_and_the_relay_carries_on(
    make_store: StoreFactory, relay_channel: AbstractChannel, downstream: Downstream
) -> None:
    store = await make_store()
    assert isinstance(store, TransactionalStore)
    await commit_messages(store, "gone", "no-such-exchange-for-semel-tests", ["order.x"])
    assert await Relay(store, relay_channel).relay_once() == 1
    ids = await commit_messages(store, "k", downstream.exchange, ["order.x"])

    async def sent() -> bool:
        await Relay(store, relay_channel).relay_once()
        return await store.unsent() == 1

    deadline = time.monotonic() + 10
    while not await sent():
        assert time.monotonic() < deadline, "the relay did not recover its channel"
        await asyncio.sleep(0.1)
    assert [m.message_id for m in await downstream.drain()] == ids


async def test_a_relay_dying_before_its_commit_sends_again_with_the_same_id(
    make_store: StoreFactory, relay_channel: AbstractChannel, downstream: Downstream
) -> None:
    store = await make_store()
    assert isinstance(store, TransactionalStore)
    ids = await commit_messages(store, "k", downstream.exchange, ["order.x"])
    relay = Relay(store, relay_channel)

    async def publish_then_die(rows: list[OutboxMessage]) -> dict[int, str | None]:
        await relay._publish(rows)
        raise ConnectionError("killed between the confirm and the commit")

    with pytest.raises(ConnectionError):
        await store.relay(10, publish_then_die)
    assert await store.unsent() == 1
    assert await relay.relay_once() == 1
    copies = [m.message_id for m in await downstream.drain()]
    assert copies == ids * 2  # a duplicate copy, recognisable by its id


async def test_the_running_relay_wakes_on_a_commit(
    make_store: StoreFactory, relay_channel: AbstractChannel, downstream: Downstream
) -> None:
    store = await make_store()
    assert isinstance(store, TransactionalStore)
    relay = Relay(store, relay_channel, poll=60.0)  # only a commit can wake it in time
    task = asyncio.create_task(relay.run())
    try:
        await asyncio.sleep(0.2)  # idle now
        started = time.monotonic()
        ids = await commit_messages(store, "k", downstream.exchange, ["order.x"])
        while await store.unsent():
            assert time.monotonic() - started < 5, "the commit did not wake the relay"
            await asyncio.sleep(0.02)
    finally:
        with contextlib.suppress(Exception):
            await relay.stop(task)
    assert task.done()
    assert [m.message_id for m in await downstream.drain()] == ids
