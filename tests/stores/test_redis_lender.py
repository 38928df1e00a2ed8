"""A lender keeps the connections given back and lends them again, on a real Redis:
never one that was dropped, nor one idle past FRESH, and none beyond KEEP."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from semel.stores.redis import lender as redis_lender
from semel.stores.redis.eval import pack
from semel.stores.redis.lender import Lender
from semel.stores.redis.pools import server_pool
from semel.stores.redis.wire import send

pytestmark = pytest.mark.timeout(10)

PING = pack(b"PING")


@pytest.fixture
async def lender(redis_server: str) -> AsyncIterator[Lender]:
    lender = Lender(server_pool(redis_server, 8))
    yield lender
    await lender.close()


def checked_out(lender: Lender) -> int:
    """Connections the pool has lent: the lender's own, and those lent on."""
    return len(lender.pool._in_use_connections)


async def test_a_connection_given_back_is_lent_again_without_the_pool(lender: Lender) -> None:
    first = await lender.get_connection()
    await lender.release(first)
    assert checked_out(lender) == 1  # kept, not returned to the pool
    again = await lender.get_connection()
    assert again is first
    await lender.release(again)
    assert await send(lender, [PING]) == [b"PONG"]
    assert checked_out(lender) == 1


async def test_a_dropped_connection_goes_back_to_the_pool(lender: Lender) -> None:
    conn = await lender.get_connection()
    await conn.connect()
    await conn.disconnect()
    await lender.release(conn)
    assert checked_out(lender) == 0
    assert await send(lender, [PING]) == [b"PONG"]


async def test_a_connection_idle_too_long_goes_through_the_pools_checks(
    lender: Lender, monkeypatch: pytest.MonkeyPatch
) -> None:
    conn = await lender.get_connection()
    await lender.release(conn)
    monkeypatch.setattr(redis_lender, "FRESH", 0.0)
    returned: list[object] = []
    pool_release = lender.pool.release

    async def release(connection: object) -> None:
        returned.append(connection)
        await pool_release(connection)  # type: ignore[arg-type]

    monkeypatch.setattr(lender.pool, "release", release)
    await lender.get_connection()
    assert returned == [conn]  # back to the pool first, then checked out with its checks


async def test_no_more_than_keep_are_kept_and_close_returns_them(lender: Lender) -> None:
    lent = [await lender.get_connection() for _ in range(redis_lender.KEEP + 2)]
    for conn in lent:
        await conn.connect()
        await lender.release(conn)
    assert checked_out(lender) == redis_lender.KEEP
    await lender.close()
    assert checked_out(lender) == 0


async def test_a_connection_given_back_goes_to_a_caller_waiting_in_the_pool(
    redis_server: str,
) -> None:
    # One connection in all: the second caller waits in the pool while the first
    # has it. Kept by the lender, it would never reach that caller, who would
    # wait out the pool's timeout and find the store away.
    lender = Lender(server_pool(redis_server, 1))
    try:
        first = await lender.get_connection()
        second = asyncio.create_task(lender.get_connection())
        await asyncio.wait({second}, timeout=0.05)  # it waits in the pool meanwhile
        assert not second.done()
        await lender.release(first)
        conn = await asyncio.wait_for(second, 1.0)
        await lender.release(conn)
        assert await send(lender, [PING]) == [b"PONG"]
    finally:
        await lender.close()
