"""Faults under a running consumer: store outages, lost leases, a broker that goes away."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from dependency_injector import providers

from semel.consumer.names import Topology
from semel.settings import Settings
from semel.stores.base import Status, Store
from tests.conftest import open_store
from tests.consumer.conftest import CONSUMER_BACKENDS, KEPT_LEASE, ConsumerSettings, StartConsumer
from tests.consumer.faults import FaultyStore
from tests.consumer.handlers import read_ledger
from tests.consumer.harness import Broker, InProcessConsumer, TcpProxy, eventually
from tests.consumer.test_delivery import finished, runs, settle_all, status_is
from tests.servers import free_port

pytestmark = pytest.mark.timeout(90)


async def all_completed(store: Store, keys: list[str]) -> bool:
    for key in keys:
        if not await status_is(store, key, Status.COMPLETED):
            return False
    return True


def through_proxy(settings: Settings, port: int) -> tuple[int, dict[str, Any]]:
    """The store server's port, and the settings that reach it through ``port`` instead."""
    if settings.store.value == "redis":
        return 6379, {"redis_url": f"redis://127.0.0.1:{port}/0"}
    if settings.store.value == "postgres":
        target = urlsplit(settings.postgres_dsn)
        return target.port or 5432, {"postgres_dsn": f"postgresql://127.0.0.1:{port}{target.path}"}
    endpoint = urlsplit(settings.dynamodb_endpoint_url or "")
    assert endpoint.port is not None
    return endpoint.port, {"dynamodb_endpoint_url": f"http://127.0.0.1:{port}"}


class StoreSwitch:
    """Takes the consumer's store away and brings it back: a TCP cut, or for the
    embedded SQLite store (no network to cut) a wrapper that fails every call."""

    def __init__(self, proxy: TcpProxy | None, faulty: FaultyStore | None) -> None:
        self.proxy = proxy
        self.faulty = faulty

    async def cut(self) -> None:
        if self.proxy is not None:
            await self.proxy.cut()
        if self.faulty is not None:
            self.faulty.down = True

    async def restore(self) -> None:
        if self.proxy is not None:
            await self.proxy.start()
        if self.faulty is not None:
            self.faulty.down = False


@pytest.mark.parametrize("backend", CONSUMER_BACKENDS)
async def test_store_outage_pauses_consumption_and_loses_nothing(
    consumer_settings: ConsumerSettings,
    broker: Broker,
    store: Store,
    ledger: Path,
    start_consumer: StartConsumer,
) -> None:
    settings = consumer_settings()
    faulty: FaultyStore | None = None
    proxy: TcpProxy | None = None
    if settings.store.value == "sqlite":
        faulty = FaultyStore(await open_store(settings))
        consumer = await start_consumer(settings, faulty)
    else:
        port = free_port()
        target, overrides = through_proxy(settings, port)
        proxy = await TcpProxy(target, port).start()
        settings = consumer_settings(**overrides)
        consumer = await start_consumer(settings)
    switch = StoreSwitch(proxy, faulty)
    try:
        await broker.publish(settings, {"n": 0}, key="before")
        await eventually(lambda: all_completed(store, ["before"]), what="'before' completed")
        await broker.publish(settings, {"sleep": 0.5}, key="in-flight")
        await eventually(lambda: _started(ledger, "in-flight"), what="'in-flight' running")
        await switch.cut()
        during = [f"during-{i}" for i in range(5)]
        for key in during:
            await broker.publish(settings, {"n": 1}, key=key)

        async def paused() -> bool:
            # The new messages wait in the queue, nothing is dead-lettered. The
            # in-flight delivery stays in hand: its handler returned and its
            # fenced completion waits for the store. (A quorum queue keeps a
            # cancelled consumer listed while it holds an unacked delivery, so
            # the consumer count cannot show the pause here.)
            return await broker.depth(settings.queue) == len(during)

        await eventually(paused, 30, "consumption paused with every message queued")
        assert await broker.depth(Topology(settings.queue).dead_letter_queue) == 0
        await switch.restore()
        keys = ["before", "in-flight", *during]
        await eventually(lambda: all_completed(store, keys), 30, "every key completed")
        await settle_all(broker, settings, dead_letters=0)
        await finished(consumer, broker, settings, dead_letters=0)
        assert _starts(ledger, "in-flight") == 1, "the held completion ran the handler again"
    finally:
        if proxy is not None:
            await proxy.cut()
        if faulty is not None:
            await faulty.close()

    for key in ["before", *during]:
        assert len(runs(ledger, key)) == 1, key
    # Its completion could not be written during the outage, so it may run again.
    assert 1 <= len(runs(ledger, "in-flight")) <= 2


