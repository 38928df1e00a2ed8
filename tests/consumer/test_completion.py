"""A handler that succeeded is never run again nor dead-lettered because its
result could not be written as it was, and a dead letter is ACKed only once
its key is marked failed (real servers, in-process consumer)."""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path

import pytest

from semel.consumer.names import Topology
from semel.stores.base import DelegatingStore, Status, Store
from semel.stores.errors import StoreUnavailable
from tests.conftest import open_store
from tests.consumer.conftest import ConsumerSettings, StartConsumer
from tests.consumer.harness import Broker, eventually
from tests.consumer.result_handlers import ORDER_ID
from tests.consumer.test_delivery import finished, runs, settle_all, status_is

pytestmark = pytest.mark.timeout(60)

HANDLERS = "tests.consumer.result_handlers"


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_results_that_are_not_json_as_they_are_are_stored_in_json_form(
    consumer_settings: ConsumerSettings,
    broker: Broker,
    store: Store,
    ledger: Path,
    start_consumer: StartConsumer,
) -> None:
    receipt = {"order_id": str(ORDER_ID), "amount": "12.30", "paid_at": "2026-11-27T01:30:00Z"}
    for handler, expected in [
        ("pydantic_model", receipt),
        (
            "python_values",
            {
                "amount": "12.30",
                "paid_at": "2026-11-27T01:30:00+00:00",
                "day": "2026-11-27",
                "order_id": str(ORDER_ID),
                "colour": "red",
                "point": {"x": 1, "y": 2},
                "tags": ["a", "b"],
                "pair": [1, 2],
                "receipt": receipt | {"amount": "1"},
            },
        ),
    ]:
        settings = consumer_settings(handler=f"{HANDLERS}:{handler}")
        consumer = await start_consumer(settings)
        await broker.publish(settings, {"n": 1}, key=handler)
        await eventually(partial(status_is, store, handler, Status.COMPLETED), 10, handler)
        await finished(consumer, broker, settings, dead_letters=0)
        record = await store.get(handler)
        assert record is not None
        assert record.result == expected
        assert len(runs(ledger, handler)) == 1


@pytest.mark.parametrize(
    ("backend", "handler"), [("sqlite", "unencodable"), ("dynamodb-moto", "oversized")]
)
async def test_a_result_that_cannot_be_stored_completes_the_key_with_none(
    consumer_settings: ConsumerSettings,
    broker: Broker,
    store: Store,
    ledger: Path,
    start_consumer: StartConsumer,
    handler: str,
) -> None:
    settings = consumer_settings(handler=f"{HANDLERS}:{handler}")
    consumer = await start_consumer(settings)
    await broker.publish(settings, {"n": 1}, key="k")
    await eventually(partial(status_is, store, "k", Status.COMPLETED), 10, "'k' completed")
    await settle_all(broker, settings, dead_letters=0)
    await finished(consumer, broker, settings, dead_letters=0)
    record = await store.get("k")
    assert record is not None
    assert record.result is None
    assert len(runs(ledger, "k")) == 1


class AwayWhenMarkingFailed(DelegatingStore):
    """From the first ``fail`` call, heartbeats and writes after the handler fail for
    ``outage`` seconds (longer than the lease), as through a store outage; claims
    pass, so a late copy is decided by what the first delivery left behind."""

    def __init__(self, inner: Store, outage: float) -> None:
        super().__init__(inner)
        self.outage = outage
        self.back_at: float | None = None
        self.last_fail_at: float | None = None

    def _away(self) -> None:
        if self.back_at is not None and time.monotonic() < self.back_at:
            raise StoreUnavailable(self.backend, "away")

    async def fail(self, key: str, fence: int, error: str) -> bool:
        self.last_fail_at = time.monotonic()
        if self.back_at is None:
            self.back_at = self.last_fail_at + self.outage
        self._away()
        return await self.inner.fail(key, fence, error)

    async def heartbeat(self, key: str, fence: int) -> bool:
        self._away()
        return await self.inner.heartbeat(key, fence)

    async def release(self, key: str, fence: int) -> bool:
        self._away()
        return await self.inner.release(key, fence)

    def given_up(self, quiet: float) -> bool:
        """No ``fail`` call for ``quiet`` seconds: marking the key was abandoned."""
        return self.last_fail_at is not None and time.monotonic() - self.last_fail_at > quiet


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_a_dead_letter_is_acked_only_once_its_key_is_marked_failed(
    consumer_settings: ConsumerSettings,
    broker: Broker,
    store: Store,
    ledger: Path,
    start_consumer: StartConsumer,
) -> None:
    settings = consumer_settings()
    away = AwayWhenMarkingFailed(await open_store(settings), outage=2 * settings.lock_ttl)
    try:
        consumer = await start_consumer(settings, away)
        body = {"permanent": "declined"}
        await broker.publish(settings, body, key="k")

        async def marked_or_given_up() -> bool:
            # Retries come at most a second apart; a longer silence means given up.
            return await status_is(store, "k", Status.FAILED) or away.given_up(1.5)

        await eventually(marked_or_given_up, 20, "'k' marked failed, or the marking given up")
        await broker.publish(settings, body, key="k")  # a late copy, past the first lease
        dlq = Topology(settings.queue).dead_letter_queue

        async def only_the_dead_letter_left() -> bool:
            depths = await broker.depths(settings)
            return sum(depth for queue, depth in depths.items() if queue != dlq) == 0

        await eventually(only_the_dead_letter_left, 10, "the late copy taken")
        await finished(consumer, broker, settings, dead_letters=1)  # waits for it to settle
        assert len(runs(ledger, "k")) == 1
        assert await status_is(store, "k", Status.FAILED)
    finally:
        await away.close()


class MarkRefused(DelegatingStore):
    """Answers every ``fail`` as refused: the claim taken over between the dead
    letter's confirm and the mark (a lease lost while the store was away)."""

    async def fail(self, key: str, fence: int, error: str) -> bool:
        return False


@pytest.mark.parametrize("backend", ["postgres"])
async def test_a_mark_refused_after_the_dead_letter_is_a_fenced_out_outcome(
    consumer_settings: ConsumerSettings,
    broker: Broker,
    ledger: Path,
    start_consumer: StartConsumer,
) -> None:
    settings = consumer_settings()
    refused = MarkRefused(await open_store(settings))
    try:
        consumer = await start_consumer(settings, refused)
        await broker.publish(settings, {"permanent": "declined"}, key="k")
        await settle_all(broker, settings, dead_letters=1)
        registry = consumer.container.metrics().registry
        conflicts = registry.get_sample_value(
            "semel_messages_total", {"outcome": "conflict", "reason": ""}
        )
        dead = registry.get_sample_value(
            "semel_messages_total", {"outcome": "dead_lettered", "reason": "permanent-error"}
        )
        await finished(consumer, broker, settings, dead_letters=1)
        assert (conflicts, dead) == (1.0, 0.0)
        assert len(runs(ledger, "k")) == 1
    finally:
        await refused.close()
