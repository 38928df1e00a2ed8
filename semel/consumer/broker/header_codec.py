"""AMQP header tables as tagged JSON, and back, without losing a type.

A dead letter lives in a stream, and a stream keeps only scalar header values:
RabbitMQ drops a table or array value silently, and a decimal closes the
publishing connection. So the producer's headers travel as one string header
(``x-semel-headers``), and the same form is what ``semel dlq export`` writes.

Scalars that JSON has (str, int, float, bool, None) are themselves; lists are
lists; everything else is a one-key object whose key starts with ``$``:
``{"$table": {...}}``, ``{"$bytes": "<base64>"}``, ``{"$decimal": "1.50"}``,
``{"$time": "<ISO 8601>"}``. A plain object never appears untagged, so a
producer's table whose key happens to start with ``$`` reads back unchanged.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

TABLE, BYTES, DECIMAL, TIME = "$table", "$bytes", "$decimal", "$time"


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
        try:  # aio-pika sends a bytearray, not bytes
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


def encode_headers(headers: Mapping[str, Any]) -> str:
    """Headers as one compact JSON string (the value of ``x-semel-headers``)."""
    return json.dumps(
        {str(k): to_json_value(v) for k, v in headers.items()},
        separators=(",", ":"),
        ensure_ascii=False,
    )


def decode_headers(text: str | bytes | None) -> dict[str, Any]:
    """The headers :func:`encode_headers` wrote; ``{}`` for none. Raises ``ValueError``
    on anything else."""
    if text is None or text == "":
        return {}
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("x-semel-headers is not a JSON object")
    return {k: from_json_value(v) for k, v in data.items()}
