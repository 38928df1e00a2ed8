"""Any ``async def`` run effectively once per idempotency key, on the worker's engine.

The same claim, renewed lease, fences and fenced writes as a delivery
(:mod:`semel.consumer.delivery.keyed`), with the broker's part replaced by
the caller: a duplicate call gets the stored result, a call that meets the
key in progress raises, waits, or is told when to come back. See
``docs/idempotent.md``.
"""

from semel.consumer.idempotent.calls import Call, Duplicate, current_call
from semel.consumer.idempotent.decorator import idempotent
from semel.consumer.idempotent.errors import (
    KeyFailed,
    KeyInProgress,
    PayloadMismatch,
    ResultNotStored,
    RetryLater,
)

__all__ = [
    "Call",
    "Duplicate",
    "KeyFailed",
    "KeyInProgress",
    "PayloadMismatch",
    "ResultNotStored",
    "RetryLater",
    "current_call",
    "idempotent",
]
