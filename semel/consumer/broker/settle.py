"""Settling deliveries of the work queue: the only place that acks, nacks or re-publishes them.

Parked and retry copies and dead letters go out through the one confirmed publish
(:func:`semel.consumer.broker.publishing.publish_confirmed`), and the original is
ACKed only after the broker confirmed the copy. A copy that comes back
unroutable, is NACKed by the broker or is not confirmed in time leaves the
original un-ACKed: it is handed back (``nack(requeue=True)``), so a message
is never in neither place. No hop is left to the broker's dead-lettering: an
in-progress conflict is parked in ``Q.retry.conflict`` as a confirmed copy
too. The pipeline decides the order; this module only carries out each step.
"""

from __future__ import annotations

import asyncio
from typing import Self

import structlog
from aio_pika.abc import AbstractChannel, AbstractExchange

from semel.consumer.broker.copies import dead_letter_copy, parked_copy, retry_copy
from semel.consumer.broker.publishing import BROKER_TROUBLE, publish_copy
from semel.consumer.delivery.decide import (
    Applied,
    Copied,
    Detour,
    NackToConflict,
    Outcome,
    Requeue,
    Retry,
    Settle,
)
from semel.consumer.delivery.facts import Facts
from semel.consumer.delivery.message import Incoming
from semel.consumer.names import DLQ_ROUTING_KEY, Topology

UNCONFIRMED_PAUSE = 1.0  # seconds before a delivery whose copy failed goes back

log = structlog.get_logger("semel.settle")


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
    async def open(cls, publisher: AbstractChannel, names: Topology) -> Self:
        """``publisher`` must have publisher confirms on (aio-pika's default)."""
        retry = await publisher.get_exchange(names.retry_exchange, ensure=False)
        dead = await publisher.get_exchange(names.dead_letter_exchange, ensure=False)
        return cls(retry, dead, names)

    async def copy(self, message: Incoming, decision: Copied, facts: Facts) -> bool:
        """Publish the retry copy or dead letter of ``message``; whether it was confirmed."""
        if isinstance(decision, Retry):
            copy = retry_copy(message, facts, decision)
            exchange = self._retry_exchange
            routing_key = self._names.tier_routing_key(decision.delay)
        elif isinstance(decision, Detour):
            return await self.park(message)
        else:
            copy = dead_letter_copy(message, facts, decision)
            exchange, routing_key = self._dead_letter_exchange, DLQ_ROUTING_KEY
        return await publish_copy(exchange, copy, routing_key)

    async def park(self, message: Incoming) -> bool:
        """Publish a fresh copy of ``message`` to ``Q.retry.conflict``; whether it was confirmed."""
        copy = parked_copy(message, self._names.queue)
        return await publish_copy(self._retry_exchange, copy, self._names.conflict_routing_key)

    async def finish(self, message: Incoming, decision: Settle) -> Applied:
        """Ack or nack ``message`` as ``decision`` says; a copied one is acked."""
        match decision:
            case NackToConflict():
                if not await self.park(message):
                    # Handed back instead of parked: the outcome is still the
                    # conflict's (in progress, fenced out, lease lost), which
                    # says why the handler did not complete.
                    return await self.give_back(message, decision.outcome)
                return await _ack(message, decision.outcome)
            case Requeue():
                return await _nack(message, decision.outcome, requeue=True)
            case _:  # Ack, or a Retry / DeadLetter whose copy the broker confirmed
                return await _ack(message, decision.outcome)

    async def give_back(
        self, message: Incoming, outcome: Outcome = Outcome.COPY_UNCONFIRMED
    ) -> Applied:
        """Hand ``message`` back after its copy failed, a moment later: an unroutable
        or refused copy would otherwise loop between this worker and the broker."""
        await asyncio.sleep(UNCONFIRMED_PAUSE)
        return await _nack(message, outcome, requeue=True)


async def _ack(message: Incoming, outcome: Outcome) -> Applied:
    try:
        await message.ack()
    except BROKER_TROUBLE as exc:
        # The channel is gone: the broker redelivers, and the store recognises it.
        log.warning("ack not sent, left for redelivery", error=repr(exc))
        return Applied(outcome, "ack", sent=False)
    return Applied(outcome, "ack")


async def _nack(message: Incoming, outcome: Outcome, *, requeue: bool) -> Applied:
    try:
        await message.nack(requeue=requeue)
    except BROKER_TROUBLE as exc:
        log.warning("nack not sent, left for redelivery", error=repr(exc))
        return Applied(outcome, "nack", sent=False)
    return Applied(outcome, "nack")
