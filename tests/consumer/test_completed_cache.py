"""The worker's cache of keys known completed, on its own: when it answers, what it
keeps and for how long. Clocks are passed in, so no test waits."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from semel.consumer.delivery.completed_cache import MARGIN, CompletedCache
from semel.stores.base import Claim, Record, Status
from semel.stores.base import Outcome as ClaimOutcome

pytestmark = pytest.mark.timeout(10)

FP = "f" * 64
OTHER_FP = "0" * 64
WALL = 1_800_000_000.0  # the wall clock's "now", seconds since the epoch
TTL = 300.0
RETENTION = 86_400.0


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def cache(
    clock: Clock, size: int = 10, ttl: float = TTL, retention: float = RETENTION
) -> CompletedCache:
    return CompletedCache(size, ttl, retention, clock=clock, wall=lambda: WALL)


def claim(
    outcome: ClaimOutcome,
    status: Status,
    *,
    fingerprint: str = FP,
    expires_in: float | None = RETENTION,
) -> Claim:
    expires = None if expires_in is None else datetime.fromtimestamp(WALL + expires_in, UTC)
    record = Record("k", fingerprint, status, 7, 1, None, None, None, None, None, expires)
    return Claim(outcome, record)


def test_a_completion_answers_copies_with_the_same_body_only() -> None:
    clock = Clock()
    known = cache(clock)
    assert known.answer("k", FP) is None
    known.completed("k", FP, fence=7, sent_at=clock.now)
    hit = known.answer("k", FP)
    assert hit is not None
    assert hit.fence == 7
    # Another body under the key: the store decides (a payload-mismatch dead
    # letter), and the entry stays for the copies that do match.
    assert known.answer("k", OTHER_FP) is None
    assert known.answer("k", FP) is not None
    assert known.answer("other", FP) is None


def test_entries_expire_after_the_ttl() -> None:
    clock = Clock()
    known = cache(clock)
    known.completed("k", FP, 7, clock.now)
    clock.now += TTL - 0.001
    assert known.answer("k", FP) is not None
    clock.now += 0.001
    assert known.answer("k", FP) is None
    assert len(known) == 0  # dropped when found expired


def test_an_own_completion_ends_before_its_retention_from_the_call() -> None:
    clock = Clock()
    known = cache(clock, ttl=TTL, retention=200.0)
    sent_at = clock.now
    clock.now += 5.0  # the completion took 5 s to be confirmed
    known.completed("k", FP, 7, sent_at)
    clock.now = sent_at + 200.0 - MARGIN - 0.001
    assert known.answer("k", FP) is not None
    clock.now += 0.001
    assert known.answer("k", FP) is None


def test_a_retention_within_the_margin_keeps_nothing() -> None:
    clock = Clock()
    known = cache(clock, retention=MARGIN)
    known.completed("k", FP, 7, clock.now)
    assert len(known) == 0
    assert known.answer("k", FP) is None


def test_a_duplicate_claim_is_kept_until_its_records_expiry_less_the_margin() -> None:
    clock = Clock()
    known = cache(clock)
    known.learn("k", claim(ClaimOutcome.DUPLICATE, Status.COMPLETED, expires_in=100.0))
    start = clock.now
    assert known.answer("k", FP) is not None
    clock.now = start + 100.0 - MARGIN - 0.001
    assert known.answer("k", FP) is not None
    clock.now += 0.001
    assert known.answer("k", FP) is None


def test_a_duplicate_claim_far_from_expiry_is_kept_for_the_ttl() -> None:
    clock = Clock()
    known = cache(clock)
    known.learn("k", claim(ClaimOutcome.DUPLICATE, Status.COMPLETED))
    clock.now += TTL
    assert known.answer("k", FP) is None


def test_a_record_that_never_expires_is_kept_for_the_ttl() -> None:
    clock = Clock()
    known = cache(clock)
    known.learn("k", claim(ClaimOutcome.DUPLICATE, Status.COMPLETED, expires_in=None))
    clock.now += TTL - 0.001
    assert known.answer("k", FP) is not None
    clock.now += 0.001
    assert known.answer("k", FP) is None


def test_a_duplicate_claim_keeps_the_stores_fingerprint() -> None:
    known = cache(Clock())
    known.learn("k", claim(ClaimOutcome.DUPLICATE, Status.COMPLETED, fingerprint=OTHER_FP))
    assert known.answer("k", FP) is None
    assert known.answer("k", OTHER_FP) is not None


@pytest.mark.parametrize(
    ("outcome", "status"),
    [
        # A failed key may be reset by `semel dlq replay`: its replayed copy must run.
        (ClaimOutcome.FAILED, Status.FAILED),
        (ClaimOutcome.POISON, Status.FAILED),
        (ClaimOutcome.CLAIMED, Status.IN_PROGRESS),
        (ClaimOutcome.IN_PROGRESS, Status.IN_PROGRESS),
        (ClaimOutcome.MISMATCH, Status.COMPLETED),
        (ClaimOutcome.MISMATCH, Status.FAILED),
        # Not a store's answer, but a duplicate of anything but a completed
        # record is not trusted either.
        (ClaimOutcome.DUPLICATE, Status.FAILED),
    ],
)
def test_only_a_completed_duplicate_is_learned(outcome: ClaimOutcome, status: Status) -> None:
    known = cache(Clock())
    known.learn("k", claim(outcome, status))
    assert len(known) == 0
    assert known.answer("k", FP) is None


def test_a_size_of_zero_keeps_nothing() -> None:
    clock = Clock()
    known = cache(clock, size=0)
    known.completed("k", FP, 7, clock.now)
    known.learn("j", claim(ClaimOutcome.DUPLICATE, Status.COMPLETED))
    assert len(known) == 0


def test_the_least_recently_used_key_goes_first() -> None:
    clock = Clock()
    known = cache(clock, size=3)
    for key in ("a", "b", "c"):
        known.completed(key, FP, 1, clock.now)
    assert known.answer("a", FP) is not None  # "a" used: "b" is now the oldest
    known.completed("d", FP, 1, clock.now)
    assert len(known) == 3
    assert known.answer("b", FP) is None
    assert all(known.answer(key, FP) is not None for key in ("a", "c", "d"))


def test_the_lru_bound_holds_under_many_keys() -> None:
    clock = Clock()
    known = cache(clock, size=100)
    for n in range(10_000):
        known.completed(f"k{n}", FP, n, clock.now)
    assert len(known) == 100
    assert known.answer("k9999", FP) is not None
    assert known.answer("k9899", FP) is None
