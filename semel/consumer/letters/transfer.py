"""Dead letters out and in: export to JSON Lines, import edited ones, migrate an old ``Q.dlq``.

An export line is a letter whole (body, producer's headers in header_codec's
tagged JSON, semel's headers, properties), so an operator can fix a body by
hand and import it: the fixed letter is a new letter (new id, and a new
message id unless the message id is the key) saying which one it replaces
(``x-semel-edited-from``), and one ``edited`` event ends the originals once
every new one is confirmed.
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import InvalidOperation
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection

from semel.consumer.broker.copies import (
    new_letter_id,
    stream_safe_headers,
)
from semel.consumer.broker.header_codec import from_json_value, to_json_value
from semel.consumer.errors import EXIT_USAGE
from semel.consumer.letters.admin import operator
from semel.consumer.letters.log import (
    PROPERTIES,
    Event,
    Letter,
    LogError,
    append_event,
    append_letters,
    read_log,
)
from semel.consumer.letters.writing import carry_forward, writer_lock
from semel.consumer.names import (
    H_CARRIED_AT,
    H_DLQ_EVENT,
    H_EDITED_FROM,
    H_HEADERS,
    H_LETTER_ID,
    H_ORIGINAL_EXCHANGE,
    SEMEL_HEADER_PREFIX,
    Topology,
)

# Rebuilt for every imported letter, never taken from the line.
_REBUILT = frozenset({H_LETTER_ID, H_EDITED_FROM, H_CARRIED_AT, H_HEADERS, H_DLQ_EVENT})


class ImportRefused(LogError):
    """A line of an import is not a letter; nothing was written."""

    exit_code = EXIT_USAGE


def _text(value: object) -> str | None:
    return value.decode() if isinstance(value, bytes) else None if value is None else str(value)


def _instant(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def export_record(letter: Letter) -> dict[str, Any]:
    """One export line: what ``semel dlq list`` shows, and the letter whole."""
    entry = letter.entry
    semel = letter.semel_headers()
    exchange = semel.get(H_ORIGINAL_EXCHANGE)
    properties = {k: v for k, v in letter.properties.items() if v is not None}
    if isinstance(properties.get("timestamp"), datetime):
        properties["timestamp"] = properties["timestamp"].isoformat()
    record: dict[str, Any] = {
        "letter_id": letter.letter_id,
        "reason": entry.reason,
        "key": entry.key,
        "attempts": entry.attempts,
        "error": entry.error,
        "error_type": entry.error_type,
        "error_frame": entry.error_frame,
        "dead_lettered_at": _instant(entry.dead_lettered_at),
        "routing_key": entry.routing_key,
        "exchange": _text(exchange),
        "replays": entry.replays,
        "archived_at": _instant(letter.archived_at),
        "headers": {k: to_json_value(v) for k, v in letter.producer_headers().items()},
        "semel_headers": {k: to_json_value(v) for k, v in semel.items()},
        "properties": properties,
    }
    try:
        record["body"] = letter.body.decode("utf-8")
    except UnicodeDecodeError:
        record["body_base64"] = base64.b64encode(letter.body).decode("ascii")
    return record


@dataclass(frozen=True, slots=True)
class Edited:
    """One import line, checked: the letter it replaces and what replaces it."""

    line: int
    replaces: str
    body: bytes
    headers: dict[str, Any]  # the producer's and semel's, whole
    properties: dict[str, Any]

    def message(self, *, keep_message_id: bool) -> aio_pika.Message:
        headers = stream_safe_headers(self.headers)
        headers[H_LETTER_ID] = new_letter_id()
        headers[H_EDITED_FROM] = self.replaces
        properties = dict(self.properties)
        if not keep_message_id:  # the message id is not the key: a new message
            properties["message_id"] = uuid.uuid4().hex
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


def amqp_value(value: Any) -> Any:
    """A decoded header value as the AMQP client encodes it: bytes as a byte array
    (what a producer's byte-array header reads as; plain bytes it cannot send)."""
    if isinstance(value, bytes):
        return bytearray(value)
    if isinstance(value, dict):
        return {k: amqp_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [amqp_value(v) for v in value]
    return value


def _edited(line: int, data: object) -> Edited:
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    replaces = data.get("letter_id")
    if not isinstance(replaces, str) or not replaces:
        raise ValueError("'letter_id' is missing: it names the letter this line replaces")
    if ("body" in data) == ("body_base64" in data):
        raise ValueError("give 'body' (text) or 'body_base64', one of them")
    if "body" in data:
        if not isinstance(data["body"], str):
            raise ValueError("'body' must be a string")
        body = data["body"].encode("utf-8")
    else:
        if not isinstance(data["body_base64"], str):
            raise ValueError("'body_base64' must be a string")
        body = base64.b64decode(data["body_base64"], validate=True)
    producer = {k: amqp_value(from_json_value(v)) for k, v in _object(data, "headers").items()}
    semel = {k: amqp_value(from_json_value(v)) for k, v in _object(data, "semel_headers").items()}
    if any(k.startswith(SEMEL_HEADER_PREFIX) for k in producer):
        raise ValueError(
            f"'headers' holds the producer's; {SEMEL_HEADER_PREFIX}* go in 'semel_headers'"
        )
    if not all(k.startswith(SEMEL_HEADER_PREFIX) for k in semel):
        raise ValueError(f"'semel_headers' holds {SEMEL_HEADER_PREFIX}* headers only")
    kept = {k: v for k, v in semel.items() if k not in _REBUILT}
    properties = _properties(_object(data, "properties"))
    return Edited(line, replaces, body, producer | kept, properties)


def parse_import(lines: Iterable[str]) -> list[Edited]:
    """Every line checked before anything is written; blank lines are skipped.

    Raises :class:`ImportRefused` naming the first bad line.
    """
    edits: list[Edited] = []
    seen: dict[str, int] = {}
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            edit = _edited(number, json.loads(text))
        except (ValueError, TypeError, InvalidOperation, binascii.Error) as exc:
            raise ImportRefused(f"line {number}: {exc}; nothing was imported") from None
        if edit.replaces in seen:
            raise ImportRefused(
                f"line {number}: letter {edit.replaces} is on line {seen[edit.replaces]} "
                "too; nothing was imported"
            )
        seen[edit.replaces] = number
        edits.append(edit)
    return edits


@dataclass(frozen=True, slots=True)
class Imported:
    imported: int  # new letters appended
    resumed: int  # new letters a killed import had appended already
    carried: int


async def import_letters(
    connection: AbstractConnection,
    channel: AbstractChannel,
    names: Topology,
    edits: list[Edited],
    *,
    keep_message_id: bool,
    retention: timedelta,
    note: str | None = None,
) -> Imported:
    """Append the edited letters, then one ``edited`` event ending the ones they replace.

    Refused, before anything is written, when a letter a line replaces is no
    longer there (an import run twice, say). A letter appended by an import
    killed before its event is not appended again.
    """
    async with writer_lock(connection, names):
        state = await read_log(connection, names, archive_retention=retention)
        for edit in edits:
            if edit.replaces not in state.letters:
                raise ImportRefused(
                    f"line {edit.line}: letter {edit.replaces} is no longer among the dead "
                    "letters (replayed, discarded or imported since it was exported); "
                    "nothing was imported"
                )
        earlier = {_text(letter.headers.get(H_EDITED_FROM)) for letter in state.letters.values()}
        fresh = [edit for edit in edits if edit.replaces not in earlier]
        imported = await append_letters(
            channel, names, (edit.message(keep_message_id=keep_message_id) for edit in fresh)
        )
        replaced = [edit.replaces for edit in edits]
        if replaced:
            await append_event(channel, names, Event.EDITED, replaced, note=note, by=operator())
        for letter_id in replaced:  # ended: never carried forward after their event
            del state.letters[letter_id]
        carried = await carry_forward(channel, names, state)
        return Imported(imported, len(edits) - len(fresh), carried)
