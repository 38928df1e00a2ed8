"""Tracing on: one CONSUMER span per delivery, continuing the trace the message carries."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from tests.consumer.conftest import ConsumerSettings, StartConsumer
from tests.consumer.harness import ROUTING_KEY, Broker, eventually
from tests.fences import clock_us, started_fresh

pytestmark = pytest.mark.timeout(30)

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PRODUCER_SPAN_ID = "b7ad6b7169203331"


@pytest.fixture
def exporter(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """A TracerProvider for this test, as ``opentelemetry-instrument`` would set one."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    # Patched rather than set: the global provider can be set once per process.
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    yield exporter
    provider.shutdown()


def spans_named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


async def test_each_delivery_is_a_consumer_span_continuing_the_message_trace(
    consumer_settings: ConsumerSettings,
    broker: Broker,
    start_consumer: StartConsumer,
    exporter: InMemorySpanExporter,
) -> None:
    settings = consumer_settings(handler="tests.ops.handlers:charge")
    consumer = await start_consumer(settings)
    name = f"process {settings.exchange}"
    published_at = clock_us()
    traceparent = f"00-{TRACE_ID}-{PRODUCER_SPAN_ID}-01"
    await broker.publish(
        settings, {"order": 1}, key="o-1", message_id="m-1", headers={"traceparent": traceparent}
    )
    await broker.publish(settings, b"not json", key="o-2")

    async def both_exported() -> bool:
        return len(spans_named(exporter, name)) == 2

    await eventually(both_exported, 15, "two delivery spans")
    assert await consumer.finish() == 0

    by_key = {
        str((s.attributes or {})["semel.idempotency_key"]): s for s in spans_named(exporter, name)
    }
    processed, dead = by_key["o-1"], by_key["o-2"]
    assert processed.kind is SpanKind.CONSUMER
    attributes = dict(processed.attributes or {})
    assert isinstance(attributes.pop("messaging.rabbitmq.message.delivery_tag"), int)
    fence = attributes.pop("semel.fence")
    assert isinstance(fence, int)
    assert started_fresh(fence, published_at)  # a first claim: the store's clock
    assert attributes == {
        "messaging.system": "rabbitmq",
        "messaging.operation.name": "process",
        "messaging.operation.type": "process",
        "messaging.destination.name": settings.exchange,
        "messaging.destination.subscription.name": settings.queue,
        "messaging.rabbitmq.destination.routing_key": ROUTING_KEY,
        "messaging.message.id": "m-1",
        "messaging.message.body.size": len(b'{"order":1}'),
        "semel.outcome": "processed",
        "semel.idempotency_key": "o-1",
        "semel.attempt": 1,
    }
    # It continues the producer's trace, as the child of the producer's span.
    assert processed.parent is not None
    assert processed.parent.is_remote
    assert f"{processed.parent.trace_id:032x}" == TRACE_ID
    assert f"{processed.parent.span_id:016x}" == PRODUCER_SPAN_ID
    assert processed.status.status_code is StatusCode.UNSET
    # The handler's own span is a child of the delivery's.
    (charge,) = spans_named(exporter, "charge card")
    assert charge.parent is not None
    assert charge.parent.span_id == processed.context.span_id
    assert charge.context.trace_id == processed.context.trace_id

    # No traceparent: a trace of its own. Dead-lettered: an error, with why.
    assert dead.parent is None
    assert dead.attributes is not None
    assert dead.attributes["semel.outcome"] == "dead_lettered"
    assert dead.attributes["semel.dead_letter.reason"] == "malformed-body"
    assert "semel.fence" not in dead.attributes  # never claimed
    assert dead.status.status_code is StatusCode.ERROR
