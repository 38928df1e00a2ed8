"""The store contract, written once and run against every backend's real server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest

from semel.stores.base import Outcome, Status, Store
from semel.stores.errors import ResultTooLarge, StoreUnavailable
from tests.conftest import CONTRACT_BACKENDS, SettingsFactory, StoreFactory, open_store
from tests.fences import clock_us, started_fresh
from tests.stores.race import assert_one_winner_per_key

pytestmark = [pytest.mark.parametrize("backend", CONTRACT_BACKENDS), pytest.mark.timeout(60)]

FP = "f" * 64
OTHER_FP = "0" * 64


async def eventually(check: Callable[[], Awaitable[bool]], deadline: float = 10.0) -> None:
    """Poll ``check`` until it holds; fail after ``deadline`` seconds."""
    end = time.monotonic() + deadline
    while not await check():
        if time.monotonic() > end:
            pytest.fail(f"condition not met within {deadline}s")
        await asyncio.sleep(0.05)


async def take_over(store: Store, key: str) -> int:
    """Claim ``key`` until its lease has run out and a claim takes it; the new fence."""
    taken: list[int] = []

    async def taken_over() -> bool:
        claim = await store.claim(key, FP)
        if claim.outcome is Outcome.CLAIMED:
            taken.append(claim.fence)
        return bool(taken)

    await eventually(taken_over)
    return taken[0]


async def test_first_claim_then_duplicate_returns_stored_result(make_store: StoreFactory) -> None:
    store = await make_store()
    since = clock_us()
    first = await store.claim("k1", FP)
    assert first.outcome is Outcome.CLAIMED
    assert started_fresh(first.fence, since)  # a new key's fence: the clock in µs
    assert first.record.status is Status.IN_PROGRESS
    assert first.record.lease_expires_at is not None

    result = {"charged": 42, "items": ["a", "b"], "nested": {"ok": True}}
    assert await store.complete("k1", first.fence, result)

    again = await store.claim("k1", FP)
    assert again.outcome is Outcome.DUPLICATE
    assert again.record.result == result
    assert again.record.status is Status.COMPLETED
    record = await store.get("k1")
    assert record is not None
    assert record.result == result
    assert record.fence == first.fence


async def test_claim_while_held_is_in_progress(make_store: StoreFactory) -> None:
    store = await make_store()
    first = await store.claim("k", FP)
    second = await store.claim("k", FP)
    assert second.outcome is Outcome.IN_PROGRESS
    assert second.record.lease_expires_at is not None
    assert second.record.fence == first.fence


async def test_release_lets_next_claim_in_with_higher_fence(make_store: StoreFactory) -> None:
    store = await make_store()
    first = await store.claim("k", FP)
    assert await store.release("k", first.fence)
    second = await store.claim("k", FP)
    assert second.outcome is Outcome.CLAIMED
    assert second.fence > first.fence
    assert second.record.claims == 2


async def test_terminal_failure_is_remembered(make_store: StoreFactory) -> None:
    store = await make_store()
    first = await store.claim("k", FP)
    assert await store.fail("k", first.fence, "PermanentError: card declined")
    again = await store.claim("k", FP)
    assert again.outcome is Outcome.FAILED
    assert again.record.error == "PermanentError: card declined"
    record = await store.get("k")
    assert record is not None
    assert record.status is Status.FAILED


async def test_mismatch_writes_nothing(make_store: StoreFactory) -> None:
    store = await make_store()
    first = await store.claim("k", FP)
    other = await store.claim("k", OTHER_FP)
    assert other.outcome is Outcome.MISMATCH
    assert other.record.fingerprint == FP
    assert await store.complete("k", first.fence, {"n": 1})
    late = await store.claim("k", OTHER_FP)
    assert late.outcome is Outcome.MISMATCH
    record = await store.get("k")
    assert record is not None
    assert (record.status, record.fingerprint, record.result) == (Status.COMPLETED, FP, {"n": 1})


async def test_lease_expiry_takeover_fences_out_old_owner(make_store: StoreFactory) -> None:
    store = await make_store(lock_ttl=0.5)
    old = await store.claim("k", FP)
    new_fence = await take_over(store, "k")
    assert new_fence == old.fence + 1
    assert not await store.heartbeat("k", old.fence)
    assert not await store.complete("k", old.fence, {"stale": True})
    assert not await store.release("k", old.fence)
    assert not await store.fail("k", old.fence, "stale")

    record = await store.get("k")
    assert record is not None
    assert (record.status, record.fence, record.result) == (Status.IN_PROGRESS, new_fence, None)
    assert await store.complete("k", new_fence, {"fresh": True})
    dup = await store.claim("k", FP)
    assert dup.outcome is Outcome.DUPLICATE
    assert dup.record.result == {"fresh": True}


async def test_heartbeat_keeps_lease_past_ttl(make_store: StoreFactory) -> None:
    # A lease long enough that a scheduling stall of most of a second under a
    # loaded test run does not lapse it between two heartbeats (0.6 s once did).
    ttl = 1.2
    store = await make_store(lock_ttl=ttl)
    owner = await store.claim("k", FP)
    end = time.monotonic() + ttl * 3
    while time.monotonic() < end:
        assert await store.heartbeat("k", owner.fence)
        other = await store.claim("k", FP)
        assert other.outcome is Outcome.IN_PROGRESS, "lease lost despite heartbeats"
        await asyncio.sleep(ttl / 4)
    assert await store.complete("k", owner.fence, None)


async def test_heartbeat_after_release_does_not_lease_the_key_again(
    make_store: StoreFactory,
) -> None:
    """A heartbeat that lands after its own worker's release (a renewal the
    release did not wait for) must not hold the released key for nobody."""
    store = await make_store(lock_ttl=30)
    first = await store.claim("k", FP)
    assert await store.release("k", first.fence)
    assert not await store.heartbeat("k", first.fence)
    second = await store.claim("k", FP)
    assert second.outcome is Outcome.CLAIMED, "the late heartbeat leased the key again"
    assert second.fence == first.fence + 1


async def test_poison_after_max_claims(make_store: StoreFactory) -> None:
    store = await make_store(max_claims=3)
    fences = []
    for _ in range(3):
        claim = await store.claim("k", FP)
        assert claim.outcome is Outcome.CLAIMED
        fences.append(claim.fence)
        assert await store.release("k", claim.fence)
    assert fences == [fences[0], fences[0] + 1, fences[0] + 2]  # each takeover: one more
    poison = await store.claim("k", FP)
    assert poison.outcome is Outcome.POISON
    assert poison.record.claims == 3
    after = await store.claim("k", FP)
    assert after.outcome is Outcome.FAILED
    record = await store.get("k")
    assert record is not None
    assert record.status is Status.FAILED


async def test_completion_resets_nothing_but_retention_forgets(make_store: StoreFactory) -> None:
    store = await make_store(retention=1.0, lock_ttl=0.5)
    first = await store.claim("k", FP)
    assert await store.complete("k", first.fence, {"v": 1})
    assert (await store.claim("k", FP)).outcome is Outcome.DUPLICATE

    reclaimed: list[int] = []

    async def forgotten() -> bool:
        claim = await store.claim("k", FP)
        if claim.outcome is Outcome.CLAIMED:
            reclaimed.append(claim.fence)
        return bool(reclaimed)

    await eventually(forgotten)
    assert reclaimed[0] >= 1


async def test_reset_lets_failed_key_run_again(make_store: StoreFactory) -> None:
    store = await make_store()
    first = await store.claim("k", FP)
    assert await store.fail("k", first.fence, "boom")
    assert await store.reset("k")
    again = await store.claim("k", FP)
    assert again.outcome is Outcome.CLAIMED
    assert again.fence > first.fence
    assert not await store.reset("never-seen")


async def test_reset_lets_poisoned_key_run_again(make_store: StoreFactory) -> None:
    store = await make_store(max_claims=2)

    async def use_up_claims() -> None:
        for _ in range(2):
            claim = await store.claim("k", FP)
            assert claim.outcome is Outcome.CLAIMED
            assert await store.release("k", claim.fence)

    await use_up_claims()
    assert await store.reset("k")  # claims used up, not yet marked: poison all the same
    await use_up_claims()
    assert (await store.claim("k", FP)).outcome is Outcome.POISON
    assert await store.reset("k")
    assert (await store.claim("k", FP)).outcome is Outcome.CLAIMED


async def test_reset_never_reopens_a_completed_key(make_store: StoreFactory) -> None:
    """A replayed copy of a key that completed is a duplicate: its handler never runs again."""
    store = await make_store()
    first = await store.claim("k", FP)
    assert await store.complete("k", first.fence, {"v": 1})
    assert not await store.reset("k")
    again = await store.claim("k", FP)
    assert again.outcome is Outcome.DUPLICATE
    assert again.record.result == {"v": 1}


async def test_reset_leaves_a_claim_in_hand_alone(make_store: StoreFactory) -> None:
    """Only a failed key is reset: a held claim keeps its lease, a released one its count."""
    store = await make_store(lock_ttl=30)
    held = await store.claim("k", FP)
    assert not await store.reset("k")
    assert (await store.claim("k", FP)).outcome is Outcome.IN_PROGRESS
    assert await store.heartbeat("k", held.fence)
    assert await store.release("k", held.fence)
    assert not await store.reset("k")
    taken = await store.claim("k", FP)
    assert (taken.outcome, taken.record.claims) == (Outcome.CLAIMED, 2)


async def test_get_absent_is_none(make_store: StoreFactory) -> None:
    store = await make_store()
    assert await store.get("absent") is None


async def test_keys_are_namespaced_by_prefix(make_store: StoreFactory) -> None:
    one = await make_store(key_prefix="svc-a")
    two = await make_store(key_prefix="svc-b")
    await one.reset("shared")
    await two.reset("shared")
    a = await one.claim("shared", FP)
    b = await two.claim("shared", OTHER_FP)
    try:
        assert a.outcome is Outcome.CLAIMED
        assert b.outcome is Outcome.CLAIMED
    finally:
        await one.release("shared", a.fence)
        await two.release("shared", b.fence)
        await one.reset("shared")
        await two.reset("shared")


async def test_large_result_is_kept_whole_or_refused(make_store: StoreFactory) -> None:
    store = await make_store()
    claim = await store.claim("k", FP)
    big = {"blob": "x" * 500_000}
    try:
        stored = await store.complete("k", claim.fence, big)
    except ResultTooLarge:
        record = await store.get("k")
        assert record is not None
        assert record.status is Status.IN_PROGRESS  # refused whole, nothing written
        return
    assert stored
    dup = await store.claim("k", FP)
    assert dup.record.result == big


async def test_migrate_is_idempotent(make_store: StoreFactory) -> None:
    store = await make_store()
    first = await store.migrate()
    second = await store.migrate()
    assert first == second


async def test_race_one_winner_per_key(make_settings: SettingsFactory) -> None:
    await assert_one_winner_per_key(make_settings())


async def test_store_down_raises_unavailable_fast(
    make_settings: SettingsFactory, backend: str
) -> None:
    settings = make_settings()
    dead = {
        "sqlite": {"sqlite_path": "/nonexistent-dir/semel.db"},
        "postgres": {"postgres_dsn": "postgresql://127.0.0.1:1/test"},
        "redis": {"redis_url": "redis://127.0.0.1:1/0"},
        "redis-sentinel": {"redis_url": "redis+sentinel://127.0.0.1:1,127.0.0.1:2/svc/0"},
        "redis-cluster": {"redis_url": "redis+cluster://127.0.0.1:1,127.0.0.1:2/"},
        "dynamodb": {"dynamodb_endpoint_url": "http://127.0.0.1:1"},
    }[backend if backend.startswith("redis") else settings.store.value]
    down = settings.model_copy(update=dead)

    async def attempt() -> None:
        store: Store | None = None
        try:
            store = await open_store(down)
            await store.claim("k", FP)
        finally:
            if store is not None:
                await store.close()

    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as info:
        await asyncio.wait_for(attempt(), timeout=15)
    assert info.value.__cause__ is not None or "unavailable" in str(info.value)
    assert time.monotonic() - started < 15
