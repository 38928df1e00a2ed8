"""The PostgreSQL store: one row per key, claimed by a single upsert.

The claim is one ``INSERT ... ON CONFLICT DO UPDATE ... WHERE ... RETURNING``
statement; PostgreSQL locks the conflicting row and evaluates the WHERE
clause against its latest committed version, so concurrent claimers of one
key are serialised by the server and exactly one of them writes. Every lease
and retention time is computed from the server's ``now()``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool

from settings import Settings
from settings.redact import redact
from stores.base import JSON, POISON_ERROR, Claim, Outcome, Record, Status, Store, StoreConfig
from stores.codec import dump_result, load_result, store_config
from stores.errors import StoreUnavailable
from stores.refusal import refused_outcome

BACKEND = "postgres"
CONNECT_TIMEOUT = 3  # seconds; libpq's minimum useful value is 2
POOL_TIMEOUT = 5.0  # seconds a caller waits for a pooled connection
POOL_MAX = (2, 32)  # bounds of the pool size derived from the prefetch

# Errors that mean "the server cannot serve us now", not "this request is wrong".
# ReadOnlySqlTransaction is what a standby answers after a failover.
UNAVAILABLE = (
    psycopg.OperationalError,
    psycopg.InterfaceError,
    psycopg.errors.ReadOnlySqlTransaction,
)

COLUMNS = sql.SQL(
    "key, fingerprint, status, fence, claims, lock_expires_at, result::text, error,"
    " first_seen, updated_at, expires_at"
)

# Past retention a row counts as absent (its fence still grows). A live row
# gets past the claim's WHERE clause only when it is in progress with the same
# fingerprint and no lease, so "live" alone tells a takeover from a fresh start.
# The claim and the read after a refusal share these, so they never disagree.
LIVE = sql.SQL("(t.expires_at > now())")
LEASED = sql.SQL("coalesce(t.lock_expires_at > now(), false)")
POISONED = sql.SQL("(t.expires_at > now() AND t.claims >= %(max_claims)s)")

CLAIM = """
INSERT INTO {table} AS t (key, fingerprint, status, fence, claims, lock_expires_at,
                          first_seen, updated_at, expires_at)
VALUES (%(key)s, %(fingerprint)s, 'in_progress', 1, 1, now() + make_interval(secs => %(ttl)s),
        now(), now(), now() + make_interval(secs => %(hold)s))
ON CONFLICT (key) DO UPDATE SET
    fingerprint = excluded.fingerprint,
    status = CASE WHEN {poisoned} THEN 'failed' ELSE 'in_progress' END,
    fence = CASE WHEN {poisoned} THEN t.fence ELSE t.fence + 1 END,
    claims = CASE WHEN {poisoned} THEN t.claims WHEN {live} THEN t.claims + 1 ELSE 1 END,
    lock_expires_at = CASE WHEN {poisoned} THEN NULL ELSE excluded.lock_expires_at END,
    result = NULL,
    error = CASE WHEN {poisoned} THEN %(poison_error)s END,
    first_seen = CASE WHEN {live} THEN t.first_seen ELSE now() END,
    updated_at = now(),
    expires_at = CASE WHEN {poisoned} THEN now() + make_interval(secs => %(retention)s)
                      ELSE excluded.expires_at END
WHERE NOT {live}
   OR (t.status = 'in_progress' AND t.fingerprint = excluded.fingerprint AND NOT {leased})
