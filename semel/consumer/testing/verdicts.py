"""What the testing kit answers with: a :class:`Verdict` per message, the copy
semel would have published, and a handler's :class:`Context` for a plain unit test."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aio_pika

from semel.consumer.delivery.decide import Outcome, Result
from semel.consumer.delivery.handler import Context
from semel.consumer.names import Reason
from semel.stores.base import JSON, Record


def context(
    body: Mapping[str, Any] | None = None,
    *,
    key: str = "key-1",
    headers: Mapping[str, Any] | None = None,
    routing_key: str = "",
    message_id: str | None = None,
    attempt: int = 1,
    fence: int = 1,
    validated: Any = None,
) -> Context:
    """A handler's context as the worker builds it, for calling a handler directly."""
    return Context(
        key=key,
        body=dict(body or {}),
        headers=dict(headers or {}),
        routing_key=routing_key,
        message_id=message_id,
        attempt=attempt,
        fence=fence,
        validated=validated,
    )


@dataclass(frozen=True, slots=True)
class Published:
    """A copy the worker would have published: where to, and the message itself."""

    exchange: str
    routing_key: str
    message: aio_pika.Message

    @property
    def headers(self) -> dict[str, Any]:
        return dict(self.message.headers)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What semel would have done with one message."""

    key: str | None
    attempt: int  # the attempt this delivery was (x-semel-attempts, 1 on first delivery)
    outcome: Outcome  # the settled log line's outcome: completed, duplicate, retry ...
    frame: str  # "ack" or "nack": how the delivery was settled
    reason: Reason | None = None  # a dead letter's x-semel-reason
    error: str | None = None  # the handler's failure, as x-semel-error carries it
    delay: float | None = None  # a retry's wait, in seconds
    tier: int | None = None  # a retry's tier, 1-based (the last one repeats)
    copy: Published | None = None  # the retry copy, dead letter or parked copy
    record: Record | None = None  # the key's record in the store after the delivery
    handler: str | None = None  # the handler it went to (an app's handler name)
    queue: str | None = None  # the queue it was delivered from

    @property
    def result(self) -> Result:
        return self.outcome.result

    @property
    def acked(self) -> bool:
        """The handler ran and its result is stored."""
        return self.outcome is Outcome.COMPLETED

    @property
    def duplicate(self) -> bool:
        """Answered from the store, the handler not run."""
        return self.result is Result.DUPLICATE

    @property
    def parked(self) -> bool:
        """Another delivery holds the key: a copy waits in the conflict queue."""
        return self.result is Result.CONFLICT

    @property
    def retried(self) -> bool:
        return self.result is Result.RETRIED

    @property
    def dead_lettered(self) -> bool:
        return self.result is Result.DEAD_LETTERED

    @property
    def stored(self) -> JSON:
        """The handler's stored result (``None`` when there is none)."""
        return self.record.result if self.record is not None else None

    @property
    def headers(self) -> dict[str, Any]:
        """The headers of the copy the worker would publish; empty without one."""
        return self.copy.headers if self.copy is not None else {}
