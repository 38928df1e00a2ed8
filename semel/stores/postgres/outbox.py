"""The outbox table: messages a transactional handler staged, waiting to be relayed.

A handler stages messages in memory (:class:`Outbox`); they are inserted in
the same transaction as its business writes and its key's completion, so they
exist exactly when that transaction committed. The relay then takes unsent
rows with ``FOR UPDATE SKIP LOCKED`` (several relays never take the same row),
publishes them and marks them sent before it commits.

Two partial indexes keep the table cheap however large it grows between
purges: one over the few unsent rows (what the relay scans), one over
``sent_at`` of the sent ones (what the purge deletes by).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson
from psycopg import AsyncConnection, sql
from psycopg.types.json import Jsonb

from semel.stores.base import JSON

NAME_LIMIT = 255  # bytes: AMQP's short-string limit for exchange names and routing keys
RETRY_BACKOFF = (1.0, 300.0)  # first and longest wait before a refused message is tried again

COLUMNS = "id, message_id, exchange, routing_key, body, content_type, headers, attempts"

INSERT = """
INSERT INTO {table} (message_id, key, fence, exchange, routing_key, body, content_type, headers)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
"""

# Oldest first; rows another relay holds are skipped, never waited for.
TAKE = """
SELECT {columns} FROM {table}
WHERE sent_at IS NULL AND next_attempt_at <= now()
ORDER BY id LIMIT %(limit)s
FOR UPDATE SKIP LOCKED
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


def schema(table: str) -> list[sql.Composed]:
    """The DDL ``semel migrate`` runs in transactional mode."""
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
    names = {
        "table": sql.Identifier(table),
        "unsent": sql.Identifier(f"{stem}_unsent_idx"),
        "sent": sql.Identifier(f"{stem}_sent_at_idx"),
    }
    return [sql.SQL(text).format(**names) for text in (create, unsent, sent)]


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


class OutboxTable:
    """The outbox statements for one table; every method runs on the caller's connection."""

    def __init__(self, table: str) -> None:
        self.table = table
        parts = {"table": sql.Identifier(table), "columns": sql.SQL(COLUMNS)}
        self._insert = sql.SQL(INSERT).format(**parts)
        self._take = sql.SQL(TAKE).format(**parts)
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

    async def take(self, conn: AsyncConnection[Any], limit: int) -> list[OutboxMessage]:
        """Lock up to ``limit`` rows due for sending; the caller's transaction holds them."""
        async with conn.cursor() as cur:
            await cur.execute(self._take, {"limit": limit})
            return [OutboxMessage(*row) for row in await cur.fetchall()]

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