RETURNING {columns}
"""

# Read after a refused claim; the flags are judged by the server's clock.
INSPECT = """
SELECT {columns}, {live}, {leased} FROM {table} AS t WHERE key = %(key)s
"""

# Every fenced write: only the owner of the current fence changes the row.
FENCED = " WHERE key = %(key)s AND fence = %(fence)s AND status = 'in_progress'"
SET_COMPLETE = """status = 'completed', result = %(result)s::jsonb, lock_expires_at = NULL,
    updated_at = now(), expires_at = now() + make_interval(secs => %(retention)s)"""
SET_RELEASE = """lock_expires_at = now(),
    updated_at = now(), expires_at = now() + make_interval(secs => %(hold)s)"""
SET_FAIL = """status = 'failed', error = %(error)s, lock_expires_at = NULL,
    updated_at = now(), expires_at = now() + make_interval(secs => %(retention)s)"""
SET_HEARTBEAT = """lock_expires_at = now() + make_interval(secs => %(ttl)s),
    updated_at = now(), expires_at = now() + make_interval(secs => %(hold)s)"""
SET_RESET = """status = 'in_progress', claims = 0, result = NULL, error = NULL,
    lock_expires_at = now(), updated_at = now(),
    expires_at = now() + make_interval(secs => %(hold)s)"""

PURGE = """
DELETE FROM {table} WHERE key IN (
    SELECT key FROM {table} WHERE expires_at <= now() LIMIT %(limit)s FOR UPDATE SKIP LOCKED
) AND expires_at <= now()
"""


def schema(table: str) -> list[sql.Composed]:
    """The DDL ``migrate`` runs; ``deploy/postgres-schema.sql`` is its rendering."""
    index = f"{table[:48]}_expires_at_idx"  # stays within the 63-byte identifier limit
    create = """CREATE TABLE IF NOT EXISTS {table} (
    key             text        PRIMARY KEY,
    fingerprint     text        NOT NULL,
    status          text        NOT NULL CHECK (status IN ('in_progress', 'completed', 'failed')),
    fence           bigint      NOT NULL,
    claims          integer     NOT NULL,
    lock_expires_at timestamptz,
    result          jsonb,
    error           text,
    first_seen      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL,
    expires_at      timestamptz NOT NULL
)"""
    create_index = "CREATE INDEX IF NOT EXISTS {index} ON {table} (expires_at)"
    names = {"table": sql.Identifier(table), "index": sql.Identifier(index)}
    return [sql.SQL(create).format(**names), sql.SQL(create_index).format(**names)]


class PostgresStore(Store):
    """Keys in one PostgreSQL table, shared by every consumer process."""

    backend = BACKEND

    def __init__(self, config: StoreConfig, pool: AsyncConnectionPool, table: str) -> None:
        super().__init__(config)
        self._pool = pool
        self._table = table
        name = sql.Identifier(table)
        parts = {"table": name, "columns": COLUMNS, "live": LIVE, "leased": LEASED}
        self._claim = sql.SQL(CLAIM).format(poisoned=POISONED, **parts)
        self._inspect = sql.SQL(INSPECT).format(**parts)
        self._purge = sql.SQL(PURGE).format(table=name)

        def update(assignments: str, where: str = FENCED) -> sql.Composed:
            return sql.SQL("UPDATE {table} SET " + assignments + where).format(table=name)

        self._complete = update(SET_COMPLETE)
        self._release = update(SET_RELEASE)
        self._fail = update(SET_FAIL)
        self._heartbeat = update(SET_HEARTBEAT)
        # A row past retention is absent: resetting it would revive its fingerprint.
        self._reset = update(SET_RESET, " WHERE key = %(key)s AND expires_at > now()")

    @contextlib.asynccontextmanager
    async def _cursor(self) -> AsyncIterator[psycopg.AsyncCursor[tuple[Any, ...]]]:
        try:
            async with self._pool.connection() as conn, conn.cursor() as cur:
                yield cur
        except UNAVAILABLE as exc:
            raise StoreUnavailable(BACKEND, describe(exc)) from exc

    def _params(self, key: str, **extra: Any) -> dict[str, Any]:
        config = self.config
        return {
            "key": config.namespaced(key),
            "ttl": config.lock_ttl,
            "retention": config.retention,
            # An in-progress row must outlive its lease, whatever the retention.
            "hold": max(config.retention, config.lock_ttl),
            **extra,
        }

    def _record(self, key: str, row: tuple[Any, ...]) -> Record:
        return Record(
            key=key,
            fingerprint=row[1],
            status=Status(row[2]),
            fence=row[3],
            claims=row[4],
            lease_expires_at=row[5],
            result=load_result(row[6]),
            error=row[7],
            first_seen=row[8],
            updated_at=row[9],
            expires_at=row[10],
        )

    async def claim(self, key: str, fingerprint: str) -> Claim:
        params = self._params(
            key,
            fingerprint=fingerprint,
            max_claims=self.config.max_claims,
            poison_error=POISON_ERROR,
        )
        async with self._cursor() as cur:
            while True:
                await cur.execute(self._claim, params)
                row = await cur.fetchone()
                if row is not None:
                    # RETURNING only yields a row this statement wrote, and it
                    # writes either a claim (in_progress) or a poisoning (failed).
                    record = self._record(key, row)
                    won = record.status is Status.IN_PROGRESS
                    return Claim(Outcome.CLAIMED if won else Outcome.POISON, record)
                await cur.execute(self._inspect, params)
                row = await cur.fetchone()
                if row is None:
                    continue  # purged since the refusal: claim it afresh
                record = self._record(key, row)
                outcome = refused_outcome(record, fingerprint, live=row[11], leased=row[12])
                if outcome is not None:
                    return Claim(outcome, record)
                # Released or expired since the refusal: the next claim may win it.

    async def _write(self, statement: sql.Composed, params: dict[str, Any]) -> bool:
        async with self._cursor() as cur:
            await cur.execute(statement, params)
            return cur.rowcount == 1

    async def complete(self, key: str, fence: int, result: JSON) -> bool:
        data = dump_result(result).decode()
        return await self._write(self._complete, self._params(key, fence=fence, result=data))

    async def release(self, key: str, fence: int) -> bool:
        return await self._write(self._release, self._params(key, fence=fence))

    async def fail(self, key: str, fence: int, error: str) -> bool:
        return await self._write(self._fail, self._params(key, fence=fence, error=error))

    async def heartbeat(self, key: str, fence: int) -> bool:
        return await self._write(self._heartbeat, self._params(key, fence=fence))

    async def reset(self, key: str) -> bool:
        return await self._write(self._reset, self._params(key))

    async def get(self, key: str) -> Record | None:
        async with self._cursor() as cur:
            await cur.execute(self._inspect, self._params(key))
            row = await cur.fetchone()
        if row is None or not row[11]:
            return None
        return self._record(key, row)

    async def purge(self, limit: int = 10_000) -> int:
        """Delete up to ``limit`` rows past retention; returns how many went."""
        async with self._cursor() as cur:
            await cur.execute(self._purge, {"limit": limit})
            return max(cur.rowcount, 0)

    async def migrate(self) -> list[str]:
        async with self._cursor() as cur:
            for statement in schema(self._table):
                await cur.execute(statement)
        return []

    async def ping(self) -> None:
        async with self._cursor() as cur:
            await cur.execute("SELECT 1")

    async def close(self) -> None:
        await self._pool.close()


def describe(exc: Exception) -> str:
    """libpq's message on one line, with any credential masked."""
    return redact(" ".join(str(exc).split()))


