"""The work queue's consumer: deliveries in, as :class:`AmqpDelivery` messages
(the pipeline's :class:`semel.consumer.delivery.message.Incoming`).

It consumes on the robust channel's AMQP channel itself rather than through
aio-pika's queue consumer, which builds a full ``IncomingMessage`` (every
property set through a checked ``__setattr__``) and one more task for each
delivery: about a tenth of a consumer's CPU, for properties the pipeline
mostly never reads. :class:`AmqpDelivery` reads them from the frame on demand.

What aio-pika's robust queue would otherwise do is done here: the channel
reopens by itself after a reconnect or a channel error, and its reopen
callback consumes again; a consumer the broker cancels (its queue deleted, a
quorum queue's leader moved) is consumed again after a pause, until it holds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import structlog
from aio_pika.abc import AbstractRobustChannel
from aio_pika.message import decode_timestamp
from aiormq.abc import AbstractChannel, DeliveredMessage
from pamqp.commands import Basic

from semel.consumer.backoff import Backoff
from semel.consumer.broker.acks import How, Settlements
from semel.consumer.errors import AlreadySettled
from semel.consumer.names import BROKER_CALL_TIMEOUT

RECONSUME_BACKOFF = (0.5, 5.0)  # first and longest pause before consuming again

log = structlog.get_logger("semel.intake")


class AmqpDelivery:
    """One delivery of the work queue, settled once on the channel it came on:
    by its own frame, or with ``settlements`` by that channel's next flush."""

    __slots__ = ("_message", "_properties", "_settled", "_settlements", "delivery_tag")

    def __init__(self, message: DeliveredMessage, settlements: Settlements | None = None) -> None:
        self._message = message
        self._settlements = settlements
        self._properties = message.header.properties
        self._settled = False
        if message.delivery_tag is None:  # only a basic.get of an empty queue has none
            raise ValueError("a delivery without a delivery tag")
        self.delivery_tag: int = message.delivery_tag

    body = property(lambda self: self._message.body)
    exchange = property(lambda self: self._message.exchange)
    routing_key = property(lambda self: self._message.routing_key)
    redelivered = property(lambda self: self._message.redelivered)

    @property
    def headers(self) -> dict[str, Any]:
        return self._properties.headers or {}

    @property
    def content_type(self) -> str | None:
        return self._properties.content_type

    @property
    def content_encoding(self) -> str | None:
        return self._properties.content_encoding

    @property
    def priority(self) -> int | None:
        return self._properties.priority

    @property
    def correlation_id(self) -> str | None:
        return self._properties.correlation_id

    @property
    def reply_to(self) -> str | None:
        return self._properties.reply_to

    @property
    def message_id(self) -> str | None:
        return self._properties.message_id

    @property
    def timestamp(self) -> datetime | None:
        return decode_timestamp(self._properties.timestamp)

    @property
    def type(self) -> str | None:
        return self._properties.message_type

    @property
    def app_id(self) -> str | None:
        return self._properties.app_id

    @property
    def channel_closed(self) -> bool:
        """Whether its channel is gone: the broker has the message back."""
        return bool(self._message.channel.is_closed)

    def _settle(self) -> AbstractChannel:
        if self._settled:
            raise AlreadySettled(f"delivery {self.delivery_tag} is settled already")
        self._settled = True
        return self._message.channel

    async def ack(self) -> None:
        channel = self._settle()
        if self._settlements is not None:
            self._settlements.settle(self.delivery_tag, How.ACK)
        else:
            await channel.basic_ack(self.delivery_tag)

    async def nack(self, *, requeue: bool = True) -> None:
        channel = self._settle()
        if self._settlements is not None:
            self._settlements.settle(self.delivery_tag, How.REQUEUE if requeue else How.DROP)
        else:
            await channel.basic_nack(self.delivery_tag, requeue=requeue)


Callback = Callable[[AmqpDelivery], Awaitable[None]]


