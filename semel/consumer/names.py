"""Every name and constant semel puts on the wire, defined once.

Queue and exchange names derive from ``SEMEL_QUEUE``; the header names and
reasons are the DLQ contract that operators and tooling read; the timeouts
bound every broker call that must not hang a worker or a command.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

# -- headers semel writes. Attempts are counted here, never in x-death. -------------------
H_ATTEMPTS = "x-semel-attempts"
H_REASON = "x-semel-reason"
H_ERROR = "x-semel-error"
# The error fingerprint of a dead letter a handler's exception sent (max-attempts,
# permanent-error): the exception's qualified class name and the handler's own
# frame, module:function:line (see semel.consumer.delivery.error_site). Bad input
# carries neither: its reason is its group.
H_ERROR_TYPE = "x-semel-error-type"
H_ERROR_FRAME = "x-semel-error-frame"
# Why a body failed validation (reason invalid-body): a bounded JSON list of {loc, type, msg}.
H_VALIDATION_ERRORS = "x-semel-validation-errors"
H_KEY = "x-semel-key"
H_ORIGINAL_EXCHANGE = "x-semel-original-exchange"
H_ORIGINAL_ROUTING_KEY = "x-semel-original-routing-key"
H_FIRST_SEEN = "x-semel-first-seen"
H_DEAD_LETTERED_AT = "x-semel-dead-lettered-at"
# When a copy was published to a delay queue, in epoch milliseconds: it is due
# back in Q one queue delay later (see semel.consumer.broker.delays).
H_PARKED_AT = "x-semel-parked-at"
# A dead letter's own id, the same on every copy a turn of the DLQ makes of it
# (semel.consumer.broker.turn), and what the DLQ commands record about it.
H_LETTER_ID = "x-semel-letter-id"
H_REPLAYS = "x-semel-replays"  # how many times this message was replayed from the DLQ
H_ARCHIVED_AT = "x-semel-archived-at"  # archived by semel dlq archive (ISO 8601)
H_ARCHIVE_NOTE = "x-semel-archive-note"
H_EDITED_FROM = "x-semel-edited-from"  # imported: the id of the letter this one replaces
# The turn that made a copy: a turn meeting its own copy has gone round the queue.
H_TURN = "x-semel-turn"
SEMEL_HEADER_PREFIX = "x-semel-"
# Broker-written headers that must never be copied onto a re-published message.
BROKER_HEADERS = (
    "x-death",
    "x-first-death-exchange",
    "x-first-death-queue",
    "x-first-death-reason",
    "x-last-death-exchange",
    "x-last-death-queue",
    "x-last-death-reason",
    "x-delivery-count",  # DELIVERY_COUNT
)
X_DEATH = "x-death"
REJECTED_DEATH = "rejected"  # the x-death reason of a NACK without requeue
ERROR_HEADER_LIMIT = 1024  # bytes of exception text kept in x-semel-error
ERROR_TYPE_LIMIT = 256  # bytes kept in x-semel-error-type
ERROR_FRAME_LIMIT = 256  # bytes kept in x-semel-error-frame

# -- the message ---------------------------------------------------------------------------
IDEMPOTENCY_HEADER = "Idempotency-Key"
JSON_CONTENT_TYPE = "application/json"
MAX_KEY_LENGTH = 256

# -- routing -------------------------------------------------------------------------------
DEFAULT_EXCHANGE = ""  # routes by queue name
DLQ_ROUTING_KEY = "dlq"
CONFLICT_ROUTING_KEY = "conflict"

# -- the broker's delivery count (quorum queues) --------------------------------------------
DELIVERY_COUNT = "x-delivery-count"  # how often the broker has had the message returned
# The delivery limit of Q and of the delay queues, declared so RabbitMQ 3.x
# (no limit unless set) and 4.x (20 unless set) behave alike. The limit must
# never fire: Q then dead-letters to Q.retry.conflict (the one hop left to the
# broker, better than a drop), a delay queue drops the message. It is the
# brake for returns semel never sees (a connection lost over and over with
# deliveries still in its prefetch buffer).
DELIVERY_LIMIT = 100
# A delivery that has come back this many times is not handed back to its
# queue once more but published anew (Q's to Q.retry.conflict, a delay
# queue's to the same queue), so the broker's count starts again at 0, far
# from any limit. Half of RabbitMQ 4's default, so a queue declared without
# a limit is safe too.
RETURNS_BEFORE_DETOUR = 10
# How many messages one worker holds from each delay queue until they are due:
# a delay queue returns at most this many per delay per worker.
DELAY_PREFETCH = 1000


def returns(headers: Mapping[str, Any]) -> int:
    """How many times the broker says this message was returned to its queue."""
    value = headers.get(DELIVERY_COUNT)
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return value
    try:
        return int(str(value.decode() if isinstance(value, bytes) else value))
    except (TypeError, ValueError):
        return 0


# -- broker timeouts, in seconds -----------------------------------------------------------
CONNECT_TIMEOUT = 10.0  # one attempt of the worker to reach the broker
TOOL_CONNECT_TIMEOUT = 15.0  # a command's one attempt to reach the broker
RECONNECT_INTERVAL = 1.0  # between the robust connection's reconnect attempts
CONFIRM_TIMEOUT = 15.0  # for the broker's confirm of one publish
BROKER_CALL_TIMEOUT = 5.0  # a cancel, close or get that must not block a pause or a stop


class Reason(StrEnum):
    """Why a message reached the DLQ (the ``x-semel-reason`` header)."""

    MALFORMED_BODY = "malformed-body"
    INVALID_BODY = "invalid-body"  # valid JSON, but not what the handler's type declares
    TOO_LARGE = "too-large"
    MISSING_KEY = "missing-key"
    INVALID_KEY = "invalid-key"
    PAYLOAD_MISMATCH = "payload-mismatch"
    MAX_ATTEMPTS = "max-attempts"
    PERMANENT_ERROR = "permanent-error"
    POISON = "poison"
    STORE_REFUSED = "store-refused"  # the store cannot hold the key (a foreign value there)
    NO_HANDLER = "no-handler"  # no handler of the queue's app matches its routing key (and type)


@dataclass(frozen=True, slots=True)
class Topology:
    """The names derived from the work queue ``Q``."""

    queue: str

    @property
    def retry_exchange(self) -> str:
        return f"{self.queue}.retry"

    @property
    def conflict_queue(self) -> str:
        return f"{self.queue}.retry.conflict"

    @property
    def conflict_routing_key(self) -> str:
        return CONFLICT_ROUTING_KEY

    def tier_queue(self, seconds: float) -> str:
        return f"{self.queue}.retry.{seconds:g}s"

    def tier_routing_key(self, seconds: float) -> str:
        return f"{seconds:g}s"

    @property
    def dead_letter_exchange(self) -> str:
        return f"{self.queue}.dlx"

    @property
    def dead_letter_queue(self) -> str:
        return f"{self.queue}.dlq"
