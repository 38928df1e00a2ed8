"""The messages semel re-publishes: parked and retry copies, returns to Q, dead letters.

Pure builders: an incoming delivery and a decision in, an ``aio_pika.Message``
out. A copy keeps the producer's body and properties; it loses what the
broker wrote (``x-death`` and friends) so attempts are never counted from
broker headers, and it gains semel's own headers.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

import aio_pika

from semel.consumer.delivery.decide import DeadLetter, Retry, bounded
from semel.consumer.delivery.facts import Facts, first_seen, now_iso, origin
from semel.consumer.delivery.message import Incoming
from semel.consumer.names import (
    BROKER_HEADERS,
    H_ATTEMPTS,
    H_DEAD_LETTERED_AT,
    H_ERROR,
    H_ERROR_FRAME,
    H_ERROR_TYPE,
    H_FIRST_SEEN,
    H_KEY,
    H_LETTER_ID,
    H_ORIGINAL_EXCHANGE,
    H_ORIGINAL_ROUTING_KEY,
    H_PARKED_AT,
    H_REASON,
    H_VALIDATION_ERRORS,
)


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


def fresh_copy(message: Incoming) -> aio_pika.Message:
    """``message`` published anew: its headers as they are, the broker's dropped, so the
    broker's delivery count starts again at 0 (see ``names.RETURNS_BEFORE_DETOUR``)."""
    return copy_message(message, carried_headers(message.headers))


def parked_at_now() -> dict[str, Any]:
    return {H_PARKED_AT: int(time.time() * 1000)}


def parked_copy(message: Incoming, queue: str) -> aio_pika.Message:
    """A fresh copy of a delivery of ``queue`` for the conflict queue, stamped with
    when it was parked; it carries the producer's route and when semel first saw it."""
    headers = message.headers
    route = origin(headers, message.exchange or "", message.routing_key or "", queue)
    kept = {
        H_FIRST_SEEN: first_seen(headers),
        H_ORIGINAL_EXCHANGE: route.exchange,
        H_ORIGINAL_ROUTING_KEY: route.routing_key,
    }
    return copy_message(message, carried_headers(headers) | kept | parked_at_now())


def returned_copy(message: Incoming) -> aio_pika.Message:
    """A delay queue's message on its way back to Q: the parking stamp has done its job."""
    headers = carried_headers(message.headers)
    headers.pop(H_PARKED_AT, None)
    return copy_message(message, headers)


def _semel_headers(facts: Facts, attempts: int) -> dict[str, Any]:
    return {
        H_ATTEMPTS: attempts,
        H_FIRST_SEEN: facts.first_seen,
        H_ORIGINAL_EXCHANGE: facts.origin.exchange,
        H_ORIGINAL_ROUTING_KEY: facts.origin.routing_key,
    }


def retry_copy(message: Incoming, facts: Facts, decision: Retry) -> aio_pika.Message:
    headers = carried_headers(message.headers) | _semel_headers(facts, decision.next_attempt)
    return copy_message(message, headers | parked_at_now())


def dead_letter_copy(message: Incoming, facts: Facts, decision: DeadLetter) -> aio_pika.Message:
    headers = carried_headers(message.headers) | _semel_headers(facts, facts.attempt)
    headers |= {
        H_REASON: decision.reason.value,
        H_ERROR: bounded(decision.error),
        H_KEY: facts.key or "",
        H_DEAD_LETTERED_AT: now_iso(),
        # Its own id, new even for a replayed message that failed again: that is
        # a new letter, and the DLQ commands tell letters apart by it.
        H_LETTER_ID: uuid.uuid4().hex,
    }
    if decision.validation_errors is not None:
        headers[H_VALIDATION_ERRORS] = decision.validation_errors
    # Only a handler's exception has a fingerprint; one a message arrived with
    # (a producer's, say) must not put a bad input into a handler's group.
    for name in (H_ERROR_TYPE, H_ERROR_FRAME):
        headers.pop(name, None)
    if decision.site is not None:
        headers[H_ERROR_TYPE] = decision.site.error_type
        if decision.site.frame is not None:
            headers[H_ERROR_FRAME] = decision.site.frame
    return copy_message(message, headers)