async def _started(ledger: Path, key: str) -> bool:
    return any(e["key"] == key for e in read_ledger(ledger))


def _starts(ledger: Path, key: str) -> int:
    return sum(1 for e in read_ledger(ledger) if e["key"] == key and e["event"] == "start")


@pytest.mark.parametrize("backend", CONSUMER_BACKENDS)
async def test_lost_lease_cancels_or_fences_out_the_old_run(
    consumer_settings: ConsumerSettings, broker: Broker, store: Store, ledger: Path
) -> None:
    settings = consumer_settings(lock_ttl=KEPT_LEASE)  # the second runs must keep theirs
    faulty = FaultyStore(await open_store(settings))
    # The first runs' heartbeats never reach the store: their leases run out under them.
    faulty.muted_first |= {"cancelled", "fenced"}
    consumer = InProcessConsumer(settings, faulty)
    # Without the per-call deadline (a third of this 1 s lease): moto on a loaded
    # machine missed it on the first claims, which then ran in another order and
    # the two runs per key this test is about did not both happen.
    consumer.container.bounded_store.override(providers.Object(faulty))
    await consumer.start(broker, settings)
    try:
        # The takeover comes a lease and a conflict delay after the first claim.
        # "cancelled" runs long enough that its next heartbeat after it always
        # lands before it would finish, "fenced" long enough to finish after it.
        ttl = KEPT_LEASE
        for key, sleep in (("cancelled", 2.4 * ttl), ("fenced", 2.0 * ttl)):
            await broker.publish(settings, {"sleep": sleep}, key=key)
            await broker.publish(settings, {"sleep": sleep}, key=key)  # takes the key over

        async def taken_over() -> bool:
            record = await store.get("cancelled")
            return record is not None and record.claims == 2

        await eventually(taken_over, 4 * ttl, "'cancelled' taken over")
        # Its first run's next heartbeat reaches the store and learns it lost the claim.
        faulty.muted_first.discard("cancelled")
        await eventually(lambda: all_completed(store, ["cancelled", "fenced"]), 30, "completed")
        await settle_all(broker, settings, dead_letters=0)
        await finished(consumer, broker, settings, dead_letters=0)
    finally:
        if consumer.task is not None and not consumer.task.done():
            consumer.stop.set()  # a failed test leaves no consumer running
            await asyncio.wait({consumer.task}, timeout=30)
        await faulty.close()

    first, second = {}, {}
    for key in ("cancelled", "fenced"):
        record = await store.get(key)
        assert record is not None
        first[key], second[key] = [e["fence"] for e in runs(ledger, key)]
        # Taken over: one higher, or more where a claim answered too late under
        # load was given back and the next one went higher again.
        assert second[key] > first[key]
        # The new owner's result stands.
        assert record.result == {"key": key, "fence": second[key]}
    # Cancelled before it could finish; the fenced one finished but could not complete.
    assert [e["fence"] for e in runs(ledger, "cancelled", "end")] == [second["cancelled"]]
    ends = [first["fenced"], second["fenced"]]
    assert [e["fence"] for e in runs(ledger, "fenced", "end")] == ends


