"""Declaring semel's exchanges and queues, idempotently, at start-up.

Delay queues use a queue-level TTL (a per-message TTL would block the head of
the queue behind a longer one) and dead-letter back to the work queue through
the default exchange by queue name, so other queues bound to the producers'
exchange never see a retry. Quorum queues dead-letter at-least-once, which
needs ``x-overflow=reject-publish``; no dead-lettering step can then drop a
message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractQueue
from aiormq.exceptions import ChannelPreconditionFailed

from consumer.names import Topology
from settings import QueueType, Settings

DEFAULT_EXCHANGE = ""
DLQ_ROUTING_KEY = "dlq"


class TopologyMismatch(Exception):
    """A queue or exchange exists with other arguments than semel declares."""


@dataclass(frozen=True, slots=True)
class QueueSpec:
    name: str
    arguments: dict[str, Any]
    exchange: str  # the exchange it is bound to
    routing_keys: tuple[str, ...]


def _queue_args(settings: Settings, **extra: Any) -> dict[str, Any]:
    args: dict[str, Any] = {"x-queue-type": settings.queue_type.value}
    if settings.queue_type is QueueType.QUORUM and "x-dead-letter-exchange" in extra:
        args |= {"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"}
    return args | extra


def _delay_queue(settings: Settings, name: str, ttl_s: float, routing_key: str) -> QueueSpec:
    names = Topology(settings.queue)
    return QueueSpec(
        name=name,
        arguments=_queue_args(
            settings,
            **{
                "x-message-ttl": int(ttl_s * 1000),
                "x-dead-letter-exchange": DEFAULT_EXCHANGE,
                "x-dead-letter-routing-key": settings.queue,
            },
        ),
        exchange=names.retry_exchange,
        routing_keys=(routing_key,),
    )


def queue_specs(settings: Settings) -> list[QueueSpec]:
    """Every queue semel declares, in declaration order (targets first)."""
    names = Topology(settings.queue)
    work = QueueSpec(
        name=settings.queue,
        # A NACK without requeue is an in-progress conflict: it waits in the
        # conflict queue and comes back.
        arguments=_queue_args(
            settings,
            **{
                "x-dead-letter-exchange": names.retry_exchange,
                "x-dead-letter-routing-key": names.conflict_routing_key,
            },
        ),
        exchange=settings.exchange,
        routing_keys=tuple(settings.binding_keys),
    )
    tiers = [
        _delay_queue(settings, names.tier_queue(d), d, names.tier_routing_key(d))
        for d in dict.fromkeys(settings.retry_delays)
    ]
    conflict = _delay_queue(
        settings, names.conflict_queue, settings.conflict_delay, names.conflict_routing_key
    )
    dlq = QueueSpec(
        name=names.dead_letter_queue,
        arguments=_queue_args(settings),
        exchange=names.dead_letter_exchange,
        routing_keys=(DLQ_ROUTING_KEY,),
    )
    return [work, conflict, *tiers, dlq]


async def _declare_queue(connection: AbstractConnection, spec: QueueSpec) -> None:
    # A precondition failure closes the channel, so each queue gets its own.
    channel = await connection.channel()
    try:
        try:
            queue = await channel.declare_queue(spec.name, durable=True, arguments=spec.arguments)
        except ChannelPreconditionFailed as exc:
            raise TopologyMismatch(f"queue {spec.name!r}: {_reply_text(exc)}") from None
        for key in spec.routing_keys:
            await queue.bind(spec.exchange, routing_key=key)
    finally:
        if not channel.is_closed:
            await channel.close()


def _reply_text(exc: ChannelPreconditionFailed) -> str:
    # aiormq carries the broker's reply text (which names the argument) in args.
    text = " ".join(str(a) for a in exc.args if a)
    return text.removeprefix("PRECONDITION_FAILED - ") or "declared with different arguments"


async def declare(connection: AbstractConnection, settings: Settings) -> None:
    """Declare exchanges, queues and bindings; safe to run any number of times.

    Raises :class:`TopologyMismatch` naming the queue and argument when an
    existing queue was declared differently.
    """
    names = Topology(settings.queue)
    channel = await connection.channel()
    try:
        exchanges = [
            (settings.exchange, aio_pika.ExchangeType.TOPIC),
            (names.retry_exchange, aio_pika.ExchangeType.DIRECT),
            (names.dead_letter_exchange, aio_pika.ExchangeType.DIRECT),
        ]
        for name, kind in exchanges:
            try:
                await channel.declare_exchange(name, kind, durable=True)
            except ChannelPreconditionFailed as exc:
                raise TopologyMismatch(f"exchange {name!r}: {_reply_text(exc)}") from None
    finally:
        if not channel.is_closed:
            await channel.close()
    for spec in reversed(queue_specs(settings)):
        await _declare_queue(connection, spec)


async def passive_queue(channel: AbstractChannel, name: str) -> AbstractQueue:
    """Look a queue up without declaring it (raises if it does not exist)."""
    return await channel.get_queue(name, ensure=True)
