"""The outbox table as a relay reads it: a small pool of its own, any store beside it.

Transactional mode's store already holds such a pool and relays through it
(:class:`semel.stores.postgres.transactional.TransactionalStore`); everywhere
else (``semel relay``, ``engine.relay()``, ``semel consume`` with
``SEMEL_OUTBOX_RELAY=true``) the relay opens a :class:`PostgresOutbox`.
Both answer the same calls (:class:`OutboxSource`), so one relay serves both.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from semel.consumer.stopping import UNWIND, within
from semel.stores.postgres.outbox import Ordering, OutboxTable, Publish
from semel.stores.postgres.outbox_pool import PooledOutbox
from semel.stores.postgres.store import open_pool

# A pass holds one connection while it publishes; the purge and the watch share
# the other. LISTEN has a connection of its own (semel.consumer.outbox.listener).
POOL_SIZE = 2
# Seconds the pool's tasks get to end when it closes; a connection still out
# (a pass left behind) is closed when it comes back.
CLOSE_WAIT = 2.0


class OutboxSource(Protocol):
    """What a relay needs of the outbox table."""

    # Set when there may be rows to send: a commit of this process, a NOTIFY.
    commits: asyncio.Event

    async def relay(
        self, limit: int, publish: Publish, ordering: Ordering = Ordering.OLDEST_FIRST
    ) -> int: ...

    async def purge_outbox(self, limit: int = ...) -> int: ...

    async def unsent(self) -> int: ...

    async def check_schema(self) -> None: ...


class PostgresOutbox(PooledOutbox):
    """:class:`PooledOutbox` on a pool of its own, closed with it."""

    async def migrate(self) -> None:
        """Create the table and its indexes (safe to run twice)."""
        await self.migrate_outbox()

    async def close(self) -> None:
        await within(
            CLOSE_WAIT + UNWIND, "closing the outbox pool", self._pool.close(timeout=CLOSE_WAIT)
        )


async def open_outbox(
    *, dsn: str, table: str, retention: float, deadline: float | None = None
) -> PostgresOutbox:
    """A :class:`PostgresOutbox` on a pool of its own; fails fast when the server is down."""
    pool = await open_pool(dsn=dsn, size=POOL_SIZE, name="semel-outbox", deadline=deadline)
    return PostgresOutbox(pool, OutboxTable(table), retention)
