"""What the outbox holds and why: the counts and the unsent rows, read only.

``semel outbox list`` prints them; the outbox watch turns the counts into
gauges and a ``/readyz`` detail. Every statement reads unsent rows only
(``WHERE sent_at IS NULL``), which the table's partial index covers: the
rows already sent, millions of them between purges, are never scanned.

Why a row is still unsent is derived, never stored: it is due (the relay has
not taken it yet), backing off after the broker refused it, or, in per-key
order, held behind an older row of its key that backs off; the relay's
``last_error`` says how the broker refused it (:class:`Refusal`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

import psycopg
from psycopg import AsyncConnection, sql

from semel.stores.errors import StoreMisconfigured
from semel.stores.postgres.errors import translated
from semel.stores.postgres.outbox import MISSING_TABLE
from semel.stores.postgres.store import CONNECT_TIMEOUT


class Refusal(StrEnum):
    """How the broker refused a row's last publish, read from its ``last_error``."""

    UNROUTABLE = "unroutable"  # returned: no queue is bound for its routing key
    NACKED = "nacked"  # basic.nack
    EXCHANGE_NOT_FOUND = "exchange not found"  # the channel closed with a 404
    OTHER = "refused"  # a text this version does not know


# The beginnings of the relay's last_error texts, one per kind.
REFUSAL_PREFIXES = {
    Refusal.UNROUTABLE: "unroutable",
    Refusal.NACKED: "refused by the broker",
    Refusal.EXCHANGE_NOT_FOUND: "exchange not found",
}


def refusal_of(last_error: str | None) -> Refusal | None:
    """The kind of refusal ``last_error`` records; ``None`` when there was none."""
    if last_error is None:
        return None
    for kind, prefix in REFUSAL_PREFIXES.items():
        if last_error.startswith(prefix):
            return kind
    return Refusal.OTHER


# One pass over the unsent rows (the partial index), every count from it.
SUMMARY = """
SELECT count(*),
       count(*) FILTER (WHERE next_attempt_at <= now()),
       count(*) FILTER (WHERE last_error IS NOT NULL),
       count(*) FILTER (WHERE starts_with(last_error, %(unroutable)s)),
       count(*) FILTER (WHERE created_at < now() - make_interval(secs => %(stale_after)s)),
       extract(epoch FROM now() - min(created_at))::float8
FROM {table} WHERE sent_at IS NULL
"""

# Oldest first, the order the relay takes them in; never the body. The last
# column: an older unsent row of the same key waits out a back-off (per-key
# ordering then holds this one back; the key index answers it).
WAITING = """
SELECT o.id, o.message_id, o.exchange, o.routing_key, o.key, o.attempts, o.last_error,
       o.next_attempt_at,
       extract(epoch FROM now() - o.created_at)::float8,
       extract(epoch FROM o.next_attempt_at - now())::float8,
       EXISTS (SELECT 1 FROM {table} AS e
               WHERE e.key = o.key AND e.sent_at IS NULL AND e.id < o.id
                 AND e.next_attempt_at > now())
FROM {table} AS o WHERE o.sent_at IS NULL
ORDER BY o.id LIMIT %(limit)s
"""


@dataclass(frozen=True, slots=True)
class OutboxSummary:
    """The counts of unsent rows; ``oldest_age`` is in seconds, ``None`` when none wait."""

    unsent: int
    due: int  # the relay may take them now
    backing_off: int  # refused, waiting out their back-off
    refused: int  # the broker refused their last publish, whatever the kind
    unroutable: int  # of those, returned: no queue is bound for the routing key
    stale: int  # staged longer than ``stale_after`` seconds ago
    stale_after: float
    oldest_age: float | None


@dataclass(frozen=True, slots=True)
class WaitingMessage:
    """One unsent row, without its body; ages in seconds by the server's clock."""

    id: int
    message_id: str
    exchange: str
    routing_key: str
    key: str  # the ordering group (the key, unless the stager named another)
    attempts: int  # publishes the broker refused
    last_error: str | None
    next_attempt_at: datetime
    age: float
    next_attempt_in: float  # zero or less: due now
    behind_back_off: bool  # an older unsent message of its key waits out a back-off

    @property
    def backing_off(self) -> bool:
        return self.next_attempt_in > 0

    @property
    def refusal(self) -> Refusal | None:
        return refusal_of(self.last_error)


