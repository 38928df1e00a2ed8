"""Batched claims and completions answer exactly as one call per key would.

The consumer groups the claims and completions of concurrent deliveries into
``claim_many`` / ``complete_many``; each backend turns a batch into one round
trip where it can. These tests hold every backend's batch to the single-key
contract, against the real servers.
"""

from __future__ import annotations

import asyncio

import pytest

from semel.stores.base import ClaimRequest, Completion, Outcome, Status, Store
from tests.conftest import CONTRACT_BACKENDS, SettingsFactory, StoreFactory
from tests.fences import clock_us, started_fresh
from tests.stores.race import assert_one_winner_per_key, decided
from tests.stores.test_contract import take_over

pytestmark = [pytest.mark.parametrize("backend", CONTRACT_BACKENDS), pytest.mark.timeout(60)]

FP = "f" * 64
OTHER_FP = "0" * 64


def done(store: Store, key: str, fence: int, result: object) -> Completion:
    return Completion(key, fence, store.encode_result(result))


async def test_new_keys_are_claimed_in_order(make_store: StoreFactory) -> None:
    store = await make_store()
    keys = [f"n{i}" for i in range(40)]
    since = clock_us()
    claims = decided(await store.claim_many([ClaimRequest(k, FP) for k in keys]))
    assert [c.record.key for c in claims] == keys
    assert {c.outcome for c in claims} == {Outcome.CLAIMED}
    assert all(c.record.status is Status.IN_PROGRESS for c in claims)
    assert all(started_fresh(c.fence, since) for c in claims)  # new keys: the clock
    written = await store.complete_many(
        [done(store, c.record.key, c.fence, {"k": c.record.key}) for c in claims]
    )
    assert written == [True] * len(keys)
    for key in keys:
        record = await store.get(key)
        assert record is not None
        assert (record.status, record.result) == (Status.COMPLETED, {"k": key})


async def test_every_outcome_in_one_batch(make_store: StoreFactory) -> None:
    store = await make_store(max_claims=2)
    held = await store.claim("held", FP)
    finished = await store.claim("finished", FP)
    assert await store.complete("finished", finished.fence, [1, 2])
    failed = await store.claim("failed", FP)
    assert await store.fail("failed", failed.fence, "PermanentError: no")
    other = await store.claim("other-fp", FP)
    assert await store.complete("other-fp", other.fence, None)
    for _ in range(2):
        again = await store.claim("poison", FP)
        assert await store.release("poison", again.fence)
    released = await store.claim("released", FP)
    assert await store.release("released", released.fence)

    claims = decided(
        await store.claim_many(
            [
                ClaimRequest("fresh", FP),
                ClaimRequest("held", FP),
                ClaimRequest("finished", FP),
                ClaimRequest("failed", FP),
                ClaimRequest("other-fp", OTHER_FP),
                ClaimRequest("poison", FP),
                ClaimRequest("released", FP),
            ]
        )
    )
    by_key = {c.record.key: c for c in claims}
    assert [c.record.key for c in claims] == [
        "fresh",
        "held",
        "finished",
        "failed",
        "other-fp",
        "poison",
        "released",
    ]
    assert by_key["fresh"].outcome is Outcome.CLAIMED
    assert by_key["held"].outcome is Outcome.IN_PROGRESS
    assert by_key["held"].fence == held.fence
    assert by_key["finished"].outcome is Outcome.DUPLICATE
    assert by_key["finished"].record.result == [1, 2]
    assert by_key["failed"].outcome is Outcome.FAILED
    assert by_key["failed"].record.error == "PermanentError: no"
    assert by_key["other-fp"].outcome is Outcome.MISMATCH
    assert by_key["poison"].outcome is Outcome.POISON
    assert by_key["released"].outcome is Outcome.CLAIMED
    assert by_key["released"].fence > released.fence
    # Nothing was written for the keys that were not claimed.
    record = await store.get("other-fp")
    assert record is not None
    assert record.fingerprint == FP
    poisoned = await store.get("poison")
    assert poisoned is not None
    assert poisoned.status is Status.FAILED


async def test_completions_are_fenced_one_by_one(make_store: StoreFactory) -> None:
    store = await make_store(lock_ttl=0.5)
    stale = await store.claim("stale", FP)
    mine = await store.claim("mine", FP)
    new_fence = await take_over(store, "stale")
    # "mine"'s lease may have run out too, but nobody took it over: it still lands.
    written = await store.complete_many(
        [done(store, "stale", stale.fence, "late"), done(store, "mine", mine.fence, "ok")]
    )
    assert written == [False, True]
    record = await store.get("stale")
    assert record is not None
    assert (record.status, record.fence, record.result) == (Status.IN_PROGRESS, new_fence, None)
    mine_record = await store.get("mine")
    assert mine_record is not None
    assert mine_record.result == "ok"


async def test_concurrent_batches_of_the_same_keys_have_one_winner(
    make_store: StoreFactory,
) -> None:
    store = await make_store()
    keys = [f"c{i}" for i in range(30)]
    batches = (store.claim_many([ClaimRequest(k, FP) for k in keys]) for _ in range(8))
    answers = [decided(a) for a in await asyncio.gather(*batches)]
    for i, key in enumerate(keys):
        won = [a[i] for a in answers if a[i].outcome is Outcome.CLAIMED]
        assert len(won) == 1, f"{key}: {len(won)} winners"
        assert {a[i].outcome for a in answers} <= {Outcome.CLAIMED, Outcome.IN_PROGRESS}


async def test_empty_batches_do_nothing(make_store: StoreFactory) -> None:
    store = await make_store()
    assert await store.claim_many([]) == []
    assert await store.complete_many([]) == []


async def test_race_one_winner_per_key_in_batches(make_settings: SettingsFactory) -> None:
    await assert_one_winner_per_key(make_settings(), batch=True)
