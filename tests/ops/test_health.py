"""Readiness and the HTTP endpoint, without a broker: stand-in connection and store."""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import orjson
import pytest
from dependency_injector import providers

from semel.consumer.commands.consume import run_consumer
from semel.consumer.container import Container
from semel.consumer.errors import EXIT_FAILURE, ListenError, SemelError
from semel.consumer.ops import httpd
from semel.consumer.ops.health import Health
from semel.consumer.ops.httpd import open_operations
from semel.consumer.ops.metered import MeteredStore
from semel.consumer.ops.metrics import Metrics
from semel.settings import Settings
from tests.consumer.harness import eventually
from tests.ops.conftest import http
from tests.ops.fakes import ScriptedStore, StubConnection, connection
from tests.servers import free_port

pytestmark = pytest.mark.timeout(20)


@contextlib.asynccontextmanager
async def endpoint(port: int, metrics: Metrics) -> AsyncIterator[Health]:
    async with contextlib.asynccontextmanager(open_operations)(port, metrics) as health:
        yield health


async def test_ready_once_both_are_handed_over_and_up_and_not_while_either_is_down() -> None:
    health = Health(ping_interval=0.1, ping_timeout=0.2)
    broker, inner = StubConnection(), ScriptedStore()
    try:
        assert health.readiness() == {"broker": False, "store": False}  # starting up
        health.watch_broker(connection(broker))
        health.watch_store(MeteredStore(inner, Metrics()))
        broker.connected.set()

        async def readiness_is(broker_up: bool, store_up: bool) -> bool:
            return health.readiness() == {"broker": broker_up, "store": store_up}

        await eventually(lambda: readiness_is(True, True), 5, "ready")
        inner.down = True  # the store refuses
        await eventually(lambda: readiness_is(True, False), 5, "store down")
        inner.down = False
        await eventually(lambda: readiness_is(True, True), 5, "store back")
        inner.hang = True  # the store never answers: the ping times out
        await eventually(lambda: readiness_is(True, False), 5, "store silent")
        inner.hang = False
        broker.connected.clear()  # aio-pika's robust connection is reconnecting
        await eventually(lambda: readiness_is(False, True), 5, "broker down")
        broker.connected.set()
        await eventually(lambda: readiness_is(True, True), 5, "both back")
    finally:
        await health.close()


async def test_the_store_is_pinged_only_when_traffic_leaves_it_quiet() -> None:
    health = Health(ping_interval=0.3, ping_timeout=0.3)
    metrics = Metrics()
    store = MeteredStore(ScriptedStore(), metrics)

    async def pings() -> float | None:
        labels = {"operation": "ping", "backend": "scripted"}
        return metrics.registry.get_sample_value(
            "semel_store_operation_duration_seconds_count", labels
        )

    await store.claim("k", "f")
    health.watch_store(store)
    try:
        for _ in range(10):  # a second of traffic, every call an answer
            await store.claim("k", "f")
            await asyncio.sleep(0.1)
        assert await pings() == 0
        await eventually(lambda: _at_least(pings, 2), 5, "pings once quiet")
    finally:
        await health.close()


async def _at_least(value: Callable[[], Awaitable[float | None]], least: float) -> bool:
    return (await value() or 0) >= least


async def test_the_endpoint_answers_its_three_paths() -> None:
    port = free_port()
    metrics = Metrics()
    async with endpoint(port, metrics) as health:
        alive = await http(port, "/healthz")
        assert (alive.status, orjson.loads(alive.body)) == (200, {"status": "alive"})
        ready = await http(port, "/readyz")
        assert ready.status == 503
        assert orjson.loads(ready.body) == {
            "status": "not ready",
            "broker": "down",
            "store": "down",
            "node": None,  # no broker node while the broker is down
        }
        assert ready.headers["content-type"] == "application/json"
        scraped = await http(port, "/metrics?debug=1")
        assert scraped.status == 200
        assert scraped.headers["content-type"].startswith("text/plain; version=")
        assert b'semel_messages_total{outcome="processed",reason=""} 0.0' in scraped.body
        assert b"process_cpu_seconds_total" in scraped.body
        head = await http(port, "/metrics", method="HEAD")
        assert (head.status, head.body) == (200, b"")
        assert int(head.headers["content-length"]) > 0
        assert (await http(port, "/metrics", method="POST")).status == 405
        assert (await http(port, "/")).status == 404
        assert health.readiness() == {"broker": False, "store": False}


async def test_a_client_that_sends_nothing_or_nonsense_is_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(httpd, "READ_TIMEOUT", 0.2)
    port = free_port()
    async with endpoint(port, Metrics()):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed without an answer
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"NONSENSE\r\n\r\n")
        assert (await asyncio.wait_for(reader.read(), 5)).startswith(b"HTTP/1.1 400 ")
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /" + b"x" * (httpd.REQUEST_LIMIT + 1))
        assert await asyncio.wait_for(reader.read(), 5) == b""  # too long: dropped
        writer.close()
        assert (await http(port, "/healthz")).status == 200  # still serving


async def test_port_zero_serves_nothing_and_health_still_works() -> None:
    async with endpoint(0, Metrics()) as health:
        assert health.readiness() == {"broker": False, "store": False}


async def test_a_busy_port_stops_start_up_with_one_line_and_exit_1() -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))  # noqa: S104 - the endpoint binds every interface
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ListenError, match=f"SEMEL_METRICS_PORT: cannot listen on port {port}"):
            async with endpoint(port, Metrics()):
                pass
        container = Container()
        container.settings.override(
            providers.Object(
                Settings(metrics_port=port, handler="semel.consumer.examples:order_paid")
            )
        )
        with pytest.raises(SemelError) as stopped:
            await run_consumer(container, asyncio.Event())
    assert stopped.value.exit_code == EXIT_FAILURE
    assert "SEMEL_METRICS_PORT" in str(stopped.value)


async def test_close_never_hangs_when_it_meets_a_ping_that_answers() -> None:
    # On Python 3.11, asyncio.wait_for swallows a cancellation that arrives as
    # its inner call finishes: a pinger cancelled right then outlived close().
    metrics, hung = Metrics(), 0
    for _ in range(40):
        health = Health(ping_interval=0.0005, ping_timeout=0.5)
        health.watch_store(MeteredStore(ScriptedStore(), metrics))
        await asyncio.sleep(random.uniform(0.0, 0.003))
        try:
            await asyncio.wait_for(health.close(), 0.5)
        except TimeoutError:
            hung += 1
    assert hung == 0, f"{hung} of 40 closes hung"
