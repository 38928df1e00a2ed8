"""The docs' staging samples (examples/outbox_staging.py) on the real PostgreSQL:
each commits its business row and its message together, and stages nothing when
the transaction rolls back. The samples' ``orders`` table is a schema of the
test's own, first on the search path; the outbox table is the test's too."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import AsyncConnectionPool
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

from examples import outbox_staging
from semel.consumer.outbox.writer import OutboxWriter

pytestmark = pytest.mark.timeout(60)


class Boom(Exception):
    pass


@pytest.fixture
async def schema(db: psycopg.AsyncConnection[Any]) -> AsyncIterator[str]:
    """A schema holding an ``orders`` table with two unpaid orders, dropped after."""
    name = f"t_{uuid.uuid4().hex[:10]}"
    ident = sql.Identifier(name)
    await db.execute(sql.SQL("CREATE SCHEMA {}").format(ident))
    await db.execute(
        sql.SQL("CREATE TABLE {}.orders (id int PRIMARY KEY, paid bool)").format(ident)
    )
    await db.execute(sql.SQL("INSERT INTO {}.orders VALUES (1, false), (2, false)").format(ident))
    yield name
    await db.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(ident))


@pytest.fixture(autouse=True)
def example_engine(monkeypatch: pytest.MonkeyPatch, writer: OutboxWriter) -> None:
    # The example's engine reads SEMEL_*; the test's writer names the test's outbox table.
    monkeypatch.setattr(type(outbox_staging.engine), "outbox", property(lambda _: writer))


def dsn_in(postgres_server: str, schema: str) -> str:
    glue = "&" if "?" in postgres_server else "?"
    return f"{postgres_server}{glue}options={quote(f'-c search_path={schema},public')}"


async def counts(db: psycopg.AsyncConnection[Any], table: str, schema: str) -> tuple[int, int]:
    """(staged messages, paid orders)."""
    query = sql.SQL("SELECT (SELECT count(*) FROM {}), (SELECT count(*) FROM {}.orders WHERE paid)")
    cursor = await db.execute(query.format(sql.Identifier(table), sql.Identifier(schema)))
    row = await cursor.fetchone()
    assert row is not None
    return row[0], row[1]


async def test_psycopg_sample_commits_both_or_neither(
    postgres_server: str, db: psycopg.AsyncConnection[Any], table: str, schema: str
) -> None:
    dsn = dsn_in(postgres_server, schema)
    async with AsyncConnectionPool(dsn, min_size=1, open=False) as pool:
        message_id = await outbox_staging.pay_with_psycopg(pool, 1, 990)
        assert uuid.UUID(message_id)
        assert await counts(db, table, schema) == (1, 1)

        async def fails_after_staging() -> None:
            async with pool.connection() as conn, conn.transaction():
                await conn.execute("UPDATE orders SET paid = true WHERE id = 2")
                await outbox_staging.engine.outbox.stage(
                    conn, {"order_id": 2}, key="order-paid-2", routing_key="order.paid"
                )
                raise Boom

        with pytest.raises(Boom):  # the same steps, then a failure: neither is left
            await fails_after_staging()
    assert await counts(db, table, schema) == (1, 1)


async def test_sqlalchemy_sample_commits_both(
    postgres_server: str, db: psycopg.AsyncConnection[Any], table: str, schema: str
) -> None:
    url = postgres_server.replace("postgresql://", "postgresql+asyncpg://", 1)
    sa = create_async_engine(
        url, connect_args={"server_settings": {"search_path": f"{schema},public"}}
    )
    try:
        async with AsyncSession(sa) as session:
            await outbox_staging.pay_with_sqlalchemy(session, 1, 990)
    finally:
        await sa.dispose()
    assert await counts(db, table, schema) == (1, 1)


async def test_blocking_sample_commits_both(
    postgres_server: str, db: psycopg.AsyncConnection[Any], table: str, schema: str
) -> None:
    with psycopg.connect(dsn_in(postgres_server, schema)) as conn:
        outbox_staging.pay_blocking(conn, 2, 120)
    assert await counts(db, table, schema) == (1, 1)
