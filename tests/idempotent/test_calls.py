"""An idempotent call on real stores: duplicates, failures, fences, lost leases."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from decimal import Decimal

import pytest
from pydantic import BaseModel

from semel.consumer.errors import HandlerTimeout, LeaseLost, PermanentError
from semel.consumer.idempotent import (
    KeyFailed,
    ResultNotStored,
    current_call,
    idempotent,
)
from semel.stores.base import Outcome, Status
from semel.stores.errors import StoreUnavailable
from tests.conftest import SettingsFactory, open_store
from tests.consumer.harness import eventually
from tests.idempotent.conftest import (
    IDEMPOTENT_BACKENDS,
    SHORT_LEASE,
    Counted,
    StoresFactory,
    Unrenewed,
)
from tests.idempotent.conftest import Stores as StoreFor

pytestmark = pytest.mark.timeout(60)
on_every_store = pytest.mark.parametrize("backend", IDEMPOTENT_BACKENDS, indirect=True)


class Receipt(BaseModel):
    payment_id: str
    amount: Decimal


@dataclass
class Shipment:
    order_id: str
    parcels: list[str]


@on_every_store
async def test_a_duplicate_gets_the_stored_result_without_running(store_for: StoreFor) -> None:
    runs: list[str] = []

    @idempotent(store_for, key="order_id")
    async def charge(order_id: str, amount: Decimal) -> Receipt:
        runs.append(order_id)
        return Receipt(payment_id=f"p-{order_id}", amount=amount)

    first = await charge("o-1", Decimal("12.30"))
    again = await charge(order_id="o-1", amount=Decimal("12.30"))  # by name: the same payload
    assert runs == ["o-1"]
    assert again == first == Receipt(payment_id="p-o-1", amount=Decimal("12.30"))
    assert isinstance(again, Receipt)  # rebuilt from its JSON by the return annotation


async def test_a_dataclass_result_comes_back_as_itself(store_for: StoreFor) -> None:
    @idempotent(store_for, key="order.id")
    async def ship(order: dict[str, str]) -> Shipment:
        return Shipment(order["id"], ["a", "b"])

    first = await ship({"id": "o-2"})
    assert await ship({"id": "o-2"}) == first


@on_every_store
async def test_a_failure_releases_the_key_and_the_next_call_runs_it(store_for: StoreFor) -> None:
    seen: list[tuple[int, int]] = []

    @idempotent(store_for, key="order_id")
    async def charge(order_id: str, *, fence: int = 0) -> int:
        call = current_call()
        seen.append((fence, call.attempt))
        if len(seen) == 1:
            raise ConnectionError("psp down")
        return fence

    with pytest.raises(ConnectionError):
        await charge("o-3")
    fence = await charge("o-3")
    (first, one), (second, two) = seen
    assert (second, one, two) == (first + 1, 1, 2)  # a new claim, after a fenced release
    assert fence == second
    assert await charge("o-3") == second


@on_every_store
async def test_a_permanent_error_fails_the_key_for_good(store_for: StoreFor) -> None:
    runs = 0

    @idempotent(store_for, key="order_id")
    async def charge(order_id: str) -> None:
        nonlocal runs
        runs += 1
        raise PermanentError("card declined")

    with pytest.raises(PermanentError):
        await charge("o-4")
    with pytest.raises(KeyFailed) as failed:
        await charge("o-4")
    assert runs == 1
    assert failed.value.error == "PermanentError: card declined"


async def test_claims_without_completion_end_as_poison(make_stores: StoresFactory) -> None:
    runs = 0

    @idempotent(make_stores(max_claims=2), key="order_id")
    async def charge(order_id: str) -> None:
        nonlocal runs
        runs += 1
        raise ConnectionError("psp down")

    for _ in range(2):
        with pytest.raises(ConnectionError):
            await charge("o-5")
    with pytest.raises(KeyFailed) as poison:
        await charge("o-5")
    assert runs == 2
    assert poison.value.error is not None
    assert poison.value.error.startswith("poison")


@on_every_store
async def test_a_lost_lease_cancels_the_function_and_raises_lease_lost(
    make_stores: StoresFactory,
) -> None:
    """The store's heartbeats are cut until the lease has lapsed and the key has been
    taken over through the store; the next heartbeat that gets through is refused."""
    stores = make_stores(wrap=Unrenewed, lock_ttl=SHORT_LEASE)
    started, cancelled = asyncio.Event(), asyncio.Event()

    @idempotent(stores, key="order_id", scope="charge")
    async def charge(order_id: str, *, fence: int = 0) -> int:
        started.set()
        try:
            await asyncio.Event().wait()  # runs until cancelled
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return fence

    call = asyncio.create_task(charge("o-6"))
    await started.wait()
    store = await stores(None)
    assert isinstance(store, Unrenewed)
    record = await store.get("charge:o-6")
    assert record is not None
    taken: list[int] = []

    async def taken_over() -> bool:
        claim = await store.claim("charge:o-6", record.fingerprint)
        if claim.outcome is Outcome.CLAIMED:
            taken.append(claim.fence)
        return bool(taken)

    await eventually(taken_over, SHORT_LEASE * 4, "the lapsed key taken over")
    store.cut = False
    with pytest.raises(LeaseLost):
        await call
    assert cancelled.is_set()
    assert taken == [record.fence + 1]
    after = await store.get("charge:o-6")
    assert after is not None
    assert (after.status, after.fence) == (Status.IN_PROGRESS, taken[0])  # left to its owner


async def test_a_result_after_an_unnoticed_takeover_is_refused(
    make_stores: StoresFactory,
) -> None:
    """Heartbeats cut for the whole run: the function never hears of the takeover,
    and returns; its completion is fenced out and the new owner keeps the key."""
    stores = make_stores(wrap=Unrenewed, lock_ttl=SHORT_LEASE)
    started, finish = asyncio.Event(), asyncio.Event()

    @idempotent(stores, key="order_id", scope="charge")
    async def charge(order_id: str) -> str:
        started.set()
        await finish.wait()
        return "stale"

    call = asyncio.create_task(charge("o-12"))
    await started.wait()
    store = await stores(None)
    record = await store.get("charge:o-12")
    assert record is not None

    async def taken_over() -> bool:
        claim = await store.claim("charge:o-12", record.fingerprint)
        return claim.outcome is Outcome.CLAIMED

    await eventually(taken_over, SHORT_LEASE * 4, "the lapsed key taken over")
    finish.set()
    with pytest.raises(LeaseLost):
        await call
    after = await store.get("charge:o-12")
    assert after is not None
    assert (after.status, after.fence, after.result) == (
        Status.IN_PROGRESS,
        record.fence + 1,
        None,
    )


async def test_the_fence_and_the_call_are_passed_in(store_for: StoreFor) -> None:
    @idempotent(store_for, key=lambda order, **_: order["id"], scope="payments")
    async def charge(order: dict[str, str], fence: int = 0) -> dict[str, object]:
        call = current_call()
        return {"fence": fence, "key": call.key, "scope": call.scope, "same": call.fence == fence}

    answer = await charge({"id": "o-7"})
    store = await store_for(None)
    record = await store.get("payments:o-7")
    assert record is not None
    assert answer == {"fence": record.fence, "key": "o-7", "scope": "payments", "same": True}
    with pytest.raises(LookupError):
        current_call()


async def test_a_result_the_store_cannot_keep_raises_and_releases(store_for: StoreFor) -> None:
    runs = 0

    @idempotent(store_for, key="order_id")
    async def charge(order_id: str) -> object:
        nonlocal runs
        runs += 1
        return object() if runs == 1 else "ok"

    with pytest.raises(ResultNotStored):
        await charge("o-8")
    assert await charge("o-8") == "ok"  # released: run again
    assert runs == 2


async def test_past_its_time_limit_the_function_is_cancelled_and_the_key_released(
    store_for: StoreFor,
) -> None:
    runs = 0

    @idempotent(store_for, key="order_id", time_limit=0.2)
    async def charge(order_id: str) -> int:
        nonlocal runs
        runs += 1
        if runs == 1:
            await asyncio.Event().wait()
        return runs

    with pytest.raises(HandlerTimeout):
        await charge("o-9")
    assert await charge("o-9") == 2


async def test_a_caller_cancelled_mid_call_frees_the_key(store_for: StoreFor) -> None:
    started = asyncio.Event()
    runs = 0

    @idempotent(store_for, key="order_id")
    async def charge(order_id: str) -> int:
        nonlocal runs
        runs += 1
        if runs == 1:
            started.set()
            await asyncio.Event().wait()
        return runs

    first = asyncio.create_task(charge("o-10"))
    await started.wait()
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert await charge("o-10") == 2  # at once: released, not left to its lease


async def test_an_unreachable_store_raises_and_never_runs_the_function(
    make_settings: SettingsFactory,
) -> None:
    # Nothing listens on port 1: connections open lazily and fail on the claim.
    store = await open_store(make_settings(store="redis", redis_url="redis://127.0.0.1:1/0"))
    runs = 0

    async def store_for(_: float | None) -> object:
        return store

    @idempotent(store_for, key="order_id")  # type: ignore[arg-type]
    async def charge(order_id: str) -> None:
        nonlocal runs
        runs += 1

    try:
        with pytest.raises(StoreUnavailable):
            await charge("o-11")
    finally:
        await store.close()
    assert runs == 0


async def test_the_local_cache_answers_without_the_store(make_stores: StoresFactory) -> None:
    counted = Counted()

    @idempotent(make_stores(wrap=counted), key="order_id", local_cache=2)
    async def charge(order_id: str) -> str:
        return order_id.upper()

    assert await charge("a") == "A"
    (store,) = counted.stores
    calls = store.calls.copy()
    assert await charge("a") == "A"
    assert store.calls == calls  # a hit never touches the store
    await charge("b")
    await charge("c")  # "a" falls out: least recently used
    calls = store.calls.copy()
    assert await charge("a") == "A"
    assert store.calls - calls == {"claim": 1}  # asked again, answered duplicate


def test_a_plain_function_is_refused() -> None:
    async def store_for(_: float | None) -> object:
        raise AssertionError

    with pytest.raises(TypeError, match="async def"):

        @idempotent(store_for, key="order_id")  # type: ignore[arg-type]
        def charge(order_id: str) -> None:
            pass


def test_a_key_that_names_no_argument_is_refused() -> None:
    async def store_for(_: float | None) -> object:
        raise AssertionError

    with pytest.raises(TypeError, match="order_id"):

        @idempotent(store_for, key="order_id.id")  # type: ignore[arg-type]
        async def charge(order: str) -> None:
            pass
