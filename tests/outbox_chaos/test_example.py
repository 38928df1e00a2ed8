"""The FastAPI outbox example on the real PostgreSQL: an order and its message, or neither.

Each test imports the example afresh with its own orders and outbox tables
(and, for the relay, its own exchange on the shared broker), drives it
through httpx's ASGI transport inside its lifespan, and drops what it made.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from functools import partial
from types import ModuleType
from typing import Any

import aio_pika
import httpx
import orjson
import psycopg
import pytest
from psycopg import sql

from tests.chaos.processes import run
from tests.consumer.harness import eventually

pytestmark = pytest.mark.timeout(60)

MODULE = "examples.fastapi_outbox"


@dataclass
class Example:
    module: ModuleType
    client: httpx.AsyncClient
    dsn: str
    orders: str
    outbox: str
    exchange: str

    async def rows(self, query: str, table: str) -> list[tuple[Any, ...]]:
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            cursor = await conn.execute(sql.SQL(query).format(sql.Identifier(table)))
            return await cursor.fetchall()

    async def post(self, key: str, **body: Any) -> httpx.Response:
        order = {"item": "book", "amount": 1200} | body
        return await self.client.post("/orders", json=order, headers={"Idempotency-Key": key})


@pytest.fixture
def environment(
    postgres_server: str, rabbitmq_server: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, str]]:
    """The example's environment: its own tables and exchange, nothing else of SEMEL_*."""
    run_id = uuid.uuid4().hex[:8]
    for name in [name for name in os.environ if name.startswith("SEMEL_")]:
        monkeypatch.delenv(name)
    env = {
        "SEMEL_STORE": "postgres",
        "SEMEL_POSTGRES_DSN": postgres_server,
        "SEMEL_POSTGRES_TABLE": f"ex_{run_id}_keys",
        "SEMEL_OUTBOX_TABLE": f"ex_{run_id}_outbox",
        "SEMEL_AMQP_URL": rabbitmq_server,
        "SEMEL_EXCHANGE": f"ex.{run_id}.events",
        "SEMEL_METRICS_PORT": "0",
        "ORDERS_TABLE": f"ex_{run_id}_orders",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    yield env
    sys.modules.pop(MODULE, None)


async def _drop(env: dict[str, str]) -> None:
    async with await psycopg.AsyncConnection.connect(
        env["SEMEL_POSTGRES_DSN"], autocommit=True
    ) as conn:
        for name in ("ORDERS_TABLE", "SEMEL_OUTBOX_TABLE", "SEMEL_POSTGRES_TABLE"):
            await conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(env[name])))


@contextlib.asynccontextmanager
async def opened(env: dict[str, str], relay: bool) -> AsyncIterator[Example]:
    """The example imported afresh, its tables made, inside its lifespan; dropped after."""
    os.environ["ORDERS_RELAY"] = "1" if relay else "0"
    try:
        await run([sys.executable, "-m", "semel", "migrate"], 30, env=dict(os.environ))
        sys.modules.pop(MODULE, None)
        module = importlib.import_module(MODULE)
        transport = httpx.ASGITransport(app=module.app)
        async with (
            module.lifespan(module.app),
            httpx.AsyncClient(transport=transport, base_url="http://example") as client,
        ):
            yield Example(module, client, env["SEMEL_POSTGRES_DSN"], env["ORDERS_TABLE"],
                          env["SEMEL_OUTBOX_TABLE"], env["SEMEL_EXCHANGE"])  # fmt: skip
    finally:
        del os.environ["ORDERS_RELAY"]
        await _drop(env)


async def _all_sent(example: Example) -> bool:
    rows = await example.rows("SELECT sent_at FROM {}", example.outbox)
    return rows != [] and all(at is not None for (at,) in rows)


@pytest.fixture
async def example(environment: dict[str, str]) -> AsyncIterator[Example]:
    """The example without a relay: staged rows stay unsent."""
    async with opened(environment, relay=False) as example:
        yield example


async def test_a_committed_order_has_its_row_and_one_staged_message(example: Example) -> None:
    response = await example.post("order-1")

    assert response.status_code == 201, response.text
    message_id = response.json()["message_id"]
    assert await example.rows("SELECT key, message_id::text FROM {}", example.orders) == [
        ("order-1", message_id)
    ]
    [(key, staged_id, routing_key, body, sent)] = await example.rows(
        "SELECT key, message_id::text, routing_key, body, sent_at IS NOT NULL FROM {}",
        example.outbox,
    )
    assert (key, staged_id, routing_key, sent) == ("order-1", message_id, "order.placed", False)
    assert orjson.loads(body) == {"key": "order-1", "item": "book", "amount": 1200}


async def test_the_same_key_again_answers_the_first_message_id_and_stages_nothing(
    example: Example,
) -> None:
    first = await example.post("order-2")
    again = await example.post("order-2")

    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json() == first.json()
    assert len(await example.rows("SELECT key FROM {}", example.orders)) == 1
    assert len(await example.rows("SELECT key FROM {}", example.outbox)) == 1


async def test_a_failed_order_leaves_neither_row_nor_message(example: Example) -> None:
    response = await example.post("order-3", fail=True)

    assert response.status_code == 500
    assert await example.rows("SELECT key FROM {}", example.orders) == []
    assert await example.rows("SELECT key FROM {}", example.outbox) == []
    # Nothing of it remains: the key is free for a request that does commit.
    assert (await example.post("order-3")).status_code == 201


async def test_the_relay_in_the_web_process_publishes_the_committed_order_only(
    environment: dict[str, str],
) -> None:
    connection = await aio_pika.connect(environment["SEMEL_AMQP_URL"])
    channel = await connection.channel()
    exchange = await channel.declare_exchange(
        environment["SEMEL_EXCHANGE"], aio_pika.ExchangeType.TOPIC, durable=True
    )
    queue = await channel.declare_queue(exclusive=True)
    await queue.bind(exchange, "#")
    try:
        async with opened(environment, relay=True) as example:
            placed = await example.post("order-4")
            await example.post("order-5", fail=True)
            await eventually(partial(_all_sent, example), 20, "the staged message relayed")
        message = await queue.get(timeout=5)
        assert message.message_id == placed.json()["message_id"]
        assert message.headers["Idempotency-Key"] == "order-4"
        assert message.routing_key == "order.placed"
        assert await queue.get(fail=False) is None  # order-5 rolled back: never published
    finally:
        await exchange.delete()
        await connection.close()