@pytest.mark.parametrize("backend", CONSUMER_BACKENDS)
async def test_a_completion_waiting_on_a_slow_store_keeps_its_lease(
    consumer_settings: ConsumerSettings, broker: Broker, store: Store, ledger: Path
) -> None:
    settings = consumer_settings(lock_ttl=1.0)
    faulty = FaultyStore(await open_store(settings))
    faulty.slow_completions["slow"] = 4.0  # four leases
    consumer = InProcessConsumer(settings, faulty)
    # Without the per-call deadline: this store is slow, not silent, and the
    # test is about what the lease does meanwhile.
    consumer.container.bounded_store.override(providers.Object(faulty))
    await consumer.start(broker, settings)
    try:
        await broker.publish(settings, {}, key="slow")

        async def ran() -> bool:
            return len(runs(ledger, "slow", "end")) == 1

        await eventually(ran, 10, "the handler ran")
        # The time a lease takes to lapse is the event awaited: the completion
        # is still on its way, and only renewals keep the key this worker's.
        await asyncio.sleep(settings.lock_ttl * 2)
        await broker.publish(settings, {}, key="slow")  # a copy: must not run again
        await eventually(lambda: all_completed(store, ["slow"]), 20, "completed")
        await settle_all(broker, settings, dead_letters=0)
        await finished(consumer, broker, settings, dead_letters=0)
    finally:
        if consumer.task is not None and not consumer.task.done():
            consumer.stop.set()  # a failed test leaves no consumer running
            await asyncio.wait({consumer.task}, timeout=30)
        await faulty.close()
    assert len(runs(ledger, "slow")) == 1  # the copy waited, then was a duplicate


async def test_broker_drop_reconnects_and_a_long_absence_exits_1(
    consumer_settings: ConsumerSettings,
    broker: Broker,
    store: Store,
    ledger: Path,
    start_consumer: StartConsumer,
    rabbitmq_port: int,
) -> None:
    port = free_port()
    proxy = await TcpProxy(rabbitmq_port, port).start()
    settings = consumer_settings(
        amqp_url=f"amqp://guest:guest@127.0.0.1:{port}/", broker_give_up=3.0
    )
    consumer = await start_consumer(settings)
    try:
        await broker.publish(settings, {"sleep": 1.0}, key="in-flight")
        await eventually(lambda: _started(ledger, "in-flight"), what="'in-flight' running")
        await proxy.cut()  # the handler finishes, but its ACK cannot reach the broker
        await broker.publish(settings, {"n": 1}, key="while-away")
        await asyncio.sleep(1.5)  # away for a while, less than the give-up limit
        await proxy.start()
        await eventually(
            lambda: all_completed(store, ["in-flight", "while-away"]), 20, "both completed"
        )
        await settle_all(broker, settings, dead_letters=0)
        assert len(runs(ledger, "in-flight")) == 1  # its redelivery was a duplicate
        assert len(runs(ledger, "while-away")) == 1

        await proxy.cut()  # now for longer than broker_give_up
        assert consumer.task is not None
        code = await asyncio.wait_for(consumer.task, 20)
        assert code == 1
    finally:
        await proxy.cut()
    assert await broker.depth(settings.queue) == 0


@pytest.mark.parametrize("backend", ["postgres", "redis"])
async def test_a_stop_lets_a_delivery_whose_handler_ended_record_its_outcome(
    consumer_settings: ConsumerSettings, broker: Broker, store: Store, ledger: Path
) -> None:
    # The stop comes while the completion is on its way: cutting that short
    # would leave the key held for nobody, and its work would run again.
    settings = consumer_settings(shutdown_grace=0.01, lock_ttl=KEPT_LEASE)
    faulty = FaultyStore(await open_store(settings))
    faulty.slow_completions["ended"] = 1.5
    consumer = InProcessConsumer(settings, faulty)
    consumer.container.bounded_store.override(providers.Object(faulty))
    await consumer.start(broker, settings)
    try:
        await broker.publish(settings, {}, key="ended")

        async def ended() -> bool:
            return len(runs(ledger, "ended", "end")) == 1

        await eventually(ended, 10, "the handler ended")
        assert await consumer.finish() == 0
        assert await status_is(store, "ended", Status.COMPLETED)
        assert await broker.depth(settings.queue) == 0  # ACKed, not handed back
    finally:
        if consumer.task is not None and not consumer.task.done():
            consumer.stop.set()
            await asyncio.wait({consumer.task}, timeout=30)
        await faulty.close()
