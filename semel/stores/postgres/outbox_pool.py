"""The outbox table through a connection pool: what a relay calls, in one place.

Transactional mode's store holds one on its own pool (its commits wake the
relay at once); everywhere else the relay opens one on a small pool of its
own (:mod:`semel.consumer.outbox.source`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from semel.stores.errors import StoreMisconfigured
from semel.stores.postgres.errors import translated
from semel.stores.postgres.outbox import MISSING_TABLE, Ordering, OutboxTable, Publish, schema


class PooledOutbox:
    """The outbox ``table`` through ``pool``; sent rows are kept ``retention`` seconds."""

    def __init__(self, pool: AsyncConnectionPool, table: OutboxTable, retention: float) -> None:
        self._pool = pool
        self.outbox = table
        self.retention = retention
        self.commits = asyncio.Event()  # set when there may be rows to send

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
        """How many staged messages wait for the relay."""
        async with self._session() as conn:
            return await self.outbox.unsent(conn)

    async def check_schema(self) -> None:
        """Raise :class:`StoreMisconfigured` unless the table exists."""
        async with self._session() as conn:
            if not await self.outbox.exists(conn):
                raise StoreMisconfigured(MISSING_TABLE.format(table=self.outbox.table))

    async def migrate_outbox(self) -> None:
        """Create the table and its indexes (safe to run twice)."""
        async with self._session() as conn:
            for statement in schema(self.outbox.table):
                await conn.execute(statement)
