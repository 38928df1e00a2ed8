"""Which primary of a Redis Cluster serves each hash slot, and a connection pool per node.

The map is read with ``CLUSTER SLOTS`` from the first node that answers
(the one that answered last, then the known primaries, then the URL's seed
nodes), and corrected slot by slot by the ``MOVED`` redirections the nodes
answer. A node that cannot be reached, or a cluster that says it is down,
makes the map stale: the next call reads it again first, which is how a
promoted replica is found after a failover.
"""

from __future__ import annotations

import asyncio
from typing import Any

from redis.crc import REDIS_CLUSTER_HASH_SLOTS
from redis.exceptions import ClusterDownError, RedisError, ResponseError

from semel.stores.errors import StoreMisconfigured
from semel.stores.redis.eval import pack
from semel.stores.redis.lender import Lender
from semel.stores.redis.pools import server_pool
from semel.stores.redis.url import Address, RedisTarget
from semel.stores.redis.wire import send

CLUSTER_SLOTS = pack(b"CLUSTER", b"SLOTS")
NOT_A_CLUSTER = (
    "a redis+cluster:// URL reached a server not in cluster mode; "
    "reach one server with redis:// (or a Sentinel-managed primary with redis+sentinel://)"
)


class SlotMap:
    """The primaries of ``target``'s cluster, by slot; ``connections`` per node's pool."""

    def __init__(self, target: RedisTarget, connections: int) -> None:
        self._target = target
        self._connections = connections
        self._pools: dict[Address, Lender] = {}
        self._owners: list[Address | None] = [None] * REDIS_CLUSTER_HASH_SLOTS
        self.primaries: list[Address] = []
        self._answered: Address | None = None
        self._stale = True
        self._reading = asyncio.Lock()

    def pool(self, address: Address) -> Lender:
        """The connections to the node at ``address``, opened on first use."""
        pool = self._pools.get(address)
        if pool is None:
            pool = Lender(server_pool(self._target.node_url(address), self._connections))
            self._pools[address] = pool
        return pool

    def node(self, slot: int) -> Address:
        """The primary serving ``slot``; a slot nobody serves is a cluster that is down."""
        owner = self._owners[slot]
        if owner is None:
            self._stale = True
            raise ClusterDownError(f"hash slot {slot} is not served")
        return owner

    def moved(self, slot: int, address: Address) -> None:
        """A node answered ``MOVED``: ``slot`` is served at ``address`` now."""
        self._owners[slot] = address
        if address not in self.primaries:  # a node the map does not know: read it all again
            self._stale = True

    def forget(self) -> None:
        """Read the map again before the next call: a node failed, or the cluster is down."""
        self._stale = True

    async def ready(self) -> None:
        """Read the map if it is stale; one reading serves every caller waiting for it."""
        if not self._stale:
            return
        async with self._reading:
            if self._stale:
                await self._read()

    async def _read(self) -> None:
        asked = [a for a in (self._answered,) if a is not None]
        candidates = list(dict.fromkeys([*asked, *self.primaries, *self._target.hosts]))
        failure: Exception | None = None
        for address in candidates:
            try:
                (reply,) = await send(self.pool(address), [CLUSTER_SLOTS])
            except (RedisError, OSError) as exc:  # that node is away: ask the next
                failure = exc
                continue
            if isinstance(reply, ResponseError):
                if "cluster support disabled" in str(reply):
                    raise StoreMisconfigured(NOT_A_CLUSTER)
                raise reply
            self._load(reply, address)
            return
        assert failure is not None  # the URL names one host at least
        raise failure

    def _load(self, reply: Any, asked: Address) -> None:
        owners: list[Address | None] = [None] * REDIS_CLUSTER_HASH_SLOTS
        primaries: set[Address] = set()
        for start, end, primary, *_replicas in reply:
            # An empty host is the node's own address as the asked node reaches it.
            host = primary[0].decode() if primary[0] else asked[0]
            address = (host, int(primary[1]))
            owners[start : end + 1] = [address] * (end + 1 - start)
            primaries.add(address)
        self._owners = owners
        self.primaries = sorted(primaries)
        self._answered = asked
        self._stale = False

    async def close(self) -> None:
        pools, self._pools = list(self._pools.values()), {}
        await asyncio.gather(*(pool.close() for pool in pools))
