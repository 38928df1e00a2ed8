"""A plain (thread-run) handler past SEMEL_HANDLER_TIMEOUT: its thread cannot be
cancelled, so its key stays claimed until the thread ends, and no retry of the
key ever runs beside it."""

from __future__ import annotations

from pathlib import Path

import pytest

from semel.consumer.names import H_REASON, Reason, Topology
from semel.settings import Settings
from tests.consumer.conftest import KEPT_LEASE, ConsumerSettings, StartConsumer
from tests.consumer.handlers import read_ledger
from tests.consumer.harness import Broker, InProcessConsumer, eventually

pytestmark = pytest.mark.timeout(60)


def _times(ledger: Path, key: str, event: str) -> list[float]:
    return sorted(e["t"] for e in read_ledger(ledger) if e["key"] == key and e["event"] == event)


def _overrunning(consumer: InProcessConsumer) -> float:
    gauge = consumer.container.metrics().handler_threads_overrunning
    return float(gauge._value.get())


async def test_a_thread_past_its_time_limit_is_never_overlapped_by_a_retry(
    consumer_settings: ConsumerSettings, broker: Broker, ledger: Path, start_consumer: StartConsumer
) -> None:
    # A lease a loaded host's event loop stalls cannot cost: a running thread's
    # lease that comes near lapsing ends the process, here the test run's.
    settings: Settings = consumer_settings(
        handler="tests.consumer.handlers:blocking",
        handler_timeout=0.3,
        max_attempts=2,
        lock_ttl=KEPT_LEASE,
    )
    consumer = await start_consumer(settings)
    # Each attempt blocks its thread five times longer than it may run.
    await broker.publish(settings, {"sleep": 1.5}, key="slow")

    async def overrun_counted() -> bool:
        return _overrunning(consumer) == 1

    await eventually(overrun_counted, 10, "the overrunning thread counted")

    async def dead_lettered() -> bool:
        return await broker.depth(Topology(settings.queue).dead_letter_queue) == 1

    await eventually(dead_lettered, 20, "the second timeout dead-lettered")
    starts, ends = _times(ledger, "slow", "start"), _times(ledger, "slow", "end")
    assert len(starts) == 2
    assert len(ends) == 2, "dead-lettered while a thread still ran"
    assert starts[1] >= ends[0], "the retry ran beside the first, still running thread"
    (letter,) = await broker.dead_letters(settings)
    assert letter.headers[H_REASON] == Reason.MAX_ATTEMPTS.value
    assert _overrunning(consumer) == 0
