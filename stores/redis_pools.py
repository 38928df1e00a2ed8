"""Connection pools of the Redis store.

Every pool blocks a caller for a free connection up to :data:`POOL_WAIT`
and never resends a command (see :func:`pool_options`). Connections open
lazily, so an unreachable server surfaces on the first operation as a
connection error, not when the pool is made.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import BlockingConnectionPool
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

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
        # Scripts bypass the client's retry loop (stores.redis_eval); ping and
        # CONFIG GET still go through it.
        "retry": Retry(NoBackoff(), 0),
    }


def server_pool(url: str, connections: int) -> BlockingConnectionPool:
    """A pool of connections to the one server ``url`` names (a standalone or a cluster node)."""
    return BlockingConnectionPool.from_url(url, **pool_options(connections))
