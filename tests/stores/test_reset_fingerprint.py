"""A reset that takes a new fingerprint: replaying a dead letter whose body was edited.

The edited copy keeps its key, so the failed key's record must take the edited
body's fingerprint, or the copy is refused as a mismatch. Run against every
backend's real server, and through the wrappers the consumer puts around a store.
"""

from __future__ import annotations

import pytest

from semel.consumer.ops.metered import MeteredStore
from semel.consumer.ops.metrics import Metrics
from semel.stores.base import DelegatingStore, Outcome, Status, Store
from tests.conftest import CONTRACT_BACKENDS, StoreFactory

pytestmark = pytest.mark.timeout(60)
every_backend = pytest.mark.parametrize("backend", CONTRACT_BACKENDS)

OLD_FP = "a" * 64
NEW_FP = "b" * 64


async def failed(store: Store, key: str) -> int:
    """``key`` claimed with the old body and failed; the fence it ran under."""
    claim = await store.claim(key, OLD_FP)
    assert claim.outcome is Outcome.CLAIMED
    assert await store.fail(key, claim.fence, "boom")
    return claim.fence


async def assert_takes_new_body(store: Store, key: str, last_fence: int) -> None:
    """After a reset to ``NEW_FP``: the old body is the mismatch, the new one runs, higher."""
    record = await store.get(key)
    assert record is not None
    assert (record.fingerprint, record.status) == (NEW_FP, Status.IN_PROGRESS)
    assert (await store.claim(key, OLD_FP)).outcome is Outcome.MISMATCH
    again = await store.claim(key, NEW_FP)
    assert again.outcome is Outcome.CLAIMED
    assert again.fence > last_fence
    assert (again.record.fingerprint, again.record.claims) == (NEW_FP, 1)
    assert await store.complete(key, again.fence, {"ok": True})
    assert (await store.claim(key, OLD_FP)).outcome is Outcome.MISMATCH
    assert (await store.claim(key, NEW_FP)).outcome is Outcome.DUPLICATE


@every_backend
async def test_reset_with_a_fingerprint_takes_the_edited_body(make_store: StoreFactory) -> None:
    store = await make_store()
    fence = await failed(store, "k")
    assert await store.reset("k", NEW_FP)
    await assert_takes_new_body(store, "k", fence)


@every_backend
async def test_reset_with_a_fingerprint_takes_it_over_poison(make_store: StoreFactory) -> None:
    """Poison both ways: marked failed by a claim, and claims used up but not yet marked."""
    store = await make_store(max_claims=1)
    first = await store.claim("marked", OLD_FP)
    assert await store.release("marked", first.fence)
    assert (await store.claim("marked", OLD_FP)).outcome is Outcome.POISON
    assert await store.reset("marked", NEW_FP)
    await assert_takes_new_body(store, "marked", first.fence)

    unmarked = await store.claim("unmarked", OLD_FP)
    assert await store.release("unmarked", unmarked.fence)
    assert await store.reset("unmarked", NEW_FP)
    await assert_takes_new_body(store, "unmarked", unmarked.fence)


@every_backend
async def test_reset_with_a_fingerprint_never_touches_a_completed_key(
    make_store: StoreFactory,
) -> None:
    store = await make_store()
    first = await store.claim("k", OLD_FP)
    assert await store.complete("k", first.fence, {"v": 1})
    assert not await store.reset("k", NEW_FP)
    record = await store.get("k")
    assert record is not None
    assert (record.fingerprint, record.status, record.fence) == (
        OLD_FP,
        Status.COMPLETED,
        first.fence,
    )
    assert (await store.claim("k", OLD_FP)).outcome is Outcome.DUPLICATE
    assert (await store.claim("k", NEW_FP)).outcome is Outcome.MISMATCH


@every_backend
async def test_reset_with_a_fingerprint_leaves_a_claim_in_hand_and_absent_keys_alone(
    make_store: StoreFactory,
) -> None:
    store = await make_store(lock_ttl=30)
    held = await store.claim("k", OLD_FP)
    assert not await store.reset("k", NEW_FP)
    record = await store.get("k")
    assert record is not None
    assert (record.fingerprint, record.fence, record.claims) == (OLD_FP, held.fence, 1)
    assert (await store.claim("k", OLD_FP)).outcome is Outcome.IN_PROGRESS
    assert await store.complete("k", held.fence, {"v": 1})

    assert not await store.reset("never-seen", NEW_FP)
    assert await store.get("never-seen") is None


@every_backend
async def test_reset_without_a_fingerprint_keeps_the_old_one(make_store: StoreFactory) -> None:
    store = await make_store()
    fence = await failed(store, "k")
    assert await store.reset("k")
    record = await store.get("k")
    assert record is not None
    assert record.fingerprint == OLD_FP
    assert (await store.claim("k", NEW_FP)).outcome is Outcome.MISMATCH
    again = await store.claim("k", OLD_FP)
    assert again.outcome is Outcome.CLAIMED
    assert again.fence > fence


@every_backend
async def test_the_wrappers_pass_the_fingerprint_on(make_store: StoreFactory) -> None:
    store = await make_store()
    fence = await failed(store, "k")
    wrapped = MeteredStore(DelegatingStore(store), Metrics())
    assert await wrapped.reset("k", fingerprint=NEW_FP)
    await assert_takes_new_body(wrapped, "k", fence)


@pytest.mark.parametrize("backend", ["dynamodb-moto", "dynamodb-dynalite"])
async def test_the_botocore_client_resets_to_a_fingerprint_too(make_store: StoreFactory) -> None:
    """DynamoDB sends its calls through its own lean client or through botocore."""
    store = await make_store(dynamodb_client="botocore")
    fence = await failed(store, "k")
    assert await store.reset("k", NEW_FP)
    await assert_takes_new_body(store, "k", fence)
