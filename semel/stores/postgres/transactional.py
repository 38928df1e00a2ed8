"""The PostgreSQL store in transactional mode: a handler's writes and its key's
completion in one transaction.

The claim is the ordinary one-statement claim, committed on its own, so a
duplicate meets a committed ``in_progress`` row and is treated as a conflict.
The handler then runs inside a transaction on a connection of its own
(:meth:`TransactionalStore.run_unit`); staged messages are inserted into the
outbox table, and the transaction ends with the key's fenced completion.
Business writes, the completion and the outgoing messages commit together or
not at all; a completion that finds its fence gone rolls everything back.

The key's row is locked by that transaction only from the fenced completion,
issued last, to the commit. Nothing else ever waits for it: every connection
the store itself uses carries a short ``lock_timeout``, and a claim that runs
into it answers "in progress", which sends the duplicate to the conflict queue.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from enum import Enum
from typing import Any

import psycopg
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from semel.stores.base import JSON, Claim, Completion, Outcome, Record, Status, Store, StoreConfig
from semel.stores.errors import FencedOut, StoreError, StoreUnavailable
from semel.stores.postgres.errors import BACKEND, one_line, translated
from semel.stores.postgres.outbox import Ordering, Outbox, OutboxTable, Publish
from semel.stores.postgres.outbox_pool import PooledOutbox
from semel.stores.postgres.store import POOL_TIMEOUT, PostgresStore, open_pool, pool_size
from semel.stores.shared.refusal import refused_outcome

# A claim (or heartbeat) that meets a locked key row gives up after this long:
# the row belongs to a transaction that is about to commit, or to a lost client.
LOCK_TIMEOUT_MS = 100
# A handler's transaction idle longer than its time limit plus this belongs to a
# client that is gone or frozen; the server then ends it, and its locks with it.
IDLE_MARGIN = 10.0  # seconds
# Claims go one by one here (a batch would fail whole on one locked row), and
# every handler holds a unit connection: both pools keep one connection per
# in-flight delivery, within what the server can afford.
POOL_MAX = (2, 32)

Work = Callable[[AsyncConnection[Any], Outbox], Awaitable[JSON]]


class Phase(Enum):
    """How far a unit of work has got towards its commit."""

    COMPLETING = "completing"  # the fenced completion is sent: the row is ours or lost
    COMMITTED = "committed"


class TransactionalStore(PostgresStore):
    """The PostgreSQL store plus units of work and the outbox table."""

    def __init__(
        self,
        config: StoreConfig,
        pool: AsyncConnectionPool,
        table: str,
        *,
        units: AsyncConnectionPool,
        outbox: OutboxTable,
    ) -> None:
        super().__init__(config, pool, table)
        self._units = units
        self.outbox = outbox
        self._outbox = PooledOutbox(pool, outbox, config.retention)
        self.commits = self._outbox.commits  # set after every commit; the relay waits on it
        # (key, fence) of units past their fenced completion; the pipeline's
        # heartbeat and completion for such a claim are answered from here.
        self._finishing: dict[tuple[str, int], Phase] = {}

    # -- the claim never waits for a row lock ---------------------------------------------

    # One claim per key: a lock timeout on one key's row must not fail a batch.
    # (PostgresStore's batches are typed as the contract's, so these fit.)
    claim_many = Store.claim_many
    complete_many = Store.complete_many

    async def claim(self, key: str, fingerprint: str) -> Claim:
        try:
            return await super().claim(key, fingerprint)
        except StoreUnavailable as exc:
            if not isinstance(exc.__cause__, psycopg.errors.LockNotAvailable):
                raise
        # A transaction is writing the row. Its last committed state decides what
        # this delivery is; if that state would let us in, the writer is about to
        # change it, so the answer is "in progress" either way.
        async with self._cursor() as cur:
            await cur.execute(self._sql.inspect, self._params(key))
            row = await cur.fetchone()
        if row is None:
            record = Record(key, fingerprint, Status.IN_PROGRESS, 0, 0, None)
            return Claim(Outcome.IN_PROGRESS, record)
        record = self._record(key, row)
        outcome = refused_outcome(record, fingerprint, live=row[11], leased=row[12])
        return Claim(outcome or Outcome.IN_PROGRESS, record)

    # -- the pipeline's fenced writes, answered by the unit where it got that far ---------

    async def heartbeat(self, key: str, fence: int) -> bool:
        if (key, fence) in self._finishing:
            return True  # the unit's own transaction holds the row: the lease no longer matters
        try:
            renewed = await super().heartbeat(key, fence)
        except StoreUnavailable:
            if (key, fence) in self._finishing:
                return True  # it waited on our own completion's lock
            raise
        # A heartbeat sent just before the completion sees the completed row.
        return renewed or (key, fence) in self._finishing

    async def complete_encoded(self, completion: Completion) -> bool:
        if self._finishing.pop((completion.key, completion.fence), None) is Phase.COMMITTED:
            return True  # completed by the unit's commit, with the business writes
        return await super().complete_encoded(completion)

    async def release(self, key: str, fence: int) -> bool:
        self._finishing.pop((key, fence), None)
        return await super().release(key, fence)

    async def fail(self, key: str, fence: int, error: str) -> bool:
        self._finishing.pop((key, fence), None)
        return await super().fail(key, fence, error)

    # -- the unit of work ------------------------------------------------------------------

    async def run_unit(self, key: str, fence: int, work: Work) -> JSON:
        """Run ``work`` in one transaction that ends with the key's fenced completion.

        ``work`` gets the connection and an :class:`Outbox` to stage messages in,
        and returns the handler's result. Raises :class:`FencedOut` or whatever
        ``work`` raised, with nothing committed; the store errors of the
        server's failures in the store's own statements (the outbox rows, the
        completion); or :class:`StoreUnavailable` when the connection broke, in
        which case the key's record tells whether the commit landed.
        """
        entry = (key, fence)
        async with self._unit_connection() as conn:
            try:
                async with conn.transaction():
                    outbox = Outbox()
                    result = await work(conn, outbox)
                    data = self.encode_result(result).decode()
                    namespaced = self.config.namespaced(key)
                    with translated():  # the store's statements; the handler's errors are its own
                        await self.outbox.insert(conn, namespaced, fence, outbox.staged)
                        # Last, so the key's row stays locked only until the commit.
                        self._finishing[entry] = Phase.COMPLETING
                        params = self._params(key, fence=fence, result=data)
                        completed = await conn.execute(self._sql.complete, params)
                    if completed.rowcount != 1:
                        raise FencedOut(key, fence)
            except Exception as exc:
                self._finishing.pop(entry, None)
                if conn.broken and not isinstance(exc, StoreError):
                    raise StoreUnavailable(BACKEND, one_line(exc)) from exc
                raise
            except BaseException:  # cancelled: the transaction was rolled back, or is in doubt
                self._finishing.pop(entry, None)
                raise
        self._finishing[entry] = Phase.COMMITTED
        self.commits.set()
        return result

    @contextlib.asynccontextmanager
    async def _unit_connection(self) -> AsyncIterator[AsyncConnection[Any]]:
        with translated():
            while True:
                try:
                    conn: AsyncConnection[Any] = await self._units.getconn(timeout=POOL_TIMEOUT)
                    break
                except PoolTimeout:
                    # Every connection is busy with a handler, or the server is away:
                    # only the latter is an outage; otherwise wait for a turn.
                    await self.ping()
        try:
            yield conn
        finally:
            await self._units.putconn(conn)

    # -- the outbox ------------------------------------------------------------------------

    # Through the store's own pool, as any relay reads it (PooledOutbox).

    async def relay(
        self, limit: int, publish: Publish, ordering: Ordering = Ordering.OLDEST_FIRST
    ) -> int:
        """One relay pass over the outbox table (:meth:`OutboxTable.relay`)."""
        return await self._outbox.relay(limit, publish, ordering)

    async def purge_outbox(self, limit: int = 10_000) -> int:
        """Delete up to ``limit`` messages sent longer ago than the retention period."""
        return await self._outbox.purge_outbox(limit)

    async def unsent(self) -> int:
        """How many staged messages wait for the relay."""
        return await self._outbox.unsent()

    async def check_schema(self) -> None:
        """Raise :class:`StoreMisconfigured` unless the outbox table exists."""
        await self._outbox.check_schema()

    async def migrate(self) -> list[str]:
        warnings = await super().migrate()
        await self._outbox.migrate_outbox()
        return warnings

    async def close(self) -> None:
        try:
            await self._units.close()
        finally:
            await super().close()


def _set(name: str, value: str) -> Callable[[AsyncConnection[Any]], Awaitable[None]]:
    async def configure(conn: AsyncConnection[Any]) -> None:
        await conn.execute("SELECT set_config(%s, %s, false)", (name, value))

    return configure


async def open_store(
    *,
    dsn: str,
    table: str,
    outbox_table: str,
    connections: int,
    handler_timeout: float,
    config: StoreConfig,
) -> Store:
    """Two pools to ``dsn``: the store's own (short lock waits) and the handlers' transactions.

    Keys go in ``table``, staged messages in ``outbox_table``; a handler's
    transaction idle past ``handler_timeout`` seconds (plus a margin) is ended
    by the server.
    """
    size = pool_size(connections, POOL_MAX)
    pool = await open_pool(
        dsn=dsn,
        size=size,
        configure=_set("lock_timeout", f"{LOCK_TIMEOUT_MS}ms"),
        deadline=config.call_deadline,
    )
    idle = round((handler_timeout + IDLE_MARGIN) * 1000)
    try:
        units = await open_pool(
            dsn=dsn,
            size=size,
            name="semel-postgres-units",
            configure=_set("idle_in_transaction_session_timeout", f"{idle}ms"),
        )
    except BaseException:
        await pool.close()
        raise
    return TransactionalStore(config, pool, table, units=units, outbox=OutboxTable(outbox_table))
