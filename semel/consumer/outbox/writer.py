"""Staging: a message inserted into the outbox table in the caller's own transaction.

:class:`OutboxWriter` holds no connection. Given the transaction a web
request (or any code) already has open, it inserts one row and a ``NOTIFY``
in that transaction, so the message exists exactly when the transaction
commits and a relay listening on the table's channel wakes at that moment.
The row is what the relay publishes: the key placed where the consumer's
``SEMEL_KEY_SOURCE`` reads it (:func:`semel.consumer.producer.envelope.envelope`),
a message id fixed now, so every copy the relay ever sends carries the same.

The transaction may be psycopg 3's or SQLAlchemy's, async or not
(:mod:`semel.consumer.outbox.drivers`); neither library is imported here.
"""

from __future__ import annotations

import re
import uuid
from typing import TYPE_CHECKING, Any

import orjson

from semel.consumer.delivery.message import KeySource
from semel.consumer.outbox import drivers
from semel.consumer.outbox.drivers import Statement
from semel.consumer.producer.envelope import envelope, stable_message_id
from semel.stores.base import JSON

if TYPE_CHECKING:
    from semel.consumer.outbox.drivers import AsyncTransaction, SyncTransaction

NAME_LIMIT = 255  # bytes: AMQP's short-string limit for exchange names and routing keys
TABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")  # as SEMEL_OUTBOX_TABLE allows

COLUMNS = ("message_id", "key", "exchange", "routing_key", "body", "content_type", "headers")

# One statement: the row, and the NOTIFY PostgreSQL sends only if it commits.
# Placeholders are written {name}; each driver gets its own syntax. Staged
# rows carry fence 0: no claim of semel's committed them.
INSERT = """WITH staged AS (
    INSERT INTO {table} (message_id, key, fence, exchange, routing_key, body, content_type,
                         headers)
    VALUES ({message_id}, {key}, 0, {exchange}, {routing_key}, {body}, {content_type},
            CAST({headers} AS jsonb))
    RETURNING 1
)
SELECT pg_notify({channel}, '') FROM staged"""


def statement(table: str) -> Statement:
    """The insert into ``table``; raises ``ValueError`` for a name SEMEL_OUTBOX_TABLE refuses."""
    if not TABLE_NAME.match(table):
        raise ValueError(f"outbox table: {table!r} is not a plain SQL name")
    names = (*COLUMNS, "channel")
    quoted = f'"{table}"'
    return Statement(
        INSERT.format(table=quoted, **{n: f"%({n})s" for n in names}),
        INSERT.format(table=quoted, **{n: f":{n}" for n in names}),
    )


class OutboxWriter:
    """Stages messages in the caller's transaction; see the module's docstring.

    ``table`` is the outbox table (``SEMEL_OUTBOX_TABLE``), ``exchange`` the
    default exchange of what is staged (``SEMEL_EXCHANGE``), ``key_source``
    where the consumer reads the key (``SEMEL_KEY_SOURCE``).
    """

    def __init__(self, table: str, exchange: str, key_source: KeySource) -> None:
        self.table = table
        self.exchange = exchange
        self.key_source = key_source
        self._statement = statement(table)

    def row(
        self,
        body: JSON | bytes,
        *,
        key: str,
        routing_key: str,
        exchange: str | None = None,
        headers: dict[str, Any] | None = None,
        group: str | None = None,
        message_id: str | None = None,
    ) -> dict[str, Any]:
        """The parameters of the insert; raises ``ValueError`` / ``TypeError`` for a
        message that could never be stored or read by the consumer, before any SQL."""
        exchange = self.exchange if exchange is None else exchange
        for what, name in (("exchange", exchange), ("routing key", routing_key)):
            if not isinstance(name, str) or len(name.encode()) > NAME_LIMIT:
                raise ValueError(f"{what} must be a string of at most {NAME_LIMIT} bytes")
        group = key if group is None else group
        if not isinstance(group, str) or not group:
            raise ValueError("group must be a non-empty string")
        message = envelope(self.key_source, key, body, headers=headers, message_id=message_id)
        return {
            "message_id": _message_id(self.key_source, key, message_id),
            "key": group,
            "exchange": exchange,
            "routing_key": routing_key,
            "body": message.body,
            "content_type": message.content_type,
            "headers": orjson.dumps(message.headers).decode(),
            "channel": self.table,
        }

    async def stage(
        self,
        tx: AsyncTransaction,
        body: JSON | bytes,
        *,
        key: str,
        routing_key: str,
        exchange: str | None = None,
        headers: dict[str, Any] | None = None,
        group: str | None = None,
        message_id: str | None = None,
    ) -> str:
        """Insert one message in ``tx`` (a psycopg ``AsyncConnection``, a SQLAlchemy
        ``AsyncSession`` or ``AsyncConnection``); returns its message id.

        It is published once ``tx`` commits, never if it rolls back. Raises
        :class:`drivers.NotInTransaction` for a connection whose writes commit
        on their own (autocommit, outside a transaction block).
        """
        params = self.row(
            body, key=key, routing_key=routing_key, exchange=exchange, headers=headers,
            group=group, message_id=message_id,
        )  # fmt: skip
        await drivers.execute(tx, self._statement, params)
        return str(params["message_id"])

    def stage_sync(
        self,
        tx: SyncTransaction,
        body: JSON | bytes,
        *,
        key: str,
        routing_key: str,
        exchange: str | None = None,
        headers: dict[str, Any] | None = None,
        group: str | None = None,
        message_id: str | None = None,
    ) -> str:
        """:meth:`stage` for a psycopg ``Connection`` or a SQLAlchemy ``Session`` or
        ``Connection``."""
        params = self.row(
            body, key=key, routing_key=routing_key, exchange=exchange, headers=headers,
            group=group, message_id=message_id,
        )  # fmt: skip
        drivers.execute_sync(tx, self._statement, params)
        return str(params["message_id"])


def _message_id(source: KeySource, key: str, given: str | None) -> uuid.UUID:
    """The row's message id: the table stores a UUID.

    With ``SEMEL_KEY_SOURCE=message_id`` the id is the key, so it is derived
    from it (:func:`stable_message_id`: the key itself if it is a UUID).
    """
    if source.kind == "message_id":
        return stable_message_id(key)
    if given is None:
        return uuid.uuid4()
    try:
        return uuid.UUID(given)
    except ValueError:
        raise ValueError(
            f"message_id must be a UUID (the outbox stores it as one): {given!r}"
        ) from None