@dataclass(frozen=True, slots=True)
class OutboxReport:
    """What ``semel outbox list`` shows: the counts, then the oldest unsent rows."""

    table: str
    summary: OutboxSummary
    waiting: list[WaitingMessage]


class OutboxMissing(StoreMisconfigured):
    """The outbox table does not exist (yet)."""

    def __init__(self, table: str) -> None:
        super().__init__(MISSING_TABLE.format(table=table))
        self.table = table


class OutboxStatus:
    """The status statements for one outbox table; each runs on the caller's connection."""

    def __init__(self, table: str) -> None:
        self.table = table
        name = sql.Identifier(table)
        self._summary = sql.SQL(SUMMARY).format(table=name)
        self._waiting = sql.SQL(WAITING).format(table=name)

    async def summary(self, conn: AsyncConnection[Any], stale_after: float) -> OutboxSummary:
        params = {"unroutable": REFUSAL_PREFIXES[Refusal.UNROUTABLE], "stale_after": stale_after}
        async with self._reading(conn) as cur:
            await cur.execute(self._summary, params)
            row = await cur.fetchone()
        assert row is not None  # an aggregate always answers one row
        unsent, due, refused, unroutable, stale, oldest = row
        return OutboxSummary(
            unsent=unsent,
            due=due,
            backing_off=unsent - due,
            refused=refused,
            unroutable=unroutable,
            stale=stale,
            stale_after=stale_after,
            oldest_age=oldest,
        )

    async def waiting(self, conn: AsyncConnection[Any], limit: int) -> list[WaitingMessage]:
        async with self._reading(conn) as cur:
            await cur.execute(self._waiting, {"limit": limit})
            rows = await cur.fetchall()
        return [
            WaitingMessage(
                id=row[0],
                message_id=str(row[1]),
                exchange=row[2],
                routing_key=row[3],
                key=row[4],
                attempts=row[5],
                last_error=row[6],
                next_attempt_at=row[7],
                age=row[8],
                next_attempt_in=row[9],
                behind_back_off=row[10],
            )
            for row in rows
        ]

    @contextlib.asynccontextmanager
    async def _reading(self, conn: AsyncConnection[Any]) -> AsyncIterator[psycopg.AsyncCursor[Any]]:
        try:
            with translated():
                async with conn.cursor() as cur:
                    yield cur
        except StoreMisconfigured as exc:
            if isinstance(exc.__cause__, psycopg.errors.UndefinedTable):
                raise OutboxMissing(self.table) from None
            raise


Connect = Callable[[], AbstractAsyncContextManager[AsyncConnection[Any]]]


def connecting(dsn: str) -> Connect:
    """Each use opens a connection of its own to ``dsn`` and closes it after: a look
    every few seconds needs no pool, and a busy pool never delays it."""

    @contextlib.asynccontextmanager
    async def connect() -> AsyncIterator[AsyncConnection[Any]]:
        with translated():
            conn = await AsyncConnection.connect(
                dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT, application_name="semel"
            )
        async with conn:
            yield conn

    return connect


def summary_reader(
    connect: Connect, table: str, stale_after: float
) -> Callable[[], Awaitable[OutboxSummary]]:
    """A callable that reads ``table``'s counts through ``connect`` each time it is awaited
    (``connecting(dsn)``, or a pool's ``connection`` method)."""
    status = OutboxStatus(table)

    async def read() -> OutboxSummary:
        async with connect() as conn:
            return await status.summary(conn, stale_after)

    return read


async def report(connect: Connect, table: str, *, limit: int, stale_after: float) -> OutboxReport:
    """The counts and the ``limit`` oldest unsent rows of ``table``."""
    status = OutboxStatus(table)
    async with connect() as conn:
        summary = await status.summary(conn, stale_after)
        waiting = await status.waiting(conn, limit)
    return OutboxReport(table, summary, waiting)
