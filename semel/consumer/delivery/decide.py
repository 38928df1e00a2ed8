"""What to do with a delivery, as a value computed by pure functions, and the
one vocabulary that names what became of it.

The pipeline asks these functions and hands the answer to the settler, the one
place that acts on the broker. Keeping the decision a value means every row of
the "one delivery" table can be tested without a broker or a store: a test of
the retry decision builds a :class:`RetryPolicy` of two numbers.

A decision carries an :class:`Outcome` (the ``outcome`` of the ``settled``
log line); each outcome belongs to one :class:`Result` (the ``outcome`` label
of ``semel_messages_total``). Both sets of values are part of the documented
interface and never change spelling.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from semel.consumer.delivery.error_site import ErrorSite
from semel.consumer.errors import BadMessage, InvalidBody, PermanentError
from semel.consumer.names import ERROR_HEADER_LIMIT, Reason
from semel.stores.base import POISON_ERROR, Claim, Record, Status
from semel.stores.base import Outcome as ClaimOutcome
from semel.stores.errors import KeyRefused, StoreError, StoreMisconfigured


class Result(StrEnum):
    """What became of a delivery, in the few words metrics and traces use."""

    PROCESSED = "processed"  # the handler ran and its result was stored
    DUPLICATE = "duplicate"  # completed (or failed for good) before: acked, handler not run
    CONFLICT = "conflict"  # someone else holds the key: parked in Q.retry.conflict
    RETRIED = "retried"  # the handler failed: a copy waits in a retry tier
    DEAD_LETTERED = "dead_lettered"  # a copy is in Q.dlq
    REQUEUED = "requeued"  # handed back untouched (store down, shutdown, copy unconfirmed)
    ERROR = "error"  # the pipeline itself raised: parked in Q.retry.conflict


class Outcome(StrEnum):
    """The precise outcome of one delivery, as the ``settled`` log line names it."""

    COMPLETED = "completed"
    DUPLICATE = "duplicate"
    DUPLICATE_OF_FAILED = "duplicate-of-failed"
    IN_PROGRESS = "in-progress"
    FENCED_OUT = "fenced-out"  # the claim was taken over before the outcome was written
    LEASE_LOST = "lease-lost"  # the claim was taken over while the handler ran
    RETRY = "retry"
    DEAD_LETTER = "dead-letter"
    STORE_UNAVAILABLE = "store-unavailable"
    STORE_MISCONFIGURED = "store-misconfigured"  # handed back; consumption stops
    SHUTDOWN = "requeued-shutdown"
    COPY_UNCONFIRMED = "requeued-copy-unconfirmed"  # the broker never confirmed the copy
    # Returned to Q too often (names.RETURNS_BEFORE_DETOUR): a fresh copy
    # waits in Q.retry.conflict, with the broker's count back at 0.
    DETOUR = "requeued-via-conflict"

    @property
    def result(self) -> Result:
        return _RESULTS[self]


_RESULTS = {
    Outcome.COMPLETED: Result.PROCESSED,
    Outcome.DUPLICATE: Result.DUPLICATE,
    Outcome.DUPLICATE_OF_FAILED: Result.DUPLICATE,
    Outcome.IN_PROGRESS: Result.CONFLICT,
    Outcome.FENCED_OUT: Result.CONFLICT,
    Outcome.LEASE_LOST: Result.CONFLICT,
    Outcome.RETRY: Result.RETRIED,
    Outcome.DEAD_LETTER: Result.DEAD_LETTERED,
    Outcome.STORE_UNAVAILABLE: Result.REQUEUED,
    Outcome.STORE_MISCONFIGURED: Result.REQUEUED,
    Outcome.SHUTDOWN: Result.REQUEUED,
    Outcome.COPY_UNCONFIRMED: Result.REQUEUED,
    Outcome.DETOUR: Result.REQUEUED,
}


@dataclass(frozen=True, slots=True)
class Applied:
    """What settling did: the outcome, and whether the ack or nack frame got out."""

    outcome: Outcome
    frame: str = "ack"  # "ack" or "nack": the frame that settled the delivery
    sent: bool = True  # False: the channel was gone; the broker redelivers

    @property
    def logged(self) -> str:
        """The log line's ``outcome``: a lost frame is named, the broker redelivers it."""
        return self.outcome.value if self.sent else f"{self.outcome.value}-{self.frame}-lost"

    @property
    def result(self) -> Result:
        return self.outcome.result


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """``SEMEL_RETRY_DELAYS`` and ``SEMEL_MAX_ATTEMPTS``."""

    delays: tuple[float, ...]
    max_attempts: int

    def delay(self, attempt: int) -> float:
        """The wait before attempt ``attempt + 1``; the last tier repeats."""
        return self.delays[min(attempt, len(self.delays)) - 1]


