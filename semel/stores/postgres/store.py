"""The PostgreSQL store: one row per key, claimed by a single upsert.

Claims and completions of many keys go out as one statement each, over
arrays of keys; a single claim is a batch of one, so both paths decide a key
in exactly the same way. The SQL and its guarantees are in
:mod:`semel.stores.postgres.sql`.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import orjson
import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool

from semel.stores.base import (
    JSON,
    POISON_ERROR,
    Claim,
    ClaimRequest,
    Completion,
    Record,
    Status,
    Store,
    StoreConfig,
)
from semel.stores.codec import load_result
from semel.stores.errors import KeyRefused
from semel.stores.postgres.errors import BACKEND, translated
from semel.stores.postgres.sql import Statements, schema
from semel.stores.shared.refusal import refused_outcome, written_claim

CONNECT_TIMEOUT = 3  # seconds; libpq's minimum useful value is 2
POOL_TIMEOUT = 5.0  # seconds a caller waits for a pooled connection
# The client-side bounds below never go under this many seconds: they back up
# the consumer's own deadline (semel.stores.wrappers.deadline), they do not replace it, and a
# loaded server must not see its statements cut short under a short lease.
BACKSTOP_FLOOR = 5.0
# Bounds of the store's pool. With claims and completions batched, a process
# has few statements on the wire at once: two claim batches and two
# completion batches (semel.consumer.delivery.batching), plus the unbatched fenced writes
# (heartbeat, release, fail), each well under a millisecond of server time.
# More connections would not add throughput, only server processes: ten
# replicas of 8 stay within PostgreSQL's default max_connections of 100.
POOL_MAX = (2, 8)
# A batch that loses a deadlock against a write which locked the same rows
# in another order was rolled back whole, so it is simply sent again.
DEADLOCK_ATTEMPTS = 3

# jsonb cannot hold U+0000 (an escape preceded by an even run of backslashes;
# after an odd run the backslash itself is the escaped character).
NUL_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")

Row = tuple[Any, ...]


class PostgresStore(Store):
    """Keys in one PostgreSQL table, shared by every consumer process.

    The server's failures become store errors by SQLSTATE
    (:mod:`semel.stores.postgres.errors`). No key is refused alone: the keys the
    consumer sends (printable, at most 256 characters) all fit a row.
    """

    backend = BACKEND

    def __init__(self, config: StoreConfig, pool: AsyncConnectionPool, table: str) -> None:
        super().__init__(config)
        self._pool = pool
        self._table = table
        self._sql = Statements(table)
        # The lease and retention every statement is given, built once.
        self._times: dict[str, Any] = {
            "ttl": config.lock_ttl,
            "retention": config.retention,
            # An in-progress row must outlive its lease, whatever the retention.
            "hold": max(config.retention, config.lock_ttl),
        }

    @contextlib.asynccontextmanager
    async def _cursor(self) -> AsyncIterator[psycopg.AsyncCursor[Row]]:
        with translated():
            async with self._pool.connection() as conn, conn.cursor() as cur:
                yield cur

    def _params(self, key: str, **extra: Any) -> dict[str, Any]:
        return {"key": self.config.namespaced(key), **self._times, **extra}

    def _record(self, key: str, row: Row) -> Record:
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

    async def _rows(
        self, cur: psycopg.AsyncCursor[Row], statement: sql.Composed, params: dict[str, Any]
    ) -> list[Row]:
        """The rows ``statement`` returns; sent again after a lost deadlock."""
        attempt = 1
        while True:
            try:
                await cur.execute(statement, params)
                return await cur.fetchall()
            except psycopg.errors.DeadlockDetected:
                if attempt == DEADLOCK_ATTEMPTS:
                    raise
                attempt += 1

    def _distinct(self, keys: Sequence[str]) -> dict[str, int]:
        """Each namespaced key's position in the batch."""
        where = {self.config.namespaced(key): i for i, key in enumerate(keys)}
        if len(where) != len(keys):
            raise ValueError("a batch names some key twice")
        return where

    def encode_result(self, result: JSON) -> bytes:
        data = super().encode_result(result)
        # Refused here, before the batch: in the statement it would fail every key.
        if b"u0000" in data and NUL_ESCAPE.search(data):
            raise orjson.JSONEncodeError("result holds U+0000, which jsonb cannot store")
        return data

    async def claim(self, key: str, fingerprint: str) -> Claim:
        (claim,) = await self._claim_all([ClaimRequest(key, fingerprint)])
        return claim

    async def claim_many(self, requests: Sequence[ClaimRequest]) -> Sequence[Claim | KeyRefused]:
        return await self._claim_all(requests)

    async def _claim_all(self, requests: Sequence[ClaimRequest]) -> list[Claim]:
        """The batch claim; private so a subclass's claim_many may call claim."""
        if not requests:
            return []
        where = self._distinct([r.key for r in requests])
        params = {**self._times, "max_claims": self.config.max_claims, "poison_error": POISON_ERROR}
        answers: dict[str, Claim] = {}
        pending = sorted(where)  # the lock order every batch shares
        async with self._cursor() as cur:
            while pending:
                fingerprints = [requests[where[key]].fingerprint for key in pending]
                params |= {"keys": pending, "fingerprints": fingerprints}
                for row in await self._rows(cur, self._sql.claim, params):
                    answers[row[0]] = written_claim(self._record(requests[where[row[0]]].key, row))
                refused = [key for key in pending if key not in answers]
                if not refused:
                    break
                params["keys"] = refused
                for row in await self._rows(cur, self._sql.inspect_many, params):
                    request = requests[where[row[0]]]
                    record = self._record(request.key, row)
                    live, leased = row[11], row[12]
                    outcome = refused_outcome(record, request.fingerprint, live=live, leased=leased)
                    if outcome is not None:
                        answers[row[0]] = Claim(outcome, record)
                # Left: purged, released or expired since the refusal. Each is
                # claimable now, so the next round decides it like a fresh claim.
                pending = [key for key in refused if key not in answers]
        return [answers[key] for key in where]

    async def _write(self, statement: sql.Composed, params: dict[str, Any]) -> bool:
        async with self._cursor() as cur:
            await cur.execute(statement, params)
            return cur.rowcount == 1

    async def complete_encoded(self, completion: Completion) -> bool:
        data = completion.data.decode()
        params = self._params(completion.key, fence=completion.fence, result=data)
        return await self._write(self._sql.complete, params)

    async def complete_many(self, completions: Sequence[Completion]) -> Sequence[bool | KeyRefused]:
        if not completions:
            return []
        where = self._distinct([c.key for c in completions])
        # In the claims' lock order where the plan follows the array (a
        # nested loop); a hash join may not, and a lost deadlock is retried.
        keys = sorted(where)
        batch = [completions[where[key]] for key in keys]
        params = self._times | {
            "keys": keys,
            "fences": [c.fence for c in batch],
            "results": [c.data.decode() for c in batch],
        }
        async with self._cursor() as cur:
            done = {row[0] for row in await self._rows(cur, self._sql.complete_many, params)}
        return [key in done for key in where]

    async def release(self, key: str, fence: int) -> bool:
        return await self._write(self._sql.release, self._params(key, fence=fence))

    async def fail(self, key: str, fence: int, error: str) -> bool:
        return await self._write(self._sql.fail, self._params(key, fence=fence, error=error))

    async def heartbeat(self, key: str, fence: int) -> bool:
        return await self._write(self._sql.heartbeat, self._params(key, fence=fence))

    async def reset(self, key: str, fingerprint: str | None = None) -> bool:
        params = self._params(key, max_claims=self.config.max_claims, fingerprint=fingerprint)
        return await self._write(self._sql.reset, params)

    async def get(self, key: str) -> Record | None:
        async with self._cursor() as cur:
            await cur.execute(self._sql.inspect, self._params(key))
            row = await cur.fetchone()
        if row is None or not row[11]:
            return None
        return self._record(key, row)

    async def purge(self, limit: int = 10_000) -> int:
        """Delete up to ``limit`` rows past retention; returns how many went."""
        async with self._cursor() as cur:
            await cur.execute(self._sql.purge, {"limit": limit})
            return max(cur.rowcount, 0)

    async def migrate(self) -> list[str]:
        async with self._cursor() as cur:
            # A schema change may wait for locks or build an index: no deadline
            # for it, and the connection's own one back afterwards.
            await cur.execute("SET statement_timeout = 0")
            # Two migrations at once (two workers starting, a Job beside them)
            # would race in CREATE ... IF NOT EXISTS, which PostgreSQL answers
            # with a unique violation on its catalog: one at a time.
            await cur.execute("SELECT pg_advisory_lock(%s)", (MIGRATE_LOCK,))
            try:
                for statement in schema(self._table):
                    await cur.execute(statement)
            finally:
                await cur.execute("SELECT pg_advisory_unlock(%s)", (MIGRATE_LOCK,))
                await cur.execute("RESET statement_timeout")
        return []

    async def ping(self) -> None:
        async with self._cursor() as cur:
            await cur.execute("SELECT 1")

    async def close(self) -> None:
        await self._pool.close()


