"""Writes that wait for replicas (``SEMEL_REDIS_REPLICAS_ACK``): a write too few replicas
acknowledge is the store being away, never a write reported stored; and what the store
reported stored survives its primary."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from semel.stores.base import ClaimRequest, Completion, Outcome, Status, StoreConfig
from semel.stores.errors import StoreUnavailable
from semel.stores.redis.errors import NotReplicated
from semel.stores.redis.setup import FEW_REPLICAS
from semel.stores.redis.store import open_store
from tests.conftest import StoreFactory
from tests.proxy import TcpProxy
from tests.redis_process import HOST, Server, Topology, until
from tests.servers import free_port
from tests.stores.race import decided

pytestmark = pytest.mark.timeout(90)

FP = "f" * 64
LEASE = 3.0  # a second's deadline per call: a WAIT gives up after half a second


@pytest.mark.parametrize("backend", ["redis-sentinel", "redis-cluster"])
async def test_a_write_too_few_replicas_acknowledge_is_the_store_away(
    make_store: StoreFactory,
) -> None:
    # One replica per primary; the store asks for two.
    store = await make_store(lock_ttl=LEASE, redis_replicas_ack=2)
    met = await make_store(lock_ttl=LEASE, redis_replicas_ack=1, key_prefix=store.config.key_prefix)
    assert any(FEW_REPLICAS.format(wanted=2, replicas=1) in w for w in await store.warnings())
    warm = decided(await met.claim_many([ClaimRequest(f"warm{i}", FP) for i in range(30)]))
    await met.complete_many([Completion(c.record.key, c.fence, b"1") for c in warm])
    keys = [f"k{i}" for i in range(10)]
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as info:
        await store.claim_many([ClaimRequest(k, FP) for k in keys])
    assert isinstance(info.value.__cause__, NotReplicated)
    assert time.monotonic() - started < LEASE / 3  # within a store call's deadline
    # The claims were given back uncounted: the next claim gets in at once, as the first.
    claims = decided(await met.claim_many([ClaimRequest(k, FP) for k in keys]))
    assert [(c.outcome, c.record.claims) for c in claims] == [(Outcome.CLAIMED, 1)] * len(keys)
    # Every write waits, and fails the same way; a read does not wait.
    first = claims[0]
    with pytest.raises(StoreUnavailable):
        await store.heartbeat(first.record.key, first.fence)
    with pytest.raises(StoreUnavailable):
        await store.complete_many([Completion(first.record.key, first.fence, b"1")])
    record = await store.get(first.record.key)
    assert record is not None
    # The completion landed on the primary; only its copy on a replica was not confirmed.
    assert record.status is Status.COMPLETED


async def _pair(root: Path) -> tuple[Server, Server, TcpProxy]:
    """A primary, and a replica whose replication link runs through a proxy."""
    primary = Server(free_port(), root / "primary", [])
    primary.options = _options(primary)
    primary.start()
    proxy = await TcpProxy(primary.port, free_port()).start()
    replica = Server(free_port(), root / "replica", [])
    replica.options = [*_options(replica), "--replicaof", HOST, str(proxy.port)]
    replica.start()
    await asyncio.to_thread(until, lambda: Topology.in_sync(replica), "the replica in sync")
    return primary, replica, proxy


def _options(server: Server) -> list[str]:
    return [
        *("--port", str(server.port), "--bind", HOST, "--dir", str(server.workdir)),
        *("--save", "", "--appendonly", "no"),
    ]


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[tuple[Server, Server, TcpProxy]]:
    primary, replica, proxy = await _pair(tmp_path)
    try:
        yield primary, replica, proxy
    finally:
        await proxy.close()
        primary.stop()
        replica.stop()


@pytest.mark.parametrize("acks", [0, 1])
async def test_what_is_reported_stored_survives_the_primary_only_with_replica_acks(
    pair: tuple[Server, Server, TcpProxy], acks: int
) -> None:
    primary, replica, proxy = pair
    config = StoreConfig(lock_ttl=LEASE, key_prefix="t" + uuid.uuid4().hex[:12])
    store = await open_store(
        url=f"redis://{HOST}:{primary.port}/0", connections=4, config=config, replicas_ack=acks
    )
    try:
        before, during = decided(
            await store.claim_many([ClaimRequest("before", FP), ClaimRequest("during", FP)])
        )
        assert await store.complete("before", before.fence, "ok")
        offset = primary.info("replication")["master_repl_offset"]
        await asyncio.to_thread(
            until,
            lambda: replica.info("replication")["slave_repl_offset"] == offset,
            "the replica caught up",
        )
        proxy.stall()  # the replica hears nothing more, nor is heard: a lagging link
        refusal: BaseException | None = None
        try:
            reported = await store.complete("during", during.fence, "ok")
        except StoreUnavailable as exc:
            refusal, reported = exc.__cause__, False
    finally:
        await store.close()
    primary.kill()  # then its replica is promoted, as Sentinel or the cluster would
    with replica.client() as client:
        client.replicaof("NO", "ONE")
    promoted = await open_store(url=f"redis://{HOST}:{replica.port}/0", connections=4,
                                config=config)  # fmt: skip
    try:
        kept = await promoted.get("before")
        lost = await promoted.get("during")
    finally:
        await promoted.close()
    assert kept is not None
    assert kept.status is Status.COMPLETED
    assert lost is not None
    assert lost.status is Status.IN_PROGRESS  # its completion never reached the replica
    # Without acknowledgements the store reported that completion stored, and it is gone:
    # a late copy would run again. With them, it was never reported stored.
    assert reported is (acks == 0)
    assert isinstance(refusal, NotReplicated) is (acks == 1)
