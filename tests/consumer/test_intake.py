"""The work queue's consumer on the real broker: settles once, and keeps consuming
through a channel error, a consumer cancelled by the broker, and a pause."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, cast

import aio_pika
import pytest
from aio_pika.abc import AbstractRobustChannel, AbstractRobustConnection
from aio_pika.message import IncomingMessage
from aiormq.abc import AbstractChannel, DeliveredMessage
from aiormq.exceptions import ChannelInvalidStateError
from pamqp.commands import Basic
from pamqp.header import ContentHeader

from semel.consumer.broker import intake as intake_module
from semel.consumer.broker.copies import copy_message
from semel.consumer.broker.intake import AmqpDelivery, Intake
from semel.consumer.errors import AlreadySettled
from tests.consumer.harness import eventually

pytestmark = pytest.mark.timeout(60)


class Received:
    """What the intake handed over, awaitable one at a time."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[AmqpDelivery] = asyncio.Queue()

    async def __call__(self, message: AmqpDelivery) -> None:
        await self.queue.put(message)

    async def next(self) -> AmqpDelivery:
        return await asyncio.wait_for(self.queue.get(), 15)


@pytest.fixture
async def connection(rabbitmq_server: str) -> AsyncIterator[AbstractRobustConnection]:
    connection = await aio_pika.connect_robust(rabbitmq_server, reconnect_interval=0.2)
    yield connection
    await connection.close()


@pytest.fixture
async def queue(connection: AbstractRobustConnection) -> AsyncIterator[str]:
    name = f"t.intake.{uuid.uuid4().hex[:10]}"
    channel = await connection.channel()
    await channel.declare_queue(name, durable=True, arguments={"x-queue-type": "quorum"})
    yield name
    await channel.queue_delete(name)
    await channel.close()


async def publish(connection: AbstractRobustConnection, queue: str, body: bytes) -> None:
    channel = await connection.channel()
    await channel.default_exchange.publish(aio_pika.Message(body), routing_key=queue)
    await channel.close()