@dataclass(frozen=True, slots=True)
class Ack:
    """Done with the message: processed now, or before."""

    outcome: Outcome = Outcome.COMPLETED
    cached: bool = False  # a duplicate the worker's cache of completed keys answered


@dataclass(frozen=True, slots=True)
class NackToConflict:
    """Someone else owns the key: a confirmed copy waits in ``Q.retry.conflict``, then the ACK."""

    outcome: Outcome = Outcome.IN_PROGRESS
    error: str | None = None  # the handler's failure, when its claim was lost meanwhile


@dataclass(frozen=True, slots=True)
class Retry:
    """Re-publish to the retry tier that waits ``delay`` seconds."""

    delay: float
    next_attempt: int
    error: str
    outcome: Outcome = Outcome.RETRY


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """Re-publish to ``Q.dlq`` with ``reason``; terminal."""

    reason: Reason
    error: str
    outcome: Outcome = Outcome.DEAD_LETTER
    validation_errors: str | None = None  # x-semel-validation-errors, for invalid-body
    site: ErrorSite | None = None  # the handler's exception: type and frame; None for bad input


@dataclass(frozen=True, slots=True)
class Requeue:
    """Hand the message back untouched: the store cannot be reached, or the worker stops."""

    error: str
    outcome: Outcome = Outcome.STORE_UNAVAILABLE
    store_down: bool = True


@dataclass(frozen=True, slots=True)
class Detour:
    """Park an unread copy in ``Q.retry.conflict``: the delivery came back too often.

    A copy, not a NACK: RabbitMQ 4 carries a message's delivery count through
    dead-lettering, so only a newly published message starts again at 0.
    """

    outcome: Outcome = Outcome.DETOUR
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Run:
    """The claim was granted: run the handler under ``fence``."""

    fence: int


Settle = Ack | NackToConflict | Retry | DeadLetter | Requeue | Detour
Copied = Retry | DeadLetter | Detour  # the decisions that re-publish a copy before the ACK

MISMATCH_ERROR = "key already used with a different body"
SHUTDOWN = Requeue("shutdown", outcome=Outcome.SHUTDOWN, store_down=False)
# A duplicate answered without the store (semel.consumer.delivery.completed_cache).
CACHED_DUPLICATE = Ack(Outcome.DUPLICATE, cached=True)


def decide_bad_message(bad: BadMessage) -> DeadLetter:
    """A delivery that can never be processed; nothing was claimed for it."""
    errors = bad.errors if isinstance(bad, InvalidBody) else None
    return DeadLetter(bad.reason, str(bad), validation_errors=errors)


def decide_store_error(exc: StoreError) -> Settle:
    """The store answered with an error instead of a decision: what becomes of the delivery.

    A store that passes out of reach or refuses for a while hands the message
    back and pauses the worker; one not set up for semel hands it back and
    stops the worker consuming; a key the store cannot hold is a dead letter.
    """
    if isinstance(exc, KeyRefused):
        return DeadLetter(Reason.STORE_REFUSED, describe(exc))
    if isinstance(exc, StoreMisconfigured):
        return Requeue(describe(exc), outcome=Outcome.STORE_MISCONFIGURED)
    return Requeue(describe(exc))


