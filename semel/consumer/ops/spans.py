"""One OpenTelemetry CONSUMER span per delivery (imported only when tracing is on).

The span follows the messaging semantic conventions for RabbitMQ: named
``process <exchange>``, with the producer's exchange and routing key (kept
through retries and conflicts, as the DLQ headers keep them) and the queue
as the subscription. It continues the trace whose context the producer put
in the message headers (W3C ``traceparent``, through the global
propagator), it is the current span while the handler runs, so the
handler's own spans are its children, and it ends with semel's outcome.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.propagators.textmap import Getter
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from semel.consumer.delivery.decide import Applied, DeadLetter, Result, Retry, Settle, bounded
from semel.consumer.delivery.facts import Delivery, origin
from semel.consumer.delivery.message import Incoming
from semel.consumer.delivery.observe import Observer
from semel.settings.redact import redact
from semel.stores.base import Claim

_STATUS_LIMIT = 256  # bytes of error text in a span status


class _HeaderGetter(Getter[Mapping[str, Any]]):
    """Reads propagation fields from AMQP headers, whose strings may arrive as bytes."""

    def get(self, carrier: Mapping[str, Any], key: str) -> list[str] | None:
        value = carrier.get(key)
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        return [value] if isinstance(value, str) else None

    def keys(self, carrier: Mapping[str, Any]) -> list[str]:
        return list(carrier)


_HEADERS = _HeaderGetter()


class SpanObserver(Observer):
    """Wraps another observer; adds a span around each delivery."""

    def __init__(self, inner: Observer, tracer: trace.Tracer, queue: str) -> None:
        self._inner = inner
        self._tracer = tracer
        self._queue = queue

    @contextlib.contextmanager
    def delivery(self, message: Incoming) -> Iterator[None]:
        headers = message.headers or {}
        route = origin(headers, message.exchange or "", message.routing_key or "", self._queue)
        attributes: dict[str, AttributeValue] = {
            "messaging.system": "rabbitmq",
            "messaging.operation.name": "process",
            "messaging.operation.type": "process",
            "messaging.destination.name": route.exchange,
            "messaging.destination.subscription.name": self._queue,
            "messaging.message.body.size": len(message.body),
        }
        if route.routing_key:
            attributes["messaging.rabbitmq.destination.routing_key"] = route.routing_key
        if message.message_id:
            attributes["messaging.message.id"] = message.message_id
        if message.correlation_id:
            attributes["messaging.message.conversation_id"] = message.correlation_id
        if message.delivery_tag is not None:
            attributes["messaging.rabbitmq.message.delivery_tag"] = message.delivery_tag
        name = f"process {route.exchange}" if route.exchange else "process"
        with (
            self._tracer.start_as_current_span(
                name,
                context=propagate.extract(headers, getter=_HEADERS),
                kind=SpanKind.CONSUMER,
                attributes=attributes,
            ),
            self._inner.delivery(message),
        ):
            yield

    def claimed(self, claim: Claim, attempt: int) -> None:
        self._inner.claimed(claim, attempt)

    def overrun(self) -> AbstractContextManager[object]:
        return self._inner.overrun()

    def admitting(self, limit: int) -> None:
        self._inner.admitting(limit)

    def settled(self, delivery: Delivery, decision: Settle, applied: Applied) -> None:
        self._inner.settled(delivery, decision, applied)
        span = trace.get_current_span()
        if not span.is_recording():
            return
        result = applied.result
        span.set_attribute("semel.outcome", result.value)
        span.set_attribute("semel.attempt", delivery.facts.attempt)
        if delivery.facts.key is not None:
            span.set_attribute("semel.idempotency_key", delivery.facts.key)
        if delivery.fence is not None:
            span.set_attribute("semel.fence", delivery.fence)
        if isinstance(decision, DeadLetter):
            span.set_attribute("semel.dead_letter.reason", decision.reason.value)
        if result in (Result.RETRIED, Result.DEAD_LETTERED) and isinstance(
            decision, Retry | DeadLetter
        ):
            error = bounded(redact(decision.error), _STATUS_LIMIT)
            span.set_status(Status(StatusCode.ERROR, error))
