"""The embedded SQLite store: the default, for one host.

The claim is the PostgreSQL upsert's equivalent, run inside ``BEGIN
IMMEDIATE``: the write lock is taken before anything is read, so processes
sharing the file are serialised by SQLite itself (WAL mode, busy timeout).
sqlite3 blocks, so each store runs its one connection on one dedicated
thread; the event loop only awaits it.

A batch (``claim_many``, ``complete_many``) is one hop to that thread and one
write transaction, so one fsync at COMMIT stands for the whole batch; its
callers are answered only once COMMIT has returned. A batch of claims is one
statement (``semel.stores.sqlite.sql``); completions keep one statement per key,
as in-process statements cost microseconds and the fsync milliseconds.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from itertools import chain
from typing import Any, TypeVar

from semel.stores.base import (
    POISON_ERROR,
    Claim,
    ClaimRequest,
    Completion,
    Record,
    Store,
    StoreConfig,
)
from semel.stores.errors import StoreError
from semel.stores.shared.refusal import refused_outcome, written_claim
from semel.stores.sqlite.errors import BACKEND, store_error
from semel.stores.sqlite.sql import batch_text, decode, refuse_nul, statements

BUSY_TIMEOUT = 5.0  # seconds a writer waits for another process's lock
MIN_VERSION = (3, 35, 0)  # UPSERT ... RETURNING

A = TypeVar("A")
T = TypeVar("T")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def clock() -> dict[str, int]:
    """One reading of the clock as the statements bind it: ``now`` in ms, ``now_us`` in µs."""
    ns = time.time_ns()
    return {"now": ns // 1_000_000, "now_us": ns // 1_000}


@contextmanager
def immediate(conn: sqlite3.Connection) -> Iterator[dict[str, int]]:
    """A write transaction holding the lock from the start; yields its clock.

    The clock is read once the lock is held, so time spent waiting for
    another process never shortens the lease this transaction writes, and
    a fence started from it follows every fence written before.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield clock()
        conn.execute("COMMIT")
    except BaseException:
        conn.rollback()
        raise


