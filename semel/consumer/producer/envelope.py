"""Where an outgoing message carries its idempotency key.

The consumer reads the key from ``SEMEL_KEY_SOURCE``: a header, the AMQP
message id, or a dotted path into a JSON body. A producer must put it in
the same place, or every message it sends is dead-lettered as
``missing-key``. :func:`envelope` is that one rule, shared by the publisher,
the outbox and ``semel publish``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson

from semel.consumer.delivery.message import KeySource, validate_key
from semel.consumer.errors import BadMessage
from semel.consumer.names import JSON_CONTENT_TYPE
from semel.stores.base import JSON

# Message ids the outbox derives from a key (SEMEL_KEY_SOURCE=message_id with a
# key that is not a UUID): the same key always gives the same id.
KEY_NAMESPACE = uuid.UUID("5e3e1d2a-7b0c-4f3e-9a51-6d2f0c8b4a17")


@dataclass(frozen=True, slots=True)
class Envelope:
    """A message ready to publish: its body, headers and message id."""

    body: bytes
    headers: dict[str, Any] = field(default_factory=dict)
    message_id: str | None = None
    content_type: str | None = JSON_CONTENT_TYPE


def with_path(body: dict[str, Any], path: str, value: object) -> dict[str, Any]:
    """A copy of ``body`` with ``value`` at the dotted ``path`` (objects made on the way)."""
    head, _, rest = path.partition(".")
    inner = body.get(head)
    if rest:
        value = with_path(dict(inner) if isinstance(inner, dict) else {}, rest, value)
    return body | {head: value}


def envelope(
    source: KeySource,
    key: str,
    body: JSON | bytes,
    *,
    headers: dict[str, Any] | None = None,
    message_id: str | None = None,
    content_type: str | None = None,
) -> Envelope:
    """``body`` with ``key`` where ``source`` says the consumer reads it.

    Raises ``ValueError`` for a key the consumer would refuse, or a key that
    must go into a body that is not a JSON object; ``TypeError`` for a body
    JSON cannot hold. A header key also leaves the message id free: when none
    is given, the caller (or the client library) assigns one.
    """
    try:  # the consumer's own check: refuse the key here, not in its DLQ
        validate_key(key, "this message")
    except BadMessage as exc:
        raise ValueError(str(exc)) from None
    table = dict(headers or {})
    if source.kind == "header":
        table[source.name] = key
    elif source.kind == "message_id":
        if message_id is not None and message_id != key:
            raise ValueError("SEMEL_KEY_SOURCE=message_id: the key is the message id")
        message_id = key
    elif isinstance(body, bytes | bytearray) or not isinstance(body, dict):
        raise ValueError(f"SEMEL_KEY_SOURCE=body:{source.name} needs a JSON object body")
    else:
        body = with_path(body, source.name, key)
    if isinstance(body, bytes | bytearray):
        return Envelope(bytes(body), table, message_id, content_type)
    return Envelope(orjson.dumps(body), table, message_id, content_type or JSON_CONTENT_TYPE)


def stable_message_id(key: str) -> uuid.UUID:
    """A UUID for ``key``: the key itself when it is one, else one derived from it."""
    try:
        return uuid.UUID(key)
    except ValueError:
        return uuid.uuid5(KEY_NAMESPACE, key)
