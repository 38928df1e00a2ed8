"""The outbox table: messages waiting to be relayed, whoever staged them.

A transactional handler stages messages in memory (:class:`Outbox`); they are
inserted in the same transaction as its business writes and its key's
completion, so they exist exactly when that transaction committed. Any other
code inserts rows in its own transaction (``semel.consumer.outbox.writer``).
Every insert also sends a ``NOTIFY`` on the channel named like the table,
which PostgreSQL delivers at commit: that is what wakes the relays.

The relay (:meth:`OutboxTable.relay`) takes unsent rows with ``FOR UPDATE SKIP
LOCKED`` (several relays never take the same row), publishes them and marks
them sent before it commits. Two orders (:class:`Ordering`):

- ``oldest-first``: the oldest due rows, whatever their key;
- ``per-key``: only the *head* of a key (its oldest unsent row) can start a
  batch's run of that key, and only if no other relay holds it; the rows of
  the key after it come with it, to be published one after another. A key
  whose head waits out a refusal's back-off sends nothing meanwhile.

Three partial indexes keep the table cheap however large it grows between
purges: two over the few unsent rows (by id, and by key for ``per-key``), one
over ``sent_at`` of the sent ones (what the purge deletes by).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import orjson
from psycopg import AsyncConnection, sql
from psycopg.types.json import Jsonb

from semel.stores.base import JSON

NAME_LIMIT = 255  # bytes: AMQP's short-string limit for exchange names and routing keys
RETRY_BACKOFF = (1.0, 300.0)  # first and longest wait before a refused message is tried again

COLUMNS = (
    "id, message_id, exchange, routing_key, body, content_type, headers, attempts, key,"
    " next_attempt_at <= now()"
)

# The NOTIFY is sent by the insert itself: one statement, and PostgreSQL holds
# it back until the transaction commits (and drops it if it rolls back).
INSERT = """
WITH staged AS (
    INSERT INTO {table} (message_id, key, fence, exchange, routing_key, body, content_type,
                         headers)
    VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
    RETURNING 1
)
SELECT pg_notify({channel}, '') FROM staged
"""

# Oldest first; rows another relay holds are skipped, never waited for.
TAKE = """
SELECT {columns} FROM {table}
WHERE sent_at IS NULL AND next_attempt_at <= now()
ORDER BY id LIMIT %(limit)s
FOR UPDATE SKIP LOCKED
"""

# per-key, step 1: the heads (oldest unsent row of their key) that are due,
# locked; a head another relay holds is skipped, and so is its whole key.
TAKE_HEADS = """
SELECT o.id, o.key FROM {table} AS o
WHERE o.sent_at IS NULL AND o.next_attempt_at <= now()
  AND NOT EXISTS (
      SELECT 1 FROM {table} AS e WHERE e.key = o.key AND e.sent_at IS NULL AND e.id < o.id)
ORDER BY o.id LIMIT %(limit)s
FOR UPDATE OF o SKIP LOCKED
"""

# per-key, step 2: each held head and the unsent rows of its key after it. No
# other relay can hold those (it would need the head), so this never waits.
TAKE_RUNS = """
SELECT {columns} FROM {table} AS r
JOIN unnest(%(keys)s::text[], %(heads)s::bigint[]) AS h(head_key, head_id)
  ON r.key = h.head_key AND r.id >= h.head_id
WHERE r.sent_at IS NULL
ORDER BY r.id LIMIT %(limit)s
FOR UPDATE OF r
"""

MARK_SENT = "UPDATE {table} SET sent_at = now(), last_error = NULL WHERE id = ANY(%(ids)s)"

MARK_REFUSED = """
UPDATE {table} AS t SET
    attempts = t.attempts + 1,
    last_error = r.error,
    next_attempt_at = now() + make_interval(
        secs => least(%(longest)s, %(first)s * power(2, least(t.attempts, 30))))
