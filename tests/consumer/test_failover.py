"""A broker setting with several addresses: start-up, failover and the commands, on one broker.

Two TCP proxies in front of the machine's broker stand for two nodes: cutting
one is a node gone (every connection reset, new ones refused). What a real
cluster adds (a queue leader moving, a partition) is in ``tests/cluster``.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import orjson
import pytest
from yarl import URL

from semel.consumer.broker import connection as broker_connection
from semel.consumer.broker.connection import ClusterConnection, broker_urls, connect
from semel.consumer.broker.settle import Settler
from semel.consumer.broker.topology import declare
from semel.consumer.commands import consume as consume_module
from semel.settings import Settings
from semel.stores.base import Status, Store
from tests.consumer.conftest import ConsumerSettings, StartConsumer
from tests.consumer.handlers import read_ledger
from tests.consumer.harness import Broker, TcpProxy, eventually
from tests.ops.conftest import http, scrape
from tests.servers import free_port
from tests.tools.conftest import semel

pytestmark = pytest.mark.timeout(60)

T = TypeVar("T")


@pytest.fixture
async def two_nodes(rabbitmq_port: int) -> AsyncIterator[list[TcpProxy]]:
    proxies = [await TcpProxy(rabbitmq_port, free_port()).start() for _ in range(2)]
    try:
        yield proxies
    finally:
        for proxy in proxies:
            await proxy.close()


def cluster_url(ports: Sequence[int], login: str = "guest:guest") -> str:
    """One URL, several hosts: the form the README shows first."""
    hosts = ",".join(f"127.0.0.1:{port}" for port in ports)
    return f"amqp://{login}@{hosts}/"


@pytest.fixture
def in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Addresses tried in the order given instead of a shuffled one (random.sample is
    the connection module's shuffle)."""

    def same_order(population: Sequence[T], k: int) -> list[T]:
        return list(population)[:k]

    monkeypatch.setattr(random, "sample", same_order)


async def readyz(port: int) -> dict[str, str | None]:
    body: dict[str, str | None] = orjson.loads((await http(port, "/readyz")).body)
    return body


async def completed(store: Store, keys: list[str]) -> bool:
    for key in keys:
        record = await store.get(key)
        if record is None or record.status is not Status.COMPLETED:
            return False
    return True


async def test_a_consumer_that_loses_its_node_moves_to_the_other_and_loses_nothing(
    consumer_settings: ConsumerSettings,
    broker: Broker,
    store: Store,
    ledger: Path,
    start_consumer: StartConsumer,
    two_nodes: list[TcpProxy],
) -> None:
    settings = consumer_settings(
        amqp_url=cluster_url([p.port for p in two_nodes]), metrics_port=free_port()
    )
    consumer = await start_consumer(settings)
    nodes = {f"127.0.0.1:{proxy.port}": proxy for proxy in two_nodes}
    first = (await readyz(settings.metrics_port))["node"]
    assert first in nodes
    (other,) = set(nodes) - {first}

    before = [f"before-{n}" for n in range(20)]
    for key in before:
        await broker.publish(settings, {"sleep": 0.05}, key=key)
    await eventually(lambda: completed(store, before), 20, "the first keys completed")

    # Deliveries in flight when the node goes: some handlers are running.
    during = [f"during-{n}" for n in range(20)]
    for key in during:
        await broker.publish(settings, {"sleep": 0.3}, key=key)
    await eventually(lambda: _started(ledger, 1), 10, "a handler running")
    await nodes[first].cut()  # gone for good: every connection reset, new ones refused
    after = [f"after-{n}" for n in range(20)]
    for key in after:
        await broker.publish(settings, {"sleep": 0.05}, key=key)

    await eventually(lambda: completed(store, before + during + after), 30, "every key completed")
    assert (await readyz(settings.metrics_port))["node"] == other
    samples = await scrape(settings.metrics_port)
    assert samples.get("semel_broker_failovers_total") == 1
    assert samples.get("semel_broker_reconnects_total") == 1
    runs = Counter(entry["key"] for entry in read_ledger(ledger) if entry["event"] == "end")
    assert set(runs) == set(before + during + after)
    assert max(runs.values()) == 1, [key for key, count in runs.items() if count > 1]
    assert await broker.depth(settings.queue) == 0
    assert await consumer.finish() == 0


async def _started(ledger: Path, count: int) -> bool:
    return sum(1 for entry in read_ledger(ledger) if entry["event"] == "start") >= count


async def test_a_node_that_comes_back_is_not_a_failover(
    consumer_settings: ConsumerSettings,
    broker: Broker,
    start_consumer: StartConsumer,
    two_nodes: list[TcpProxy],
) -> None:
    # One address only: a reconnect can only land on the node it lost.
    (node, _) = two_nodes
    settings = consumer_settings(amqp_url=cluster_url([node.port]), metrics_port=free_port())
    consumer = await start_consumer(settings)
    await node.cut()
    await eventually(lambda: _node_is(settings.metrics_port, None), 10, "broker down")
    await node.start()
    await eventually(lambda: _node_is(settings.metrics_port, f"127.0.0.1:{node.port}"), 15)

    async def counted() -> bool:
        return (await scrape(settings.metrics_port)).get("semel_broker_reconnects_total") == 1

    await eventually(counted, 10, "one reconnect counted")
    assert (await scrape(settings.metrics_port)).get("semel_broker_failovers_total") == 0
    assert await consumer.finish() == 0


