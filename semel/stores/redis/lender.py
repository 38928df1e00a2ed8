"""A pool's connections lent for one round trip at a time, and kept between lends.

Checking a connection out of redis-py's blocking pool and back costs about
a quarter of the client's CPU for a round trip to one server: a condition,
a timer, metric hooks, a test read for a connection closed meanwhile. The
store makes that round trip for every batch (a Redis Cluster batch to every
node it touches), every few milliseconds under load, on the same few
connections. A connection
given back to a :class:`Lender` is kept and lent again as it is while it
was last used within :data:`FRESH` seconds; one idle for longer goes back to
the pool, and the next lend takes one out of the pool with all its checks.
At most :data:`KEEP` are kept, and the pool still bounds how many exist.

A connection that failed is dropped by redis-py's connection layer (see
:mod:`semel.stores.redis.wire`), and a dropped one is never kept: the pool opens
it again. A kept connection that the server closed within the second (a
restart, ``CLIENT KILL``) fails on its next use, which is then the store
being away, as it was. Under Sentinel the store lends from the pool itself:
the pool's give-back is where a connection to a demoted primary is closed.
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
        self._waiting = 0  # callers waiting for the pool to lend them a connection

    async def get_connection(self) -> Any:
        now = time.monotonic()
        while self._kept:
            used, connection = self._kept.pop()
            if now - used < FRESH and connection.is_connected:
                return connection
            await self.pool.release(connection)  # the pool checks it before lending it again
        self._waiting += 1
        try:
            return await self.pool.get_connection()  # type: ignore[no-untyped-call]
        finally:
            self._waiting -= 1

    async def release(self, connection: Any) -> None:
        # Kept only if nobody waits in the pool: a caller that found every
        # connection out is woken by the pool's give-back alone, and would wait
        # out the pool's timeout beside a connection kept here.
        if not self._waiting and len(self._kept) < KEEP and connection.is_connected:
            self._kept.append((time.monotonic(), connection))
        else:
            await self.pool.release(connection)

    async def give_back(self) -> None:
        """Give every kept connection back to the pool (which the caller closes)."""
        kept, self._kept = self._kept, []
        for _, connection in kept:
            await self.pool.release(connection)

    async def close(self) -> None:
        """Give every kept connection back to the pool, and close the pool."""
        await self.give_back()
        await self.pool.aclose()
