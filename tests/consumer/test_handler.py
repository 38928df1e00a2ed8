"""Loading and running handlers under a lease, against the SQLite store (no broker)."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from semel.consumer.delivery.handler import Context, Handler, load_handler
from semel.consumer.delivery.lease import Lease, Renewal, run_leased
from semel.consumer.errors import HandlerLoadError, HandlerTimeout, LeaseLost
from semel.stores.base import Store
from semel.stores.errors import StoreUnavailable
from tests.conftest import StoreFactory
from tests.consumer.faults import FaultyStore
from tests.consumer.handlers import blocking, scripted
from tests.consumer.harness import eventually

pytestmark = pytest.mark.timeout(30)

# Each renewal has two thirds of a lease to come back: 0.8 s, past the stalls a
# loaded test run has shown (0.6 s lapsed the store contract's heartbeat test).
TTL = 1.2


def context(fence: int, **body: Any) -> Context:
    return Context(
        key="k", body=body, headers={}, routing_key="r", message_id=None, attempt=1, fence=fence
    )


async def claimed(store: Store) -> Lease:
    started = time.monotonic()
    claim = await store.claim("k", "f" * 64)
    return Lease("k", claim.fence, TTL, renewed_at=started)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nomodule_xyz:handler", "cannot import 'nomodule_xyz'"),
        ("tests.consumer.handlers:absent", "has no attribute 'absent'"),
        ("tests.consumer.handlers:not_callable", "is not callable"),
        ("no-colon", "is not 'package.module:callable'"),
    ],
)
def test_bad_handler_specs_are_one_line_errors(spec: str, message: str) -> None:
    with pytest.raises(HandlerLoadError, match=message) as info:
        load_handler(spec)
    assert "\n" not in str(info.value)
    assert str(info.value).startswith("SEMEL_HANDLER: ")


def test_default_handler_loads() -> None:
    from semel.consumer.examples import order_paid

    assert load_handler("semel.consumer.examples:order_paid") is order_paid


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A project folder holding a package of its own; the package's name."""
    package = "svc_" + uuid.uuid4().hex[:8]
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / package / "handlers.py").write_text("def charge(ctx):\n    return 'charged'\n")
    monkeypatch.setattr(sys, "path", list(sys.path))  # load_handler adds the folder
    yield package
    for name in [m for m in sys.modules if m.partition(".")[0] == package]:
        del sys.modules[name]


def test_a_handler_is_imported_from_the_folder_it_is_started_in(
    project: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    handler = load_handler(f"{project}.handlers:charge")
    assert handler.__module__ == f"{project}.handlers"
    assert sys.path[0] == str(tmp_path)


def test_a_handler_is_imported_from_the_app_dir(project: str, tmp_path: Path) -> None:
    with pytest.raises(HandlerLoadError, match=f"cannot import '{project}.handlers'"):
        load_handler(f"{project}.handlers:charge")  # not in the folder the tests run in
    handler = load_handler(f"{project}.handlers:charge", app_dir=str(tmp_path))
    assert handler.__module__ == f"{project}.handlers"


def test_an_app_dir_that_is_not_a_folder_is_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(HandlerLoadError, match=r"^SEMEL_APP_DIR: '.*' is not a folder$"):
        load_handler("semel.consumer.examples:order_paid", app_dir=str(tmp_path / "absent"))


async def leased(handler: Handler, ctx: Context, store: Store, lease: Lease, limit: float) -> Any:
    """The handler run under ``lease`` the way the pipeline runs it."""
    renewal = Renewal(store, lease)
    try:
        return await run_leased(handler, ctx, renewal, limit)
    finally:
        await renewal.stop()


async def test_heartbeats_keep_a_long_handler_alone(make_store: StoreFactory) -> None:
    store = FaultyStore(await make_store(lock_ttl=TTL))
    lease = await claimed(store)
    result = await leased(scripted, context(lease.fence, sleep=TTL * 3), store, lease, 10)
    assert result == {"key": "k", "fence": lease.fence}
    assert store.heartbeats >= 6
    assert (await store.claim("k", "f" * 64)).outcome.value == "in_progress"


async def test_taken_over_claim_cancels_the_handler(make_store: StoreFactory) -> None:
    inner = await make_store(lock_ttl=TTL)
    store = FaultyStore(inner)
    lease = await claimed(store)
    store.muted_heartbeats.add(("k", lease.fence))  # the lease runs out under the handler
    finished = asyncio.Event()

    async def slow(ctx: Context) -> None:
        await asyncio.sleep(TTL * 10)
        finished.set()

    async def take_over() -> None:
        async def claimed_by_thief() -> bool:
            return (await inner.claim("k", "f" * 64)).outcome.value == "claimed"

        await eventually(claimed_by_thief, TTL * 3, "lease taken over")
        store.muted_heartbeats.clear()  # the next heartbeat finds the new owner

    started = time.monotonic()
    thief = asyncio.create_task(take_over())
    with pytest.raises(LeaseLost):
        await leased(slow, context(lease.fence), store, lease, 10)
    await thief
    assert time.monotonic() - started < TTL * 4
    assert not finished.is_set()


async def test_unreachable_store_gives_up_when_the_lease_would_end(
    make_store: StoreFactory,
) -> None:
    store = FaultyStore(await make_store(lock_ttl=TTL))
    lease = await claimed(store)
    store.down = True
    started = time.monotonic()
    with pytest.raises(StoreUnavailable):
        await leased(scripted, context(lease.fence, sleep=10), store, lease, 10)
    assert TTL * 0.9 <= time.monotonic() - started < TTL * 2


async def test_timeout_cancels_and_counts_as_failure(make_store: StoreFactory) -> None:
    store = await make_store(lock_ttl=TTL)
    lease = await claimed(store)
    with pytest.raises(HandlerTimeout, match=r"longer than 0\.3s"):
        await leased(scripted, context(lease.fence, sleep=5), store, lease, 0.3)


async def test_plain_handlers_run_off_the_event_loop(make_store: StoreFactory) -> None:
    store = await make_store(lock_ttl=TTL)
    lease = await claimed(store)
    loop_thread = threading.get_ident()
    seen: list[int] = []

    def plain(ctx: Context) -> str:
        seen.append(threading.get_ident())
        time.sleep(0.2)  # would stall heartbeats if it ran on the loop
        return "done"

    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.02)
            ticks += 1

    tick = asyncio.create_task(ticker())
    assert await leased(plain, context(lease.fence), store, lease, 5) == "done"
    tick.cancel()
    assert seen == [seen[0]]
    assert seen[0] != loop_thread
    assert ticks >= 5
    assert await leased(blocking, context(lease.fence, sleep=0), store, lease, 5) == {"slept": 0}


async def test_handler_exceptions_pass_through(make_store: StoreFactory) -> None:
    store = await make_store(lock_ttl=TTL)
    lease = await claimed(store)
    with pytest.raises(RuntimeError, match="transient failure on attempt 1"):
        await leased(scripted, context(lease.fence, fail_until=1), store, lease, 5)

    def plain_failure(ctx: Context) -> None:
        raise ValueError("from a thread")

    with pytest.raises(ValueError, match="from a thread"):
        await leased(plain_failure, context(lease.fence), store, lease, 5)