class SqliteStore(Store):
    """Keys in one SQLite table, shared by the processes of one host.

    SQLite's failures become store errors by result code (:mod:`semel.stores.sqlite.errors`).
    No key is refused alone: a NUL in a key or fingerprint (which the consumer
    never sends) is refused up front as a ``ValueError``, the batch with it.
    """

    backend = BACKEND

    def __init__(
        self, config: StoreConfig, conn: sqlite3.Connection, thread: ThreadPoolExecutor, table: str
    ) -> None:
        super().__init__(config)
        self._conn = conn
        self._thread = thread
        self._sql = statements(table)
        # Bound into every statement, which reads only the names it uses.
        self._constants: dict[str, Any] = {
            "ttl": round(config.lock_ttl * 1000),
            "retention": round(config.retention * 1000),
            # An in-progress row must outlive its lease, whatever the retention.
            "hold": round(max(config.retention, config.lock_ttl) * 1000),
            "max_claims": config.max_claims,
            "poison_error": POISON_ERROR,
        }

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        return await on_thread(self._thread, work, self._conn)

    def _params(self, key: str, **extra: Any) -> dict[str, Any]:
        return self._constants | {"key": self.config.namespaced(key), **extra}

    def _decide(
        self, requests: Sequence[ClaimRequest], keys: list[str], conn: sqlite3.Connection
    ) -> list[Claim]:
        """Claim every key in one write transaction.

        Rows are decoded before COMMIT: a row that cannot be read fails the
        whole batch, never after its other keys were committed. A row the
        upsert refused is judged by the same clock in the same transaction,
        so it can never turn out claimable.
        """
        sql = self._sql
        if len(keys) == 1:
            bound = {"key": keys[0], "fingerprint": requests[0].fingerprint}
            claim, inspect = sql.claim, sql.inspect
        else:
            bound = {"batch": batch_text(keys, (request.fingerprint for request in requests))}
            claim, inspect = sql.claim_batch, sql.inspect_batch
        with immediate(conn) as times:
            params = {**self._constants, **bound, **times}
            # fetchall: sqlite3 keeps a RETURNING statement open until exhausted.
            written = {row[0]: row for row in conn.execute(claim, params).fetchall()}
            refused: dict[str, tuple[Any, ...]] = {}
            if len(written) < len(keys):
                # Reads the whole batch; the rows just written are taken from `written`.
                refused = {row[0]: row for row in conn.execute(inspect, params)}
            decided: list[Claim] = []
            for request, key in zip(requests, keys, strict=True):
                row = written.get(key)
                if row is not None:
                    decided.append(written_claim(decode(request.key, row)))
                    continue
                row = refused[key]
                record = decode(request.key, row)
                outcome = refused_outcome(record, request.fingerprint, live=row[11], leased=row[12])
                if outcome is None:
                    raise AssertionError(
                        f"claim of {key!r} refused, yet claimable in its transaction"
                    )
                decided.append(Claim(outcome, record))
        return decided

    async def claim_many(self, requests: Sequence[ClaimRequest]) -> list[Claim]:
        if not requests:
            return []
        keys = [self.config.namespaced(request.key) for request in requests]
        refuse_nul(chain(keys, (request.fingerprint for request in requests)))
        return await self._run(partial(self._decide, requests, keys))

    def _complete_all(
        self, completions: Sequence[Completion], conn: sqlite3.Connection
    ) -> list[bool]:
        statement, namespaced = self._sql.complete, self.config.namespaced
        written: list[bool] = []
        with immediate(conn) as times:
            params = self._constants | times
            for completion in completions:
                params["key"] = namespaced(completion.key)
                params["fence"] = completion.fence
                # The column is TEXT: results are stored as text, as they always were.
                params["result"] = completion.data.decode()
                written.append(conn.execute(statement, params).rowcount == 1)
        return written

    async def complete_many(self, completions: Sequence[Completion]) -> list[bool]:
        if not completions:
            return []
        return await self._run(partial(self._complete_all, completions))

    async def _write(self, statement: str, params: dict[str, Any]) -> int:
        """Run one statement in a write transaction of its own; returns the rows it changed."""

        def write(conn: sqlite3.Connection) -> int:
            with immediate(conn) as times:
                return conn.execute(statement, params | times).rowcount

        return await self._run(write)

    async def release(self, key: str, fence: int) -> bool:
        return await self._write(self._sql.release, self._params(key, fence=fence)) == 1

    async def fail(self, key: str, fence: int, error: str) -> bool:
        return await self._write(self._sql.fail, self._params(key, fence=fence, error=error)) == 1

    async def heartbeat(self, key: str, fence: int) -> bool:
        return await self._write(self._sql.heartbeat, self._params(key, fence=fence)) == 1

    async def reset(self, key: str, fingerprint: str | None = None) -> bool:
        params = self._params(key, fingerprint=fingerprint)
        return await self._write(self._sql.reset, params) == 1

    async def get(self, key: str) -> Record | None:
        params = self._params(key, now=now_ms())
        row = await self._run(lambda conn: conn.execute(self._sql.inspect, params).fetchone())
        if row is None or not row[11]:
            return None
        return decode(key, row)

    async def purge(self, limit: int = 10_000) -> int:
        """Delete up to ``limit`` rows past retention; returns how many went."""
        return await self._write(self._sql.purge, {"limit": limit})

    async def migrate(self) -> list[str]:
        await self._run(lambda conn: conn.executescript(self._sql.schema))
        return []

    async def ping(self) -> None:
        await self._run(lambda conn: conn.execute("SELECT 1").fetchone())

    async def close(self) -> None:
        try:
            await self._run(lambda conn: conn.close())
        finally:
            self._thread.shutdown(wait=False)


async def on_thread(
    thread: ThreadPoolExecutor, work: Callable[[A], T], arg: A, *, opening: bool = False
) -> T:
    """Run blocking ``work`` on the store's thread (``opening`` the store);
    SQLite's failures become store errors (:mod:`semel.stores.sqlite.errors`)."""
    try:
        return await asyncio.get_running_loop().run_in_executor(thread, work, arg)
    except sqlite3.Error as exc:
        error = store_error(exc, opening=opening)
        if error is None:
            raise
        raise error from exc


def connect(path: str) -> sqlite3.Connection:
    # Autocommit mode: every transaction is opened explicitly, IMMEDIATE.
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        # A completion lost to a power cut would run its handler again.
        conn.execute("PRAGMA synchronous=FULL")
        try:  # claims name their keys in JSON: built in since 3.38, optional before
            conn.execute("SELECT json_valid('{}')")
        except sqlite3.OperationalError as exc:
            raise StoreError(f"SQLite {sqlite3.sqlite_version} lacks the JSON functions") from exc
    except BaseException:
        conn.close()
        raise
    return conn


async def open_store(*, path: str, table: str, config: StoreConfig) -> Store:
    """Open the database file at ``path`` on a thread of its own; keys go in ``table``."""
    if sqlite3.sqlite_version_info < MIN_VERSION:
        raise StoreError(
            f"SQLite {sqlite3.sqlite_version} lacks UPSERT ... RETURNING; 3.35 or newer is needed"
        )
    thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="semel-sqlite")
    try:
        conn = await on_thread(thread, connect, path, opening=True)
    except BaseException:
        thread.shutdown(wait=False)
        raise
    store = SqliteStore(config, conn, thread, table)
    # The embedded store has no operator to run `semel migrate`: a fresh
    # checkout must consume at once, so the table is created on open.
    try:
        await store.migrate()
    except BaseException:
        await store.close()
        raise
    return store