class Intake:
    """The queue's consumer, attached and detached on demand, and kept attached."""

    def __init__(
        self,
        channel: AbstractRobustChannel,
        queue: str,
        callback: Callback,
        *,
        coalesce: bool = False,
    ) -> None:
        """``coalesce``: settle through the channel's :class:`Settlements`, which
        needs every delivery of the channel to come through this one intake."""
        self._channel = channel
        self._coalesce = coalesce
        self._settlements: Settlements | None = None
        self._queue = queue
        self._callback = callback
        self._wanted = False
        self._tag: str | None = None
        self._on: AbstractChannel | None = None  # the AMQP channel the tag lives on
        self._lock = asyncio.Lock()
        self._again: asyncio.Task[None] | None = None
        channel.reopen_callbacks.add(self._reopened)

    @property
    def consuming(self) -> bool:
        return self._tag is not None

    async def resume(self) -> None:
        """Consume from now on; raises if the broker refuses now (nothing is retried)."""
        self._wanted = True
        await self._attach()

    async def pause(self) -> None:
        self._wanted = False  # a pending consume-again sees it and stops
        try:
            # Bounded: an attach under way may be waiting for a reconnect; it
            # then sees _wanted and cancels what it attached itself.
            async with asyncio.timeout(BROKER_CALL_TIMEOUT), self._lock:
                await self._detach()
        except Exception as exc:  # the channel may be gone, or the cancel not answered
            log.debug("consumer cancel not sent", error=repr(exc))

    async def _detach(self) -> None:
        """Cancel the consumer; its tag is forgotten only once it is really gone
        (cancelled, or its channel closed), so a resume never adds a second one."""
        tag, on = self._tag, self._on
        if tag is not None and on is not None and not on.is_closed:
            await on.basic_cancel(tag)
        self._tag = None

    async def _attach(self) -> None:
        async with self._lock:
            if not self._wanted or self._tag is not None:
                return
            channel = await self._channel.get_underlay_channel()
            channel.on_consumer_cancel_callbacks.add(self._cancelled)
            if self._coalesce and (
                self._settlements is None or self._settlements.channel is not channel
            ):
                self._settlements = Settlements(channel)
            ok = await channel.basic_consume(self._queue, self._deliver, no_ack=False)
            self._tag, self._on = ok.consumer_tag, channel
            if not self._wanted:  # paused while the consume was on its way
                await self._detach()

    async def _deliver(self, message: DeliveredMessage) -> None:
        settlements = self._settlements
        if settlements is not None and settlements.channel is message.channel:
            delivery = AmqpDelivery(message, settlements)
            settlements.delivered(delivery.delivery_tag)
        else:
            delivery = AmqpDelivery(message)
        await self._callback(delivery)

    async def settled(self) -> None:
        """Wait until every settlement made so far is handed to the connection:
        before the channel is closed, or they would be lost with it."""
        if self._settlements is not None:
            await self._settlements.sent()

    def _reopened(self, _channel: Any) -> None:
        # The old channel is closed, and its consumer with it, unless an
        # attach got in on the new channel first. Not awaited here: this runs
        # inside the robust channel's own restore.
        if self._on is None or self._on.is_closed:
            self._tag = None
        if self._tag is None:
            self._consume_again(pause=False)

    def _cancelled(self, frame: Basic.Cancel) -> None:
        # Runs in the channel's frame reader: must not wait on the channel.
        if frame.consumer_tag is None or frame.consumer_tag != self._tag:
            return
        self._tag = None
        log.warning("broker cancelled the consumer, consuming again", queue=self._queue)
        self._consume_again(pause=True)

    def _consume_again(self, *, pause: bool) -> None:
        if self._wanted and (self._again is None or self._again.done()):
            self._again = asyncio.create_task(self._retry_attach(pause))

    async def _retry_attach(self, pause: bool) -> None:
        backoff = Backoff(*RECONSUME_BACKOFF)
        while self._wanted and self._tag is None:
            if pause:
                await backoff.wait()
            pause = True
            try:
                await self._attach()
            except Exception as exc:  # a reconnect consumes again by itself too
                log.warning(
                    "consuming again failed, retrying", error=repr(exc), retry_in=backoff.pause
                )