def pool_size(prefetch: int) -> int:
    """One connection per in-flight delivery, within bounds the server can afford."""
    low, high = POOL_MAX
    return max(low, min(prefetch, high))


async def open_store(settings: Settings) -> Store:
    """Open a pool to ``settings.postgres_dsn``; fails fast when the server is down."""
    if settings.transactional:
        from stores import postgres_tx  # the variant imports this module

        return await postgres_tx.open_store(settings)
    return PostgresStore(store_config(settings), await open_pool(settings), settings.postgres_table)


async def open_pool(
    settings: Settings,
    name: str = "semel-postgres",
    configure: Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]] | None = None,
) -> AsyncConnectionPool:
    """An open pool of autocommit connections; ``configure`` runs on each new one."""
    kwargs: dict[str, Any] = {"autocommit": True, "application_name": "semel"}
    if "connect_timeout" not in conninfo_to_dict(settings.postgres_dsn):
        kwargs["connect_timeout"] = CONNECT_TIMEOUT
    try:
        # The pool retries a refused connection until its timeout runs out;
        # one direct attempt first reports a down server at once, with libpq's reason.
        probe = await psycopg.AsyncConnection.connect(settings.postgres_dsn, **kwargs)
    except UNAVAILABLE as exc:
        raise StoreUnavailable(BACKEND, describe(exc)) from exc
    await probe.close()
    pool: AsyncConnectionPool = AsyncConnectionPool(
        settings.postgres_dsn,
        min_size=1,
        max_size=pool_size(settings.prefetch),
        kwargs=kwargs,
        timeout=POOL_TIMEOUT,
        open=False,
        name=name,
        configure=configure,
    )
    try:
        await pool.open(wait=True, timeout=POOL_TIMEOUT)
    except UNAVAILABLE as exc:
        await pool.close()
        raise StoreUnavailable(BACKEND, describe(exc)) from exc
    return pool
