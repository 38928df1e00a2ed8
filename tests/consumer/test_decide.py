"""The settle decision as a value (pure, no servers)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from semel.consumer import PermanentError
from semel.consumer.delivery.decide import (
    MISMATCH_ERROR,
    Ack,
    DeadLetter,
    Detour,
    NackToConflict,
    Retry,
    RetryPolicy,
    Run,
    decide_after_claim,
    decide_after_failure,
    decide_after_success,
    decide_by_record,
    describe,
)
from semel.consumer.delivery.decide import Outcome as Settled
from semel.consumer.delivery.facts import attempt_of
from semel.consumer.errors import HandlerTimeout
from semel.consumer.names import DELIVERY_LIMIT, H_ATTEMPTS, RETURNS_BEFORE_DETOUR, Reason, returns
from semel.stores.base import POISON_ERROR, Claim, Outcome, Record, Status

POLICY = RetryPolicy(delays=(1, 5, 30), max_attempts=4)


def claim(outcome: Outcome, *, fence: int = 3, error: str | None = None) -> Claim:
    status = {
        Outcome.DUPLICATE: Status.COMPLETED,
        Outcome.FAILED: Status.FAILED,
        Outcome.POISON: Status.FAILED,
    }.get(outcome, Status.IN_PROGRESS)
    record = Record(
        key="k",
        fingerprint="f" * 64,
        status=status,
        fence=fence,
        claims=fence,
        lease_expires_at=datetime.now(UTC),
        error=error,
    )
    return Claim(outcome, record)


@pytest.mark.parametrize(
    ("outcome", "expected"),
    [
        (Outcome.CLAIMED, Run(3)),
        (Outcome.DUPLICATE, Ack(Settled.DUPLICATE)),
        (Outcome.IN_PROGRESS, NackToConflict(Settled.IN_PROGRESS)),
        (Outcome.MISMATCH, DeadLetter(Reason.PAYLOAD_MISMATCH, MISMATCH_ERROR)),
        (Outcome.POISON, DeadLetter(Reason.POISON, POISON_ERROR)),
        (Outcome.FAILED, Ack(Settled.DUPLICATE_OF_FAILED)),
    ],
)
def test_after_claim(outcome: Outcome, expected: object) -> None:
    assert decide_after_claim(claim(outcome)) == expected


def test_a_copy_of_a_poison_key_is_dead_lettered_again() -> None:
    # Its first dead letter may never have been confirmed: a second one is harmless.
    decision = decide_after_claim(claim(Outcome.FAILED, error=POISON_ERROR))
    assert decision == DeadLetter(Reason.POISON, POISON_ERROR)


def test_poison_keeps_the_stores_error() -> None:
    decision = decide_after_claim(claim(Outcome.POISON, error="poison: 10 claims"))
    assert decision == DeadLetter(Reason.POISON, "poison: 10 claims")


def test_retry_tiers_follow_attempts_and_the_last_repeats() -> None:
    error = RuntimeError("db timeout")
    assert decide_after_failure(error, 1, POLICY) == Retry(1, 2, "RuntimeError: db timeout")
    assert decide_after_failure(error, 2, POLICY) == Retry(5, 3, "RuntimeError: db timeout")
    assert decide_after_failure(error, 3, POLICY) == Retry(30, 4, "RuntimeError: db timeout")


def test_last_tier_repeats_when_attempts_outnumber_tiers() -> None:
    policy = RetryPolicy(delays=(1, 2), max_attempts=6)
    delays = [decide_after_failure(ValueError(), a, policy) for a in range(1, 6)]
    assert [d.delay for d in delays if isinstance(d, Retry)] == [1, 2, 2, 2, 2]


def test_no_attempts_left_is_max_attempts() -> None:
    decision = decide_after_failure(RuntimeError("boom"), 4, POLICY)
    assert decision == DeadLetter(Reason.MAX_ATTEMPTS, "RuntimeError: boom")


def test_permanent_error_dead_letters_on_first_attempt() -> None:
    decision = decide_after_failure(PermanentError("card declined"), 1, POLICY)
    assert decision == DeadLetter(Reason.PERMANENT_ERROR, "PermanentError: card declined")


def test_timeout_is_an_ordinary_failed_attempt() -> None:
    decision = decide_after_failure(HandlerTimeout("ran longer than 5s"), 1, POLICY)
    assert isinstance(decision, Retry)
    assert decision.next_attempt == 2


def test_after_success() -> None:
    assert decide_after_success(True) == Ack(Settled.COMPLETED)
    assert decide_after_success(False) == NackToConflict(Settled.FENCED_OUT)


@pytest.mark.parametrize(
    ("headers", "attempt"),
    [
        ({}, 1),
        ({H_ATTEMPTS: 3}, 3),
        ({H_ATTEMPTS: "4"}, 4),
        ({H_ATTEMPTS: 0}, 1),
        ({H_ATTEMPTS: -2}, 1),
        ({H_ATTEMPTS: True}, 1),
        ({H_ATTEMPTS: "x"}, 1),
        # Broker counts are never read as attempts.
        ({"x-death": [{"count": 7}], "x-delivery-count": 9}, 1),
    ],
)
def test_attempt_comes_only_from_semels_header(headers: dict[str, Any], attempt: int) -> None:
    assert attempt_of(headers) == attempt


def test_describe() -> None:
    assert describe(ValueError("bad")) == "ValueError: bad"
    assert describe(KeyError()) == "KeyError"


def test_the_last_retry_tier_repeats() -> None:
    policy = RetryPolicy(delays=(0.5, 2, 10), max_attempts=9)
    assert [policy.delay(n) for n in (1, 2, 3, 4, 9)] == [0.5, 2, 10, 10, 10]


@pytest.mark.parametrize(
    ("headers", "count"),
    [
        ({}, 0),
        ({"x-delivery-count": 12}, 12),
        ({"x-delivery-count": b"7"}, 7),
        ({"x-delivery-count": "3"}, 3),
        ({"x-delivery-count": True}, 0),  # not a count
        ({"x-delivery-count": "many"}, 0),
        ({"x-delivery-count": None}, 0),
    ],
)
def test_the_broker_delivery_count_is_read_leniently(headers: dict[str, Any], count: int) -> None:
    assert returns(headers) == count


def test_a_detour_is_a_copied_requeue() -> None:
    assert Detour().outcome is Settled.DETOUR
    assert Settled.DETOUR.result.value == "requeued"
    assert RETURNS_BEFORE_DETOUR * 2 <= 20 < DELIVERY_LIMIT  # clear of 4.x's default, too


def record_of(status: Status, fence: int) -> Record:
    return Record("k", "fp", status, fence, 1, None)


@pytest.mark.parametrize(
    ("record", "decision"),
    [
        # Committed under this claim, whatever error was seen: done, never retried.
        (record_of(Status.COMPLETED, 3), Ack(Settled.COMPLETED)),
        (record_of(Status.IN_PROGRESS, 3), None),  # still this claim's: go on
        (record_of(Status.IN_PROGRESS, 4), NackToConflict(Settled.FENCED_OUT, error="E")),
        (record_of(Status.COMPLETED, 4), NackToConflict(Settled.FENCED_OUT, error="E")),
        (record_of(Status.FAILED, 4), NackToConflict(Settled.FENCED_OUT, error="E")),
        (None, NackToConflict(Settled.FENCED_OUT, error="E")),  # forgotten meanwhile
    ],
)
def test_a_claim_in_doubt_is_decided_by_its_record(
    record: Record | None, decision: NackToConflict | Ack | None
) -> None:
    assert decide_by_record(record, 3, "E") == decision
