"""The Redis store on one server: a standalone Redis, or the primary Sentinel names.

Which one a URL names, and a Redis Cluster too, is :mod:`semel.stores.redis.url`'s
to read; :func:`open_store` opens the store each needs. On one server a
batch (``claim_many`` / ``complete_many``) is one EVALSHA of a script over
all its keys: one round trip and one reply to decode (a script holds the
server while it runs: a few milliseconds for a few hundred keys). Under
Sentinel the pool asks the sentinels where the primary is for every new
connection, asks them again every second, and drops connections to a
primary they no longer name, so after a failover, which the consumer waits
out as an outage, the store is on the new primary by itself
(:mod:`semel.stores.redis.pools`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.asyncio import ConnectionPool, Redis

from semel.stores.base import Store, StoreConfig
from semel.stores.errors import StoreMisconfigured
from semel.stores.redis.base import Call, RedisScripts
from semel.stores.redis.cluster import RedisClusterStore
from semel.stores.redis.errors import CLUSTER
from semel.stores.redis.eval import Script, ScriptCall, pack
from semel.stores.redis.lender import Lender, Source
from semel.stores.redis.pools import (
    COMMAND_TIMEOUT,
    BlockingSentinelPool,
    close_sentinels,
    sentinel_pool,
    server_pool,
)
from semel.stores.redis.setup import NO_PERSISTENCE, server_facts, warnings_of
from semel.stores.redis.url import Mode, parse
from semel.stores.redis.wire import send

__all__ = ["COMMAND_TIMEOUT", "NO_PERSISTENCE", "RedisStore", "open_store"]

PING = pack(b"PING")


class RedisStore(RedisScripts):
    """One server holds every key: a standalone Redis, or the primary Sentinel names.

    A batch is one script call over all its keys.
    """

    def __init__(self, config: StoreConfig, client: Redis, replicas_ack: int = 0) -> None:
        super().__init__(config, replicas_ack)
        self._client = client
        self._pool = client.connection_pool
        self._sentinels: BlockingSentinelPool | None = None
        self._source: Source
        if isinstance(self._pool, BlockingSentinelPool):
            self._sentinels = self._pool
            self._sentinels.follow()
            # Every round trip through the pool: its give-back is where a connection
            # to a primary the sentinels no longer name is closed (a kept one would
            # write to the demoted primary for up to FRESH more).
            self._source = self._pool
        else:
            # A batch's connection kept for the next batch, as a Cluster node's: the
            # pool's checkout and give-back were a quarter of the client's CPU per trip.
            self._source = Lender(self._pool)

    async def _run(self, script: Script, calls: Sequence[Call], *, write: bool = True) -> list[Any]:
        (replies,) = await self._waited(
            [(self._source, [ScriptCall(script, c) for _, c in calls])], write
        )
        if isinstance(replies, Exception):
            raise replies
        return replies

    async def warnings(self) -> list[str]:
        """What the server's set-up risks; a cluster node behind a plain URL is refused."""
        facts = await self._call(lambda: server_facts(self._source))
        if facts.cluster_enabled:
            raise StoreMisconfigured(CLUSTER)
        return warnings_of(facts, self.replicas_ack)

    async def ping(self) -> None:
        await self._call(self._ping)

    async def _ping(self) -> None:
        # Through the batches' connections, not the client's own checkout: a
        # connection kept by the lender would otherwise be one the ping lacks.
        (reply,) = await send(self._source, [PING])
        if isinstance(reply, Exception):
            raise reply

    async def close(self) -> None:
        if self._sentinels is None:
            if isinstance(self._source, Lender):
                await self._source.give_back()
            await self._client.aclose()
            return
        await self._sentinels.stop()
        try:
            # May raise: a connection to a stalled primary can time out closing.
            await self._client.aclose()
        finally:
            await close_sentinels(self._sentinels)


async def open_store(
    *, url: str, connections: int, config: StoreConfig, replicas_ack: int = 0
) -> Store:
    """A store on ``url`` (see :mod:`semel.stores.redis.url`), pooling up to ``connections``
    per server; every write waits for ``replicas_ack`` replicas.

    Connections open lazily, so an unreachable server surfaces on the first
    operation as :class:`StoreUnavailable`, not here.
    """
    try:
        target = parse(url)
    except ValueError as exc:
        raise StoreMisconfigured(f"the Redis URL: {exc}") from None
    if target.mode is Mode.CLUSTER:
        return RedisClusterStore(config, target, connections, replicas_ack)
    pool: ConnectionPool
    if target.mode is Mode.SENTINEL:
        pool = sentinel_pool(target, connections)
    else:
        pool = server_pool(url, connections)
    return RedisStore(config, Redis.from_pool(pool), replicas_ack)
