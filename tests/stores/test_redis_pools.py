"""The Sentinel pool's poll ends when stopped, whatever redis-py makes of a cancel."""

from __future__ import annotations

import asyncio

import pytest
from redis.exceptions import TimeoutError as RedisTimeoutError

from stores import redis_pools
from stores.redis_pools import sentinel_pool
from stores.redis_url import parse

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
