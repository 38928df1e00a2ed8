"""The observer, the metrics and the metered store, without servers."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from semel.consumer.delivery.decide import (
    Ack,
    Applied,
    DeadLetter,
    NackToConflict,
    Requeue,
    Result,
    Retry,
    Settle,
    is_takeover,
)
from semel.consumer.delivery.decide import Outcome as Settled
from semel.consumer.delivery.handler import Context, is_async
from semel.consumer.delivery.observe import Observer
from semel.consumer.names import Reason
from semel.consumer.ops.metered import MeteredStore
from semel.consumer.ops.metrics import STORE_OPERATIONS, Metrics, MetricsObserver, timed
from semel.consumer.ops.spans import SpanObserver
from semel.consumer.ops.tracing import traced
from semel.stores.base import Outcome
from semel.stores.errors import StoreUnavailable
from tests.ops.fakes import ScriptedStore, claim, delivery, message

pytestmark = pytest.mark.timeout(10)

DEAD = DeadLetter(Reason.MALFORMED_BODY, "body is not JSON")
RETRY = Retry(delay=1.0, next_attempt=2, error="RuntimeError: boom")


@pytest.mark.parametrize(
    ("decision", "applied", "expected"),
    [
        (Ack(Settled.COMPLETED), Applied(Settled.COMPLETED), Result.PROCESSED),
        (Ack(Settled.COMPLETED), Applied(Settled.COMPLETED, sent=False), Result.PROCESSED),
        (Ack(Settled.DUPLICATE), Applied(Settled.DUPLICATE), Result.DUPLICATE),
        (Ack(Settled.DUPLICATE_OF_FAILED), Applied(Settled.DUPLICATE_OF_FAILED), Result.DUPLICATE),
        (
            NackToConflict(Settled.IN_PROGRESS),
            Applied(Settled.IN_PROGRESS, "nack"),
            Result.CONFLICT,
        ),
        (NackToConflict(Settled.FENCED_OUT), Applied(Settled.FENCED_OUT, "nack"), Result.CONFLICT),
        (RETRY, Applied(Settled.RETRY), Result.RETRIED),
        (RETRY, Applied(Settled.COPY_UNCONFIRMED, "nack"), Result.REQUEUED),
        (DEAD, Applied(Settled.DEAD_LETTER), Result.DEAD_LETTERED),
        (DEAD, Applied(Settled.COPY_UNCONFIRMED, "nack"), Result.REQUEUED),
        (Requeue("store down"), Applied(Settled.STORE_UNAVAILABLE, "nack"), Result.REQUEUED),
    ],
)
def test_every_decision_sorts_into_one_outcome(
    decision: Settle, applied: Applied, expected: Result
) -> None:
    assert applied.outcome in (decision.outcome, Settled.COPY_UNCONFIRMED)
    assert applied.result is expected


@pytest.mark.parametrize(
    ("outcome", "claims", "attempt", "expected"),
    [
        (Outcome.CLAIMED, 1, 1, False),  # a first claim
        (Outcome.CLAIMED, 2, 2, False),  # a retry: one claim per attempt
        (Outcome.CLAIMED, 2, 1, True),  # the first claim's run never ended in a retry
        (Outcome.CLAIMED, 4, 2, True),
        (Outcome.IN_PROGRESS, 3, 1, False),  # nothing was granted
    ],
)
def test_a_takeover_is_a_granted_claim_beyond_the_attempts(
    outcome: Outcome, claims: int, attempt: int, expected: bool
) -> None:
    assert is_takeover(claim(outcome, claims=claims, fence=claims), attempt) is expected


def test_every_series_exists_at_zero_before_any_message() -> None:
    metrics = Metrics()
    value = metrics.registry.get_sample_value
    for result in Result:
        if result is not Result.DEAD_LETTERED:
            assert value("semel_messages_total", {"outcome": result.value, "reason": ""}) == 0
    for reason in Reason:
        labels = {"outcome": "dead_lettered", "reason": reason.value}
        assert value("semel_messages_total", labels) == 0
    for operation in ("complete", "release", "fail", "heartbeat"):
        assert value("semel_fence_rejections_total", {"operation": operation}) == 0
    for name in (
        "semel_lease_takeovers_total",
        "semel_duplicates_cached_total",
        "semel_broker_reconnects_total",
        "semel_broker_failovers_total",
    ):
        assert value(name) == 0
    assert value("semel_deliveries_in_flight") == 0
    assert value("semel_handler_duration_seconds_count") == 0


async def test_the_metrics_observer_counts_outcomes_in_flight_and_failures() -> None:
    metrics = Metrics()
    observer = MetricsObserver(metrics)
    value = metrics.registry.get_sample_value
    with observer.delivery(message()):
        assert value("semel_deliveries_in_flight") == 1
        observer.claimed(claim(claims=2), attempt=1)
        observer.settled(delivery(), DEAD, Applied(Settled.DEAD_LETTER))
    with observer.delivery(message()):
        observer.settled(delivery(), Ack(Settled.COMPLETED), Applied(Settled.COMPLETED))
    with pytest.raises(RuntimeError), observer.delivery(message()):
        raise RuntimeError("a bug in the pipeline")
    with pytest.raises(asyncio.CancelledError), observer.delivery(message()):
        raise asyncio.CancelledError  # a stop, not an error
    assert value("semel_deliveries_in_flight") == 0
    assert value("semel_messages_total", {"outcome": "processed", "reason": ""}) == 1
    assert value("semel_messages_total", {"outcome": "error", "reason": ""}) == 1
    labels = {"outcome": "dead_lettered", "reason": "malformed-body"}
    assert value("semel_messages_total", labels) == 1
    assert value("semel_lease_takeovers_total") == 1


async def test_timed_handlers_keep_their_kind_and_are_timed_even_when_they_raise() -> None:
    metrics = Metrics()
    context = Context("k", {}, {}, "rk", None, 1, 1)

    async def coroutine(context: Context) -> Any:
        return "async"

    def plain(context: Context) -> Any:
        raise ValueError("plain fails")

    timed_coroutine, timed_plain = timed(coroutine, metrics), timed(plain, metrics)
    assert is_async(timed_coroutine)
    assert not is_async(timed_plain)
    assert await timed_coroutine(context) == "async"
    with pytest.raises(ValueError, match="plain fails"):
        timed_plain(context)
    assert metrics.registry.get_sample_value("semel_handler_duration_seconds_count") == 2


async def test_the_metered_store_times_every_operation_and_counts_what_went_wrong() -> None:
    metrics = Metrics()
    inner = ScriptedStore()
    store = MeteredStore(inner, metrics)
    value = metrics.registry.get_sample_value
    assert not store.pulse.up
    await store.claim("k", "f")
    assert await store.complete("k", 1, {})
    assert store.pulse.up
    inner.fenced_out = True
    assert not await store.heartbeat("k", 1)
    assert not await store.release("k", 1)
    inner.down = True
    with pytest.raises(StoreUnavailable):
        await store.fail("k", 1, "error")
    assert not store.pulse.up

    def timed_count(operation: str) -> float | None:
        labels = {"operation": operation, "backend": "scripted"}
        return value("semel_store_operation_duration_seconds_count", labels)

    assert [timed_count(op) for op in ("claim", "complete", "heartbeat", "release", "fail")] == [
        1, 1, 1, 1, 1,
    ]  # fmt: skip
    assert all(timed_count(op) is not None for op in STORE_OPERATIONS)  # created up front
    assert value("semel_store_errors_total", {"operation": "fail", "backend": "scripted"}) == 1
    assert value("semel_store_errors_total", {"operation": "claim", "backend": "scripted"}) == 0
    assert value("semel_fence_rejections_total", {"operation": "heartbeat"}) == 1
    assert value("semel_fence_rejections_total", {"operation": "release"}) == 1
    assert value("semel_fence_rejections_total", {"operation": "complete"}) == 0
    assert store.backend == "scripted"
    assert store.purge() == "purged"  # a backend's extras pass through


def test_tracing_is_off_unless_a_tracer_provider_is_set() -> None:
    observer = Observer()
    assert traced(observer, "q") is observer


def test_a_span_continues_a_traceparent_header_sent_as_bytes() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    observer = SpanObserver(Observer(), provider.get_tracer("test"), "q")
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    headers = {"traceparent": f"00-{trace_id}-{parent_id}-01".encode()}
    with observer.delivery(message(headers=headers)):
        observer.settled(delivery(fence=None), RETRY, Applied(Settled.RETRY))
    (span,) = exporter.get_finished_spans()
    assert span.parent is not None
    assert f"{span.parent.trace_id:032x}" == trace_id
    assert f"{span.parent.span_id:016x}" == parent_id
    assert span.attributes is not None
    assert span.attributes["semel.outcome"] == "retried"
    assert "semel.fence" not in span.attributes
    assert span.status.description == "RuntimeError: boom"
