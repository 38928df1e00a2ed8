"""The Sentinel pool's poll ends when stopped, whatever redis-py makes of a cancel; the
sentinels' connections all close with the store, however many asked them at once."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import pytest
from redis.exceptions import TimeoutError as RedisTimeoutError

from semel.stores.base import Outcome, StoreConfig
from semel.stores.redis import pools as redis_pools
from semel.stores.redis.pools import sentinel_pool
from semel.stores.redis.store import open_store
from semel.stores.redis.url import parse
from tests.redis_process import HOST
from tests.redis_sentinels import SERVICE, AstraySentinel
from tests.redis_servers import SentinelSet, running

pytestmark = pytest.mark.timeout(10)


async def test_a_cancel_turned_into_a_timeout_still_ends_the_poll(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Python 3.11's asyncio.timeout can hand a cancellation that lands as its own
    # deadline passes back as TimeoutError; redis-py raises its own TimeoutError.
    monkeypatch.setattr(redis_pools, "SENTINEL_POLL", 0.01)
    pool = sentinel_pool(parse("redis+sentinel://127.0.0.1:1/mymaster"), 2)
    asked = asyncio.Event()

    async def swallowing() -> None:
        asked.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            raise RedisTimeoutError("Timeout reading from 127.0.0.1:1") from None

    monkeypatch.setattr(pool, "get_master_address", swallowing)
    pool.follow()
    await asyncio.wait_for(asked.wait(), 5)
    await asyncio.wait_for(pool.stop(), 5)  # for ever before the fix
    assert pool._following is not None
    assert pool._following.done()
    await redis_pools.close_sentinels(pool)


@pytest.fixture
def astray_sentinel() -> Iterator[AstraySentinel]:
    with running(AstraySentinel()) as astray:
        yield astray


@pytest.mark.timeout(60)
async def test_connections_asking_past_a_sentinel_that_calls_the_primary_down_all_close(
    redis_sentinel: SentinelSet, astray_sentinel: AstraySentinel
) -> None:
    # The first sentinel named says the primary is down, as the first sentinel to see a
    # primary die does while the others still name it: every connection the store
    # opens meanwhile asks it, then the next one, all at once.
    sentinels = [astray_sentinel.sentinel, *redis_sentinel.sentinels]
    url = f"redis+sentinel://{','.join(f'{HOST}:{s.port}' for s in sentinels)}/{SERVICE}/0"
    config = StoreConfig(key_prefix="t" + uuid.uuid4().hex[:12])
    store = await open_store(url=url, connections=8, config=config)
    try:
        claims = await asyncio.gather(*(store.claim(f"k{i}", "f" * 64) for i in range(8)))
        assert {c.outcome for c in claims} == {Outcome.CLAIMED}
    finally:
        await store.close()
    end = time.monotonic() + 5
    while (left := await asyncio.to_thread(astray_sentinel.clients)) > 0:
        assert time.monotonic() < end, f"{left} connections to the first sentinel left open"
        await asyncio.sleep(0.05)
