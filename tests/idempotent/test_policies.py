"""What a call meets besides its own run: a key in progress, a key used with
other arguments, and a duplicate answered through the response hook."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from semel.consumer.idempotent import (
    Duplicate,
    KeyInProgress,
    PayloadMismatch,
    RetryLater,
    current_call,
    idempotent,
)
from semel.stores.base import Outcome, Store
from tests.consumer.harness import eventually
from tests.idempotent.conftest import SHORT_LEASE, Counted, StoresFactory
from tests.idempotent.conftest import Stores as StoreFor

pytestmark = [
    pytest.mark.parametrize("backend", ["sqlite", "redis"], indirect=True),
    pytest.mark.timeout(60),
]

Charge = Callable[[str], Coroutine[Any, Any, str]]


def gated(store_for: StoreFor, **options: object) -> tuple[Charge, asyncio.Event, asyncio.Event]:
    """A function that holds its key until ``gate`` is set; ``inside`` once it does."""
    inside, gate = asyncio.Event(), asyncio.Event()

    @idempotent(store_for, key="order_id", **options)  # type: ignore[arg-type]
    async def charge(order_id: str) -> str:
        inside.set()
        await gate.wait()
        return f"charged {order_id} under {current_call().fence}"

    return charge, inside, gate


async def test_in_progress_raise(store_for: StoreFor) -> None:
    charge, inside, gate = gated(store_for)
    first = asyncio.create_task(charge("o-1"))
    await inside.wait()
    with pytest.raises(KeyInProgress) as busy:
        await charge("o-1")
    assert not isinstance(busy.value, RetryLater)
    gate.set()
    result = await first
    assert await charge("o-1") == result


async def test_in_progress_retry_later_says_when(make_stores: StoresFactory) -> None:
    stores = make_stores(lock_ttl=30)
    charge, inside, gate = gated(stores, in_progress="retry_later")
    first = asyncio.create_task(charge("o-2"))
    await inside.wait()
    with pytest.raises(RetryLater) as later:
        await charge("o-2")
    assert 20 < later.value.retry_after <= 30  # what is left of the holder's lease
    gate.set()
    await first


async def test_in_progress_wait_gets_the_first_calls_result(make_stores: StoresFactory) -> None:
    counted = Counted()
    stores = make_stores(wrap=counted)
    charge, inside, gate = gated(stores, in_progress="wait", wait_timeout=30)
    first = asyncio.create_task(charge("o-3"))
    await inside.wait()
    inside.clear()
    waiting = asyncio.create_task(charge("o-3"))

    async def met_in_progress_twice() -> bool:
        return (
            counted.stores[0].calls["claim"] >= 3
        )  # the first call's claim, then two of the waiter's

    await eventually(met_in_progress_twice, 10, "the waiter claiming again")
    assert not waiting.done()
    gate.set()
    assert await waiting == await first
    assert not inside.is_set()  # the waiter never ran the function


async def test_in_progress_wait_gives_up_after_its_timeout(store_for: StoreFor) -> None:
    charge, inside, gate = gated(store_for, in_progress="wait", wait_timeout=0.3)
    first = asyncio.create_task(charge("o-4"))
    await inside.wait()
    with pytest.raises(KeyInProgress):
        await charge("o-4")
    gate.set()
    await first


async def test_a_waiter_takes_over_a_key_whose_holder_died(make_stores: StoresFactory) -> None:
    """The holder claimed through the store and vanished: no heartbeat, no release."""
    stores = make_stores(lock_ttl=SHORT_LEASE)
    # No field in the fingerprint: every key's is the same, learnt from a probe.
    charge, _, gate = gated(
        stores, in_progress="wait", wait_timeout=SHORT_LEASE * 4, fields=[], scope="charge"
    )
    gate.set()
    store: Store = await stores(None)
    await charge("probe")
    probe = await store.get("charge:probe")
    assert probe is not None
    dead = await store.claim("charge:o-5", probe.fingerprint)
    assert dead.outcome is Outcome.CLAIMED
    answer = await charge("o-5")
    assert answer == f"charged o-5 under {dead.fence + 1}"


async def test_a_key_reused_with_other_arguments_is_a_mismatch(store_for: StoreFor) -> None:
    runs: list[tuple[str, int, str]] = []

    @idempotent(store_for, key="order_id", fields=["order_id", "amount"])
    async def charge(order_id: str, amount: int, note: str = "") -> int:
        runs.append((order_id, amount, note))
        return amount

    assert await charge("o-6", 5) == 5
    with pytest.raises(PayloadMismatch):
        await charge("o-6", 6)
    assert await charge("o-6", 5, note="not in the fingerprint") == 5
    assert runs == [("o-6", 5, "")]


async def test_the_response_hook_answers_duplicates(store_for: StoreFor) -> None:
    told: list[tuple[object, Duplicate]] = []

    def replayed(result: object, info: Duplicate) -> object:
        told.append((result, info))
        return {"replayed": True, **result}  # type: ignore[dict-item]

    @idempotent(store_for, key="order_id", on_duplicate=replayed, scope="payments")
    async def charge(order_id: str) -> dict[str, object]:
        return {"fence": current_call().fence}

    first = await charge("o-7")
    assert not told
    again = await charge("o-7")
    assert again == {"replayed": True, **first}
    ((result, info),) = told
    assert result == first
    assert (info.key, info.scope, info.fence, info.cached) == (
        "o-7",
        "payments",
        first["fence"],
        False,
    )
    assert info.expires_at is not None
