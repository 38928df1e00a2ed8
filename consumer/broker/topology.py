"""Declaring semel's exchanges and queues, idempotently, at start-up.

Delay queues use a queue-level TTL (a per-message TTL would block the head of
the queue behind a longer one) and dead-letter back to the work queue through
the default exchange by queue name, so other queues bound to the producers'
exchange never see a retry. Quorum queues dead-letter at-least-once, which
needs ``x-overflow=reject-publish``; no dead-lettering step can then drop a
message.

The work queue's delivery limit is declared (``names.DELIVERY_LIMIT``) so 3.x
and 4.x agree. A queue that an earlier semel declared without one is used as
it is, with a warning: refusing it would force operators to drain and
re-create a live work queue, and the pipeline's detour (``names.
RETURNS_BEFORE_DETOUR``) keeps deliveries clear of RabbitMQ 4's default limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aio_pika
import structlog
from aio_pika.abc import AbstractConnection
from aiormq.exceptions import ChannelPreconditionFailed

from consumer.errors import TopologyMismatch
from consumer.names import DEFAULT_EXCHANGE, DELIVERY_LIMIT, DLQ_ROUTING_KEY, Topology

DELIVERY_LIMIT_ARG = "x-delivery-limit"

log = structlog.get_logger("semel.topology")


@dataclass(frozen=True, slots=True)
class TopologySpec:
    """What the topology is declared from (``SEMEL_QUEUE``, ``SEMEL_EXCHANGE``, ...)."""

    queue: str
    exchange: str
    binding_keys: tuple[str, ...] = ("#",)
    quorum: bool = True
    retry_delays: tuple[float, ...] = (1.0, 5.0, 30.0, 120.0)
    conflict_delay: float = 5.0

    @property
    def names(self) -> Topology:
        return Topology(self.queue)


@dataclass(frozen=True, slots=True)
class QueueSpec:
    name: str
    arguments: dict[str, Any]
    exchange: str  # the exchange it is bound to
    routing_keys: tuple[str, ...]
    # Arguments an existing queue may lack (declared by an earlier semel).
    may_lack: tuple[str, ...] = ()

    def lacks_only_optional(self, reply: str) -> bool:
        """Whether the broker refused the declaration only because the existing
        queue has no value for one of ``may_lack``."""
        return reply.endswith("current is none") and any(
            f"arg '{arg}'" in reply for arg in self.may_lack
        )


def _queue_args(spec: TopologySpec, **extra: Any) -> dict[str, Any]:
    args: dict[str, Any] = {"x-queue-type": "quorum" if spec.quorum else "classic"}
    if spec.quorum and "x-dead-letter-exchange" in extra:
        args |= {"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"}
    return args | extra


def _delay_queue(spec: TopologySpec, name: str, ttl_s: float, routing_key: str) -> QueueSpec:
    return QueueSpec(
        name=name,
        arguments=_queue_args(
            spec,
            **{
                "x-message-ttl": int(ttl_s * 1000),
                "x-dead-letter-exchange": DEFAULT_EXCHANGE,
                "x-dead-letter-routing-key": spec.queue,
            },
        ),
        exchange=spec.names.retry_exchange,
        routing_keys=(routing_key,),
    )


def queue_specs(spec: TopologySpec) -> list[QueueSpec]:
    """Every queue semel declares, in declaration order (targets first)."""
    names = spec.names
    # A NACK without requeue is an in-progress conflict: it waits in the
    # conflict queue and comes back.
    work_args: dict[str, Any] = {
        "x-dead-letter-exchange": names.retry_exchange,
        "x-dead-letter-routing-key": names.conflict_routing_key,
    }
    if spec.quorum:  # classic queues have no delivery limit
        work_args[DELIVERY_LIMIT_ARG] = DELIVERY_LIMIT
    work = QueueSpec(
        name=spec.queue,
        arguments=_queue_args(spec, **work_args),
        exchange=spec.exchange,
        routing_keys=spec.binding_keys,
        may_lack=(DELIVERY_LIMIT_ARG,) if spec.quorum else (),
    )
    tiers = [
        _delay_queue(spec, names.tier_queue(d), d, names.tier_routing_key(d))
        for d in dict.fromkeys(spec.retry_delays)
    ]
    conflict = _delay_queue(
        spec, names.conflict_queue, spec.conflict_delay, names.conflict_routing_key
    )
    dlq = QueueSpec(
        name=names.dead_letter_queue,
        arguments=_queue_args(spec),
        exchange=names.dead_letter_exchange,
        routing_keys=(DLQ_ROUTING_KEY,),
    )
    return [work, conflict, *tiers, dlq]


async def _declare_queue(connection: AbstractConnection, spec: QueueSpec) -> None:
    # A precondition failure closes the channel, so each attempt gets its own.
    channel = await connection.channel()
    try:
        try:
            queue = await channel.declare_queue(spec.name, durable=True, arguments=spec.arguments)
        except ChannelPreconditionFailed as exc:
            if not spec.lacks_only_optional(_reply_text(exc)):
                raise TopologyMismatch(f"queue {spec.name!r}: {_reply_text(exc)}") from None
            # The broker names the first difference only: the rest must still match.
            rest = {k: v for k, v in spec.arguments.items() if k not in spec.may_lack}
            channel = await connection.channel()
            try:
                queue = await channel.declare_queue(spec.name, durable=True, arguments=rest)
            except ChannelPreconditionFailed as again:
                raise TopologyMismatch(f"queue {spec.name!r}: {_reply_text(again)}") from None
            log.warning(
                "queue declared without a delivery limit; using it as it is",
                queue=spec.name,
                wanted={arg: spec.arguments[arg] for arg in spec.may_lack},
                hint="RabbitMQ 4 applies its default limit of 20 there; set a "
                "delivery-limit policy or re-create the queue to make it explicit",
            )
        for key in spec.routing_keys:
            await queue.bind(spec.exchange, routing_key=key)
    finally:
        if not channel.is_closed:
            await channel.close()


def _reply_text(exc: ChannelPreconditionFailed) -> str:
    # aiormq carries the broker's reply text (which names the argument) in args.
    text = " ".join(str(a) for a in exc.args if a)
    return text.removeprefix("PRECONDITION_FAILED - ") or "declared with different arguments"


async def declare(connection: AbstractConnection, spec: TopologySpec) -> None:
    """Declare exchanges, queues and bindings; safe to run any number of times.

    Raises :class:`TopologyMismatch` naming the queue and argument when an
    existing queue was declared differently.
    """
    names = spec.names
    channel = await connection.channel()
    try:
        exchanges = [
            (spec.exchange, aio_pika.ExchangeType.TOPIC),
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
    for queue in reversed(queue_specs(spec)):
        await _declare_queue(connection, queue)
