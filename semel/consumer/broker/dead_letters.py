"""What a dead letter in ``Q.dlq`` says about itself, and the copy a replay sends.

Pure: a message in, its headers read or a copy built. The commands' work on
the queue (a turn of it per command) is :mod:`semel.consumer.broker.letter_runs`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import aio_pika
from aio_pika.abc import AbstractIncomingMessage

from semel.consumer import names
from semel.consumer.broker.copies import carried_headers, copy_message
from semel.consumer.names import Reason

# Only these reasons mean the store holds this message's failure. The others
# wrote nothing for the key, and resetting it could wipe another message's
# completed record (a too-large copy of a key that already ran, a key reuse).
RESET_REASONS = frozenset({Reason.MAX_ATTEMPTS, Reason.PERMANENT_ERROR, Reason.POISON})


@dataclass(frozen=True, slots=True)
class DlqEntry:
    """What the DLQ headers say about one dead letter (the message, not the decision)."""

    reason: str | None
    key: str | None
    attempts: int | None
    error: str | None
    dead_lettered_at: datetime | None
    routing_key: str | None  # the routing key it was first published with
    message_id: str | None
    # The handler's exception, for max-attempts and permanent-error: its qualified
    # type and the handler's own frame (module:function:line). Grouping and
    # filters: semel.consumer.broker.letter_filters.
    error_type: str | None = None
    error_frame: str | None = None
    letter_id: str | None = None  # :func:`letter_id`: carried, or derived for an older letter
    replays: int = 0  # how many times its message was replayed before
    archived_at: datetime | None = None
    exchange: str | None = None  # the exchange the producer published it to

    def age(self, now: datetime) -> timedelta | None:
        return None if self.dead_lettered_at is None else now - self.dead_lettered_at

    def as_json(self, now: datetime) -> dict[str, Any]:
        age = self.age(now)
        return {
            "reason": self.reason,
            "key": self.key,
            "attempts": self.attempts,
            "error": self.error,
            "dead_lettered_at": self.dead_lettered_at and self.dead_lettered_at.isoformat(),
            "age_seconds": None if age is None else round(age.total_seconds(), 3),
            "routing_key": self.routing_key,
            "message_id": self.message_id,
            "error_type": self.error_type,
            "error_frame": self.error_frame,
            "letter_id": self.letter_id,
            "replays": self.replays,
            "archived_at": self.archived_at and self.archived_at.isoformat(),
            "exchange": self.exchange,
        }


def _text(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _int(value: object) -> int | None:
    try:
        return int(str(_text(value)))
    except ValueError:
        return None


def parse_instant(value: object) -> datetime | None:
    """A header timestamp as an aware datetime: AMQP timestamp, epoch or ISO 8601."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = value / 1000 if value > 1e11 else value  # epoch milliseconds
        try:
            return datetime.fromtimestamp(seconds, UTC)
        except (ValueError, OverflowError, OSError):
            return None
    text = _text(value)
    if not text:
        return None
    try:
        return parse_instant(float(text))
    except ValueError:
        pass
    try:
        return parse_instant(datetime.fromisoformat(text.replace("Z", "+00:00")))
    except ValueError:
        return None


def read_entry(message: AbstractIncomingMessage) -> DlqEntry:
    """Read the ``x-semel-*`` headers of a message taken from the DLQ."""
    headers = message.headers or {}
    return DlqEntry(
        reason=_text(headers.get(names.H_REASON)),
        key=_text(headers.get(names.H_KEY)) or None,  # "" when the key was missing
        attempts=_int(headers.get(names.H_ATTEMPTS)),
        error=_text(headers.get(names.H_ERROR)),
        dead_lettered_at=parse_instant(headers.get(names.H_DEAD_LETTERED_AT)),
        routing_key=_text(headers.get(names.H_ORIGINAL_ROUTING_KEY)) or message.routing_key,
        message_id=message.message_id,
        error_type=_text(headers.get(names.H_ERROR_TYPE)) or None,
        error_frame=_text(headers.get(names.H_ERROR_FRAME)) or None,
        letter_id=letter_id(message),
        replays=_int(headers.get(names.H_REPLAYS)) or 0,
        archived_at=parse_instant(headers.get(names.H_ARCHIVED_AT)),
        exchange=_text(headers.get(names.H_ORIGINAL_EXCHANGE)),
    )


def letter_id(message: AbstractIncomingMessage) -> str:
    """The letter's id: the one it carries, else one derived from what it is.

    The worker gives every new dead letter an id; one written before ids has
    none. Deriving it (and not drawing a random one) gives it the same id on
    every look, and both copies a killed command may leave of it the same id
    (a turn writes the id on each copy it makes).
    """
    given = _text((message.headers or {}).get(names.H_LETTER_ID))
    if given:
        return given
    headers = message.headers or {}
    digest = hashlib.sha256()
    for part in (
        message.message_id,
        headers.get(names.H_DEAD_LETTERED_AT),
        headers.get(names.H_KEY),
        headers.get(names.H_REASON),
        message.routing_key,
    ):
        digest.update(repr(part).encode("utf-8", "backslashreplace") + b"\x1f")
    digest.update(message.body)
    return digest.hexdigest()[:32]


# Kept on a replayed copy: the producer's route. It goes to the work queue
# through the default exchange, so without them its route would be the queue's
# name, which no handler of an app's queue takes (dead-lettered again as
# no-handler), and a later dead letter would name the default exchange.
_ROUTE_HEADERS = (names.H_ORIGINAL_EXCHANGE, names.H_ORIGINAL_ROUTING_KEY)
# Kept too: how many times the message was replayed, shown in listings.
_KEPT_HEADERS = (*_ROUTE_HEADERS, names.H_REPLAYS)


def replay_headers(headers: Mapping[str, Any]) -> dict[str, Any]:
    """The headers without semel's retry/DLQ headers (but the producer's route) and the
    broker's death records."""
    return {
        name: value
        for name, value in carried_headers(headers).items()
        if not name.startswith(names.SEMEL_HEADER_PREFIX) or name in _KEPT_HEADERS
    }


def replay_copy(message: AbstractIncomingMessage) -> aio_pika.Message:
    """A fresh, persistent copy of a dead letter with its original properties.

    Built like every copy semel makes (:func:`semel.consumer.broker.copies.copy_message`):
    ``user_id`` and ``expiration`` are left out.
    """
    return copy_message(message, replay_headers(message.headers or {}))


class Chooser(Protocol):
    """Which dead letters a replay takes: a :class:`Selection`, or any filter
    (:class:`semel.consumer.broker.letter_filters.LetterFilter`)."""

    def matches(self, entry: DlqEntry) -> bool: ...


@dataclass(frozen=True, slots=True)
class Selection:
    """One key, one reason, or all (the filters' first form, kept for its callers)."""

    key: str | None = None
    reason: Reason | None = None
    everything: bool = False

    def matches(self, entry: DlqEntry) -> bool:
        if self.everything:
            return True
        if self.key is not None:
            return entry.key == self.key
        return self.reason is not None and entry.reason == self.reason.value
