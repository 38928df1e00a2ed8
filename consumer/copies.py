"""The messages semel re-publishes: retry copies and dead letters.

Pure builders: an incoming delivery and a decision in, an ``aio_pika.Message``
out. A copy keeps the producer's body and properties; it loses what the
broker wrote (``x-death`` and friends) so attempts are never counted from
broker headers, and it gains semel's own headers.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aio_pika

from consumer.decide import DeadLetter, Retry
from consumer.intake import Incoming
from consumer.message import Origin
from consumer.names import (
    BROKER_HEADERS,
    ERROR_HEADER_LIMIT,
    H_ATTEMPTS,
    H_DEAD_LETTERED_AT,
    H_ERROR,
    H_FIRST_SEEN,
    H_KEY,
    H_ORIGINAL_EXCHANGE,
    H_ORIGINAL_ROUTING_KEY,
    H_REASON,
)


@dataclass(frozen=True, slots=True)
class Facts:
    """What semel learnt about a delivery, carried onto its copies."""

    key: str | None
    attempt: int
    origin: Origin
    first_seen: str


_second: tuple[int, str] = (-1, "")  # the last whole second formatted, reused within it


def now_iso() -> str:
    """Now as ``datetime.isoformat(timespec="milliseconds")`` in UTC would write it.

    Every delivery needs one (its first-seen time), so the date and time of
    day are formatted once per second and only the milliseconds per call.
    """
    global _second
    seconds, millis = divmod(time.time_ns() // 1_000_000, 1000)
    if _second[0] != seconds:
        _second = (seconds, datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S"))
    return f"{_second[1]}.{millis:03d}+00:00"


def first_seen(headers: Mapping[str, Any]) -> str:
    """When semel first saw this message: kept across retries, else now."""
    value = headers.get(H_FIRST_SEEN)
    return value if isinstance(value, str) and value else now_iso()


def bounded(text: str, limit: int = ERROR_HEADER_LIMIT) -> str:
    """At most ``limit`` UTF-8 bytes, never cutting a character in half."""
    return text.encode("utf-8")[:limit].decode("utf-8", "ignore")


def carried_headers(headers: Mapping[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in headers.items() if name not in BROKER_HEADERS}


def copy_message(message: Incoming, headers: dict[str, Any]) -> aio_pika.Message:
    """A persistent copy of ``message`` with ``headers`` and its other properties."""
    # expiration is dropped: a per-message TTL would let a waiting retry or a
    # dead letter vanish. user_id is dropped: the broker refuses a user_id
    # other than the publishing connection's.
    return aio_pika.Message(
        body=message.body,
        headers=headers,
        content_type=message.content_type,
        content_encoding=message.content_encoding,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        priority=message.priority,
        correlation_id=message.correlation_id,
        reply_to=message.reply_to,
        message_id=message.message_id,
        timestamp=message.timestamp,
        type=message.type,
        app_id=message.app_id,
    )


def _semel_headers(facts: Facts, attempts: int) -> dict[str, Any]:
    return {
        H_ATTEMPTS: attempts,
        H_FIRST_SEEN: facts.first_seen,
        H_ORIGINAL_EXCHANGE: facts.origin.exchange,
        H_ORIGINAL_ROUTING_KEY: facts.origin.routing_key,
    }


def retry_copy(message: Incoming, facts: Facts, decision: Retry) -> aio_pika.Message:
    headers = carried_headers(message.headers) | _semel_headers(facts, decision.next_attempt)
    return copy_message(message, headers)


def dead_letter_copy(message: Incoming, facts: Facts, decision: DeadLetter) -> aio_pika.Message:
    headers = carried_headers(message.headers) | _semel_headers(facts, facts.attempt)
    headers |= {
        H_REASON: decision.reason.value,
        H_ERROR: bounded(decision.error),
        H_KEY: facts.key or "",
        H_DEAD_LETTERED_AT: now_iso(),
    }
    return copy_message(message, headers)
