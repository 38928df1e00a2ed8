"""The worker's cache of completed keys on the real broker and stores: copies of a
key known completed are ACKed without a claim, and nothing else is answered
from it (another body, a failed key reset for a replay)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from semel.consumer.delivery.message import fingerprint
from semel.consumer.names import Topology
from semel.settings import Settings
from semel.stores.base import Claim, ClaimRequest, DelegatingStore, Outcome, Status, Store
from semel.stores.errors import KeyRefused
from tests.conftest import open_store
from tests.consumer.conftest import ConsumerSettings, StartConsumer
from tests.consumer.handlers import read_ledger
from tests.consumer.harness import Broker, InProcessConsumer

pytestmark = [
    pytest.mark.parametrize("backend", ["redis", "postgres"]),
    pytest.mark.timeout(60),
]

BODY = {"n": 1}


class CountedClaims(DelegatingStore):
    """The consumer's store, counting the claims it is asked for, by key."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.claims: dict[str, int] = {}

    def _count(self, key: str) -> None:
        self.claims[key] = self.claims.get(key, 0) + 1

    async def claim(self, key: str, fingerprint: str) -> Claim:
        self._count(key)
        return await self.inner.claim(key, fingerprint)

    async def claim_many(self, requests: Sequence[ClaimRequest]) -> Sequence[Claim | KeyRefused]:
        for request in requests:
            self._count(request.key)
        return await self.inner.claim_many(requests)


@pytest.fixture
async def counted(settings: Settings) -> AsyncIterator[CountedClaims]:
    opened = await open_store(settings)
    try:
        yield CountedClaims(opened)
    finally:
        await opened.close()


def runs(ledger: Path, key: str) -> int:
    return sum(1 for e in read_ledger(ledger) if e["key"] == key and e["event"] == "start")


async def stop_clean(consumer: InProcessConsumer, broker: Broker, settings: Settings) -> None:
    """Stopped cleanly, with nothing handed back or parked."""
    assert await consumer.finish() == 0
    depths = await broker.depths(settings)
    dlq = Topology(settings.queue).dead_letter_queue
    assert all(n == 0 for name, n in depths.items() if name != dlq), depths


@pytest.mark.parametrize("size", [100, 0])
async def test_copies_of_a_completed_key_are_acked_without_a_claim(
    size: int,
    consumer_settings: ConsumerSettings,
    broker: Broker,
    counted: CountedClaims,
    ledger: Path,
    start_consumer: StartConsumer,
) -> None:
    settings = consumer_settings(completed_cache_size=size)
    consumer = await start_consumer(settings, counted)
    await broker.publish(settings, BODY, key="done")
    await consumer.until_settled("processed", 1)
    for _ in range(4):
        await broker.publish(settings, BODY, key="done")
    await consumer.until_settled("duplicate", 4)
    await stop_clean(consumer, broker, settings)

    assert runs(ledger, "done") == 1
    # The first copy claims and completes; with the cache, the copies ask nothing.
    assert counted.claims["done"] == (1 if size else 5)


async def test_a_copy_with_another_body_is_still_dead_lettered(
    settings: Settings,
    broker: Broker,
    counted: CountedClaims,
    ledger: Path,
    start_consumer: StartConsumer,
) -> None:
    consumer = await start_consumer(settings, counted)
    await broker.publish(settings, BODY, key="reused")
    await consumer.until_settled("processed", 1)
    await broker.publish(settings, {"n": 2}, key="reused")
    await consumer.until_settled("dead_lettered", 1, "payload-mismatch")
    await broker.publish(settings, BODY, key="reused")  # the original body: still known
    await consumer.until_settled("duplicate", 1)
    await stop_clean(consumer, broker, settings)

    (letter,) = await broker.dead_letters(settings)
    assert (letter.reason, letter.key, letter.body) == ("payload-mismatch", "reused", b'{"n":2}')
    assert runs(ledger, "reused") == 1
    assert counted.claims["reused"] == 2  # the first copy, and the one with another body


async def test_a_key_completed_elsewhere_is_learned_from_its_first_copy(
    settings: Settings,
    broker: Broker,
    store: Store,
    counted: CountedClaims,
    ledger: Path,
    start_consumer: StartConsumer,
) -> None:
    # Another worker's completion: this one's cache cannot know of it.
    claim = await store.claim("elsewhere", fingerprint(BODY))
    assert await store.complete("elsewhere", claim.fence, {"by": "another worker"})
    consumer = await start_consumer(settings, counted)
    for copies in range(1, 4):
        await broker.publish(settings, BODY, key="elsewhere")
        await consumer.until_settled("duplicate", copies)
    await stop_clean(consumer, broker, settings)

    assert runs(ledger, "elsewhere") == 0
    assert counted.claims["elsewhere"] == 1  # the first copy's claim answered "duplicate"


async def test_a_failed_key_reset_for_a_replay_runs_again(
    settings: Settings,
    broker: Broker,
    store: Store,
    counted: CountedClaims,
    ledger: Path,
    start_consumer: StartConsumer,
) -> None:
    body = {"permanent": "card declined"}
    consumer = await start_consumer(settings, counted)
    await broker.publish(settings, body, key="declined")
    await consumer.until_settled("dead_lettered", 1, "permanent-error")
    await broker.publish(settings, body, key="declined")  # a copy: the key failed for good
    await consumer.until_settled("duplicate", 1)
    # What `semel dlq replay` does before publishing the dead letter again.
    assert await store.reset("declined")
    await broker.publish(settings, body, key="declined")
    await consumer.until_settled("dead_lettered", 2, "permanent-error")
    await stop_clean(consumer, broker, settings)

    assert runs(ledger, "declined") == 2  # run again after the reset, never a cached duplicate
    assert counted.claims["declined"] == 3
    record = await store.get("declined")
    assert record is not None
    assert record.status is Status.FAILED
    assert [letter.reason for letter in await broker.dead_letters(settings)] == [
        "permanent-error",
        "permanent-error",
    ]


async def test_a_claim_in_progress_is_never_learned(
    settings: Settings,
    broker: Broker,
    store: Store,
    counted: CountedClaims,
    ledger: Path,
    start_consumer: StartConsumer,
) -> None:
    # Held by a worker that died: every copy must wait, then run once, here.
    held = await store.claim("held", fingerprint(BODY))
    assert held.outcome is Outcome.CLAIMED
    consumer = await start_consumer(settings, counted)
    await broker.publish(settings, BODY, key="held")
    await consumer.until_settled("processed", 1)
    await broker.publish(settings, BODY, key="held")
    await consumer.until_settled("duplicate", 1)
    await stop_clean(consumer, broker, settings)

    assert runs(ledger, "held") == 1
    assert consumer.settled("conflict") >= 1  # parked while the dead worker's lease ran
    record = await store.get("held")
    assert record is not None
    assert record.status is Status.COMPLETED
    # Claims: the parked ones, the one granted; the copy after completion asked nothing.
    assert counted.claims["held"] == consumer.settled("conflict") + 1
