"""Connection pools of the Redis store: one server, a Sentinel-managed primary, a cluster node.

Every pool blocks a caller for a free connection up to :data:`POOL_WAIT`
and never resends a command (see :func:`pool_options`). Connections open
lazily, so an unreachable server surfaces on the first operation as a
connection error, not when the pool is made.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, cast

from redis.asyncio import BlockingConnectionPool
from redis.asyncio.connection import AbstractConnection, SSLConnection, parse_url
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import (
    MasterNotFoundError,
    Sentinel,
    SentinelConnectionPool,
    SentinelManagedConnection,
    SentinelManagedSSLConnection,
)
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from semel.stores.redis.url import RedisTarget

CONNECT_TIMEOUT = 2.0
"""Seconds to open a connection: a stopped server shows up this fast."""
COMMAND_TIMEOUT = 3.0
"""Seconds to wait for a reply; a script never runs near this long, nor does a ``WAIT``."""
POOL_WAIT = 5.0
"""Seconds an operation waits for a free pooled connection; then the store counts as down."""


def pool_options(connections: int) -> dict[str, Any]:
    """The options of every pool of the store."""
    return {
        # One connection per delivery in flight; heartbeats beyond that wait briefly.
        "max_connections": connections,
        "timeout": POOL_WAIT,
        "socket_connect_timeout": CONNECT_TIMEOUT,
        "socket_timeout": COMMAND_TIMEOUT,
        # Never resend: a script that ran but whose reply was lost would run
        # twice, and a repeated complete would report a fence it lost to itself.
        # Scripts bypass the client's retry loop (semel.stores.redis.eval); ping and
        # CONFIG GET still go through it.
        "retry": Retry(NoBackoff(), 0),
    }


def server_pool(url: str, connections: int) -> BlockingConnectionPool:
    """A pool of connections to the one server ``url`` names (a standalone or a cluster node)."""
    return BlockingConnectionPool.from_url(url, **pool_options(connections))


SENTINEL_POLL = 1.0
"""Seconds between two questions to the sentinels about where the primary is."""


class Sentinels(Sentinel):
    """redis-py's client of the sentinels, asked by several connections at once.

    Its ``discover_master`` asks the sentinels in turn and moves the one that
    named the primary to the front by swapping list positions taken before its
    wait for the answer. Connections opened at once while the first sentinel
    calls the primary down (the first to see it die, during a failover) all ask
    the next one; once one of them has moved it to the front, the next swap
    writes it twice and drops the first sentinel from the list: never asked
    again, never closed, its open connections left for the garbage collector.
    Here each caller goes through the sentinels as they were when it began, and
    the one that answered is moved to the front by identity, in one step.
    """

    async def discover_master(self, service_name: str) -> tuple[str, int]:
        errors = []
        for sentinel in list(self.sentinels):
            try:
                # Parsed into a dict by primary name (its type says a list may come too).
                masters = cast(dict[str, Any], await sentinel.sentinel_masters())
            except (RedisConnectionError, RedisTimeoutError) as exc:
                errors.append(f"{sentinel} - {exc!r}")
                continue
            state = masters.get(service_name)
            if state and self.check_master_state(state, service_name):
                self.sentinels.remove(sentinel)
                self.sentinels.insert(0, sentinel)
                return state["ip"], state["port"]
        said = f" : {', '.join(errors)}" if errors else ""
        raise MasterNotFoundError(f"No master found for {service_name!r}{said}")


class BlockingSentinelPool(SentinelConnectionPool, BlockingConnectionPool):
    """Connections to the primary Sentinel names, blocking for a free one like the others.

    Each new connection asks the sentinels where the primary is, and one to a
    primary demoted under it is closed on its first ``READONLY``. A primary
    that is up when a failover demotes it (a planned failover, a partition)
    accepts writes until the sentinels reconfigure it, seconds later, and its
    replacement never gets them: :meth:`follow` asks the sentinels every
    :data:`SENTINEL_POLL` and drops the connections to a primary they no longer
    name, which bounds that window to about a second (replica
    acknowledgements close it).
    """

    async def release(self, connection: AbstractConnection) -> None:
        address = getattr(connection, "host", None), getattr(connection, "port", None)
        if self.master_address is not None and address != self.master_address:
            # To a primary the sentinels no longer name: not waiting for the close to
            # finish, which a stalled one can hold until the close's timeout raises.
            await connection.disconnect(nowait=True)
        await super().release(connection)

    _stopped = False
    _following: asyncio.Task[None] | None = None

    def follow(self) -> None:
        """Ask the sentinels where the primary is, every :data:`SENTINEL_POLL`, in a task
        of the running loop, until :meth:`stop`; when it moved, idle connections close
        now and busy ones when released."""
        self._following = asyncio.get_running_loop().create_task(self._poll())

    async def _poll(self) -> None:
        while not self._stopped:
            await asyncio.sleep(SENTINEL_POLL)
            with contextlib.suppress(RedisError, OSError):
                await self.get_master_address()  # type: ignore[no-untyped-call]

    async def stop(self) -> None:
        """End the poll: told to stop and cancelled. The flag ends the loop even if
        redis-py hands the cancel back as a timeout error, which the loop suppresses:
        a store's close once waited on it for ever."""
        self._stopped = True
        if self._following is not None:
            self._following.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._following


def sentinel_pool(target: RedisTarget, connections: int) -> BlockingSentinelPool:
    """A pool of connections to ``target``'s primary, found through its sentinels."""
    kwargs: dict[str, Any] = dict(parse_url(target.node_url(("localhost", 0))))
    for placeholder in ("host", "port"):
        kwargs.pop(placeholder, None)
    tls = kwargs.pop("connection_class", None) is SSLConnection
    options = pool_options(connections)
    asking = {
        # A sentinel that does not answer is skipped for the next one: no resend.
        k: options[k]
        for k in ("socket_connect_timeout", "socket_timeout", "retry")
    }
    asking |= {k.removeprefix("sentinel_"): v for k, v in target.sentinel_auth.items()}
    if tls:
        asking |= {k: v for k, v in kwargs.items() if k.startswith("ssl")}
        asking["ssl"] = True
    sentinels = Sentinels(list(target.hosts), sentinel_kwargs=asking)  # type: ignore[no-untyped-call]
    connection = SentinelManagedSSLConnection if tls else SentinelManagedConnection
    return BlockingSentinelPool(  # type: ignore[no-untyped-call]
        target.service, sentinels, connection_class=connection, **options, **kwargs
    )


async def close_sentinels(pool: BlockingSentinelPool) -> None:
    """Close the pool's connections to the sentinels (the pool's own close leaves them)."""
    manager: Sentinel = pool.sentinel_manager
    await manager.aclose()
