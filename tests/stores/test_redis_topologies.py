"""Under Sentinel and in a Cluster as on one server: a forgotten key's fence still grows, and
``semel migrate`` / ``semel inspect`` work through the URL."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from redis.crc import key_slot

from semel.settings import Settings
from semel.stores.base import Outcome, Store
from semel.stores.redis.buckets import stored_key
from tests.conftest import REDIS_TOPOLOGIES, SettingsFactory, StoreFactory, open_store, settings_env
from tests.redis_process import Server
from tests.redis_servers import Cluster, SentinelSet

pytestmark = [pytest.mark.parametrize("backend", REDIS_TOPOLOGIES), pytest.mark.timeout(90)]

FP = "f" * 64
OTHER_FP = "0" * 64


def _holder(topology: Cluster | SentinelSet, key: bytes) -> Server:
    """The primary holding ``key``: the Sentinel's primary, or the node serving its slot."""
    if isinstance(topology, SentinelSet):
        return topology.primary()
    owner = next(n for n in topology.primaries() if key_slot(key) in n.slots)
    return topology.server(owner.port)


async def test_a_forgotten_key_is_claimed_with_a_higher_fence(
    make_store: StoreFactory, request: pytest.FixtureRequest, backend: str
) -> None:
    topology = request.getfixturevalue(backend.replace("-", "_"))
    store = await make_store()
    first = await store.claim("k", FP)
    assert await store.release("k", first.fence)
    second = await store.claim("k", FP)
    assert second.fence == first.fence + 1
    key = store.config.namespaced("k").encode()
    if isinstance(topology, Cluster):
        key = stored_key(store.config.namespaced("").encode(), "k")
    with _holder(topology, key).client() as client:
        assert client.delete(key) == 1  # as an eviction, or a failover losing it, does

    again = await store.claim("k", OTHER_FP)
    assert again.outcome is Outcome.CLAIMED
    assert again.fence > second.fence
    for stale in (first.fence, second.fence):
        assert not await store.heartbeat("k", stale)
        assert not await store.complete("k", stale, {"stale": stale})


def _semel(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "semel.consumer.commands.app", *args],
        env=settings_env(settings),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def test_migrate_twice_then_inspect(make_settings: SettingsFactory) -> None:
    settings = make_settings()
    for _ in range(2):
        done = _semel(settings, "migrate")
        assert done.returncode == 0, done.stderr
        assert "store ready" in done.stdout
    store: Store = await open_store(settings)
    try:
        claim = await store.claim("order-1", FP)
        assert await store.complete("order-1", claim.fence, {"charged": 1})
    finally:
        await store.close()
    shown = _semel(settings, "inspect", "order-1")
    assert shown.returncode == 0, shown.stderr
    record = json.loads(shown.stdout)
    assert (record["status"], record["result"]) == ("completed", {"charged": 1})
