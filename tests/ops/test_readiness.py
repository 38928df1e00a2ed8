"""/readyz during real outages: the broker and the store taken away and brought back."""

from __future__ import annotations

import contextlib
import sqlite3
import time
import uuid
from collections.abc import Awaitable, Callable

import orjson
import psycopg
import pytest

from semel.settings import Settings
from tests.conftest import open_store
from tests.consumer.conftest import ConsumerSettings, StartConsumer
from tests.consumer.harness import Broker, TcpProxy, eventually
from tests.consumer.test_faults import through_proxy
from tests.ops.conftest import http, scrape
from tests.servers import free_port

pytestmark = pytest.mark.timeout(60)

# PING_INTERVAL + PING_TIMEOUT, and a second of slack: "within seconds".
TURNS_WITHIN = 5.0


class Readiness:
    def __init__(self, port: int) -> None:
        self.port = port

    async def is_(self, status: int, **checks: str | None) -> bool:
        response = await http(self.port, "/readyz")
        body = orjson.loads(response.body)
        return response.status == status and all(body[k] == v for k, v in checks.items())

    async def turns(self, status: int, deadline: float, **checks: str | None) -> float:
        """Seconds until ``/readyz`` answers ``status`` with ``checks``."""
        began = time.monotonic()
        await eventually(lambda: self.is_(status, **checks), deadline, f"/readyz {status} {checks}")
        return time.monotonic() - began


async def test_readiness_follows_the_broker_connection(
    consumer_settings: ConsumerSettings,
    broker: Broker,
    start_consumer: StartConsumer,
    rabbitmq_port: int,
) -> None:
    proxy = await TcpProxy(rabbitmq_port, free_port()).start()
    settings = consumer_settings(
        amqp_url=f"amqp://guest:guest@127.0.0.1:{proxy.port}/", metrics_port=free_port()
    )
    ready = Readiness(settings.metrics_port)
    consumer = await start_consumer(settings)
    try:
        await ready.turns(200, 10, broker="up", store="up", node=f"127.0.0.1:{proxy.port}")
        await proxy.cut()
        assert await ready.turns(503, TURNS_WITHIN, broker="down", store="up") < TURNS_WITHIN
        assert await ready.is_(503, node=None)
        assert (await http(settings.metrics_port, "/healthz")).status == 200  # alive all along
        await proxy.start()
        await ready.turns(200, 15, broker="up", store="up")

        async def reconnects() -> float:
            return (await scrape(settings.metrics_port)).get("semel_broker_reconnects_total")

        # Counted once aio-pika has restored the channels, a moment after the connection.
        await eventually(lambda: _equals(reconnects, 1), 10, "one reconnect counted")
        assert await consumer.finish() == 0
    finally:
        await proxy.cut()


@pytest.mark.parametrize("backend", ["redis", "postgres"])
async def test_readiness_follows_the_store(
    consumer_settings: ConsumerSettings, broker: Broker, start_consumer: StartConsumer
) -> None:
    port = free_port()
    target, overrides = through_proxy(consumer_settings(), port)
    proxy = await TcpProxy(target, port).start()
    settings = consumer_settings(**overrides, metrics_port=free_port())
    ready = Readiness(settings.metrics_port)
    consumer = await start_consumer(settings)
    try:
        await ready.turns(200, 10, broker="up", store="up")
        await proxy.cut()
        assert await ready.turns(503, TURNS_WITHIN, broker="up", store="down") < TURNS_WITHIN
        await proxy.start()
        await ready.turns(200, 15, broker="up", store="up")
        samples = await scrape(settings.metrics_port)
        errors = samples.get(
            "semel_store_errors_total", operation="ping", backend=settings.store.value
        )
        assert errors >= 1
        assert await consumer.finish() == 0
    finally:
        await proxy.cut()


async def _equals(value: Callable[[], Awaitable[float]], expected: float) -> bool:
    return await value() == expected


async def _drop_table(settings: Settings) -> None:
    """The store's table gone under a running consumer: an operator's slip."""
    if settings.store.value == "postgres":
        async with await psycopg.AsyncConnection.connect(settings.postgres_dsn) as conn:
            await conn.execute(f'DROP TABLE "{settings.postgres_table}"')
            await conn.commit()
    else:
        with contextlib.closing(sqlite3.connect(settings.sqlite_path)) as conn:
            conn.execute(f'DROP TABLE "{settings.postgres_table}"')
            conn.commit()


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
async def test_a_worker_that_stopped_consuming_is_neither_ready_nor_alive(
    consumer_settings: ConsumerSettings, broker: Broker, start_consumer: StartConsumer
) -> None:
    # The store still answers (PostgreSQL's ping is SELECT 1), but it is not set
    # up for semel any more: consumption stops until a restart, and says so.
    table = f"semel_gone_{uuid.uuid4().hex[:8]}"
    settings = consumer_settings(postgres_table=table, metrics_port=free_port())
    migrating = await open_store(settings)
    await migrating.migrate()
    await migrating.close()
    ready = Readiness(settings.metrics_port)
    consumer = await start_consumer(settings)
    await broker.publish(settings, {"order": 1}, key="before")
    await ready.turns(200, 10, broker="up", store="up")
    samples = await scrape(settings.metrics_port)
    assert samples.get("semel_consumption_stopped") == 0

    await _drop_table(settings)
    await broker.publish(settings, {"order": 2}, key="after")

    async def stopped() -> bool:
        answer = await http(settings.metrics_port, "/readyz")
        return answer.status == 503 and orjson.loads(answer.body)["status"] == "stopped"

    await eventually(stopped, 10, "/readyz 503, consumption stopped")
    answer = orjson.loads((await http(settings.metrics_port, "/readyz")).body)
    assert table in answer["reason"], answer
    alive = await http(settings.metrics_port, "/healthz")  # for the orchestrator to restart it
    assert alive.status == 503, alive
    assert orjson.loads(alive.body)["status"] == "stopped"
    assert (await scrape(settings.metrics_port)).get("semel_consumption_stopped") == 1
    assert await consumer.finish() == 0
