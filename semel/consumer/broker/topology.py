"""Declaring semel's exchanges and queues, idempotently, at start-up.

The delay queues (``Q.retry.conflict``, ``Q.retry.<N>s``) have no TTL and no
dead-letter exchange: semel's workers consume them and publish each message
back to Q when it is due (:mod:`semel.consumer.broker.delays`), so no message waits
on the broker's dead-lettering, which strands messages under leader churn on
quorum queues and is at-most-once on classic ones. A delay queue an earlier
semel declared with a TTL and a dead-letter exchange is used as it is (its
``legacy`` arguments): the workers drain it the same way, and what its TTL
still expires reaches Q as before.

Q keeps its dead-letter exchange (to ``Q.retry.conflict``, at-least-once on
quorum queues): semel no longer rejects into it, but if the delivery limit
ever fired, a dead-lettered message is better than a dropped one.

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

from semel.consumer.errors import TopologyMismatch
from semel.consumer.names import DEFAULT_EXCHANGE, DELIVERY_LIMIT, DLQ_ROUTING_KEY, Topology

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
    # The arguments an earlier semel declared it with, if they differ: such a
    # queue is used as it is.
    legacy: dict[str, Any] | None = None

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
    # Held messages a crashed worker hands back count as returns: the limit is
    # declared (RabbitMQ 4 would apply 20), and a delay consumer re-publishes a
    # message that has come back often (names.RETURNS_BEFORE_DETOUR).
    limit = {DELIVERY_LIMIT_ARG: DELIVERY_LIMIT} if spec.quorum else {}
    legacy = {
        "x-message-ttl": int(ttl_s * 1000),
        "x-dead-letter-exchange": DEFAULT_EXCHANGE,
        "x-dead-letter-routing-key": spec.queue,
    }
    return QueueSpec(
        name=name,
        arguments=_queue_args(spec, **limit),
        exchange=spec.names.retry_exchange,
        routing_keys=(routing_key,),
        legacy=_queue_args(spec, **legacy),
    )


def queue_specs(spec: TopologySpec) -> list[QueueSpec]:
    """Every queue semel declares, in declaration order (targets first)."""
    names = spec.names
    # Only the broker's delivery limit dead-letters from Q (see above).
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
            if spec.legacy is not None and await _declared_as_before(connection, spec):
                return
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


async def _declared_as_before(connection: AbstractConnection, spec: QueueSpec) -> bool:
    """Whether ``spec``'s queue exists with its ``legacy`` arguments (then bound and used)."""
    assert spec.legacy is not None
    channel = await connection.channel()
    try:
        queue = await channel.declare_queue(spec.name, durable=True, arguments=spec.legacy)
    except ChannelPreconditionFailed:
        return False
    try:
        log.warning(
            "delay queue declared by an earlier semel; using it as it is",
            queue=spec.name,
            hint="its TTL still sends what no worker holds back to the work queue; "
            "nothing to do (see the README's upgrade note)",
        )
        for key in spec.routing_keys:
            await queue.bind(spec.exchange, routing_key=key)
        return True
    finally:
        if not channel.is_closed:
            await channel.close()


def _reply_text(exc: ChannelPreconditionFailed) -> str:
    # aiormq carries the broker's reply text (which names the argument) in args.
    text = " ".join(str(a) for a in exc.args if a)
    return text.removeprefix("PRECONDITION_FAILED - ") or "declared with different arguments"


async def declare(
    connection: AbstractConnection, spec: TopologySpec, *, work_queue: bool = True
) -> None:
    """Declare exchanges, queues and bindings; safe to run any number of times.

    Without ``work_queue``, Q and its exchange are left alone: a consumer of
    another framework declares its own queue, with its own arguments, and
    semel adds only the delay queues, the DLQ and their exchanges beside it.

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
        ][0 if work_queue else 1 :]
        for name, kind in exchanges:
            try:
                await channel.declare_exchange(name, kind, durable=True)
            except ChannelPreconditionFailed as exc:
                raise TopologyMismatch(f"exchange {name!r}: {_reply_text(exc)}") from None
    finally:
        if not channel.is_closed:
            await channel.close()
    for queue in reversed(queue_specs(spec)[0 if work_queue else 1 :]):
        await _declare_queue(connection, queue)
