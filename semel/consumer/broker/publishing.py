"""The one confirmed publish: every message semel sends goes through here.

Retry copies, dead letters, outbox rows, DLQ replays and test traffic are all
published persistent, with ``mandatory`` (an unroutable message comes back
instead of vanishing) on a publisher-confirm channel, and awaited until the
broker confirms, refuses or the timeout passes. Only a confirmed message is
the broker's responsibility; the caller decides what the other answers mean.
"""

from __future__ import annotations

import asyncio
from enum import StrEnum

import aio_pika
import structlog
from aio_pika.abc import AbstractExchange
from aiormq.exceptions import AMQPError, DeliveryError, PublishError
from pamqp.commands import Basic

from semel.consumer.names import CONFIRM_TIMEOUT

# Raised when the channel or connection is gone or the confirm never came:
# the message may or may not have reached the broker.
BROKER_TROUBLE = (AMQPError, ConnectionError, RuntimeError, asyncio.TimeoutError)

log = structlog.get_logger("semel.publish")


class Published(StrEnum):
    """What the broker answered to one publish."""

    CONFIRMED = "confirmed"  # the broker took responsibility for it
    RETURNED = "returned"  # unroutable: no queue is bound for its routing key
    NACKED = "nacked"  # the broker refused it (basic.nack)


async def publish_confirmed(
    exchange: AbstractExchange,
    message: aio_pika.Message,
    routing_key: str,
) -> Published:
    """Publish ``message`` persistent and mandatory; the broker's answer.

    ``exchange`` must be on a channel with publisher confirms. Raises one of
    :data:`BROKER_TROUBLE` when no answer came.
    """
    message.delivery_mode = aio_pika.DeliveryMode.PERSISTENT
    try:
        # The outer bound also covers a robust channel waiting for a reconnect.
        answer = await asyncio.wait_for(
            exchange.publish(message, routing_key, mandatory=True, timeout=CONFIRM_TIMEOUT),
            CONFIRM_TIMEOUT,
        )
    except PublishError:  # returned, on a channel opened with on_return_raises
        return Published.RETURNED
    except DeliveryError:
        return Published.NACKED
    # A channel without on_return_raises hands a returned message back as the answer.
    return Published.CONFIRMED if isinstance(answer, Basic.Ack) else Published.RETURNED


async def publish_copy(
    exchange: AbstractExchange, copy: aio_pika.Message, routing_key: str
) -> bool:
    """Publish a copy of a delivery in hand; whether the broker confirmed it.

    Anything but a confirm is logged and answered ``False``: the caller keeps
    the original (it is never ACKed without its copy).
    """
    try:
        published = await publish_confirmed(exchange, copy, routing_key)
    except BROKER_TROUBLE as exc:
        log.warning(
            "copy not confirmed", exchange=exchange.name, routing_key=routing_key, error=repr(exc)
        )
        return False
    if published is not Published.CONFIRMED:
        log.warning(
            "copy not taken", exchange=exchange.name, routing_key=routing_key, answer=published
        )
        return False
    return True
