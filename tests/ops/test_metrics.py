"""Metrics during real runs: a scrape counts what was sent; takeovers and fencing show."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from semel.consumer.names import Reason
from semel.consumer.ops.metrics import FENCED_OPERATIONS
from semel.stores.base import Store
from tests.conftest import open_store
from tests.consumer.conftest import KEPT_LEASE, ConsumerSettings, StartConsumer
from tests.consumer.faults import FaultyStore
from tests.consumer.handlers import read_ledger
from tests.consumer.harness import Broker, eventually, processes
from tests.consumer.test_delivery import settle_all
from tests.ops.conftest import scrape
from tests.ops.traffic import Traffic, scraped_until, send_duplicates, send_originals, started
from tests.servers import free_port

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("backend", ["redis"])
async def test_a_scrape_during_a_run_counts_what_was_sent(
    consumer_settings: ConsumerSettings, broker: Broker, tmp_path: Path
) -> None:
    settings = consumer_settings(metrics_port=free_port())
    port = settings.metrics_port
    traffic = Traffic(unique=20, retried=2, bad=3, duplicates=5)
    await broker.declare(settings)
    with processes() as running:
        worker = await started(settings, tmp_path / "consumer.log")
        running.append(worker)
        await send_originals(broker, settings, traffic)
        # Duplicates only once the originals are done, or some would be conflicts.
        await scraped_until(
            port,
            "originals settled",
            {("processed", ""): traffic.processed, ("dead_lettered", "malformed-body"): 3},
        )
        await send_duplicates(broker, settings, traffic)
        await scraped_until(port, "duplicates settled", {("duplicate", ""): traffic.duplicates})
        await settle_all(broker, settings, dead_letters=traffic.bad)
        samples = await scrape(port)
        worker.signal(signal.SIGTERM)
        assert await worker.wait() == 0, worker.output()

    assert samples.messages("processed") == traffic.processed
    assert samples.messages("retried") == traffic.retried
    assert samples.messages("duplicate") == traffic.duplicates
    assert samples.messages("dead_lettered", "malformed-body") == traffic.bad
    for outcome in ("conflict", "requeued", "error"):
        assert samples.messages(outcome) == 0, outcome
    for reason in Reason:
        if reason is not Reason.MALFORMED_BODY:
            assert samples.messages("dead_lettered", reason.value) == 0, reason
    handler_runs = traffic.unique + 2 * traffic.retried
    assert samples.get("semel_handler_duration_seconds_count") == handler_runs
    assert samples.get("semel_deliveries_in_flight") == 0

    def store_ops(operation: str) -> float:
        return samples.get(
            "semel_store_operation_duration_seconds_count", operation=operation, backend="redis"
        )

    # Malformed bodies never reach the store; a retry claims and releases, then claims again;
    # a duplicate of a key this worker completed is answered from its cache, unclaimed.
    cached = samples.get("semel_duplicates_cached_total")
    assert 0 <= cached <= traffic.duplicates
    assert store_ops("claim") + cached == handler_runs + traffic.duplicates
    assert store_ops("complete") == traffic.processed
    assert store_ops("release") == traffic.retried
    for operation in ("claim", "complete", "release", "heartbeat", "ping"):
        assert samples.get("semel_store_errors_total", operation=operation, backend="redis") == 0
    for operation in FENCED_OPERATIONS:
        assert samples.get("semel_fence_rejections_total", operation=operation) == 0
    assert samples.get("semel_lease_takeovers_total") == 0  # retries are not takeovers
    assert samples.get("semel_broker_reconnects_total") == 0
    assert samples.get("semel_broker_failovers_total") == 0


async def test_a_lease_that_runs_out_shows_as_a_takeover_and_a_fence_rejection(
    consumer_settings: ConsumerSettings,
    broker: Broker,
    store: Store,
    ledger: Path,
    start_consumer: StartConsumer,
) -> None:
    settings = consumer_settings(lock_ttl=KEPT_LEASE)  # the second run must keep it
    faulty = FaultyStore(await open_store(settings))
    # The first run's heartbeats never reach the store: its lease runs out under it.
    faulty.muted_first.add("slow")
    consumer = await start_consumer(settings, faulty)
    registry = consumer.container.metrics().registry

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    try:
        # Long enough for the first run to finish only after the takeover, which
        # comes a lease and a conflict delay after its claim.
        sleep = 2 * KEPT_LEASE
        await broker.publish(settings, {"sleep": sleep}, key="slow")
        await eventually(lambda: _runs(ledger, "slow", 1), 10, "first run started")
        await broker.publish(settings, {"sleep": sleep}, key="slow")  # takes the key over
        await eventually(lambda: _runs(ledger, "slow", 2), 10, "second run started")

        async def both_settled() -> bool:
            # The new owner completes; the old run's copy comes back as a duplicate.
            settled = ("processed", "duplicate")
            return all(value("semel_messages_total", outcome=o, reason="") == 1 for o in settled)

        await eventually(both_settled, 20, "completed and duplicate")
        await settle_all(broker, settings, dead_letters=0)
        await asyncio.wait_for(consumer.finish(), 30)
    finally:
        await faulty.close()

    assert value("semel_lease_takeovers_total") == 1
    # The first run finished after the takeover: its fenced completion was refused.
    assert value("semel_fence_rejections_total", operation="complete") == 1
    assert value("semel_messages_total", outcome="processed", reason="") == 1
    assert value("semel_messages_total", outcome="duplicate", reason="") == 1
    assert (value("semel_messages_total", outcome="conflict", reason="") or 0) >= 1


async def _runs(ledger: Path, key: str, count: int) -> bool:
    return sum(1 for e in read_ledger(ledger) if e["key"] == key and e["event"] == "start") >= count
