"""What semel knows of a delivery, gathered in one place and carried onto its copies.

Its key, which attempt it is, where the producer first published it and when
semel first saw it: read from semel's own headers (and, for the route of a
conflict, the broker's ``x-death``), never counted from broker headers.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from semel.consumer.delivery.message import Incoming
from semel.consumer.delivery.routes import Route
from semel.consumer.names import (
    H_ATTEMPTS,
    H_FIRST_SEEN,
    H_ORIGINAL_EXCHANGE,
    H_ORIGINAL_ROUTING_KEY,
    REJECTED_DEATH,
    X_DEATH,
)


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a producer first published the message."""

    exchange: str
    routing_key: str


@dataclass(frozen=True, slots=True)
class Facts:
    """What semel learnt about a delivery, carried onto its copies."""

    key: str | None
    attempt: int
    origin: Origin
    first_seen: str


@dataclass(slots=True)
class Delivery:
    """One message on its way through the pipeline, and what is known of it so far."""

    message: Incoming
    facts: Facts
    headers: dict[str, Any]
    started: float
    fence: int | None = None
    route: Route | None = None  # the handler it goes to; None when none matched


def attempt_of(headers: Mapping[str, Any]) -> int:
    """The 1-based attempt this delivery is; only semel's own header counts."""
    value = headers.get(H_ATTEMPTS)
    if isinstance(value, bool):
        return 1
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, int) and value >= 1:
        return value
    return 1


def origin(headers: Mapping[str, Any], exchange: str, routing_key: str, queue: str) -> Origin:
    """The producer's exchange and routing key, through retries and conflicts.

    A retry copy carries semel's own headers. A conflict went through broker
    dead-lettering, whose x-death entry for the work queue still names the
    original route (read for the route only, never to count attempts).
    """
    if H_ORIGINAL_EXCHANGE in headers:
        return Origin(
            str(headers[H_ORIGINAL_EXCHANGE]), str(headers.get(H_ORIGINAL_ROUTING_KEY, ""))
        )
    for death in headers.get(X_DEATH) or ():
        if (
            isinstance(death, Mapping)
            and death.get("queue") == queue
            and death.get("reason") == REJECTED_DEATH
        ):
            keys = death.get("routing-keys") or [routing_key]
            return Origin(str(death.get("exchange", exchange)), str(keys[0]))
    return Origin(exchange, routing_key)


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
