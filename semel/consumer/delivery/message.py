"""Reading one delivery: its JSON body, its idempotency key and its fingerprint.

Everything here is pure: bytes and headers in, values out, or
:class:`BadMessage` naming the DLQ reason. Nothing touches the broker or the store.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import orjson

from semel.consumer.errors import BadMessage
from semel.consumer.names import JSON_CONTENT_TYPE, MAX_KEY_LENGTH, Reason


class Incoming(Protocol):
    """What the pipeline reads of a delivery: the broker's frame as
    :class:`semel.consumer.broker.intake.AmqpDelivery`, or aio-pika's ``IncomingMessage``
    (the DLQ tools read through aio-pika)."""

    @property
    def body(self) -> bytes: ...
    @property
    def headers(self) -> Mapping[str, Any]: ...
    @property
    def exchange(self) -> str | None: ...
    @property
    def routing_key(self) -> str | None: ...
    @property
    def delivery_tag(self) -> int | None: ...
    @property
    def content_type(self) -> str | None: ...
    @property
    def content_encoding(self) -> str | None: ...
    @property
    def priority(self) -> int | None: ...
    @property
    def correlation_id(self) -> str | None: ...
    @property
    def reply_to(self) -> str | None: ...
    @property
    def message_id(self) -> str | None: ...
    @property
    def timestamp(self) -> datetime | None: ...
    @property
    def type(self) -> str | None: ...
    @property
    def app_id(self) -> str | None: ...
    async def ack(self) -> None: ...
    async def nack(self, *, requeue: bool = True) -> None: ...


@dataclass(frozen=True, slots=True)
class KeySource:
    """Where the idempotency key is read from (``SEMEL_KEY_SOURCE``)."""

    kind: str  # "header", "message_id" or "body"
    name: str = ""  # the header name, or the dotted path into the body

    @classmethod
    def parse(cls, spec: str) -> KeySource:
        if spec == "message_id":
            return cls("message_id")
        kind, _, name = spec.partition(":")
        if kind not in ("header", "body") or not name:
            raise ValueError(f"unknown key source {spec!r}")
        return cls(kind, name)

    def extract(
        self, headers: Mapping[str, Any], message_id: str | None, body: Mapping[str, Any]
    ) -> str:
        """The validated key; raises :class:`BadMessage` when missing or invalid."""
        if self.kind == "message_id":
            return validate_key(message_id or None, "message_id")
        if self.kind == "header":
            return validate_key(_header(headers, self.name), f"header {self.name!r}")
        return validate_key(_dig(body, self.name), f"body field {self.name!r}")


@dataclass(frozen=True, slots=True)
class MessageRules:
    """How a delivery is read: where its key is, how large its body may be."""

    source: KeySource
    max_body_bytes: int


def _header(headers: Mapping[str, Any], name: str) -> Any:
    if name in headers:
        return headers[name]
    # Header names are case-sensitive in AMQP, but producers disagree on the
    # spelling of "Idempotency-Key"; accept any case rather than dead-letter.
    lowered = name.lower()
    for candidate, value in headers.items():
        if candidate.lower() == lowered:
            return value
    return None


def _dig(body: Mapping[str, Any], path: str) -> Any:
    value: Any = body
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def validate_key(value: Any, where: str) -> str:
    """A key is a string of 1..256 printable characters."""
    if value is None:
        raise BadMessage(Reason.MISSING_KEY, f"no idempotency key in {where}")
    if not isinstance(value, str):
        raise BadMessage(Reason.INVALID_KEY, f"key in {where} is a {type(value).__name__}")
    if not 1 <= len(value) <= MAX_KEY_LENGTH:
        raise BadMessage(
            Reason.INVALID_KEY, f"key in {where} has {len(value)} characters (1..{MAX_KEY_LENGTH})"
        )
    if not value.isprintable():
        raise BadMessage(Reason.INVALID_KEY, f"key in {where} has non-printable characters")
    return value


def _forbid_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# Ticks once per float the decoder reads, in any thread (``next`` on a count
# is atomic). A parse across which it ticked only for its own two marks read
# no float, and its body may take orjson's canonical form: see fingerprint().
_FLOATS_READ = itertools.count()


def _finite_float(text: str) -> float:
    next(_FLOATS_READ)
    # 1e400 and 1e999 would both become inf and share one fingerprint, hiding
    # a key reused with another body.
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


# Built once: json.loads / json.dumps with options build a new decoder or
# encoder on every call, a measurable share of a duplicate's cost.
_DECODER = json.JSONDecoder(parse_constant=_forbid_constant, parse_float=_finite_float)
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def parse_body(body: bytes, content_type: str | None, limit: int) -> dict[str, Any]:
    """The body as a JSON object, or :class:`BadMessage`."""
    if len(body) > limit:
        raise BadMessage(Reason.TOO_LARGE, f"body of {len(body)} bytes exceeds {limit} bytes")
    media_type = (content_type or JSON_CONTENT_TYPE).split(";", 1)[0].strip().lower()
    if media_type != JSON_CONTENT_TYPE:
        raise BadMessage(Reason.MALFORMED_BODY, f"content type {content_type!r} is not JSON")
    try:
        # The standard library keeps integers exact (orjson turns big ones into
        # floats), and the fingerprint must not merge two different bodies.
        parsed = _DECODER.decode(body.decode("utf-8"))
    except UnicodeDecodeError:
        raise BadMessage(Reason.MALFORMED_BODY, "body is not valid UTF-8") from None
    except (ValueError, RecursionError) as exc:
        raise BadMessage(Reason.MALFORMED_BODY, f"body is not JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise BadMessage(
            Reason.MALFORMED_BODY, f"body is a JSON {type(parsed).__name__}, not an object"
        )
    return parsed


def fingerprint(body: Mapping[str, Any], *, floats: bool = True) -> str:
    """sha256 of the canonical JSON: sorted keys, no whitespace, UTF-8.

    The canonical form is the standard library's (the stored fingerprints
    are). For a body with no float (``floats=False``), orjson writes the same
    bytes several times faster: the same escapes, the same key order (UTF-8
    order is code point order), the same integers. Floats differ (``1e-05``
    against ``0.00001``), so a body holding one takes the standard library's
    path, and so does one orjson refuses: integers beyond 64 bits, a lone
    surrogate, nesting deeper than 255 levels.
    """
    if not floats:
        try:
            return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()
        except orjson.JSONEncodeError:
            pass
    canonical = _CANONICAL.encode(body)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class Parsed:
    """A delivery that can be claimed."""

    key: str
    body: dict[str, Any]
    fingerprint: str
    validated: Any = None  # the body as a typed handler's annotation validated it


def parse(
    body: bytes,
    content_type: str | None,
    headers: Mapping[str, Any],
    message_id: str | None,
    *,
    source: KeySource,
    limit: int,
) -> Parsed:
    """Body first, then the key: a key inside a malformed body cannot be read."""
    mark = next(_FLOATS_READ)
    data = parse_body(body, content_type, limit)
    floats = next(_FLOATS_READ) != mark + 1
    key = source.extract(headers, message_id, data)
    try:
        digest = fingerprint(data, floats=floats)
    except UnicodeEncodeError:
        # JSON may escape a lone surrogate ("\ud800"), which no UTF-8 text holds.
        raise BadMessage(Reason.MALFORMED_BODY, "body escapes a lone surrogate") from None
    return Parsed(key=key, body=data, fingerprint=digest)


def best_effort_key(
    headers: Mapping[str, Any], message_id: str | None, source: KeySource
) -> str | None:
    """The key of a delivery that failed parsing, for the DLQ headers, if it has one."""
    if source.kind == "body":
        return None
    try:
        return source.extract(headers, message_id, {})
    except BadMessage:
        return None
