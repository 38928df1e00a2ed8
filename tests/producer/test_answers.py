"""Each answer a publish can get, on the real broker (through a TCP proxy for the faults)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any, cast

import aio_pika
import pytest
from aio_pika.abc import AbstractConnection

from semel.consumer.delivery.message import KeySource
from semel.consumer.producer import NO_RETRY, Answer, Publisher, Retry
from tests.producer.conftest import ROUTING_KEY, Place, body_of, eventually
from tests.proxy import TcpProxy
from tests.servers import free_port

pytestmark = pytest.mark.timeout(60)

QUICK = Retry(attempts=2, first=0.01, longest=0.01)


@pytest.fixture
async def proxy(rabbitmq_port: int) -> AsyncIterator[TcpProxy]:
    proxy = await TcpProxy(rabbitmq_port, free_port()).start()
    try:
        yield proxy
    finally:
        await proxy.close()


def through(proxy: TcpProxy) -> str:
    # A heartbeat far off: the faults here are the proxy's, not a missed heartbeat.
    return f"amqp://guest:guest@127.0.0.1:{proxy.port}/?heartbeat=60"


async def test_a_routed_message_is_confirmed_persistent_json_and_keyed(place: Place) -> None:
    async with Publisher.connect(place.url, exchange=place.exchange) as publisher:
        receipt = await publisher.publish({"order": 42}, key="order-42", routing_key=ROUTING_KEY)
    assert receipt.ok
    assert (receipt.answer, receipt.attempts, receipt.error) == (Answer.CONFIRMED, 1, None)
    assert receipt.key == "order-42"
    assert uuid.UUID(receipt.message_id).version == 4  # assigned by semel
    (message,) = await place.taken(1)
    assert body_of(message) == {"order": 42}
    assert message.headers == {"Idempotency-Key": "order-42"}
    assert message.message_id == receipt.message_id
    assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
    assert message.content_type == "application/json"
    assert message.routing_key == ROUTING_KEY


async def test_bytes_go_as_they_are_and_a_given_message_id_is_kept(place: Place) -> None:
    async with Publisher.connect(place.url, exchange=place.exchange) as publisher:
        receipt = await publisher.publish(
            b"<order/>", key="o-1", routing_key="x", message_id="m-1", content_type="text/xml"
        )
    assert receipt.ok
    assert receipt.message_id == "m-1"
    (message,) = await place.taken(1)
    assert (message.body, message.content_type, message.message_id) == (
        b"<order/>",
        "text/xml",
        "m-1",
    )


async def test_no_queue_bound_is_returned_and_not_retried(
    place: Place, observer: AbstractConnection
) -> None:
    channel = await observer.channel()
    lonely = await channel.declare_exchange(f"t.pub.lonely.{uuid.uuid4().hex[:8]}", "topic")
    try:
        async with Publisher.connect(place.url, exchange=lonely.name, retry=QUICK) as publisher:
            receipt = await publisher.publish({"a": 1}, key="k-1", routing_key=ROUTING_KEY)
            assert (receipt.answer, receipt.attempts, receipt.ok) == (Answer.RETURNED, 1, False)
            # The channel is still good for the next one.
            other = await publisher.publish({"a": 2}, key="k-2", routing_key=ROUTING_KEY)
            assert other.answer is Answer.RETURNED
    finally:
        await lonely.delete()


async def test_a_full_queue_rejecting_publishes_is_nacked_after_the_retries(
    place: Place, observer: AbstractConnection
) -> None:
    channel = await observer.channel()
    full = await channel.declare_queue(
        f"t.pub.full.{uuid.uuid4().hex[:8]}",
        arguments={"x-max-length": 1, "x-overflow": "reject-publish"},
    )
    exchange = await channel.declare_exchange(f"t.pub.full.{uuid.uuid4().hex[:8]}", "topic")
    await full.bind(exchange, "#")
    try:
        async with Publisher.connect(place.url, exchange=exchange.name, retry=QUICK) as publisher:
            first = await publisher.publish({"n": 1}, key="k-1", routing_key=ROUTING_KEY)
            second = await publisher.publish({"n": 2}, key="k-2", routing_key=ROUTING_KEY)
            assert first.answer is Answer.CONFIRMED
            assert (second.answer, second.attempts) == (Answer.NACKED, 2)
            await full.purge()  # drained: the same message is taken now
            again = await publisher.publish(
                {"n": 2}, key="k-2", routing_key=ROUTING_KEY, message_id=second.message_id
            )
            assert again.ok
    finally:
        await full.delete(if_unused=False, if_empty=False)
        await exchange.delete()


async def test_a_link_gone_silent_times_out(place: Place, proxy: TcpProxy) -> None:
    opening = Publisher.connect(
        through(proxy), exchange=place.exchange, confirm_timeout=0.5, retry=NO_RETRY
    )
    async with opening as publisher:
        proxy.stall()
        receipt = await publisher.publish({"a": 1}, key="k-1", routing_key=ROUTING_KEY)
        assert (receipt.answer, receipt.attempts, receipt.ok) == (Answer.TIMED_OUT, 1, False)
        assert receipt.error == "TimeoutError"
        proxy.resume()


async def test_a_connection_lost_before_the_answer_fails_the_batch(
    place: Place, proxy: TcpProxy
) -> None:
    async with Publisher.connect(
        through(proxy), exchange=place.exchange, retry=NO_RETRY
    ) as publisher:
        proxy.stall()
        messages = [
            publisher.prepare({"n": n}, key=f"k-{n}", routing_key=ROUTING_KEY) for n in range(5)
        ]
        batch = asyncio.create_task(publisher.publish_prepared(messages, window=5))
        channel = await cast(Any, publisher.exchange).channel.get_underlay_channel()
        await eventually(lambda: unconfirmed(channel, 5), 10, "five publishes sent")
        await proxy.cut()
        receipts = await batch
    assert [r.answer for r in receipts] == [Answer.FAILED] * 5
    assert all(r.attempts == 1 and r.error for r in receipts)


async def unconfirmed(channel: object, count: int) -> bool:
    return len(getattr(channel, "confirmations", {})) == count


async def test_a_retry_after_a_lost_confirm_keeps_the_message_id(
    place: Place, proxy: TcpProxy
) -> None:
    retry = Retry(attempts=3, first=0.05, longest=0.05)
    async with Publisher.connect(through(proxy), exchange=place.exchange, retry=retry) as publisher:
        proxy.delay = 2.0  # the confirm is on its way back for two seconds
        sending = asyncio.create_task(
            publisher.publish({"order": 7}, key="order-7", routing_key=ROUTING_KEY)
        )
        await eventually(lambda: arrived(place), 10, "the first copy queued")
        proxy.delay = 0.0
        await proxy.cut()  # the confirm is lost with the connection
        await proxy.start()  # the robust connection comes back; the retry goes through
        receipt = await sending
    assert (receipt.answer, receipt.attempts) == (Answer.CONFIRMED, 2)
    first, copy = await place.taken(2)
    assert first.message_id == copy.message_id == receipt.message_id
    source = KeySource.parse("header:Idempotency-Key")
    keys = {source.extract(m.headers, m.message_id, body_of(m)) for m in (first, copy)}
    assert keys == {"order-7"}
    assert first.body == copy.body


async def arrived(place: Place) -> bool:
    return await place.depth() == 1
