"""Fixtures of the transactional-mode tests: the PostgreSQL store in transactional
mode, on tables of its own per test, and a direct connection to look at them."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from stores.postgres_tx import TransactionalStore
from tests.conftest import SettingsFactory, StoreFactory, open_store


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
async def db(postgres_server: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A connection of the test's own, outside any store (autocommit)."""
    async with await psycopg.AsyncConnection.connect(postgres_server, autocommit=True) as conn:
        yield conn


@pytest.fixture
async def tables(
    db: psycopg.AsyncConnection[Any], outbox_table: str, business_table: str
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
    for table in (business_table, outbox_table):
        await db.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))


@pytest.fixture
def make_settings_tx(make_settings: SettingsFactory, outbox_table: str) -> SettingsFactory:
    def factory(**overrides: Any) -> Any:
        return make_settings(**({"transactional": True, "outbox_table": outbox_table} | overrides))

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


async def rows(db: psycopg.AsyncConnection[Any], query: str, *names: str) -> list[Any]:
    """Run ``query`` with ``{}`` placeholders filled by the table ``names``."""
    statement = sql.SQL(query).format(*(sql.Identifier(n) for n in names))
    cur = await db.execute(statement)
    return await cur.fetchall()
