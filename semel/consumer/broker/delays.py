"""The way back from the delay queues: every worker consumes ``Q.retry.conflict``
and ``Q.retry.<N>s`` and publishes each message back to Q when it is due.

Each delay queue has one delay, so its head is always the next one due: a
consumer holds what it is sent (at most ``names.DELAY_PREFETCH`` per queue)
until due, publishes a copy to Q (default exchange, persistent, mandatory,
confirmed) and ACKs the original only after the broker's confirm. A worker
killed at any point leaves the message in the delay queue, in Q, or in both
(a duplicate, which the store answers), never in neither.

When a message is due is read from ``x-semel-parked-at``, stamped at publish
by another worker's clock: the wait is bounded by the queue's delay, so a
clock ahead never holds a message longer than one delay, and a clock behind
returns it early at worst. A message without the stamp (parked by an earlier
semel) waits one delay from its arrival.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aio_pika
import structlog
from aio_pika.abc import AbstractRobustChannel, AbstractRobustConnection

from semel.consumer.backoff import Backoff
from semel.consumer.broker.copies import fresh_copy, returned_copy
from semel.consumer.broker.intake import AmqpDelivery, Intake
from semel.consumer.broker.publishing import BROKER_TROUBLE, publish_copy
from semel.consumer.broker.topology import TopologySpec
from semel.consumer.names import (
    BROKER_CALL_TIMEOUT,
    DELAY_PREFETCH,
    H_PARKED_AT,
    RETURNS_BEFORE_DETOUR,
    returns,
)

UNCONFIRMED_BACKOFF = (1.0, 10.0)  # between attempts to publish a due message's copy

log = structlog.get_logger("semel.delays")


@dataclass(frozen=True, slots=True)
class DelayQueue:
    name: str
    delay: float  # seconds


def delay_queues(spec: TopologySpec) -> list[DelayQueue]:
    """Every delay queue of ``spec``: the conflict queue and one per retry tier."""
    names = spec.names
    tiers = [DelayQueue(names.tier_queue(d), d) for d in dict.fromkeys(spec.retry_delays)]
    return [DelayQueue(names.conflict_queue, spec.conflict_delay), *tiers]


def due_in(headers: Mapping[str, Any], delay: float, now: float) -> float:
    """Seconds until a message parked with ``headers`` is due, from ``now`` (epoch
    seconds): never negative, never more than ``delay``."""
    stamp = headers.get(H_PARKED_AT)
    if isinstance(stamp, bool) or not isinstance(stamp, int):
        return delay
    return min(max(stamp / 1000 + delay - now, 0.0), delay)


class DelayReturns:
    """The consumers of one worker's delay queues, and the messages they hold."""

    def __init__(self, channel: AbstractRobustChannel, work_queue: str) -> None:
        self._channel = channel
        self._work_queue = work_queue
        self._intakes: list[Intake] = []
        self._held: set[asyncio.Task[None]] = set()
        self._sending: set[asyncio.Task[None]] = set()

    @classmethod
    async def start(cls, connection: AbstractRobustConnection, spec: TopologySpec) -> DelayReturns:
        """Consume every delay queue of ``spec`` from now on."""
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        assert isinstance(channel, AbstractRobustChannel)
        # Per consumer (not global): each delay queue gets its own window.
        await channel.set_qos(prefetch_count=DELAY_PREFETCH)
        returns_ = cls(channel, spec.queue)
        for queue in delay_queues(spec):
            intake = Intake(channel, queue.name, returns_._taker(queue))
            returns_._intakes.append(intake)
            await intake.resume()
        log.info("returning delayed messages", queues=[q.name for q in delay_queues(spec)])
        return returns_

    async def stop(self) -> None:
        """Stop consuming; what is held goes back to its delay queue with the channel.

        A copy already on its way (a due message, or a worn one's fresh copy) is
        given up to ``BROKER_CALL_TIMEOUT`` to be confirmed and its original acked:
        cut short, a worn message would go back with one more return, and at the
        delivery limit the broker drops it.
        """
        for intake in self._intakes:
            await intake.pause()
        for task in self._held:
            task.cancel()
        await asyncio.gather(*self._held, return_exceptions=True)
        if self._sending:
            await asyncio.wait(self._sending, timeout=BROKER_CALL_TIMEOUT)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._channel.close(), BROKER_CALL_TIMEOUT)

    def _taker(self, queue: DelayQueue) -> Callable[[AmqpDelivery], Awaitable[None]]:
        async def take(delivery: AmqpDelivery) -> None:
            await self._on_message(queue, delivery)

        return take

    async def _on_message(self, queue: DelayQueue, delivery: AmqpDelivery) -> None:
        # A task of our own: aiormq's delivery task must not wait out the delay.
        task = asyncio.create_task(self._hold(queue, delivery))
        self._held.add(task)
        task.add_done_callback(self._held.discard)

    async def _hold(self, queue: DelayQueue, delivery: AmqpDelivery) -> None:
        if returns(delivery.headers) >= RETURNS_BEFORE_DETOUR:
            # Handed back by crashed holders often: a fresh copy of it, stamp
            # kept, starts the broker's count again (names.DELIVERY_LIMIT).
            copy, routing_key = fresh_copy(delivery), queue.name
        else:
            await asyncio.sleep(due_in(delivery.headers, queue.delay, time.time()))
            if delivery.channel_closed:  # a reconnect meanwhile: redelivered on the new one
                return
            copy, routing_key = returned_copy(delivery), self._work_queue
        # Shielded: a stop cancels the waiting, never a copy on its way (see stop).
        sending = asyncio.create_task(self._send(queue, delivery, copy, routing_key))
        self._sending.add(sending)
        sending.add_done_callback(self._sending.discard)
        await asyncio.shield(sending)

    async def _send(
        self, queue: DelayQueue, delivery: AmqpDelivery, copy: aio_pika.Message, routing_key: str
    ) -> None:
        """Publish ``copy`` until confirmed, then ack the original."""
        exchange = self._channel.default_exchange
        backoff = Backoff(*UNCONFIRMED_BACKOFF)
        while not await publish_copy(exchange, copy, routing_key):
            if delivery.channel_closed:  # the broker has it back in the delay queue
                return
            await backoff.wait()
        try:
            await delivery.ack()
        except BROKER_TROUBLE as exc:
            # It comes back from the delay queue and goes to Q once more: a
            # duplicate, which the store answers.
            log.warning("delayed message ack not sent", queue=queue.name, error=repr(exc))