FROM unnest(%(ids)s::bigint[], %(errors)s::text[]) AS r(id, error)
WHERE t.id = r.id
"""

PURGE = """
DELETE FROM {table} WHERE id IN (
    SELECT id FROM {table}
    WHERE sent_at < now() - make_interval(secs => %(retention)s)
    LIMIT %(limit)s FOR UPDATE SKIP LOCKED
)
"""

UNSENT = "SELECT count(*) FROM {table} WHERE sent_at IS NULL"

EXISTS = "SELECT to_regclass(%s) IS NOT NULL"
MISSING_TABLE = (
    "outbox table {table!r} does not exist: run `semel migrate` with SEMEL_STORE=postgres "
    "(or apply deploy/postgres-outbox.sql)"
)


class Ordering(Enum):
    """The order the relay takes rows in (see the module's docstring)."""

    OLDEST_FIRST = "oldest-first"
    PER_KEY = "per-key"


def schema(table: str) -> list[sql.Composed]:
    """The DDL ``semel migrate`` runs."""
    stem = table[:48]  # index names stay within the 63-byte identifier limit
    create = """CREATE TABLE IF NOT EXISTS {table} (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id      uuid        NOT NULL,
    key             text        NOT NULL,
    fence           bigint      NOT NULL,
    exchange        text        NOT NULL,
    routing_key     text        NOT NULL,
    body            bytea       NOT NULL,
    content_type    text,
    headers         jsonb       NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    last_error      text,
    sent_at         timestamptz
)"""
    unsent = "CREATE INDEX IF NOT EXISTS {unsent} ON {table} (id) WHERE sent_at IS NULL"
    sent = "CREATE INDEX IF NOT EXISTS {sent} ON {table} (sent_at) WHERE sent_at IS NOT NULL"
    # per-key ordering asks, for each candidate, whether its key has an older unsent row.
    keyed = "CREATE INDEX IF NOT EXISTS {keyed} ON {table} (key, id) WHERE sent_at IS NULL"
    names = {
        "table": sql.Identifier(table),
        "unsent": sql.Identifier(f"{stem}_unsent_idx"),
        "sent": sql.Identifier(f"{stem}_sent_at_idx"),
        "keyed": sql.Identifier(f"{stem}_key_unsent_idx"),
    }
    return [sql.SQL(text).format(**names) for text in (create, unsent, sent, keyed)]


@dataclass(frozen=True, slots=True)
class StagedMessage:
    """A message a handler asked to publish once its transaction commits."""

    message_id: uuid.UUID
    exchange: str
    routing_key: str
    body: bytes
    content_type: str | None
    headers: dict[str, Any]


@dataclass(slots=True)
class Outbox:
    """The messages one handler run has staged so far."""

    staged: list[StagedMessage] = field(default_factory=list)

    def stage(
        self,
        exchange: str,
        routing_key: str,
        body: JSON | bytes,
        headers: dict[str, Any] | None = None,
        content_type: str | None = None,
    ) -> str:
        """Stage one message; returns its message id. Bytes are sent as they are,
        anything else as JSON. Raises ``ValueError`` / ``TypeError`` at once, so a
        message that could never be stored fails the handler, not the commit."""
        for what, name in (("exchange", exchange), ("routing key", routing_key)):
            if not isinstance(name, str) or len(name.encode()) > NAME_LIMIT:
                raise ValueError(f"{what} must be a string of at most {NAME_LIMIT} bytes")
        if isinstance(body, bytes | bytearray):
            data = bytes(body)
        else:
            data = orjson.dumps(body)
            content_type = content_type or "application/json"
        table = dict(headers or {})
        orjson.dumps(table)  # stored as jsonb: refuse what JSON cannot hold, now
        message = StagedMessage(uuid.uuid4(), exchange, routing_key, data, content_type, table)
        self.staged.append(message)
        return str(message.message_id)


@dataclass(frozen=True, slots=True)
class OutboxMessage:
    """An unsent row, as the relay takes it."""

    id: int
    message_id: uuid.UUID
    exchange: str
    routing_key: str
    body: bytes
    content_type: str | None
    headers: dict[str, Any]
    attempts: int
    key: str = ""  # the ordering group: the staging key, or the caller's group
    due: bool = True  # False: a row of a per-key run still waiting out its back-off


# Maps a taken row's id to None (confirmed) or why the broker refused it; rows
# it leaves out stay unsent, untouched.
Publish = Callable[[list[OutboxMessage]], Awaitable[dict[int, str | None]]]


class OutboxTable:
    """The outbox statements for one table; every method runs on the caller's connection."""

    def __init__(self, table: str) -> None:
        self.table = table
        parts = {
            "table": sql.Identifier(table),
            "columns": sql.SQL(COLUMNS),
            "channel": sql.Literal(table),
        }
        self._insert = sql.SQL(INSERT).format(**parts)
        self._take = sql.SQL(TAKE).format(**parts)
        self._heads = sql.SQL(TAKE_HEADS).format(**parts)
        self._runs = sql.SQL(TAKE_RUNS).format(**parts)
        self._sent = sql.SQL(MARK_SENT).format(**parts)
        self._refused = sql.SQL(MARK_REFUSED).format(**parts)
        self._purge = sql.SQL(PURGE).format(**parts)
        self._unsent = sql.SQL(UNSENT).format(**parts)

    async def insert(
        self, conn: AsyncConnection[Any], key: str, fence: int, messages: list[StagedMessage]
    ) -> None:
        if not messages:
            return
        rows = [
            (m.message_id, key, fence, m.exchange, m.routing_key, m.body, m.content_type,
             Jsonb(m.headers))
            for m in messages
        ]  # fmt: skip
        async with conn.cursor() as cur:
            await cur.executemany(self._insert, rows)

    async def take(
        self, conn: AsyncConnection[Any], limit: int, ordering: Ordering = Ordering.OLDEST_FIRST
    ) -> list[OutboxMessage]:
        """Lock up to ``limit`` rows due for sending, in id order; the caller's
        transaction holds them. In ``per-key`` order a row may be one not yet due
        (``due`` false) after its key's head: it must not be sent before it is."""
        async with conn.cursor() as cur:
            if ordering is Ordering.OLDEST_FIRST:
                await cur.execute(self._take, {"limit": limit})
                return [OutboxMessage(*row) for row in await cur.fetchall()]
            await cur.execute(self._heads, {"limit": limit})
            heads = await cur.fetchall()
            if not heads:
                return []
            params = {"keys": [h[1] for h in heads], "heads": [h[0] for h in heads]}
            await cur.execute(self._runs, params | {"limit": limit})
            return [OutboxMessage(*row) for row in await cur.fetchall()]

    async def relay(
        self,
        conn: AsyncConnection[Any],
        limit: int,
        publish: Publish,
        ordering: Ordering = Ordering.OLDEST_FIRST,
    ) -> int:
        """Take up to ``limit`` rows, ``publish`` them, record the answers, commit.

        The rows stay locked while they are published, so no other relay sends
        them too. Returns how many rows were taken.
        """
        async with conn.transaction():
            rows = await self.take(conn, limit, ordering)
            if not rows:
                return 0
            answers = await publish(rows)
            await self.mark_sent(conn, [i for i, error in answers.items() if error is None])
            await self.mark_refused(conn, {i: e for i, e in answers.items() if e is not None})
        return len(rows)

    async def exists(self, conn: AsyncConnection[Any]) -> bool:
        cur = await conn.execute(EXISTS, (sql.Identifier(self.table).as_string(conn),))
        row = await cur.fetchone()
        return bool(row and row[0])

    async def mark_sent(self, conn: AsyncConnection[Any], ids: list[int]) -> None:
        if ids:
            await conn.execute(self._sent, {"ids": ids})

    async def mark_refused(self, conn: AsyncConnection[Any], refused: dict[int, str]) -> None:
        """Record why the broker refused these rows; each waits longer before its next try."""
        if refused:
            first, longest = RETRY_BACKOFF
            params = {
                "ids": list(refused),
                "errors": list(refused.values()),
                "first": first,
                "longest": longest,
            }
            await conn.execute(self._refused, params)

    async def purge(self, conn: AsyncConnection[Any], retention: float, limit: int) -> int:
        """Delete up to ``limit`` rows sent more than ``retention`` seconds ago."""
        async with conn.cursor() as cur:
            await cur.execute(self._purge, {"retention": retention, "limit": limit})
            return max(cur.rowcount, 0)

    async def unsent(self, conn: AsyncConnection[Any]) -> int:
        async with conn.cursor() as cur:
            await cur.execute(self._unsent)
            row = await cur.fetchone()
        return int(row[0]) if row else 0
