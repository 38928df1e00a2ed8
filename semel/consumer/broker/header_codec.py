"""A dead letter as one line of JSON, and back: what ``semel dlq export`` writes and
``semel dlq import`` reads.

Header values travel as tagged JSON so that no AMQP type is lost: scalars that
JSON has (str, int, float, bool, None) are themselves; lists are lists;
everything else is a one-key object whose key starts with ``$``:
``{"$table": {...}}``, ``{"$bytes": "<base64>"}``, ``{"$decimal": "1.50"}``,
``{"$time": "<ISO 8601>"}``. A plain object never appears untagged, so a
producer's table whose key happens to start with ``$`` reads back unchanged.

Pure: messages in, lines out, and lines in, checked, messages out. The
commands' work on the queue is :mod:`semel.consumer.broker.letter_manage`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import struct
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

import aio_pika
from aio_pika.abc import AbstractIncomingMessage
from pamqp.encode import field_table

from semel.consumer import names
from semel.consumer.broker.copies import carried_headers
from semel.consumer.broker.dead_letters import DlqEntry
from semel.consumer.names import H_TURN

TABLE, BYTES, DECIMAL, TIME = "$table", "$bytes", "$decimal", "$time"
# The properties a copy keeps (semel.consumer.broker.copies.copy_message): user_id
# and expiration are left out there, so they are here too.
PROPERTIES = (
    "content_type",
    "content_encoding",
    "priority",
    "correlation_id",
    "reply_to",
    "message_id",
    "timestamp",
    "type",
    "app_id",
)
# A turn's bookkeeping, never exported: the letter id is the line's own field.
_NOT_EXPORTED = frozenset({names.H_LETTER_ID, H_TURN})
# Written anew on an imported letter, never taken from its line: it is a new,
# live letter (an archived one's edit is made to be replayed).
_REBUILT = _NOT_EXPORTED | {names.H_EDITED_FROM, names.H_ARCHIVED_AT, names.H_ARCHIVE_NOTE}


def to_json_value(value: Any) -> Any:
    """One header value as JSON-safe data (see the module's tags)."""
    if value is None or isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, Mapping):
        return {TABLE: {str(k): to_json_value(v) for k, v in value.items()}}
    if isinstance(value, list | tuple):
        return [to_json_value(v) for v in value]
    if isinstance(value, bytes | bytearray | memoryview):
        return {BYTES: base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, Decimal):
        return {DECIMAL: str(value)}
    if isinstance(value, datetime):
        return {TIME: (value if value.tzinfo else value.replace(tzinfo=UTC)).isoformat()}
    raise TypeError(f"a header value of type {type(value).__name__} has no AMQP form")


def from_json_value(value: Any) -> Any:
    """The header value :func:`to_json_value` made, as aio-pika takes it."""
    if isinstance(value, list):
        return [from_json_value(v) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) != 1:
        raise ValueError(f"not a tagged header value: {value!r}")
    ((tag, inner),) = value.items()
    if tag == TABLE and isinstance(inner, dict):
        return {k: from_json_value(v) for k, v in inner.items()}
    if tag == BYTES and isinstance(inner, str):
        try:  # the client encodes a bytearray as a byte array; plain bytes it refuses
            return bytearray(base64.b64decode(inner, validate=True))
        except binascii.Error as exc:
            raise ValueError(f"not base64: {inner!r}") from exc
    if tag == DECIMAL and isinstance(inner, str):
        try:
            return Decimal(inner)
        except InvalidOperation as exc:
            raise ValueError(f"not a decimal: {inner!r}") from exc
    if tag == TIME and isinstance(inner, str):
        return datetime.fromisoformat(inner)
    raise ValueError(f"not a tagged header value: {value!r}")


def headers_to_json(headers: Mapping[str, Any]) -> dict[str, Any]:
    return {str(k): to_json_value(v) for k, v in headers.items()}


def headers_from_json(data: object) -> dict[str, Any]:
    """The headers :func:`headers_to_json` made; ``ValueError`` on anything else."""
    if not isinstance(data, dict):
        raise ValueError("headers must be a JSON object")
    return {k: from_json_value(v) for k, v in data.items()}