def decide_after_claim(claim: Claim) -> Settle | Run:
    match claim.outcome:
        case ClaimOutcome.CLAIMED:
            return Run(claim.fence)
        case ClaimOutcome.DUPLICATE:
            return Ack(Outcome.DUPLICATE)
        case ClaimOutcome.IN_PROGRESS:
            return NackToConflict(Outcome.IN_PROGRESS)
        case ClaimOutcome.MISMATCH:
            return DeadLetter(Reason.PAYLOAD_MISMATCH, MISMATCH_ERROR)
        case ClaimOutcome.POISON:
            return DeadLetter(Reason.POISON, claim.record.error or POISON_ERROR)
        case ClaimOutcome.FAILED if claim.record.error == POISON_ERROR:
            # The claim marks a key poison before its dead letter is confirmed;
            # if that publish failed, this copy is the only one left. A second
            # dead letter is harmless, a lost one is not.
            return DeadLetter(Reason.POISON, POISON_ERROR)
        case ClaimOutcome.FAILED:
            # Handler failures mark the key failed only after their dead letter
            # was confirmed, so this copy adds nothing.
            return Ack(Outcome.DUPLICATE_OF_FAILED)
    raise AssertionError(f"unknown claim outcome {claim.outcome!r}")


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
    return claim.outcome is ClaimOutcome.CLAIMED and claim.record.claims > attempt


def describe(exc: BaseException) -> str:
    """``Type: message`` as it goes into logs, ``x-semel-error`` and the store.

    Whatever a handler raised is stored safely: at most ``ERROR_HEADER_LIMIT``
    bytes of UTF-8 (DynamoDB's items are 400 KB), no NUL (PostgreSQL's ``text``
    refuses it) and no lone surrogate (no UTF-8 holds one), each escaped instead.
    """
    text = str(exc)
    text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    text = text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
    return bounded(text)


def bounded(text: str, limit: int = ERROR_HEADER_LIMIT) -> str:
    """At most ``limit`` UTF-8 bytes, never cutting a character in half."""
    return text.encode("utf-8")[:limit].decode("utf-8", "ignore")


def decide_after_failure(
    exc: BaseException, attempt: int, policy: RetryPolicy, site: ErrorSite | None = None
) -> Retry | DeadLetter:
    """A handler raised (or timed out) on attempt ``attempt``; ``site`` is where
    (:func:`semel.consumer.delivery.error_site.error_site`), kept on a dead letter."""
    error = describe(exc)
    if isinstance(exc, PermanentError):
        return DeadLetter(Reason.PERMANENT_ERROR, error, site=site)
    if attempt >= policy.max_attempts:
        return DeadLetter(Reason.MAX_ATTEMPTS, error, site=site)
    return Retry(delay=policy.delay(attempt), next_attempt=attempt + 1, error=error)


def decide_after_success(stored: bool) -> Ack | NackToConflict:
    """The handler returned; ``stored`` is what the fenced ``complete`` answered."""
    # Not stored means the claim was taken over while the handler ran: the new
    # owner decides, and this copy comes back later as a duplicate.
    return Ack(Outcome.COMPLETED) if stored else NackToConflict(Outcome.FENCED_OUT)


def decide_by_record(record: Record | None, fence: int, error: str | None) -> Settle | None:
    """Whether the claim of ``fence`` still holds, from its key's record read back
    after an outcome came into doubt (a write refused, a COMMIT cut short):
    ``None`` while it does (in progress under ``fence``), else what became of it.

    Completed under ``fence`` means the work committed, whatever error was seen
    on the way: the delivery is done, never retried or dead-lettered. Anything
    else means the claim was taken over (or the record forgotten): the owner
    decides, and this copy waits in the conflict queue.
    """
    if record is not None and record.fence == fence:
        if record.status is Status.COMPLETED:
            return Ack(Outcome.COMPLETED)
        if record.status is Status.IN_PROGRESS:
            return None
    return NackToConflict(Outcome.FENCED_OUT, error=error)
