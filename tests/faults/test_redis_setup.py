"""What ``semel migrate`` and start-up say of a Redis set up to lose semel's keys."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.faults.test_redis_errors import StartRedis, start_redis

__all__ = ["start_redis"]  # the fixture, shared with the error tests

pytestmark = pytest.mark.timeout(60)


def migrate(url: str) -> subprocess.CompletedProcess[str]:
    env = {"SEMEL_STORE": "redis", "SEMEL_REDIS_URL": url, "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-m", "semel.consumer.commands.app", "migrate"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.mark.parametrize("policy", ["volatile-lru", "allkeys-lfu"])
async def test_an_evicting_memory_policy_is_named_with_what_it_costs(
    start_redis: StartRedis, policy: str
) -> None:
    server = await start_redis("--maxmemory-policy", policy)
    store = await server.store()
    (warning,) = [w for w in await store.warnings() if "maxmemory-policy" in w]
    assert policy in warning
    assert "runs its handler again" in warning
    done = migrate(server.url())
    assert done.returncode == 0, done.stderr
    assert f"maxmemory-policy {policy}" in done.stderr


async def test_noeviction_draws_no_eviction_warning(start_redis: StartRedis) -> None:
    server = await start_redis("--maxmemory-policy", "noeviction")
    store = await server.store()
    assert [w for w in await store.warnings() if "maxmemory-policy" in w] == []
    done = migrate(server.url())
    assert done.returncode == 0, done.stderr
    assert "maxmemory-policy" not in done.stderr
