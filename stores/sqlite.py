"""The embedded SQLite store: the default, for one host.

The claim is the PostgreSQL upsert's equivalent, run inside ``BEGIN
IMMEDIATE``: the write lock is taken before anything is read, so processes
sharing the file are serialised by SQLite itself (WAL mode, busy timeout).
sqlite3 blocks, so each store runs its one connection on one dedicated
thread; the event loop only awaits it.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

from settings import Settings
from stores.base import JSON, POISON_ERROR, Claim, Outcome, Record, Status, Store, StoreConfig
from stores.codec import dump_result, from_epoch_ms, load_result, store_config
from stores.errors import StoreError, StoreUnavailable
from stores.refusal import refused_outcome

BACKEND = "sqlite"
BUSY_TIMEOUT = 5.0  # seconds a writer waits for another process's lock
MIN_VERSION = (3, 35, 0)  # UPSERT ... RETURNING

# Primary result codes that mean "the database cannot serve us now";
# anything else (a missing table, a constraint) is a bug to surface as is.
OUTAGE_CODES = frozenset(
    {
        sqlite3.SQLITE_BUSY,
        sqlite3.SQLITE_LOCKED,
        sqlite3.SQLITE_NOMEM,
        sqlite3.SQLITE_READONLY,
        sqlite3.SQLITE_IOERR,
        sqlite3.SQLITE_CORRUPT,
        sqlite3.SQLITE_FULL,
        sqlite3.SQLITE_CANTOPEN,
        sqlite3.SQLITE_PROTOCOL,
        sqlite3.SQLITE_NOTADB,
    }
)

A = TypeVar("A")
T = TypeVar("T")

COLUMNS = (
    "key, fingerprint, status, fence, claims, lock_expires_at, result, error,"
    " first_seen, updated_at, expires_at"
)

# Times are integer epoch milliseconds. The same conditions as the PostgreSQL
# claim: past retention a row counts as absent, so a live row passing the
# WHERE clause is a takeover (or a poisoning) and any other is a fresh start.
LIVE = "(t.expires_at > :now)"
LEASED = "coalesce(t.lock_expires_at > :now, 0)"
POISONED = "(t.expires_at > :now AND t.claims >= :max_claims)"

CLAIM = f"""
INSERT INTO {{table}} AS t (key, fingerprint, status, fence, claims, lock_expires_at,
                            first_seen, updated_at, expires_at)
VALUES (:key, :fingerprint, 'in_progress', 1, 1, :now + :ttl, :now, :now, :now + :hold)
ON CONFLICT (key) DO UPDATE SET
    fingerprint = excluded.fingerprint,
    status = CASE WHEN {POISONED} THEN 'failed' ELSE 'in_progress' END,
    fence = CASE WHEN {POISONED} THEN t.fence ELSE t.fence + 1 END,
    claims = CASE WHEN {POISONED} THEN t.claims WHEN {LIVE} THEN t.claims + 1 ELSE 1 END,
    lock_expires_at = CASE WHEN {POISONED} THEN NULL ELSE excluded.lock_expires_at END,
    result = NULL,
    error = CASE WHEN {POISONED} THEN :poison_error END,
    first_seen = CASE WHEN {LIVE} THEN t.first_seen ELSE :now END,
    updated_at = :now,
    expires_at = CASE WHEN {POISONED} THEN :now + :retention ELSE excluded.expires_at END
WHERE NOT {LIVE}
   OR (t.status = 'in_progress' AND t.fingerprint = excluded.fingerprint AND NOT {LEASED})
