"""A key's fence only grows, even after its store forgot the record.

Each store is made to forget a key the way it does in production: a Redis
hash evicted or expired, a SQL row purged or deleted, a DynamoDB item swept
by the TTL sweeper (or past retention, not swept yet). The next claim must
be granted a fence above every fence granted before, and a worker still
holding an older fence must be refused every write.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import Awaitable, Callable

import boto3
import psycopg
import pytest
from psycopg import sql
from redis.asyncio import Redis

from semel.settings import Settings
from semel.stores.base import Outcome, Store
from tests.conftest import BACKENDS, SettingsFactory, StoreFactory

pytestmark = pytest.mark.timeout(60)

FP = "f" * 64
OTHER_FP = "0" * 64
SHORT = {"retention": 0.3, "lock_ttl": 0.3}  # forgotten within a test's patience

Forget = Callable[[Settings, Store, str], Awaitable[None]]


def delete_row(settings: Settings, namespaced: str) -> None:
    with contextlib.closing(sqlite3.connect(settings.sqlite_path)) as conn, conn:
        table = '"' + settings.postgres_table + '"'
        assert conn.execute(f"DELETE FROM {table} WHERE key = ?", (namespaced,)).rowcount == 1


async def delete_pg_row(settings: Settings, namespaced: str) -> None:
    table = sql.Identifier(settings.postgres_table)
    statement = sql.SQL("DELETE FROM {} WHERE key = %s").format(table)
    async with await psycopg.AsyncConnection.connect(settings.postgres_dsn, autocommit=True) as c:
        assert (await c.execute(statement, (namespaced,))).rowcount == 1


async def delete_hash(settings: Settings, namespaced: str) -> None:
    client = Redis.from_url(settings.redis_url)
    try:
        assert await client.delete(namespaced) == 1  # as an eviction does
    finally:
        await client.aclose()


def delete_item(settings: Settings, namespaced: str) -> None:
    client = boto3.session.Session().client(
        "dynamodb",
        endpoint_url=settings.dynamodb_endpoint_url,
        region_name=settings.dynamodb_region,
    )
    try:  # as the TTL sweeper does
        client.delete_item(TableName=settings.dynamodb_table, Key={"pk": {"S": namespaced}})
    finally:
        client.close()


async def delete(settings: Settings, store: Store, key: str) -> None:
    """Remove the key's record behind the store's back: an eviction, a sweep, a DELETE."""
    namespaced = store.config.namespaced(key)
    if settings.store == "sqlite":
        delete_row(settings, namespaced)
    elif settings.store == "postgres":
        await delete_pg_row(settings, namespaced)
    elif settings.store == "redis":
        await delete_hash(settings, namespaced)
    else:
        await asyncio.to_thread(delete_item, settings, namespaced)


async def expire(settings: Settings, store: Store, key: str) -> None:
    """Let retention pass; then the SQL stores purge the row as `semel purge` does."""
    end = time.monotonic() + 10
    while await store.get(key) is not None:
        assert time.monotonic() < end, "retention never passed"
        await asyncio.sleep(0.1)
    if settings.store in ("sqlite", "postgres"):
        assert await store.purge() >= 1  # type: ignore[attr-defined]


# Every store of the contract, and PostgreSQL's transactional mode on the same table.
STORES = [pytest.param(b, False, id=b) for b in BACKENDS]
STORES.append(pytest.param("postgres", True, id="postgres-tx"))


@pytest.mark.parametrize(("backend", "transactional"), STORES)
@pytest.mark.parametrize("forget", [delete, expire], ids=["deleted", "expired"])
async def test_a_forgotten_key_is_claimed_with_a_higher_fence(
    make_settings: SettingsFactory, make_store: StoreFactory, forget: Forget, transactional: bool
) -> None:
    overrides: dict[str, object] = {"transactional": transactional}
    # Only the store that forgets has a retention short enough to wait out, and
    # only its last write (the second claim) sets it on the record: a stall
    # before that write cannot make the record vanish early. The other store
    # keeps its record for the rest of the test.
    forgetting = await make_store(**overrides, **(SHORT if forget is expire else {}))
    store = await make_store(**overrides, key_prefix=forgetting.config.key_prefix)
    settings = make_settings(**overrides)

    first = await store.claim("k", FP)
    assert first.outcome is Outcome.CLAIMED
    assert await store.release("k", first.fence)
    second = await forgetting.claim("k", FP)  # taken over: exactly one more
    assert second.outcome is Outcome.CLAIMED
    assert second.fence == first.fence + 1

    await forget(settings, forgetting, "k")
    assert await store.get("k") is None

    again = await store.claim("k", OTHER_FP)  # forgotten: a new body is no mismatch
    assert again.outcome is Outcome.CLAIMED
    assert again.fence > second.fence, (first.fence, second.fence, again.fence)

    for stale in (first.fence, second.fence):
        assert not await store.heartbeat("k", stale)
        assert not await store.release("k", stale)
        assert not await store.complete("k", stale, {"stale": stale})
        assert not await store.fail("k", stale, "stale")
    assert await store.complete("k", again.fence, {"fresh": True})
    done = await store.get("k")
    assert done is not None
    assert (done.fence, done.result) == (again.fence, {"fresh": True})