MIGRATE_LOCK = 0x73656D656C  # "semel": the advisory lock semel's migrations take turns on


def pool_size(connections: int, bounds: tuple[int, int] = POOL_MAX) -> int:
    """Up to one connection per in-flight delivery (``connections`` of them), within ``bounds``."""
    low, high = bounds
    return max(low, min(connections, high))


async def open_store(*, dsn: str, table: str, connections: int, config: StoreConfig) -> Store:
    """Open a pool to ``dsn`` sized for ``connections`` deliveries in flight.

    Keys go in ``table``. Fails fast when the server is down.
    """
    pool = await open_pool(dsn=dsn, size=pool_size(connections), deadline=config.call_deadline)
    return PostgresStore(config, pool, table)


async def open_pool(
    *,
    dsn: str,
    size: int,
    name: str = "semel-postgres",
    configure: Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]] | None = None,
    deadline: float | None = None,
) -> AsyncConnectionPool:
    """An open pool of at most ``size`` autocommit connections to ``dsn``.

    ``configure`` runs on each new connection. With ``deadline`` (seconds, at
    least :data:`BACKSTOP_FLOOR`), the server ends any statement running
    longer, and the kernel drops a connection whose sent bytes go
    unacknowledged that long (a blackholed route); keep-alives find an idle
    connection that died the same way. Settings the DSN names itself are left
    as it says.
    """
    given = conninfo_to_dict(dsn)
    kwargs: dict[str, Any] = {"autocommit": True, "application_name": "semel"}
    if "connect_timeout" not in given:
        kwargs["connect_timeout"] = CONNECT_TIMEOUT
    if deadline is not None:
        backstop = max(deadline, BACKSTOP_FLOOR)
        ms = round(backstop * 1000)
        bounds = {
            "tcp_user_timeout": ms,
            "keepalives": 1,
            "keepalives_idle": round(backstop),
            "keepalives_interval": max(1, round(backstop / 3)),
            "keepalives_count": 3,
            "options": f"-c statement_timeout={ms}",
        }
        kwargs |= {name: value for name, value in bounds.items() if name not in given}
    with translated():
        # The pool retries a refused connection until its timeout runs out;
        # one direct attempt first reports a down server at once, with libpq's reason.
        probe = await psycopg.AsyncConnection.connect(dsn, **kwargs)
    await probe.close()
    pool: AsyncConnectionPool = AsyncConnectionPool(
        dsn,
        min_size=1,
        max_size=size,
        kwargs=kwargs,
        timeout=POOL_TIMEOUT,
        open=False,
        name=name,
        configure=configure,
    )
    try:
        with translated():
            await pool.open(wait=True, timeout=POOL_TIMEOUT)
    except BaseException:
        await pool.close()
        raise
    return pool
