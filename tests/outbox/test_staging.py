"""Staging on the real PostgreSQL: a row exists exactly when the caller's transaction
commits, whichever library holds it; a transaction that would commit on its own is refused."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import orjson
import psycopg
import pytest
from psycopg import sql
from sqlalchemy import create_engine
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from semel import Semel
from semel.consumer.delivery.message import KeySource
from semel.consumer.outbox.drivers import NotInTransaction
from semel.consumer.outbox.writer import OutboxWriter
from semel.consumer.producer.envelope import stable_message_id
from tests.conftest import SettingsFactory
from tests.outbox.conftest import ROUTING_KEY, count_rows

pytestmark = pytest.mark.timeout(60)


class Boom(Exception):
    pass


async def raise_in_transaction(conn: psycopg.AsyncConnection[Any], writer: OutboxWriter) -> None:
    """Stage, then raise inside ``conn.transaction()``: the block rolls back."""
    async with conn.transaction():
        await writer.stage(conn, {"n": 3}, key="raised", routing_key=ROUTING_KEY)
        raise Boom


def raise_in_sync_transaction(conn: psycopg.Connection[Any], writer: OutboxWriter) -> None:
    with conn.transaction():
        writer.stage_sync(conn, {"n": 3}, key="raised", routing_key=ROUTING_KEY)
        raise Boom


async def raise_in_session(engine: AsyncEngine, writer: OutboxWriter) -> None:
    async with AsyncSession(engine) as session, session.begin():
        await writer.stage(session, {"n": 3}, key="raised", routing_key=ROUTING_KEY)
        raise Boom


async def keys(db: psycopg.AsyncConnection[Any], table: str) -> list[str]:
    query = sql.SQL("SELECT key FROM {} ORDER BY id").format(sql.Identifier(table))
    return [row[0] for row in await (await db.execute(query)).fetchall()]


async def test_psycopg_commit_rollback_and_exception(
    postgres_server: str, db: psycopg.AsyncConnection[Any], writer: OutboxWriter, table: str
) -> None:
    async with await psycopg.AsyncConnection.connect(postgres_server) as conn:
        async with conn.transaction():
            await writer.stage(conn, {"n": 1}, key="committed", routing_key=ROUTING_KEY)
            assert await keys(db, table) == []  # not visible before the commit
        async with conn.transaction(force_rollback=True):
            await writer.stage(conn, {"n": 2}, key="rolled-back", routing_key=ROUTING_KEY)
        with pytest.raises(Boom):
            await raise_in_transaction(conn, writer)
        # Not autocommit, no block: psycopg begins the transaction; commit() decides.
        await writer.stage(conn, {"n": 4}, key="implicit", routing_key=ROUTING_KEY)
        await conn.rollback()
        await writer.stage(conn, {"n": 5}, key="implicit-committed", routing_key=ROUTING_KEY)
        await conn.commit()
    assert await keys(db, table) == ["committed", "implicit-committed"]


async def test_an_autocommit_connection_is_refused_outside_a_transaction_block(
    db: psycopg.AsyncConnection[Any], writer: OutboxWriter, table: str
) -> None:
    with pytest.raises(NotInTransaction, match="autocommit"):
        await writer.stage(db, {"n": 1}, key="k", routing_key=ROUTING_KEY)
    async with db.transaction():  # the same connection in a block is fine
        await writer.stage(db, {"n": 2}, key="in-block", routing_key=ROUTING_KEY)
    assert await keys(db, table) == ["in-block"]


def test_sync_psycopg(postgres_server: str, writer: OutboxWriter, table: str) -> None:
    with psycopg.Connection.connect(postgres_server) as conn:
        with conn.transaction():
            writer.stage_sync(conn, {"n": 1}, key="committed", routing_key=ROUTING_KEY)
        with pytest.raises(Boom):
            raise_in_sync_transaction(conn, writer)
    with psycopg.Connection.connect(postgres_server, autocommit=True) as conn:
        with pytest.raises(NotInTransaction):
            writer.stage_sync(conn, {"n": 3}, key="autocommit", routing_key=ROUTING_KEY)
        query = sql.SQL("SELECT key FROM {}").format(sql.Identifier(table))
        assert [r[0] for r in conn.execute(query).fetchall()] == ["committed"]


@pytest.fixture(params=["asyncpg", "psycopg"])
async def async_engine(
    request: pytest.FixtureRequest, postgres_server: str
) -> AsyncIterator[AsyncEngine]:
    url = postgres_server.replace("postgresql://", f"postgresql+{request.param}://")
    engine = create_async_engine(url)
    yield engine
    await engine.dispose()


async def test_sqlalchemy_async_session_commit_rollback_and_exception(
    async_engine: AsyncEngine, db: psycopg.AsyncConnection[Any], writer: OutboxWriter, table: str
) -> None:
    async with AsyncSession(async_engine) as session, session.begin():
        await writer.stage(session, {"n": 1}, key="committed", routing_key=ROUTING_KEY)
    async with AsyncSession(async_engine) as session:
        await writer.stage(session, {"n": 2}, key="rolled-back", routing_key=ROUTING_KEY)
        await session.rollback()
    with pytest.raises(Boom):
        await raise_in_session(async_engine, writer)
    async with AsyncSession(async_engine) as session:  # autobegin, then commit()
        await writer.stage(session, {"n": 4}, key="autobegun", routing_key=ROUTING_KEY)
        await session.commit()
    async with async_engine.connect() as conn:  # an AsyncConnection, not a session
        await writer.stage(conn, {"n": 5}, key="connection", routing_key=ROUTING_KEY)
        await conn.commit()
    assert await keys(db, table) == ["committed", "autobegun", "connection"]


async def test_sqlalchemy_autocommit_is_refused(
    async_engine: AsyncEngine, writer: OutboxWriter, table: str, db: psycopg.AsyncConnection[Any]
) -> None:
    autocommit = async_engine.execution_options(isolation_level="AUTOCOMMIT")
    async with AsyncSession(autocommit) as session:
        with pytest.raises(NotInTransaction, match="AUTOCOMMIT"):
            await writer.stage(session, {"n": 1}, key="k", routing_key=ROUTING_KEY)
    assert await count_rows(db, table) == 0


@pytest.fixture
def sync_engine(postgres_server: str) -> Iterator[Engine]:
    engine = create_engine(postgres_server.replace("postgresql://", "postgresql+psycopg://"))
    yield engine
    engine.dispose()


def test_sqlalchemy_sync_session(sync_engine: Engine, writer: OutboxWriter, table: str) -> None:
    with Session(sync_engine) as session, session.begin():
        writer.stage_sync(session, {"n": 1}, key="committed", routing_key=ROUTING_KEY)
    with Session(sync_engine) as session:
        writer.stage_sync(session, {"n": 2}, key="rolled-back", routing_key=ROUTING_KEY)
        session.rollback()
    with sync_engine.connect() as conn:
        rows = conn.exec_driver_sql(f'SELECT key FROM "{table}"').fetchall()
    assert [r[0] for r in rows] == ["committed"]


async def test_the_row_carries_the_key_where_the_consumer_reads_it(
    postgres_server: str, db: psycopg.AsyncConnection[Any], table: str
) -> None:
    sources = {
        "header:X-Key": ("a", {"x": 1}),
        "body:meta.key": ("b", {"x": 1}),
        "message_id": ("c", {"x": 1}),
    }
    ids = {}
    async with await psycopg.AsyncConnection.connect(postgres_server) as conn, conn.transaction():
        for spec, (key, body) in sources.items():
            writer = OutboxWriter(table, "ex", KeySource.parse(spec))
            ids[key] = await writer.stage(
                conn, body, key=key, routing_key=ROUTING_KEY, group=f"g-{key}"
            )
    query = sql.SQL("SELECT key, fence, message_id, headers, body, exchange FROM {} ORDER BY id")
    found = await (await db.execute(query.format(sql.Identifier(table)))).fetchall()
    assert [r[0] for r in found] == ["g-a", "g-b", "g-c"]  # the ordering group
    assert {r[1] for r in found} == {0}
    assert {r[5] for r in found} == {"ex"}
    header, body, message_id = found
    assert header[3] == {"X-Key": "a"}
    assert orjson.loads(body[4]) == {"x": 1, "meta": {"key": "b"}}
    assert message_id[2] == stable_message_id("c")  # the id is the key, as a UUID
    assert ids["c"] == str(stable_message_id("c"))
    assert all(str(r[2]) == ids[k] for r, k in zip(found, "abc", strict=True))


async def test_bad_input_is_refused_before_any_sql(writer: OutboxWriter) -> None:
    with pytest.raises(ValueError, match="UUID"):
        writer.row({}, key="k", routing_key="r", message_id="not-a-uuid")
    with pytest.raises(ValueError, match="routing key"):
        writer.row({}, key="k", routing_key="r" * 256)
    with pytest.raises(TypeError):
        writer.row({"when": object()}, key="k", routing_key="r")
    with pytest.raises(TypeError, match="psycopg AsyncConnection"):
        await writer.stage(object(), {}, key="k", routing_key="r")  # type: ignore[arg-type]
    given = str(uuid.uuid4())
    assert str(writer.row({}, key="k", routing_key="r", message_id=given)["message_id"]) == given


async def test_the_engine_builds_the_writer_from_its_settings(
    outbox_settings: SettingsFactory, table: str
) -> None:
    engine = Semel(outbox_settings(key_source="message_id", exchange="orders"))
    outbox = engine.outbox  # no start() needed
    assert (outbox.table, outbox.exchange, outbox.key_source) == (
        table, "orders", KeySource("message_id"),
    )  # fmt: skip


async def test_the_notify_is_delivered_at_commit_only(
    postgres_server: str, db: psycopg.AsyncConnection[Any], writer: OutboxWriter, table: str
) -> None:
    await db.execute(sql.SQL("LISTEN {}").format(sql.Identifier(table)))
    async with await psycopg.AsyncConnection.connect(postgres_server) as conn:
        async with conn.transaction(force_rollback=True):
            await writer.stage(conn, {}, key="no", routing_key=ROUTING_KEY)
        assert [n async for n in db.notifies(timeout=0.3)] == []
        async with conn.transaction():
            await writer.stage(conn, {}, key="yes", routing_key=ROUTING_KEY)
            await writer.stage(conn, {}, key="yes2", routing_key=ROUTING_KEY)
    notes = [n async for n in db.notifies(timeout=1.0, stop_after=1)]
    assert [n.channel for n in notes] == [table]
