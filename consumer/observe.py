"""Hooks at the steps of one delivery, for metrics and traces.

The pipeline tells an :class:`Observer` when a delivery starts and ends, when
its key is claimed and how it was settled. The base class does nothing, so a
pipeline built without observers pays for three empty calls. An observer
never changes what happens to a message: it only watches.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from enum import StrEnum
from typing import TYPE_CHECKING

from consumer.decide import Ack, DeadLetter, NackToConflict, Requeue, Retry, Settle
from consumer.intake import Incoming
from consumer.settle import COPY_UNCONFIRMED
from stores.base import Claim, Outcome

if TYPE_CHECKING:
    from consumer.pipeline import Delivery

_NOTHING = contextlib.nullcontext()  # stateless, so one instance serves every delivery


class Result(StrEnum):
    """What became of a delivery, in the few words metrics and traces use."""

    PROCESSED = "processed"  # the handler ran and its result was stored
    DUPLICATE = "duplicate"  # completed (or failed for good) before: acked, handler not run
    CONFLICT = "conflict"  # someone else holds the key: parked in Q.retry.conflict
    RETRIED = "retried"  # the handler failed: a copy waits in a retry tier
    DEAD_LETTERED = "dead_lettered"  # a copy is in Q.dlq
    REQUEUED = "requeued"  # handed back untouched (store down, shutdown, copy unconfirmed)
    ERROR = "error"  # the pipeline itself raised: parked in Q.retry.conflict


def result_of(decision: Settle, applied: str) -> Result:
    """Sort a settle decision, and what :class:`consumer.settle.Settler` did with it."""
    if applied == COPY_UNCONFIRMED:
        # The broker never confirmed the retry copy or dead letter: the
        # original went back to the queue instead.
        return Result.REQUEUED
    match decision:
        case Ack(outcome="completed"):
            return Result.PROCESSED
        case Ack():
            return Result.DUPLICATE
        case NackToConflict():
            return Result.CONFLICT
        case Retry():
            return Result.RETRIED
        case DeadLetter():
            return Result.DEAD_LETTERED
        case Requeue():
            return Result.REQUEUED
    raise AssertionError(f"unknown decision {decision!r}")


def is_takeover(claim: Claim, attempt: int) -> bool:
    """Whether a granted claim took over an earlier claim whose run was abandoned.

    A store counts every claim of a key since it last completed, and each
    retry is one claim and one attempt: claim 2 is attempt 2. More claims
    than attempts means an earlier claim ended without a retry copy, because
    its worker died, stalled past the lease or was cut short at shutdown, so
    the handler may be running a second time for the same message.
    (A released claim taken by a duplicate copy before the retry copy counts
    too; it is rare, and also runs the handler again.)
    """
    return claim.outcome is Outcome.CLAIMED and claim.record.claims > attempt


class Observer:
    """Watches deliveries; every hook is a no-op here."""

    def delivery(self, message: Incoming) -> AbstractContextManager[object]:
        """Entered before anything is done with ``message``, left once it is settled."""
        return _NOTHING

    def claimed(self, claim: Claim, attempt: int) -> None:
        """The store answered the claim of a delivery's key."""

    def settled(self, delivery: Delivery, decision: Settle, applied: str) -> None:
        """``decision`` was applied to the broker; ``applied`` says how it went."""
