"""A pool's connections lent for one round trip at a time, and kept between lends.

Checking a connection out of redis-py's blocking pool and back costs about
a quarter of the client's CPU for a round trip to one server: a condition,
a timer, metric hooks, a test read for a connection closed meanwhile. A
Redis Cluster batch makes that round trip to every node it touches, every
few milliseconds under load, on the same few connections. A connection
given back to a :class:`Lender` is kept and lent again as it is while it
was last used within :data:`FRESH` seconds; one idle for longer goes back to
the pool, and the next lend takes one out of the pool with all its checks.
At most :data:`KEEP` are kept, and the pool still bounds how many exist.

A connection that failed is dropped by redis-py's connection layer (see
:mod:`semel.stores.redis.wire`), and a dropped one is never kept: the pool opens
it again. A kept connection that the server closed within the second (a
restart, ``CLIENT KILL``) fails on its next use, which is then the store
being away, as it was.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from redis.asyncio import ConnectionPool

FRESH = 1.0
"""Seconds a kept connection may sit unused and still be lent without the pool's checks."""
KEEP = 4
"""Connections kept at most: one per round trip a store has under way at once, and some."""


class Source(Protocol):
    """Where a round trip borrows its connection: a redis-py pool, or a :class:`Lender`."""

    async def get_connection(self) -> Any: ...

    async def release(self, connection: Any) -> None: ...


class Lender:
    """Lends ``pool``'s connections, keeping the ones given back (see the module)."""

    def __init__(self, pool: ConnectionPool) -> None:
        self.pool = pool
        self._kept: list[tuple[float, Any]] = []  # (last used, connection), newest last

    async def get_connection(self) -> Any:
        now = time.monotonic()
        while self._kept:
            used, connection = self._kept.pop()
            if now - used < FRESH and connection.is_connected:
                return connection
            await self.pool.release(connection)  # the pool checks it before lending it again
        return await self.pool.get_connection()  # type: ignore[no-untyped-call]

    async def release(self, connection: Any) -> None:
        if len(self._kept) < KEEP and connection.is_connected:
            self._kept.append((time.monotonic(), connection))
        else:
            await self.pool.release(connection)

    async def close(self) -> None:
        """Give every kept connection back to the pool, and close the pool."""
        kept, self._kept = self._kept, []
        for _, connection in kept:
            await self.pool.release(connection)
        await self.pool.aclose()
