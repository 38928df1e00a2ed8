"""A primary killed under a stream of claims and completions: the store says it is away
(never a wrong answer), then finds the promoted replica by itself, in Cluster and under
Sentinel; with writes waiting for a replica, nothing it said was stored is lost."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TypeVar

import pytest

from semel.stores.base import ClaimRequest, Completion, Outcome, Store
from semel.stores.errors import StoreUnavailable
from semel.stores.redis.errors import NotReplicated
from tests.conftest import StoreFactory
from tests.redis_servers import Cluster, SentinelSet
from tests.stores.race import decided

pytestmark = pytest.mark.timeout(180)

FP = "f" * 64
RECOVERY = 20.0  # seconds the store may take to write again once a replica was promoted
T = TypeVar("T")


class Stream:
    """Batches of new keys, each claimed then completed, every call retried until answered.

    With ``acks`` (replica acknowledgements) every answer must hold across the failover;
    without, a claim a failover lost can make its completion answer False.
    """

    def __init__(self, store: Store, acks: int) -> None:
        self.store = store
        self.acks = acks
        self.claims_lost: list[str] = []
        self.stop = asyncio.Event()
        self.batches = 0
        self.refusals: list[StoreUnavailable] = []
        self.stored: dict[str, int] = {}  # key: fence, for every completion answered True
        self.last_answer = 0.0

    async def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            keys = [f"s{n}-{i}" for i in range(8)]
            n += 1
            requests = [ClaimRequest(key, FP) for key in keys]
            failed_before = len(self.refusals)
            claims = decided(await self._answered(partial(self.store.claim_many, requests)))
            # A retried claim of a key its lost answer had granted: in progress. Nothing else.
            assert {c.outcome for c in claims} <= {Outcome.CLAIMED, Outcome.IN_PROGRESS}
            if len(self.refusals) == failed_before:
                assert {c.outcome for c in claims} == {Outcome.CLAIMED}
            granted = [c for c in claims if c.outcome is Outcome.CLAIMED]
            completions = [Completion(c.record.key, c.fence, b'"done"') for c in granted]
            failed_before = len(self.refusals)
            written = decided(await self._answered(partial(self.store.complete_many, completions)))
            for claim, stored in zip(granted, written, strict=True):
                if stored:
                    self.stored[claim.record.key] = claim.fence
                elif len(self.refusals) == failed_before:  # not a retry finding its own write
                    assert not self.acks, f"{claim.record.key}: acknowledged claim lost"
                    self.claims_lost.append(claim.record.key)
            self.batches += 1
            self.last_answer = time.monotonic()
            await asyncio.sleep(0.02)

    async def _answered(self, call: Callable[[], Awaitable[T]]) -> T:
        while True:
            try:
                return await call()
            except StoreUnavailable as exc:
                self.refusals.append(exc)
                await asyncio.sleep(0.1)


async def until(check: Callable[[], bool], what: str, deadline: float = RECOVERY) -> None:
    end = time.monotonic() + deadline
    while not check():
        if time.monotonic() > end:
            pytest.fail(f"{what}: not within {deadline:g}s")
        await asyncio.sleep(0.05)


async def pinged(store: Store) -> bool:
    try:
        await store.ping()
    except StoreUnavailable:
        return False
    return True


@pytest.mark.parametrize("acks", [0, 1])
@pytest.mark.parametrize("backend", ["redis-cluster", "redis-sentinel"])
async def test_a_killed_primary_is_an_outage_then_the_store_finds_its_successor(
    make_store: StoreFactory, request: pytest.FixtureRequest, backend: str, acks: int
) -> None:
    topology: Cluster | SentinelSet = request.getfixturevalue(backend.replace("-", "_"))
    store = await make_store(lock_ttl=3.0, redis_replicas_ack=acks)
    stream = Stream(store, acks)
    streaming = asyncio.create_task(stream.run())
    victim = None
    try:
        await until(lambda: stream.batches >= 5, "the stream flowing")
        killing = asyncio.create_task(asyncio.to_thread(topology.kill_primary))
        pings = []
        while not killing.done():  # readiness meanwhile
            pings.append(await pinged(store))
            await asyncio.sleep(0.1)
        victim = await killing
        assert False in pings, "the store answered its ping with a primary down"
        promoted_at = time.monotonic()
        if acks:
            # The successor has no replica yet: every write is refused, none is lost.
            refused = len(stream.refusals)
            await until(lambda: len(stream.refusals) > refused + 3, "writes refused")
            assert isinstance(stream.refusals[-1].__cause__, NotReplicated)
            await asyncio.to_thread(topology.heal, victim)
            victim = None
        batches = stream.batches
        await until(lambda: stream.batches > batches + 5, "the stream flowing again")
        assert await pinged(store)
        recovered_in = stream.last_answer - promoted_at
    finally:
        stream.stop.set()
        await streaming
        if victim is not None:
            await asyncio.to_thread(topology.heal, victim)

    assert stream.refusals, "the stream never met the failover"
    assert all(isinstance(r, StoreUnavailable) for r in stream.refusals)
    # Every completion the store said was stored: after the failover, is it there?
    keys = list(stream.stored)
    claims = decided(await store.claim_many([ClaimRequest(key, FP) for key in keys]))
    lost = [c.record.key for c in claims if c.outcome is not Outcome.DUPLICATE]
    if acks:
        assert lost == []
    print(
        f"{backend} acks={acks}: recovered {recovered_in:.1f}s after the promotion; "
        f"{len(stream.refusals)} refusals; {len(lost)} of {len(keys)} completions lost; "
        f"{len(stream.claims_lost)} claims lost"
    )


@pytest.mark.parametrize("acks", [0, 1])
@pytest.mark.parametrize("backend", ["redis-cluster", "redis-sentinel"])
async def test_a_planned_failover_moves_the_store_to_the_new_primary(
    make_store: StoreFactory, request: pytest.FixtureRequest, backend: str, acks: int
) -> None:
    # The old primary stays up, demoted: it answers MOVED (Cluster) once its replica
    # took over; under Sentinel it takes writes until the sentinels reconfigure it,
    # which its successor never gets.
    topology: Cluster | SentinelSet = request.getfixturevalue(backend.replace("-", "_"))
    store = await make_store(lock_ttl=3.0, redis_replicas_ack=acks)
    stream = Stream(store, acks)
    streaming = asyncio.create_task(stream.run())
    try:
        await until(lambda: stream.batches >= 5, "the stream flowing")
        await asyncio.to_thread(topology.switch_over)
        batches = stream.batches
        await until(lambda: stream.batches > batches + 5, "the stream flowing again")
    finally:
        stream.stop.set()
        await streaming
    keys = list(stream.stored)
    claims = decided(await store.claim_many([ClaimRequest(key, FP) for key in keys]))
    lost = [c.record.key for c in claims if c.outcome is not Outcome.DUPLICATE]
    # CLUSTER FAILOVER waits for the replica to catch up; SENTINEL FAILOVER does not,
    # and the old primary takes writes until the store has seen the switch.
    if acks or backend == "redis-cluster":
        assert lost == []
    print(
        f"{backend} acks={acks} switch-over: {len(stream.refusals)} refusals; "
        f"{len(lost)} of {len(keys)} completions lost; {len(stream.claims_lost)} claims lost"
    )
