"""Prometheus metrics of one consumer process, and the observer that feeds them.

Every labelled child is created up front: the hot path only increments
(prometheus-client's own lock per value) or observes (a tally's, see
:mod:`semel.consumer.ops.tally`), nothing more, and every
series exists from the start at 0, so ``rate()`` and ``absent()`` alerts
behave. Label values come from small closed sets (outcomes, DLQ reasons,
store operations), never from message data.

Each :class:`Metrics` has a registry of its own, so two consumers in one
process (tests, benchmarks) never collide in prometheus-client's default one.
"""

from __future__ import annotations

import functools
import time
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    PlatformCollector,
    ProcessCollector,
)

from semel.consumer.broker.connection import ClusterConnection
from semel.consumer.delivery.decide import Ack, Applied, DeadLetter, Result, Settle, is_takeover
from semel.consumer.delivery.facts import Delivery
from semel.consumer.delivery.handler import Context, Handler, is_async
from semel.consumer.delivery.message import Incoming
from semel.consumer.delivery.observe import Observer
from semel.consumer.names import Reason
from semel.consumer.ops.tally import Tally, TallyHistogram
from semel.stores.base import Claim

# Handlers run from milliseconds up to SEMEL_HANDLER_TIMEOUT (300 s by default).
HANDLER_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# A healthy store answers in about a millisecond; seconds mean trouble.
STORE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
STORE_OPERATIONS = (
    "claim", "complete", "release", "fail", "heartbeat", "get", "reset", "migrate", "ping",
)  # fmt: skip
FENCED_OPERATIONS = ("complete", "release", "fail", "heartbeat")


class StoreMeters:
    """The children one store backend times its operations with."""

    def __init__(self, duration: dict[str, Tally], errors: dict[str, Counter]) -> None:
        self.duration = duration
        self.errors = errors


class OutboxGauges:
    """What the outbox watch sets: how many messages wait, and for how long."""

    def __init__(self, unsent: Gauge, oldest_seconds: Gauge) -> None:
        self.unsent = unsent
        self.oldest_seconds = oldest_seconds