async def _node_is(port: int, node: str | None) -> bool:
    return (await readyz(port))["node"] == node


@pytest.mark.usefixtures("in_order")
async def test_start_up_passes_over_an_address_that_does_not_answer(
    two_nodes: list[TcpProxy],
) -> None:
    (dead, live) = two_nodes
    await dead.cut()
    began = time.monotonic()
    connection = await connect([cluster_url([dead.port]), cluster_url([live.port])], give_up=10)
    try:
        assert connection.node == f"127.0.0.1:{live.port}"
        assert time.monotonic() - began < 2  # the next address at once, no back-off pause
    finally:
        await connection.close()


async def test_a_lost_node_is_named_in_the_client_logs_not_the_next_one() -> None:
    # aio-pika logs "Connection attempt to <connection> failed" after the
    # connection has moved on to the next address.
    first, second = (URL(cluster_url([port])) for port in (1001, 1002))
    connection = ClusterConnection([first, second])
    lost = asyncio.get_running_loop().create_future()
    lost.set_exception(ConnectionResetError("reset"))
    await connection._on_connection_close(lost)
    assert connection.url == second  # the next attempt
    assert str(connection) == "amqp://guest:******@127.0.0.1:1001/"  # the one just lost
    await connection.close()


def test_each_process_tries_the_addresses_in_its_own_order() -> None:
    addresses = [cluster_url([port]) for port in (1001, 1002, 1003)]
    firsts = Counter(broker_urls(addresses)[0].port for _ in range(300))
    assert set(firsts) == {1001, 1002, 1003}  # each node comes first for some processes
    assert min(firsts.values()) > 50


def test_a_url_without_a_heartbeat_gets_one_and_one_with_it_keeps_it() -> None:
    (url,) = broker_urls([cluster_url([1001])])
    assert url.query["heartbeat"] == str(broker_connection.DEFAULT_HEARTBEAT)
    (url,) = broker_urls([cluster_url([1001]) + "?heartbeat=30"])
    assert url.query["heartbeat"] == "30"


async def test_the_commands_take_the_first_address_that_answers(
    consumer_settings: ConsumerSettings, broker: Broker, two_nodes: list[TcpProxy]
) -> None:
    (dead, live) = two_nodes
    await dead.cut()
    settings = consumer_settings(amqp_url=cluster_url([dead.port, live.port]))
    for _ in range(3):  # whichever the shuffled order tries first
        done = await semel(settings, "publish", "--count", "5", "--json")
        assert done.code == 0, done.stderr
        assert json.loads(done.stdout)["confirmed"] == 5
    listed = await semel(settings, "dlq", "list", "--json")
    assert listed.code == 0, listed.stderr


async def test_no_address_answering_is_one_line_naming_the_nodes_without_the_password(
    settings: Settings, two_nodes: list[TcpProxy]
) -> None:
    for proxy in two_nodes:
        await proxy.cut()
    ports = [p.port for p in two_nodes]
    nowhere = settings.model_copy(update={"amqp_url": cluster_url(ports, "guest:s3cret")})
    done = await semel(nowhere, "publish", "--count", "1")
    assert done.code == 1
    assert done.stderr.startswith("semel: error: broker: no node answered"), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert all(f"127.0.0.1:{port}" in done.stderr for port in ports)
    assert "s3cret" not in done.stderr + done.stdout


@pytest.mark.usefixtures("in_order")
@pytest.mark.parametrize("step", ["declare", "open"])
async def test_a_node_lost_while_the_worker_starts_is_passed_over_not_an_exit(
    consumer_settings: ConsumerSettings,
    broker: Broker,
    store: Store,
    start_consumer: StartConsumer,
    two_nodes: list[TcpProxy],
    monkeypatch: pytest.MonkeyPatch,
    step: str,
) -> None:
    """The first node dies just as the worker declares its queues, or opens its channels:
    the step runs again on the next node, as a node lost later would be, not exit 1."""
    first, _second = two_nodes
    cut: list[str] = []

    def cutting_first(real: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
        async def step_after_the_cut(*args: Any, **kwargs: Any) -> T:
            if not cut:
                cut.append(step)
                await first.cut()  # every connection reset: the step meets a dead one
            return await real(*args, **kwargs)

        return step_after_the_cut

    if step == "declare":
        monkeypatch.setattr(consume_module, "declare", cutting_first(declare))
    else:
        # Settler.open: the worker has opened its channels and goes on to consume.
        monkeypatch.setattr(Settler, "open", cutting_first(Settler.open))
    settings = consumer_settings(
        amqp_url=cluster_url([p.port for p in two_nodes]), metrics_port=free_port()
    )
    consumer = await start_consumer(settings)
    assert cut == [step]
    keys = [f"k-{n}" for n in range(5)]
    for key in keys:
        await broker.publish(settings, {}, key=key)
    await eventually(lambda: completed(store, keys), 20, "every key completed on the other node")
    assert (await readyz(settings.metrics_port))["node"] == f"127.0.0.1:{_second.port}"
    assert await consumer.finish() == 0
