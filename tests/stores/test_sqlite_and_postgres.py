"""What the SQLite and PostgreSQL stores share beyond the contract: retention, reset, purge."""

from __future__ import annotations

import asyncio
from typing import Protocol, cast

import pytest

from semel.stores.base import POISON_ERROR, Outcome, Record, Status, Store
from semel.stores.shared.refusal import refused_outcome
from tests.conftest import StoreFactory
from tests.fences import clock_us, started_fresh

FP = "f" * 64
OTHER_FP = "0" * 64


class Purging(Protocol):
    async def purge(self, limit: int = ...) -> int: ...


sql_backends = pytest.mark.parametrize("backend", ["sqlite", "postgres"])


@sql_backends
async def test_past_retention_is_absent_but_fence_grows(make_store: StoreFactory) -> None:
    store = await make_store(retention=0.3, lock_ttl=0.3)
    since = clock_us()
    first = await store.claim("k", FP)
    assert started_fresh(first.fence, since)
    assert first.record.claims == 1
    assert await store.complete("k", first.fence, {"v": 1})
    await asyncio.sleep(0.4)
    assert await store.get("k") is None
    assert not await store.reset("k")

    again = await store.claim("k", OTHER_FP)  # a new body is no mismatch once forgotten
    assert again.outcome is Outcome.CLAIMED
    # The row is still there: above its fence, and restarted from the clock.
    assert again.fence > first.fence
    assert started_fresh(again.fence, since)
    assert again.record.claims == 1
    assert (again.record.fingerprint, again.record.result) == (OTHER_FP, None)


@sql_backends
async def test_lease_times_follow_one_clock(make_store: StoreFactory) -> None:
    store = await make_store(lock_ttl=7.0, retention=100.0)
    record = (await store.claim("k", FP)).record
    assert record.updated_at is not None
    assert record.lease_expires_at is not None
    assert record.expires_at is not None
    assert (record.lease_expires_at - record.updated_at).total_seconds() == 7.0
    assert (record.expires_at - record.updated_at).total_seconds() == 100.0
    assert record.first_seen == record.updated_at


@sql_backends
async def test_poison_marks_failed_in_the_claim(make_store: StoreFactory) -> None:
    store = await make_store(max_claims=1)
    first = await store.claim("k", FP)
    assert await store.release("k", first.fence)
    poison = await store.claim("k", FP)
    assert poison.outcome is Outcome.POISON
    assert (poison.record.status, poison.record.error) == (Status.FAILED, POISON_ERROR)
    assert poison.fence == first.fence  # nobody was granted the key
    assert not await store.complete("k", first.fence, "late")


@sql_backends
async def test_reset_clears_outcome_and_keeps_fence(make_store: StoreFactory) -> None:
    store = await make_store(max_claims=2)
    first = await store.claim("k", FP)
    assert await store.fail("k", first.fence, "PermanentError: no")
    assert await store.reset("k")
    record = await store.get("k")
    assert record is not None
    assert (record.status, record.claims, record.result, record.error) == (
        Status.IN_PROGRESS,
        0,
        None,
        None,
    )
    assert record.fence == first.fence
    # claims restart, so a replayed key gets its full max_claims again
    for expected_fence in (first.fence + 1, first.fence + 2):
        claim = await store.claim("k", FP)
        assert (claim.outcome, claim.fence) == (Outcome.CLAIMED, expected_fence)
        assert await store.release("k", claim.fence)


@sql_backends
async def test_failed_key_with_other_body_is_mismatch(make_store: StoreFactory) -> None:
    store = await make_store()
    first = await store.claim("k", FP)
    assert await store.fail("k", first.fence, "boom")
    assert (await store.claim("k", OTHER_FP)).outcome is Outcome.MISMATCH
    assert (await store.claim("k", FP)).outcome is Outcome.FAILED


@sql_backends
async def test_purge_deletes_only_rows_past_retention(make_store: StoreFactory) -> None:
    short = await make_store(retention=0.3, lock_ttl=0.3)
    long = await make_store(key_prefix=short.config.key_prefix + "-long")
    fences = []
    for store in (short, long):
        claim = await store.claim("k", FP)
        fences.append(claim.fence)
        assert await store.complete("k", claim.fence, {"v": 1})
    await asyncio.sleep(0.4)
    # Purging is table-wide: expired rows of every prefix count as absent already.
    assert await cast(Purging, short).purge() >= 1
    assert await long.get("k") is not None
    # The row is gone, its fence with it: the clock starts the next one, above it.
    since = clock_us()
    again = await short.claim("k", FP)
    assert again.fence > fences[0]
    assert started_fresh(again.fence, since)


@sql_backends
async def test_writes_need_the_in_progress_owner(make_store: StoreFactory) -> None:
    store: Store = await make_store()
    claim = await store.claim("k", FP)
    assert await store.complete("k", claim.fence, 1)
    assert not await store.complete("k", claim.fence, 2)  # already completed
    assert not await store.heartbeat("k", claim.fence)
    assert not await store.fail("missing", 1, "x")
    record = await store.get("k")
    assert record is not None
    assert record.result == 1


def test_refusal_reasons() -> None:
    in_progress = Record("k", FP, Status.IN_PROGRESS, 3, 1, None)
    completed = Record("k", FP, Status.COMPLETED, 3, 1, None)
    failed = Record("k", FP, Status.FAILED, 3, 1, None)
    assert refused_outcome(in_progress, FP, live=True, leased=True) is Outcome.IN_PROGRESS
    assert refused_outcome(in_progress, FP, live=True, leased=False) is None
    assert refused_outcome(in_progress, OTHER_FP, live=True, leased=False) is Outcome.MISMATCH
    assert refused_outcome(completed, FP, live=True, leased=False) is Outcome.DUPLICATE
    assert refused_outcome(completed, OTHER_FP, live=True, leased=False) is Outcome.MISMATCH
    assert refused_outcome(failed, FP, live=True, leased=False) is Outcome.FAILED
    assert refused_outcome(completed, FP, live=False, leased=False) is None


@sql_backends
async def test_takeover_race_has_one_winner(make_store: StoreFactory) -> None:
    one = await make_store()
    # Two pools, or two connections to one file, claiming the same keys.
    stores = [one, await make_store(key_prefix=one.config.key_prefix)]
    first = await stores[0].claim("k", FP)
    for round_ in range(5):
        assert await stores[0].release("k", first.fence + round_)
        claims = await asyncio.gather(*(stores[i % 2].claim("k", FP) for i in range(40)))
        won = [c for c in claims if c.outcome is Outcome.CLAIMED]
        assert len(won) == 1
        assert won[0].fence == first.fence + round_ + 1
        assert {c.outcome for c in claims} == {Outcome.CLAIMED, Outcome.IN_PROGRESS}