RETURNING {COLUMNS}
"""

INSPECT = f"SELECT {COLUMNS}, {LIVE}, {LEASED} FROM {{table}} AS t WHERE key = :key"

FENCED = " WHERE key = :key AND fence = :fence AND status = 'in_progress'"
SET_COMPLETE = """status = 'completed', result = :result, lock_expires_at = NULL,
    updated_at = :now, expires_at = :now + :retention"""
SET_RELEASE = "lock_expires_at = :now, updated_at = :now, expires_at = :now + :hold"
SET_FAIL = """status = 'failed', error = :error, lock_expires_at = NULL,
    updated_at = :now, expires_at = :now + :retention"""
SET_HEARTBEAT = "lock_expires_at = :now + :ttl, updated_at = :now, expires_at = :now + :hold"
SET_RESET = """status = 'in_progress', claims = 0, result = NULL, error = NULL,
    lock_expires_at = :now, updated_at = :now, expires_at = :now + :hold"""

PURGE = """DELETE FROM {table} WHERE key IN (
    SELECT key FROM {table} WHERE expires_at <= :now LIMIT :limit)"""

SCHEMA = """
CREATE TABLE IF NOT EXISTS {table} (
    key             TEXT    PRIMARY KEY NOT NULL,
    fingerprint     TEXT    NOT NULL,
    status          TEXT    NOT NULL CHECK (status IN ('in_progress', 'completed', 'failed')),
    fence           INTEGER NOT NULL,
    claims          INTEGER NOT NULL,
    lock_expires_at INTEGER,
    result          TEXT,
    error           TEXT,
    first_seen      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    expires_at      INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS {index} ON {table} (expires_at);
"""


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@contextmanager
def immediate(conn: sqlite3.Connection) -> Iterator[int]:
    """A write transaction holding the lock from the start; yields its clock.

    The clock is read once the lock is held, so time spent waiting for
    another process never shortens the lease this transaction writes.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield now_ms()
        conn.execute("COMMIT")
    except BaseException:
        conn.rollback()
        raise


class SqliteStore(Store):
    """Keys in one SQLite table, shared by the processes of one host."""

    backend = BACKEND

    def __init__(
        self, config: StoreConfig, conn: sqlite3.Connection, thread: ThreadPoolExecutor, table: str
    ) -> None:
        super().__init__(config)
        self._conn = conn
        self._thread = thread
        name = quote(table)
        self._claim = CLAIM.format(table=name)
        self._inspect = INSPECT.format(table=name)
        self._purge = PURGE.format(table=name)
        self._schema = SCHEMA.format(table=name, index=quote(f"{table[:48]}_expires_at_idx"))
        update = f"UPDATE {name} SET "
        self._complete = update + SET_COMPLETE + FENCED
        self._release = update + SET_RELEASE + FENCED
        self._fail = update + SET_FAIL + FENCED
        self._heartbeat = update + SET_HEARTBEAT + FENCED
        # A row past retention is absent: resetting it would revive its fingerprint.
        self._reset = update + SET_RESET + " WHERE key = :key AND expires_at > :now"

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        return await on_thread(self._thread, work, self._conn)

    def _params(self, key: str, **extra: Any) -> dict[str, Any]:
        config = self.config
        return {
            "key": config.namespaced(key),
            "ttl": round(config.lock_ttl * 1000),
            "retention": round(config.retention * 1000),
            # An in-progress row must outlive its lease, whatever the retention.
            "hold": round(max(config.retention, config.lock_ttl) * 1000),
            **extra,
        }

    def _record(self, key: str, row: tuple[Any, ...]) -> Record:
        return Record(
            key=key,
            fingerprint=row[1],
            status=Status(row[2]),
            fence=row[3],
            claims=row[4],
            lease_expires_at=from_epoch_ms(row[5]),
            result=load_result(row[6]),
            error=row[7],
            first_seen=from_epoch_ms(row[8]),
            updated_at=from_epoch_ms(row[9]),
            expires_at=from_epoch_ms(row[10]),
        )

    async def claim(self, key: str, fingerprint: str) -> Claim:
        params = self._params(
            key,
            fingerprint=fingerprint,
            max_claims=self.config.max_claims,
            poison_error=POISON_ERROR,
        )

        def attempt(conn: sqlite3.Connection) -> Claim | None:
            with immediate(conn) as now:
                # fetchall: sqlite3 keeps a RETURNING statement open until exhausted.
                rows = conn.execute(self._claim, params | {"now": now}).fetchall()
                if rows:
                    # RETURNING only yields a row this statement wrote, and it
                    # writes either a claim (in_progress) or a poisoning (failed).
                    record = self._record(key, rows[0])
                    won = record.status is Status.IN_PROGRESS
                    return Claim(Outcome.CLAIMED if won else Outcome.POISON, record)
                row = conn.execute(self._inspect, params | {"now": now}).fetchone()
            record = self._record(key, row)
            outcome = refused_outcome(record, fingerprint, live=row[11], leased=row[12])
            return None if outcome is None else Claim(outcome, record)

        while True:
            # Never loops in practice: the read shares the upsert's lock and clock.
            claim = await self._run(attempt)
            if claim is not None:
                return claim

    async def _write(self, statement: str, params: dict[str, Any]) -> int:
        """Run one statement in a write transaction of its own; returns the rows it changed."""

        def write(conn: sqlite3.Connection) -> int:
            with immediate(conn) as now:
                return conn.execute(statement, params | {"now": now}).rowcount

        return await self._run(write)

    async def complete(self, key: str, fence: int, result: JSON) -> bool:
        data = dump_result(result).decode()
        return await self._write(self._complete, self._params(key, fence=fence, result=data)) == 1

    async def release(self, key: str, fence: int) -> bool:
        return await self._write(self._release, self._params(key, fence=fence)) == 1

    async def fail(self, key: str, fence: int, error: str) -> bool:
        return await self._write(self._fail, self._params(key, fence=fence, error=error)) == 1

    async def heartbeat(self, key: str, fence: int) -> bool:
        return await self._write(self._heartbeat, self._params(key, fence=fence)) == 1

    async def reset(self, key: str) -> bool:
        return await self._write(self._reset, self._params(key)) == 1

    async def get(self, key: str) -> Record | None:
        params = self._params(key, now=now_ms())
        row = await self._run(lambda conn: conn.execute(self._inspect, params).fetchone())
        if row is None or not row[11]:
            return None
        return self._record(key, row)

    async def purge(self, limit: int = 10_000) -> int:
        """Delete up to ``limit`` rows past retention; returns how many went."""
        return await self._write(self._purge, {"limit": limit})

    async def migrate(self) -> list[str]:
        await self._run(lambda conn: conn.executescript(self._schema))
        return []

    async def ping(self) -> None:
        await self._run(lambda conn: conn.execute("SELECT 1").fetchone())

    async def close(self) -> None:
        try:
            await self._run(lambda conn: conn.close())
        finally:
            self._thread.shutdown(wait=False)


async def on_thread(thread: ThreadPoolExecutor, work: Callable[[A], T], arg: A) -> T:
    """Run blocking ``work`` on the store's thread; outages become StoreUnavailable."""
    try:
        return await asyncio.get_running_loop().run_in_executor(thread, work, arg)
    except sqlite3.Error as exc:
        code = getattr(exc, "sqlite_errorcode", None)
        if code is None or code & 0xFF not in OUTAGE_CODES:
            raise
        raise StoreUnavailable(BACKEND, str(exc)) from exc


def connect(path: str) -> sqlite3.Connection:
    # Autocommit mode: every transaction is opened explicitly, IMMEDIATE.
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        # A completion lost to a power cut would run its handler again.
        conn.execute("PRAGMA synchronous=FULL")
    except BaseException:
        conn.close()
        raise
    return conn


async def open_store(settings: Settings) -> Store:
    """Open ``settings.sqlite_path`` on a thread of its own."""
    if sqlite3.sqlite_version_info < MIN_VERSION:
        raise StoreError(
            f"SQLite {sqlite3.sqlite_version} lacks UPSERT ... RETURNING; 3.35 or newer is needed"
        )
    thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="semel-sqlite")
    try:
        conn = await on_thread(thread, connect, settings.sqlite_path)
    except BaseException:
        thread.shutdown(wait=False)
        raise
    store = SqliteStore(store_config(settings), conn, thread, settings.postgres_table)
    # The embedded store has no operator to run `semel migrate`: a fresh
    # checkout must consume at once, so the table is created on open.
    try:
        await store.migrate()
    except BaseException:
        await store.close()
        raise
    return store