def _instant(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def export_record(
    message: AbstractIncomingMessage, letter_id: str, entry: DlqEntry
) -> dict[str, Any]:
    """One export line: what ``semel dlq list`` shows, then the letter whole."""
    headers = {
        k: v for k, v in carried_headers(message.headers or {}).items() if k not in _NOT_EXPORTED
    }
    properties = {name: getattr(message, name) for name in PROPERTIES}
    if isinstance(properties["timestamp"], datetime):
        properties["timestamp"] = properties["timestamp"].isoformat()
    record: dict[str, Any] = {
        "letter_id": letter_id,
        "reason": entry.reason,
        "key": entry.key,
        "attempts": entry.attempts,
        "error": entry.error,
        "error_type": entry.error_type,
        "error_frame": entry.error_frame,
        "dead_lettered_at": _instant(entry.dead_lettered_at),
        "exchange": entry.exchange,
        "routing_key": entry.routing_key,
        "replays": entry.replays,
        "archived_at": _instant(entry.archived_at),
        "headers": headers_to_json(
            {k: v for k, v in headers.items() if not k.startswith(names.SEMEL_HEADER_PREFIX)}
        ),
        "semel_headers": headers_to_json(
            {k: v for k, v in headers.items() if k.startswith(names.SEMEL_HEADER_PREFIX)}
        ),
        "properties": {k: v for k, v in properties.items() if v is not None},
    }
    try:
        record["body"] = message.body.decode("utf-8")
    except UnicodeDecodeError:
        record["body_base64"] = base64.b64encode(message.body).decode("ascii")
    return record


class LineRefused(ValueError):
    """A line of an import is not a letter; nothing was imported."""


@dataclass(frozen=True, slots=True)
class Edited:
    """One import line, checked: the letter it replaces and what replaces it."""

    line: int
    replaces: str
    body: bytes
    headers: dict[str, Any]  # the producer's and semel's, but the rebuilt ones
    properties: dict[str, Any]

    @property
    def letter_id(self) -> str:
        """The new letter's id, the same every time this line is imported: an import
        killed after publishing and run again finds its letter instead of adding one."""
        digest = hashlib.sha256(b"edited\x1f" + self.replaces.encode() + b"\x1f" + self.body)
        return digest.hexdigest()[:32]

    def message(self, *, keep_message_id: bool) -> aio_pika.Message:
        headers = dict(self.headers)
        headers[names.H_LETTER_ID] = self.letter_id
        headers[names.H_EDITED_FROM] = self.replaces
        properties = dict(self.properties)
        if not keep_message_id:  # the message id is not the key: a new message
            digest = hashlib.sha256(b"message\x1f" + self.letter_id.encode()).hexdigest()
            properties["message_id"] = str(uuid.UUID(hex=digest[:32]))
        return aio_pika.Message(
            body=self.body,
            headers=headers,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            **properties,
        )


def _object(data: dict[str, Any], name: str) -> dict[str, Any]:
    value = data.get(name, {})
    if not isinstance(value, dict):
        raise ValueError(f"{name!r} must be an object")
    return value


def _properties(given: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(given) - set(PROPERTIES))
    if unknown:
        raise ValueError(f"unknown properties: {', '.join(unknown)}")
    properties: dict[str, Any] = {}
    for name, value in given.items():
        if value is None:
            continue
        if name == "priority":
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 255:
                raise ValueError("'priority' must be an integer from 0 to 255")
        elif not isinstance(value, str):
            raise ValueError(f"property {name!r} must be a string")
        elif name == "timestamp":
            value = datetime.fromisoformat(value)
        properties[name] = value
    return properties


def _body(data: dict[str, Any]) -> bytes:
    if ("body" in data) == ("body_base64" in data):
        raise ValueError("give 'body' (text) or 'body_base64', one of them")
    if "body" in data:
        if not isinstance(data["body"], str):
            raise ValueError("'body' must be a string")
        return data["body"].encode("utf-8")
    if not isinstance(data["body_base64"], str):
        raise ValueError("'body_base64' must be a string")
    return base64.b64decode(data["body_base64"], validate=True)


def _edited(line: int, data: object) -> Edited:
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    replaces = data.get("letter_id")
    if not isinstance(replaces, str) or not replaces:
        raise ValueError("'letter_id' is missing: it names the letter this line replaces")
    producer = headers_from_json(_object(data, "headers"))
    semel = headers_from_json(_object(data, "semel_headers"))
    prefix = names.SEMEL_HEADER_PREFIX
    if any(k.startswith(prefix) for k in producer):
        raise ValueError(f"'headers' holds the producer's; {prefix}* go in 'semel_headers'")
    if not all(k.startswith(prefix) for k in semel):
        raise ValueError(f"'semel_headers' holds {prefix}* headers only")
    headers = producer | {k: v for k, v in semel.items() if k not in _REBUILT}
    try:  # what the client could not send is refused here, before anything is written
        field_table(headers)
    except (TypeError, ValueError, OverflowError, struct.error) as exc:
        raise ValueError(f"a header the broker cannot take: {exc}") from None
    properties = _properties(_object(data, "properties"))
    return Edited(line, replaces, _body(data), headers, properties)


def parse_import(lines: Iterable[str]) -> list[Edited]:
    """Every line checked before anything is written; blank lines are skipped.

    Raises :class:`LineRefused` naming the first bad line.
    """
    edits: list[Edited] = []
    seen: dict[str, int] = {}
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            edit = _edited(number, json.loads(text))
        except (ValueError, TypeError, InvalidOperation, binascii.Error) as exc:
            raise LineRefused(f"line {number}: {exc}; nothing was imported") from None
        if edit.replaces in seen:
            raise LineRefused(
                f"line {number}: letter {edit.replaces} is on line {seen[edit.replaces]} "
                "too; nothing was imported"
            )
        seen[edit.replaces] = number
        edits.append(edit)
    return edits
