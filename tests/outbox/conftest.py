"""Fixtures of the outbox tests: an outbox table of the test's own, an exchange and
queue downstream of it, settings that point a relay at both."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aio_pika
import psycopg
import pytest
from aio_pika.abc import AbstractIncomingMessage
from psycopg import sql

from semel.consumer.delivery.message import KeySource
from semel.consumer.outbox.writer import OutboxWriter
from semel.settings import Settings
from semel.stores.postgres.outbox import schema
from tests.conftest import SettingsFactory
from tests.transactional.conftest import Downstream

ROUTING_KEY = "order.paid"


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
async def db(postgres_server: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A connection of the test's own (autocommit)."""
    async with await psycopg.AsyncConnection.connect(postgres_server, autocommit=True) as conn:
        yield conn


@pytest.fixture
async def table(db: psycopg.AsyncConnection[Any], outbox_table: str) -> AsyncIterator[str]:
    """The outbox table, made as ``semel migrate`` makes it, dropped after."""
    for statement in schema(outbox_table):
        await db.execute(statement)
    yield outbox_table
    await db.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(outbox_table)))


@pytest.fixture
async def downstream(rabbitmq_server: str, run_id: str) -> AsyncIterator[Downstream]:
    """A topic exchange with one queue bound for ``order.#``."""
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


@pytest.fixture
def outbox_settings(
    make_settings: SettingsFactory,
    rabbitmq_server: str,
    outbox_table: str,
    downstream: Downstream,
    run_id: str,
) -> SettingsFactory:
    """Settings of a relay (and a writer) on the test's table and exchange."""
    fixed = {
        "amqp_url": rabbitmq_server,
        "outbox_table": outbox_table,
        "exchange": downstream.exchange,
        "postgres_table": f"t_{run_id}_keys",
        "queue": f"t.{run_id}.work",
        "broker_give_up": 30.0,
    }

    def factory(**overrides: Any) -> Settings:
        return make_settings(**(fixed | overrides))

    return factory


@pytest.fixture
def writer(table: str, downstream: Downstream) -> OutboxWriter:
    return OutboxWriter(table, downstream.exchange, KeySource.parse("header:Idempotency-Key"))


async def stage_one(
    dsn: str, writer: OutboxWriter, key: str, *, routing_key: str = ROUTING_KEY, **options: Any
) -> str:
    """Commit one staged message in a transaction of its own; returns its id."""
    async with await psycopg.AsyncConnection.connect(dsn) as conn, conn.transaction():
        return await writer.stage(conn, {"key": key}, key=key, routing_key=routing_key, **options)


async def eventually(
    check: Callable[[], Awaitable[bool]], within: float, what: str, step: float = 0.02
) -> float:
    """Poll ``check`` until true; fail naming ``what`` after ``within`` seconds.
    Returns the seconds it took."""
    started = time.monotonic()
    while not await check():
        assert time.monotonic() - started < within, f"{what} within {within}s"
        await asyncio.sleep(step)
    return time.monotonic() - started


async def received(downstream: Downstream, count: int, within: float) -> list[Any]:
    """The first ``count`` messages of the downstream queue, waiting up to ``within`` s."""
    queue = await downstream.channel.get_queue(downstream.queue)
    taken: list[AbstractIncomingMessage] = []

    async def enough() -> bool:
        while (message := await queue.get(no_ack=True, fail=False)) is not None:
            taken.append(message)
        return len(taken) >= count

    await eventually(enough, within, f"{count} messages downstream (got {len(taken)})")
    return taken


async def count_rows(db: psycopg.AsyncConnection[Any], table: str, where: str = "true") -> int:
    query = sql.SQL("SELECT count(*) FROM {} WHERE " + where).format(sql.Identifier(table))
    row = await (await db.execute(query)).fetchone()
    return int(row[0]) if row else 0
