"""The container and the store commands: only the selected backend is built."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from dependency_injector import providers

from semel.consumer.container import Container, shutdown
from semel.settings import Settings
from semel.stores.base import Outcome
from tests.conftest import BACKENDS, SettingsFactory, open_store, settings_env

pytestmark = pytest.mark.timeout(90)

IMPORTS_PROBE = """
import asyncio, sys
from semel.consumer.container import Container, shutdown
async def main():
    c = Container()
    store = await c.store()
    await store.ping()
    await shutdown(c)
asyncio.run(main())
print(",".join(m for m in ("psycopg", "psycopg_pool", "redis", "boto3", "botocore")
               if m in sys.modules))
"""


@pytest.mark.parametrize("backend", ["sqlite", "redis", "postgres"])
def test_only_the_selected_backend_is_imported(make_settings: SettingsFactory) -> None:
    settings = make_settings()
    proc = subprocess.run(
        [sys.executable, "-c", IMPORTS_PROBE],
        env=settings_env(settings),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    imported = set(filter(None, proc.stdout.strip().split(",")))
    allowed = {"sqlite": set(), "redis": {"redis"}, "postgres": {"psycopg", "psycopg_pool"}}
    assert imported == allowed[settings.store.value]


async def test_store_can_be_overridden() -> None:
    container = Container()
    sentinel = object()
    with container.store.override(providers.Object(sentinel)):
        assert container.store() is sentinel
    await shutdown(container)


def _semel(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "semel.consumer.commands.app", *args],
        env=settings_env(settings),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("backend", BACKENDS)
async def test_migrate_twice_then_inspect(make_settings: SettingsFactory) -> None:
    settings = make_settings(postgres_table="semel_cli_keys", dynamodb_table="semel_cli_keys")
    for _ in range(2):
        proc = _semel(settings, "migrate")
        assert proc.returncode == 0, proc.stderr
    store = await open_store(settings)
    try:
        claim = await store.claim("order-1", "a" * 64)
        assert claim.outcome is Outcome.CLAIMED
        assert await store.complete("order-1", claim.fence, {"charged": 1})
    finally:
        await store.close()

    proc = _semel(settings, "inspect", "order-1")
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)
    assert record["status"] == "completed"
    assert record["result"] == {"charged": 1}
    assert record["key"] == "order-1"

    missing = _semel(settings, "inspect", "no-such-key")
    assert missing.returncode == 1
    assert "no record" in missing.stderr


@pytest.mark.parametrize("backend", ["dynamodb-dynalite"])
def test_migrate_warns_without_ttl_api(make_settings: SettingsFactory) -> None:
    proc = _semel(make_settings(dynamodb_table="semel_cli_ttl"), "migrate")
    assert proc.returncode == 0, proc.stderr
    assert "warning" in proc.stderr
    assert "TTL" in proc.stderr
