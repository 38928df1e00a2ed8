"""Retention in transactional mode: ``semel purge`` and the bounded background purge."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from psycopg import AsyncConnection, sql

from semel.consumer.runtime.purge import purge
from semel.settings import Settings
from semel.stores.postgres.transactional import TransactionalStore
from tests.conftest import SettingsFactory, StoreFactory
from tests.tools.conftest import semel
from tests.transactional.test_store import FP, order

pytestmark = pytest.mark.timeout(60)


async def past_retention(
    store: TransactionalStore, db: AsyncConnection[Any], outbox_table: str, keys: int
) -> None:
    """``keys`` completed keys, each with one message sent, all past retention."""
    for i in range(keys):
        claim = await store.claim(f"k{i}", FP)
        await store.run_unit(f"k{i}", claim.fence, order("t_unused", f"k{i}", claim.fence, 0))
        await store.complete(f"k{i}", claim.fence, None)
    prefix = store.config.namespaced("")
    expire = sql.SQL("UPDATE {} SET expires_at = now() - interval '1 s' WHERE key LIKE %s")
    await db.execute(expire.format(sql.Identifier(store._table)), (prefix + "%",))
    for i in range(keys):
        stage = sql.SQL("INSERT INTO {} (message_id, key, fence, exchange, routing_key, body,"
                        " headers, sent_at) VALUES (gen_random_uuid(), %s, 1, '', 'q', '',"
                        " '{{}}', now() - interval '1 hour')")  # fmt: skip
        await db.execute(stage.format(sql.Identifier(outbox_table)), (f"k{i}",))


@pytest.fixture
async def no_business_table(db: AsyncConnection[Any]) -> None:
    await db.execute("CREATE TABLE IF NOT EXISTS t_unused (key text, fence bigint)")


async def test_semel_purge_deletes_expired_keys_and_old_sent_messages(
    make_store: StoreFactory,
    make_settings_tx: SettingsFactory,
    db: AsyncConnection[Any],
    outbox_table: str,
    no_business_table: None,
) -> None:
    settings = make_settings_tx(retention=60.0)
    store = await make_store(retention=60.0)
    assert isinstance(store, TransactionalStore)
    await past_retention(store, db, outbox_table, keys=3)
    outcome = await semel(settings, "purge", "--json")
    assert outcome.code == 0, outcome.stderr
    report = orjson.loads(outcome.stdout)
    assert report["messages"] == 3
    assert report["keys"] >= 3  # other tests' expired keys share the table
    assert report["unsent"] == 0
    again = await semel(settings, "purge")
    assert again.stdout.endswith("and 0 sent outbox messages; 0 wait for the relay\n")


async def test_the_background_purge_is_bounded(
    make_store: StoreFactory, db: AsyncConnection[Any], outbox_table: str, no_business_table: None
) -> None:
    store = await make_store(retention=60.0)
    assert isinstance(store, TransactionalStore)
    await past_retention(store, db, outbox_table, keys=5)
    first = await purge(store, batch=2, most=1)
    assert (first.keys, first.messages) == (2, 2)
    rest = await purge(store, batch=2)
    assert rest.messages == 3


async def test_stores_that_expire_keys_themselves_have_nothing_to_purge(
    redis_server: str,
) -> None:
    settings = Settings(store="redis", redis_url=redis_server)
    outcome = await semel(settings, "purge")
    assert outcome.code == 0, outcome.stderr
    assert outcome.stdout == "nothing to purge: the redis store expires keys by itself\n"
