"""The key table stays bounded with no cron job: every consumer purges in the background."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from semel.consumer.runtime.purge import purge
from semel.settings import Settings
from semel.stores.base import Outcome, Store
from tests.conftest import POSTGRES_DSN, SettingsFactory, StoreFactory, open_store
from tests.consumer.conftest import ConsumerSettings, StartConsumer
from tests.consumer.harness import Broker, eventually
from tests.ops.conftest import scrape
from tests.servers import free_port

pytestmark = pytest.mark.timeout(60)

EXAMPLE = "semel.consumer.examples:order_paid"
FP = "f" * 64


@pytest.fixture
def private_table(backend: str) -> Iterator[str]:
    """A key table of the test's own, dropped from PostgreSQL after it."""
    table = f"semel_purge_{uuid.uuid4().hex[:8]}"
    yield table
    if backend == "postgres":
        with psycopg.connect(POSTGRES_DSN, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))


async def rows(settings: Settings, prefix: str) -> int:
    """Rows of ``prefix`` in the table, expired or not: what ``get`` cannot show."""
    query = f"SELECT count(*) FROM \"{settings.postgres_table}\" WHERE key LIKE '{prefix}:%'"
    if settings.store.value == "postgres":
        async with await psycopg.AsyncConnection.connect(settings.postgres_dsn) as conn:
            cur = await conn.execute(query)
            row = await cur.fetchone()
    else:
        with contextlib.closing(sqlite3.connect(settings.sqlite_path)) as db:
            row = db.execute(query).fetchone()
    assert row is not None
    return int(row[0])


async def completed(store: Store, keys: list[str]) -> None:
    for key in keys:
        claim = await store.claim(key, FP)
        assert claim.outcome is Outcome.CLAIMED
        assert await store.complete(key, claim.fence, {"done": key})


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
async def test_expired_keys_disappear_while_the_consumer_runs_and_live_ones_stay(
    private_table: str,  # first: dropped after everything that uses it has closed
    consumer_settings: ConsumerSettings,
    broker: Broker,
    start_consumer: StartConsumer,
) -> None:
    # A two-second retention: the background purge runs every two seconds.
    settings = consumer_settings(
        postgres_table=private_table, retention=2.0, metrics_port=free_port(), handler=EXAMPLE
    )
    keeper = settings.model_copy(
        update={"retention": 3600.0, "key_prefix": "live" + uuid.uuid4().hex[:6]}
    )
    live = await open_store(keeper)
    try:
        await live.migrate()
        await completed(live, ["a", "b", "c"])
        consumer = await start_consumer(settings)
        for n in range(5):
            await broker.publish(settings, {"order_id": f"O-{n}", "amount": n}, key=f"k{n}")

        async def purged() -> bool:
            return (
                await rows(settings, settings.key_prefix) == 0
                and (await scrape(settings.metrics_port)).get("semel_keys_purged_total") >= 5
            )

        await eventually(purged, 20, "the expired keys purged with no `semel purge`")
        assert await rows(keeper, keeper.key_prefix) == 3
        assert await consumer.finish() == 0
    finally:
        await live.close()


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
async def test_two_workers_purging_at_once_delete_each_expired_key_once(
    private_table: str, make_store: StoreFactory, make_settings: SettingsFactory
) -> None:
    # Processes started together may purge together: harmless, each key goes once.
    table = private_table
    short: dict[str, Any] = {"postgres_table": table, "retention": 0.3, "lock_ttl": 0.3}
    first = await make_store(**short)
    second = await make_store(**short, key_prefix=first.config.key_prefix)
    keeper = await make_store(postgres_table=table, key_prefix="live" + uuid.uuid4().hex[:6])
    keys = [f"k{n}" for n in range(300)]
    await completed(first, keys)
    await completed(keeper, ["a", "b"])
    settings: Settings = make_settings(**short, key_prefix=first.config.key_prefix)

    async def expired() -> bool:
        return all([await first.get(k) is None for k in keys[-5:]])

    await eventually(expired, 5, "the short-lived keys expired")
    one, other = await asyncio.gather(purge(first, batch=25), purge(second, batch=25))
    assert one.keys is not None
    assert other.keys is not None
    assert one.keys + other.keys == len(keys), (one, other)
    assert await rows(settings, first.config.key_prefix) == 0
    keeper_settings: Settings = make_settings(postgres_table=table)
    assert await rows(keeper_settings, keeper.config.key_prefix) == 2
