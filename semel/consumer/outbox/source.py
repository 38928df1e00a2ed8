"""The outbox table as a relay reads it: a small pool of its own, any store beside it.

Transactional mode's store already holds such a pool and relays through it
(:class:`semel.stores.postgres.transactional.TransactionalStore`); everywhere
else (``semel relay``, ``engine.relay()``, ``semel consume`` with
``SEMEL_OUTBOX_RELAY=true``) the relay opens a :class:`PostgresOutbox`.
Both answer the same calls (:class:`OutboxSource`), so one relay serves both.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, Protocol

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from semel.stores.errors import StoreMisconfigured
from semel.stores.postgres.errors import translated
from semel.stores.postgres.outbox import MISSING_TABLE, Ordering, OutboxTable, Publish, schema
from semel.stores.postgres.store import open_pool

# A pass holds one connection while it publishes; the purge and the watch share
# the other. LISTEN has a connection of its own (semel.consumer.outbox.listener).
POOL_SIZE = 2


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


class PostgresOutbox:
    """The outbox ``table`` through ``pool``; sent rows are kept ``retention`` seconds."""

    def __init__(self, pool: AsyncConnectionPool, table: OutboxTable, retention: float) -> None:
        self._pool = pool
        self.outbox = table
        self.retention = retention
        self.commits = asyncio.Event()

    @contextlib.asynccontextmanager
    async def _session(self) -> AsyncIterator[AsyncConnection[Any]]:
        with translated():
            async with self._pool.connection() as conn:
                yield conn

    async def relay(
        self, limit: int, publish: Publish, ordering: Ordering = Ordering.OLDEST_FIRST
    ) -> int:
        """One pass (:meth:`OutboxTable.relay`); returns how many rows it took."""
        async with self._session() as conn:
            return await self.outbox.relay(conn, limit, publish, ordering)

    async def purge_outbox(self, limit: int = 10_000) -> int:
        """Delete up to ``limit`` rows sent longer ago than the retention period."""
        async with self._session() as conn:
            return await self.outbox.purge(conn, self.retention, limit)

    async def unsent(self) -> int:
        async with self._session() as conn:
            return await self.outbox.unsent(conn)

    async def check_schema(self) -> None:
        """Raise :class:`StoreMisconfigured` unless the table exists."""
        async with self._session() as conn:
            if not await self.outbox.exists(conn):
                raise StoreMisconfigured(MISSING_TABLE.format(table=self.outbox.table))

    async def migrate(self) -> None:
        """Create the table and its indexes (safe to run twice)."""
        async with self._session() as conn:
            for statement in schema(self.outbox.table):
                await conn.execute(statement)

    async def close(self) -> None:
        await self._pool.close()


async def open_outbox(
    *, dsn: str, table: str, retention: float, deadline: float | None = None
) -> PostgresOutbox:
    """A :class:`PostgresOutbox` on a pool of its own; fails fast when the server is down."""
    pool = await open_pool(dsn=dsn, size=POOL_SIZE, name="semel-outbox", deadline=deadline)
    return PostgresOutbox(pool, OutboxTable(table), retention)