def holds(condition: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return condition()

    return check


async def started(
    connection: AbstractRobustConnection, queue: str
) -> tuple[AbstractRobustChannel, Intake, Received]:
    channel = await connection.channel()
    received = Received()
    intake = Intake(channel, queue, received)
    await intake.resume()
    return channel, intake, received


async def test_a_delivery_settles_once(connection: AbstractRobustConnection, queue: str) -> None:
    _, intake, received = await started(connection, queue)
    await publish(connection, queue, b"one")
    first = await received.next()
    assert first.body == b"one"
    await first.ack()
    with pytest.raises(AlreadySettled):
        await first.nack(requeue=True)
    # Nothing was sent for the second settle: the channel, and the consumer, are intact.
    await publish(connection, queue, b"two")
    second = await received.next()
    assert second.body == b"two"
    await second.ack()
    await intake.pause()


async def test_a_channel_error_reopens_the_channel_and_consumes_again(
    connection: AbstractRobustConnection, queue: str
) -> None:
    channel, intake, received = await started(connection, queue)
    before = await channel.get_underlay_channel()
    await before.basic_ack(987654)  # an unknown tag: the broker closes the channel
    await eventually(holds(lambda: before.is_closed), what="the channel closed by the broker")
    await publish(connection, queue, b"after")
    message = await received.next()
    assert message.body == b"after"
    await message.ack()
    assert intake.consuming
    await intake.pause()


async def test_a_consumer_the_broker_cancels_consumes_again(
    connection: AbstractRobustConnection, queue: str
) -> None:
    _, intake, received = await started(connection, queue)
    admin = await connection.channel()
    await admin.queue_delete(queue)  # the broker cancels every consumer of it
    await eventually(holds(lambda: not intake.consuming), what="the consumer cancelled")
    await admin.declare_queue(queue, durable=True, arguments={"x-queue-type": "quorum"})
    await eventually(holds(lambda: intake.consuming), 20, "consuming again")
    await publish(connection, queue, b"back")
    message = await received.next()
    assert message.body == b"back"
    await message.ack()
    await intake.pause()
    await admin.close()


async def test_pause_detaches_and_resume_attaches(
    connection: AbstractRobustConnection, queue: str
) -> None:
    _, intake, received = await started(connection, queue)
    await intake.pause()

    async def consumers() -> int:
        probe = await connection.channel()
        declared = await probe.declare_queue(queue, passive=True)
        await probe.close()
        return int(declared.declaration_result.consumer_count or 0)

    assert await consumers() == 0
    await publish(connection, queue, b"held")
    await intake.resume()
    await eventually(lambda: _one(consumers), what="one consumer again")
    message = await received.next()
    assert message.body == b"held"
    await message.ack()
    await intake.pause()


async def _one(consumers: Callable[[], Awaitable[int]]) -> bool:
    return await consumers() == 1


def _delivered(**properties: Any) -> DeliveredMessage:
    return DeliveredMessage(
        delivery=Basic.Deliver(
            consumer_tag="c", delivery_tag=7, redelivered=True, exchange="ex", routing_key="rk"
        ),
        header=ContentHeader(properties=Basic.Properties(**properties)),
        body=b'{"a":1}',
        channel=cast(AbstractChannel, None),
    )


@pytest.mark.parametrize(
    "properties",
    [
        {},
        {
            "headers": {"Idempotency-Key": "k", "n": 1},
            "content_type": "application/json",
            "content_encoding": "utf-8",
            "priority": 3,
            "correlation_id": "c-1",
            "reply_to": "r",
            "message_id": "m-1",
            "timestamp": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
            "message_type": "order.paid",
            "app_id": "shop",
            "user_id": "guest",
            "expiration": "60000",
        },
    ],
)
def test_inbound_reads_what_aio_pika_reads(properties: dict[str, Any]) -> None:
    delivered = _delivered(**properties)
    ours, theirs = AmqpDelivery(delivered), IncomingMessage(delivered)
    for name in (
        "body", "headers", "exchange", "routing_key", "delivery_tag", "redelivered",
        "content_type", "content_encoding", "correlation_id", "reply_to",
        "message_id", "timestamp", "type", "app_id",
    ):  # fmt: skip
        assert getattr(ours, name) == getattr(theirs, name), name
    # aio-pika reads an absent priority as 0; a copy carries 0 either way.
    assert ours.priority == properties.get("priority")
    copied = copy_message(ours, {"h": 1}).properties
    assert copied == copy_message(theirs, {"h": 1}).properties


async def test_a_reopen_finding_the_consumer_on_the_new_channel_adds_none(
    connection: AbstractRobustConnection, queue: str
) -> None:
    # An attach can land on the reopened channel before the reopen callback
    # runs; a second consumer there would outlive a pause.
    channel, intake, received = await started(connection, queue)
    intake._reopened(channel)  # as the robust channel calls it
    await asyncio.sleep(0)  # a consume-again task would start here
    await intake.pause()
    await publish(connection, queue, b"held")
    probe = await connection.channel()
    declared = await probe.declare_queue(queue, passive=True)
    await probe.close()
    assert declared.declaration_result.message_count == 1
    assert received.queue.empty()


async def _consumers(connection: AbstractRobustConnection, queue: str) -> int:
    probe = await connection.channel()
    declared = await probe.declare_queue(queue, passive=True)
    await probe.close()
    return int(declared.declaration_result.consumer_count or 0)


async def test_a_consume_answered_after_a_pause_gave_up_is_cancelled(
    connection: AbstractRobustConnection, queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(intake_module, "BROKER_CALL_TIMEOUT", 0.2)
    channel = await connection.channel()
    underlay = await channel.get_underlay_channel()
    consume = underlay.basic_consume
    sent, answered = asyncio.Event(), asyncio.Event()

    async def slow_consume(*args: Any, **kwargs: Any) -> Any:
        sent.set()
        await asyncio.sleep(1.0)  # longer than the pause waits for the attach
        try:
            return await consume(*args, **kwargs)
        finally:
            answered.set()

    monkeypatch.setattr(underlay, "basic_consume", slow_consume)
    intake = Intake(channel, queue, Received())
    resuming = asyncio.create_task(intake.resume())
    await asyncio.wait_for(sent.wait(), 10)  # the attach is under way
    await intake.pause()  # gives up waiting for it after 0.2 s
    await asyncio.wait_for(answered.wait(), 10)
    await asyncio.wait_for(resuming, 10)
    assert not intake.consuming
    assert await _consumers(connection, queue) == 0, "a paused intake kept consuming"


async def test_a_cancel_that_failed_keeps_the_tag_so_resume_adds_no_second_consumer(
    connection: AbstractRobustConnection, queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    channel, intake, _ = await started(connection, queue)
    underlay = await channel.get_underlay_channel()
    cancel = underlay.basic_cancel
    failures = [TimeoutError("cancel not answered")]

    async def flaky_cancel(*args: Any, **kwargs: Any) -> Any:
        if failures:
            raise failures.pop()
        return await cancel(*args, **kwargs)

    monkeypatch.setattr(underlay, "basic_cancel", flaky_cancel)
    await intake.pause()  # the cancel fails: the broker still has the consumer
    await intake.resume()
    assert await _consumers(connection, queue) == 1, "resume attached a second consumer"
    await intake.pause()  # the cancel goes through this time
    assert await _consumers(connection, queue) == 0


async def test_settling_on_a_channel_that_closed_is_refused_and_the_connection_lives(
    connection: AbstractRobustConnection, queue: str
) -> None:
    channel, intake, received = await started(connection, queue)
    await publish(connection, queue, b"in flight")
    message = await received.next()
    underlay = await channel.get_underlay_channel()
    await underlay.basic_ack(999_999)  # an unknown tag: the broker closes this channel
    await eventually(holds(lambda: underlay.is_closed), what="the channel closed")
    with pytest.raises(ChannelInvalidStateError):  # refused here, never sent
        await message.ack()
    redelivered = await received.next()  # on the reopened channel, same connection
    assert redelivered.body == b"in flight"
    await redelivered.ack()
    assert not connection.is_closed
    await intake.pause()


async def _depth(connection: AbstractRobustConnection, queue: str) -> int:
    channel = await connection.channel()
    try:
        declared = await channel.declare_queue(queue, passive=True)
        count = declared.declaration_result.message_count
        assert count is not None
        return count
    finally:
        await channel.close()


async def test_coalesced_acks_on_the_broker_leave_exactly_the_unsettled(
    connection: AbstractRobustConnection, queue: str
) -> None:
    """200 deliveries, ACKed in a shuffled order in bursts, a few handed back and
    a few never settled: once the channel closes, the queue holds the handed-back
    and the unsettled, and nothing else."""
    publisher = await connection.channel()
    for n in range(200):
        await publisher.default_exchange.publish(aio_pika.Message(b"%d" % n), routing_key=queue)
    await publisher.close()

    got: list[AmqpDelivery] = []
    all_in = asyncio.Event()

    async def take(delivery: AmqpDelivery) -> None:
        got.append(delivery)
        if len(got) == 200:
            all_in.set()

    channel = await connection.channel()
    await channel.set_qos(prefetch_count=300)
    intake = Intake(channel, queue, take, coalesce=True)
    await intake.resume()
    await asyncio.wait_for(all_in.wait(), 30)
    # No consumer from here on: what is handed back stays in the queue.
    await intake.pause()
    rng = random.Random(7)
    order: list[Any] = list(got)
    rng.shuffle(order)
    kept, handed_back = order[:10], order[10:20]
    for n, delivery in enumerate(order[20:]):
        await delivery.ack()
        if n % 7 == 0:
            await asyncio.sleep(0)
    for delivery in handed_back:
        await delivery.nack(requeue=True)
    await intake.settled()

    async def ten_back() -> bool:
        return await _depth(connection, queue) == 10  # the handed back; ten still held

    await eventually(ten_back, 10.0, "the ten handed back in the queue")
    await channel.close()  # the ten held go back with the channel

    async def all_back() -> bool:
        return await _depth(connection, queue) == 20

    await eventually(all_back, 10.0, "the ten held back with the channel")
    assert len({d.body for d in kept + handed_back}) == 20