class Metrics:
    """Every metric semel exports."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        # Memory, CPU and open files of the process, as the default registry would have them.
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        r = self.registry
        messages = Counter(
            "semel_messages_total",
            "Deliveries settled, by outcome; reason is set for dead letters only.",
            ["outcome", "reason"],
            registry=r,
        )
        self.outcomes: dict[Result, Counter] = {
            result: messages.labels(result.value, "")
            for result in Result
            if result is not Result.DEAD_LETTERED
        }
        self.dead_letters = {
            reason: messages.labels(Result.DEAD_LETTERED.value, reason.value) for reason in Reason
        }
        # Observed several times per delivery: tallies (see ops/tally.py).
        self.handler_duration = TallyHistogram(
            "semel_handler_duration_seconds",
            "Time the handler ran, whatever it returned or raised.",
            (),
            HANDLER_BUCKETS,
            r,
        ).labels()
        self._store_duration = TallyHistogram(
            "semel_store_operation_duration_seconds",
            "Time a store operation took, failures included.",
            ("operation", "backend"),
            STORE_BUCKETS,
            r,
        )
        self._store_errors = Counter(
            "semel_store_errors_total",
            "Store operations that found the store unreachable, refusing, or not set up for semel.",
            ["operation", "backend"],
            registry=r,
        )
        self.in_flight = Gauge(
            "semel_deliveries_in_flight", "Deliveries being processed now.", registry=r
        )
        # Counted by the pipelines (on the event loop) as a plain integer, read
        # when scraped: no lock taken twice per delivery.
        self.deliveries_in_flight = 0
        self.in_flight.set_function(lambda: self.deliveries_in_flight)
        self.handler_threads_overrunning = Gauge(
            "semel_handler_threads_overrunning",
            "Plain (thread-run) handlers still running past SEMEL_HANDLER_TIMEOUT; "
            "their keys stay claimed until each thread ends.",
            registry=r,
        )
        self.admission_limit = Gauge(
            "semel_store_admission_limit",
            "Deliveries allowed between claim and settlement at once: SEMEL_PREFETCH "
            "while the store answers quickly, lowered while it answers slowly.",
            registry=r,
        )
        self.lease_takeovers = Counter(
            "semel_lease_takeovers_total",
            "Claims granted over an earlier claim of the key that was abandoned "
            "(its worker died, stalled past the lease or was cut short).",
            registry=r,
        )
        self.duplicates_cached = Counter(
            "semel_duplicates_cached_total",
            "Duplicates ACKed from the worker's cache of keys known completed, without "
            "a store call (also counted in semel_messages_total as duplicate).",
            registry=r,
        )
        rejections = Counter(
            "semel_fence_rejections_total",
            "Fenced writes refused because the claim had been taken over.",
            ["operation"],
            registry=r,
        )
        self.fence_rejections = {op: rejections.labels(op) for op in FENCED_OPERATIONS}
        self.broker_reconnects = Counter(
            "semel_broker_reconnects_total",
            "Times the broker connection was re-established after a loss.",
            registry=r,
        )
        self.broker_failovers = Counter(
            "semel_broker_failovers_total",
            "Times the broker connection was re-established on another node than the one it lost.",
            registry=r,
        )
        self.consumption_stopped = Gauge(
            "semel_consumption_stopped",
            "1 once consumption has stopped until a restart (the store is not set up for semel).",
            registry=r,
        )
        self.keys_purged = Counter(
            "semel_keys_purged_total",
            "Expired keys deleted by the background purge.",
            registry=r,
        )
        # Created per queue on the first look: only when SEMEL_MANAGEMENT_URL is set.
        self._held = Gauge(
            "semel_queue_messages_dlx",
            "Messages the broker holds for dead-lettering in one of semel's queues "
            "(the management API's messages_dlx); no consumer can take them.",
            ["queue"],
            registry=r,
        )
        self._outbox: OutboxGauges | None = None

    def outbox_gauges(self) -> OutboxGauges:
        """The outbox's two gauges, registered on the first call only: a process that
        runs no relay exports none, rather than a 0 that would read as "all sent"."""
        if self._outbox is None:
            self._outbox = OutboxGauges(
                Gauge(
                    "semel_outbox_unsent",
                    "Outbox messages staged and not yet confirmed by the broker.",
                    registry=self.registry,
                ),
                Gauge(
                    "semel_outbox_oldest_unsent_seconds",
                    "Age of the oldest unsent outbox message; 0 when none waits.",
                    registry=self.registry,
                ),
            )
        return self._outbox

    def store_meters(self, backend: str) -> StoreMeters:
        """The duration and error children of ``backend``, one per operation."""
        return StoreMeters(
            {op: self._store_duration.labels(op, backend) for op in STORE_OPERATIONS},
            {op: self._store_errors.labels(op, backend) for op in STORE_OPERATIONS},
        )

    def held(self, queue: str, count: int) -> None:
        """Set ``semel_queue_messages_dlx`` of ``queue`` (one of semel's own, a closed set)."""
        self._held.labels(queue).set(count)

    def count_reconnects(self, connection: ClusterConnection) -> None:
        """Count every reconnect of ``connection``, and those that moved to another node."""
        reconnects, failovers = self.broker_reconnects, self.broker_failovers
        connection.reconnect_callbacks.add(lambda _connection: reconnects.inc())
        connection.failover_callbacks.add(lambda _connection: failovers.inc())


def timed(handler: Handler, metrics: Metrics) -> Handler:
    """``handler``, timed into ``semel_handler_duration_seconds``.

    The wrapper is async exactly when the handler is, so the pipeline still
    runs a plain handler on a thread of its own (timed there too).
    """
    histogram = metrics.handler_duration

    if is_async(handler):

        @functools.wraps(handler)
        async def timed_async(context: Context) -> Any:
            started = time.perf_counter()
            try:
                return await handler(context)
            finally:
                histogram.observe(time.perf_counter() - started)

        return timed_async

    @functools.wraps(handler)
    def timed_plain(context: Context) -> Any:
        started = time.perf_counter()
        try:
            return handler(context)
        finally:
            histogram.observe(time.perf_counter() - started)

    return timed_plain


class _InFlight(AbstractContextManager[object]):
    """Counts a delivery in flight while entered; holds no state, so one serves all."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._errors = metrics.outcomes[Result.ERROR]

    def __enter__(self) -> object:
        self._metrics.deliveries_in_flight += 1
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._metrics.deliveries_in_flight -= 1
        if isinstance(exc, Exception):
            # The pipeline raised instead of settling: the worker parks the
            # message; a bug worth seeing, not a message outcome.
            self._errors.inc()


class MetricsObserver(Observer):
    """Feeds :class:`Metrics` from the pipeline's hooks."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._in_flight = _InFlight(metrics)

    def delivery(self, message: Incoming) -> AbstractContextManager[object]:
        return self._in_flight

    def overrun(self) -> AbstractContextManager[object]:
        return self._metrics.handler_threads_overrunning.track_inprogress()

    def claimed(self, claim: Claim, attempt: int) -> None:
        if is_takeover(claim, attempt):
            self._metrics.lease_takeovers.inc()

    def admitting(self, limit: int) -> None:
        self._metrics.admission_limit.set(limit)

    def settled(self, delivery: Delivery, decision: Settle, applied: Applied) -> None:
        result = applied.result
        if result is Result.DEAD_LETTERED and isinstance(decision, DeadLetter):
            self._metrics.dead_letters[decision.reason].inc()
        else:
            self._metrics.outcomes[result].inc()
            if isinstance(decision, Ack) and decision.cached:
                self._metrics.duplicates_cached.inc()
