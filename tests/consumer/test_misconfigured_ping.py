"""A worker that leaves because its store turned out misconfigured still stops like
any stop: intake paused, handlers in flight given the grace, the rest cut short
with their claims released; never torn down with their keys held."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest

from semel.consumer.delivery.message import fingerprint
from semel.stores.base import Claim, ClaimRequest, DelegatingStore, Outcome, Status, Store
from semel.stores.errors import KeyRefused, StoreMisconfigured, StoreUnavailable
from tests.consumer.conftest import ConsumerSettings, StartConsumer
from tests.consumer.handlers import read_ledger
from tests.consumer.harness import Broker, eventually
from tests.consumer.test_delivery import status_is

pytestmark = pytest.mark.timeout(60)


class TableGone(DelegatingStore):
    """Once ``gone``, claims fail as if the store were away, and the ping that
    follows finds it not set up for semel (its table dropped meanwhile, say);
    the calls of claims already held still reach the real store."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.gone = False

    def _check(self) -> None:
        if self.gone:
            raise StoreUnavailable(self.backend, "cut by the test")

    async def claim(self, key: str, fingerprint: str) -> Claim:
        self._check()
        return await self.inner.claim(key, fingerprint)

    async def claim_many(self, requests: Sequence[ClaimRequest]) -> Sequence[Claim | KeyRefused]:
        self._check()
        return await self.inner.claim_many(requests)

    async def ping(self) -> None:
        if self.gone:
            raise StoreMisconfigured("table semel_keys does not exist (run `semel migrate`)")
        await self.inner.ping()


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_a_ping_that_finds_the_store_misconfigured_drains_before_the_worker_leaves(
    consumer_settings: ConsumerSettings,
    broker: Broker,
    store: Store,
    ledger: Path,
    start_consumer: StartConsumer,
) -> None:
    settings = consumer_settings(shutdown_grace=2.0, lock_ttl=30.0)
    faulty = TableGone(store)
    consumer = await start_consumer(settings, faulty)
    await broker.publish(settings, {"sleep": 1.0}, key="short")  # ends within the grace
    await broker.publish(settings, {"sleep": 60}, key="stuck")  # cut short

    async def both_running() -> bool:
        return {e["key"] for e in read_ledger(ledger)} == {"short", "stuck"}

    await eventually(both_running, 20, "both handlers running")
    faulty.gone = True
    await broker.publish(settings, {"n": 0}, key="trigger")  # its claim finds the store away
    assert consumer.task is not None
    with pytest.raises(StoreMisconfigured):
        await asyncio.wait_for(consumer.task, 20)
    # Left only once the handler in flight had finished and been recorded ...
    faulty.gone = False
    assert await status_is(store, "short", Status.COMPLETED)
    # ... and the one cut short had its claim released, not left to its 30 s lease.
    again = await store.claim("stuck", fingerprint({"sleep": 60}))
    assert again.outcome is Outcome.CLAIMED, again
