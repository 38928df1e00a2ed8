"""What a publish is given and what it answers: one :class:`Receipt` per message.

A message is the broker's responsibility only once it is *confirmed*; every
other answer says why not, in the words an operator and a caller can act on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from semel.consumer.producer.envelope import Envelope
from semel.stores.base import JSON


class Answer(StrEnum):
    """The one answer a message ends with, after its retries."""

    CONFIRMED = "confirmed"  # the broker took it: in every queue bound for its routing key
    RETURNED = "returned"  # unroutable: no queue bound for its routing key; queued nowhere
    NACKED = "nacked"  # the broker refused it (a full queue rejecting publishes, say)
    # No answer in time: in a queue or not, nobody knows; sent again, the same
    # message id and key let the consumer drop the copy.
    TIMED_OUT = "timed_out"
    # The connection or channel went before an answer: likewise unknown.
    # With ``attempts == 0`` it was never sent (a batch stopped before it).
    FAILED = "failed"


# The answers that leave it unknown whether the broker has the message.
NO_ANSWER = frozenset({Answer.TIMED_OUT, Answer.FAILED})


@dataclass(frozen=True, slots=True)
class Receipt:
    """What became of one message."""

    message_id: str
    key: str  # "" when the caller placed no key (a prepared message)
    answer: Answer
    attempts: int  # publishes made, retries included; 0: never sent
    error: str | None = None  # why no answer came (timed_out, failed)

    @property
    def ok(self) -> bool:
        """Whether the broker confirmed the message."""
        return self.answer is Answer.CONFIRMED


@dataclass(frozen=True, slots=True)
class Message:
    """One message of a batch: its body (JSON, or bytes sent as they are) and key."""

    body: JSON | bytes
    key: str
    routing_key: str
    headers: Mapping[str, Any] | None = None
    message_id: str | None = None  # None: a new uuid4 (the key, with SEMEL_KEY_SOURCE=message_id)
    content_type: str | None = None  # None: application/json for a JSON body


@dataclass(frozen=True, slots=True)
class Prepared:
    """A message whose key the caller has placed already (``envelope()`` or by hand)."""

    envelope: Envelope
    routing_key: str
    key: str = ""  # for the receipt only
