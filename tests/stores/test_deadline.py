"""Every store call within its deadline, on real servers behind a stalled link."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from semel.settings import Settings
from semel.stores.base import Outcome
from semel.stores.errors import StoreUnavailable
from semel.stores.wrappers.deadline import DeadlineStore
from tests.conftest import SettingsFactory, open_store
from tests.consumer.harness import eventually
from tests.proxy import TcpProxy
from tests.servers import free_port
from tests.stores.leftovers import store_tasks

pytestmark = pytest.mark.timeout(60)
FP = "f" * 64
LEASE = 6.0  # a deadline of 2 s: long enough for a loaded machine, short for the test


@pytest.fixture(params=["postgres", "redis"])
async def through_proxy(
    request: pytest.FixtureRequest, make_settings: SettingsFactory
) -> AsyncIterator[tuple[TcpProxy, Settings]]:
    if request.param == "postgres":
        proxy = await TcpProxy(5432, free_port()).start()
        dsn = f"postgresql://root@127.0.0.1:{proxy.port}/test"
        settings = make_settings(store="postgres", postgres_dsn=dsn, lock_ttl=LEASE)
    else:
        proxy = await TcpProxy(6379, free_port()).start()
        url = f"redis://127.0.0.1:{proxy.port}/0"
        settings = make_settings(store="redis", redis_url=url, lock_ttl=LEASE)
    try:
        yield proxy, settings
    finally:
        await proxy.close()


async def test_a_call_on_a_stalled_link_gives_up_at_its_deadline_and_a_late_claim_is_released(
    through_proxy: tuple[TcpProxy, Settings], make_settings: SettingsFactory
) -> None:
    proxy, settings = through_proxy
    store = DeadlineStore(await open_store(settings))
    direct = await open_store(settings.model_copy(update=_direct(settings)))
    try:
        await store.claim("warm", FP)  # connections open before the stall
        proxy.stall()
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="no answer within 2s"):
            await store.claim("late", FP)
        assert time.monotonic() - started < store.deadline + 1.0
        proxy.resume()

        # The claim reaches the server after all; semel had given up on it, so
        # it is released as soon as its answer comes back, not left to expire.
        async def landed() -> bool:
            return await direct.get("late") is not None

        await eventually(landed, LEASE, "the late claim landed")

        async def claimable() -> bool:
            claim = await direct.claim("late", FP)
            return claim.outcome is Outcome.CLAIMED

        await eventually(claimable, LEASE, "the late claim released")
        assert time.monotonic() - started < LEASE  # free before its lease ran out
    finally:
        await store.close()
        await direct.close()


async def test_a_late_claim_landing_while_the_store_closes_is_released_before_the_close_ends(
    through_proxy: tuple[TcpProxy, Settings],
) -> None:
    # A call given up at its deadline runs on; its claim may land while the store
    # closes, and its release then starts after the close began. A close that does
    # not wait for it leaves the key held by nobody until its lease runs out, and
    # whatever of the store still runs after its close may open connections again.
    proxy, settings = through_proxy
    before = asyncio.all_tasks()  # the proxy's and the test's own
    store = DeadlineStore(await open_store(settings))
    direct = await open_store(settings.model_copy(update=_direct(settings)))
    try:
        await store.claim("warm", FP)
        proxy.delay = 0.3  # a slow link: the late claim's release is out when the close begins
        proxy.stall()
        with pytest.raises(StoreUnavailable):
            await store.claim("late", FP)
        closing = asyncio.create_task(store.close())
        proxy.resume()  # the late claim lands now, and its release starts during the close
        await closing
        assert store_tasks(before) == []
        claim = await direct.claim("late", FP)
        assert claim.outcome is Outcome.CLAIMED, "the late claim was left to its lease"

        async def all_closed() -> bool:
            return proxy.connections() == 0

        await eventually(all_closed, 5.0, "every connection of the closed store closed")
    finally:
        await direct.close()


def _direct(settings: Settings) -> dict[str, str]:
    if settings.store.value == "postgres":
        return {"postgres_dsn": "postgresql://root@127.0.0.1:5432/test"}
    return {"redis_url": "redis://127.0.0.1:6379/0"}
