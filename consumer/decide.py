"""What to do with a delivery, as a value computed by pure functions.

The pipeline asks these functions and hands the answer to
:mod:`consumer.settle`, the one place that acts on the broker. Keeping the
decision a value means every row of the "one delivery" table can be tested
without a broker or a store.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from consumer.errors import PermanentError
from consumer.names import H_ATTEMPTS, Reason
from settings import Settings
from stores.base import POISON_ERROR, Claim, Outcome


@dataclass(frozen=True, slots=True)
class Ack:
    """Done with the message: processed now, or before."""

    outcome: str = "completed"


@dataclass(frozen=True, slots=True)
class NackToConflict:
    """Someone else owns the key; the broker parks the message in ``Q.retry.conflict``."""

    outcome: str = "in-progress"


@dataclass(frozen=True, slots=True)
class Retry:
    """Re-publish to the retry tier that waits ``delay`` seconds."""

    delay: float
    next_attempt: int
    error: str
    outcome: str = "retry"


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """Re-publish to ``Q.dlq`` with ``reason``; terminal."""

    reason: Reason
    error: str
    outcome: str = "dead-letter"


@dataclass(frozen=True, slots=True)
class Requeue:
    """Hand the message back untouched: the store cannot be reached, or the worker stops."""

    error: str
    outcome: str = "store-unavailable"
    store_down: bool = True


@dataclass(frozen=True, slots=True)
class Run:
    """The claim was granted: run the handler under ``fence``."""

    fence: int


Settle = Ack | NackToConflict | Retry | DeadLetter | Requeue

MISMATCH_ERROR = "key already used with a different body"


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


def decide_after_claim(claim: Claim) -> Settle | Run:
    match claim.outcome:
        case Outcome.CLAIMED:
            return Run(claim.fence)
        case Outcome.DUPLICATE:
            return Ack("duplicate")
        case Outcome.IN_PROGRESS:
            return NackToConflict("in-progress")
        case Outcome.MISMATCH:
            return DeadLetter(Reason.PAYLOAD_MISMATCH, MISMATCH_ERROR)
        case Outcome.POISON:
            return DeadLetter(Reason.POISON, claim.record.error or POISON_ERROR)
        case Outcome.FAILED if claim.record.error == POISON_ERROR:
            # The claim marks a key poison before its dead letter is confirmed;
            # if that publish failed, this copy is the only one left. A second
            # dead letter is harmless, a lost one is not.
            return DeadLetter(Reason.POISON, POISON_ERROR)
        case Outcome.FAILED:
            # Handler failures mark the key failed only after their dead letter
            # was confirmed, so this copy adds nothing.
            return Ack("duplicate-of-failed")
    raise AssertionError(f"unknown claim outcome {claim.outcome!r}")


def describe(exc: BaseException) -> str:
    """``Type: message`` as it goes into logs and ``x-semel-error``."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def decide_after_failure(
    exc: BaseException, attempt: int, settings: Settings
) -> Retry | DeadLetter:
    """A handler raised (or timed out) on attempt ``attempt``."""
    error = describe(exc)
    if isinstance(exc, PermanentError):
        return DeadLetter(Reason.PERMANENT_ERROR, error)
    if attempt >= settings.max_attempts:
        return DeadLetter(Reason.MAX_ATTEMPTS, error)
    return Retry(delay=settings.retry_delay(attempt), next_attempt=attempt + 1, error=error)


def decide_after_success(stored: bool) -> Ack | NackToConflict:
    """The handler returned; ``stored`` is what the fenced ``complete`` answered."""
    # Not stored means the claim was taken over while the handler ran: the new
    # owner decides, and this copy comes back later as a duplicate.
    return Ack("completed") if stored else NackToConflict("fenced-out")
