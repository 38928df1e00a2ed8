"""Fixtures of the transactional-mode tests: the PostgreSQL store in transactional
mode, on tables of its own per test, and a direct connection to look at them."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aio_pika
import psycopg
import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage
from psycopg import sql

from semel.stores.postgres.transactional import TransactionalStore
from tests.conftest import SettingsFactory, StoreFactory, open_store
from tests.consumer.conftest import FAST
from tests.consumer.harness import Broker


@pytest.fixture
def backend() -> str:
    return "postgres"


@pytest.fixture
def run_id() -> str:
    return uuid.uuid4().hex[:10]


@pytest.fixture
def outbox_table(run_id: str) -> str:
    return f"t_{run_id}_outbox"


@pytest.fixture
def business_table(run_id: str) -> str:
    return f"t_{run_id}_orders"


@pytest.fixture
def keys_table(run_id: str) -> str:
    # Not the shared semel_keys: other suites migrate that one concurrently,
    # and their DDL locks outlast this mode's 100 ms lock timeout.
    return f"t_{run_id}_keys"


@pytest.fixture
async def db(postgres_server: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A connection of the test's own, outside any store (autocommit)."""
    async with await psycopg.AsyncConnection.connect(postgres_server, autocommit=True) as conn:
        yield conn


@pytest.fixture
async def tables(
    db: psycopg.AsyncConnection[Any], outbox_table: str, business_table: str, keys_table: str
) -> AsyncIterator[None]:
    """A business table with no unique constraint: duplicates must show, not be hidden."""
    orders = sql.Identifier(business_table)
    await db.execute(
        sql.SQL(
            "CREATE TABLE {} (id bigserial PRIMARY KEY, key text NOT NULL, fence bigint NOT NULL,"
            " pid integer NOT NULL DEFAULT pg_backend_pid())"
        ).format(orders)
    )
    yield
    for table in (business_table, outbox_table, keys_table):
        await db.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))


@pytest.fixture
def make_settings_tx(
    make_settings: SettingsFactory, outbox_table: str, keys_table: str
) -> SettingsFactory:
    def factory(**overrides: Any) -> Any:
        mode = {"transactional": True, "outbox_table": outbox_table, "postgres_table": keys_table}
        return make_settings(**(mode | overrides))

    return factory


@pytest.fixture
async def make_store(
    make_settings_tx: SettingsFactory, tables: None
) -> AsyncIterator[StoreFactory]:
    """Migrated transactional stores (the store contract's fixture, in this mode)."""
    opened: list[TransactionalStore] = []

    async def factory(**overrides: Any) -> TransactionalStore:
        store = await open_store(make_settings_tx(**overrides))
        assert isinstance(store, TransactionalStore)
        opened.append(store)
        await store.migrate()
        return store

    yield factory
    for store in opened:
        await store.close()


@dataclass
class Downstream:
    """An exchange with one queue bound for every routing key, and a way to read it."""

    connection: AbstractConnection
    channel: AbstractChannel
    exchange: str
    queue: str

    async def drain(self, settle: float = 0.3) -> list[AbstractIncomingMessage]:
        """Every message in the queue, once nothing more arrived for ``settle`` seconds."""
        queue = await self.channel.get_queue(self.queue)
        taken: list[AbstractIncomingMessage] = []
        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < settle:
            message = await queue.get(no_ack=True, fail=False)
            if message is None:
                await asyncio.sleep(0.05)
                continue
            taken.append(message)
            quiet_since = time.monotonic()
        return taken


@pytest.fixture
async def downstream(rabbitmq_server: str, run_id: str) -> AsyncIterator[Downstream]:
    connection = await aio_pika.connect(rabbitmq_server)
    channel = await connection.channel()
    exchange = await channel.declare_exchange(f"t.{run_id}.out", aio_pika.ExchangeType.TOPIC)
    queue = await channel.declare_queue(f"t.{run_id}.out.q")
    await queue.bind(exchange, "order.#")
    try:
        yield Downstream(connection, channel, exchange.name, queue.name)
    finally:
        await queue.delete(if_unused=False, if_empty=False)
        await exchange.delete()
        await connection.close()


async def rows(db: psycopg.AsyncConnection[Any], query: str, *names: str) -> list[Any]:
    """Run ``query`` with ``{}`` placeholders filled by the table ``names``."""
    statement = sql.SQL(query).format(*(sql.Identifier(n) for n in names))
    cur = await db.execute(statement)
    return await cur.fetchall()


@pytest.fixture
async def consumer_settings_tx(
    make_settings_tx: SettingsFactory, rabbitmq_server: str, run_id: str, tables: None
) -> SettingsFactory:
    """Settings of a transactional consumer on a topology no other test uses, migrated."""
    fixed = {
        "amqp_url": rabbitmq_server,
        "queue": f"t.{run_id}.work",
        "exchange": f"t.{run_id}.events",
        "handler": "tests.transactional.handlers:record_order",
    }

    def factory(**overrides: Any) -> Any:
        return make_settings_tx(**(FAST | fixed | overrides))

    store = await open_store(factory())
    try:
        await store.migrate()
    finally:
        await store.close()
    return factory


@pytest.fixture
async def broker(consumer_settings_tx: SettingsFactory) -> AsyncIterator[Broker]:
    settings = consumer_settings_tx()
    connected = await Broker.connect(settings.amqp_url)
    try:
        yield connected
    finally:
        await connected.delete_topology(settings)
        await connected.close()
