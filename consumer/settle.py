"""Applying a settle decision to the broker: the only module that acks, nacks or re-publishes.

Retry copies and dead letters go out on a publisher-confirm channel with
``mandatory`` set, and the original is ACKed only after the broker confirmed
the copy. A copy that comes back unroutable, is NACKed by the broker or is not
confirmed in time leaves the original un-ACKed: it is handed back
(``nack(requeue=True)``), so a message is never in neither place.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import aio_pika
import structlog
from aio_pika.abc import AbstractChannel, AbstractExchange
from aiormq.exceptions import AMQPError
from pamqp.commands import Basic

from consumer.copies import Facts, dead_letter_copy, retry_copy
from consumer.decide import Ack, DeadLetter, NackToConflict, Requeue, Retry, Settle
from consumer.intake import Incoming
from consumer.names import Topology
from consumer.topology import DLQ_ROUTING_KEY

CONFIRM_TIMEOUT = 15.0  # seconds to wait for the broker's confirm of a copy
UNCONFIRMED_PAUSE = 1.0  # seconds before a delivery whose copy failed goes back
COPY_UNCONFIRMED = "requeued-copy-unconfirmed"  # the outcome when a copy failed
_BROKER_TROUBLE = (AMQPError, ConnectionError, RuntimeError, asyncio.TimeoutError)

log = structlog.get_logger("semel.settle")

AfterCopy = Callable[[], Awaitable[None]]


class Settler:
    """Acts on decisions for deliveries of the work queue."""

    def __init__(
        self,
        retry_exchange: AbstractExchange,
        dead_letter_exchange: AbstractExchange,
        names: Topology,
    ) -> None:
        self._retry_exchange = retry_exchange
        self._dead_letter_exchange = dead_letter_exchange
        self._names = names

    @classmethod
    async def open(cls, publisher: AbstractChannel, names: Topology) -> Settler:
        """``publisher`` must have publisher confirms on (aio-pika's default)."""
        retry = await publisher.get_exchange(names.retry_exchange, ensure=False)
        dead = await publisher.get_exchange(names.dead_letter_exchange, ensure=False)
        return cls(retry, dead, names)

    async def apply(
        self,
        message: Incoming,
        decision: Settle,
        facts: Facts,
        *,
        after_copy: AfterCopy | None = None,
    ) -> str:
        """Settle ``message``; returns what actually happened, for the log line.

        ``after_copy`` runs between the confirmed copy and the ACK: the store
        marks a key failed only once its dead letter is safe in the DLQ.
        """
        match decision:
            case Ack():
                return await _ack(message, decision.outcome)
            case NackToConflict():
                # The work queue's dead-letter exchange routes this to Q.retry.conflict.
                return await _nack(message, requeue=False, outcome=decision.outcome)
            case Requeue():
                return await _nack(message, requeue=True, outcome=decision.outcome)
            case Retry():
                copy = retry_copy(message, facts, decision)
                exchange, routing_key = (
                    self._retry_exchange,
                    self._names.tier_routing_key(decision.delay),
                )
            case DeadLetter():
                copy = dead_letter_copy(message, facts, decision)
                exchange, routing_key = self._dead_letter_exchange, DLQ_ROUTING_KEY
        if not await _publish_confirmed(exchange, copy, routing_key):
            # Held a moment before it goes back: an unroutable or refused copy
            # would otherwise loop between this worker and the broker.
            await asyncio.sleep(UNCONFIRMED_PAUSE)
            return await _nack(message, requeue=True, outcome=COPY_UNCONFIRMED)
        if after_copy is not None:
            await after_copy()
        return await _ack(message, decision.outcome)


async def _publish_confirmed(
    exchange: AbstractExchange, copy: aio_pika.Message, routing_key: str
) -> bool:
    try:
        # On a confirm channel opened with on_return_raises, an unroutable
        # copy raises PublishError and a broker NACK raises DeliveryError.
        # The outer bound also covers a robust channel waiting for a reconnect.
        confirm = await asyncio.wait_for(
            exchange.publish(copy, routing_key, mandatory=True, timeout=CONFIRM_TIMEOUT),
            CONFIRM_TIMEOUT,
        )
    except _BROKER_TROUBLE as exc:
        log.warning(
            "copy not confirmed", exchange=exchange.name, routing_key=routing_key, error=repr(exc)
        )
        return False
    if not isinstance(confirm, Basic.Ack):
        # A channel without on_return_raises hands the returned message back instead.
        log.warning("copy returned unroutable", exchange=exchange.name, routing_key=routing_key)
        return False
    return True


async def _ack(message: Incoming, outcome: str) -> str:
    try:
        await message.ack()
    except _BROKER_TROUBLE as exc:
        # The channel is gone: the broker redelivers, and the store recognises it.
        log.warning("ack not sent, left for redelivery", error=repr(exc))
        return f"{outcome}-ack-lost"
    return outcome


async def _nack(message: Incoming, *, requeue: bool, outcome: str) -> str:
    try:
        await message.nack(requeue=requeue)
    except _BROKER_TROUBLE as exc:
        log.warning("nack not sent, left for redelivery", error=repr(exc))
        return f"{outcome}-nack-lost"
    return outcome
