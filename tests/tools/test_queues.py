"""``semel queues``: messages the broker holds for dead-lettering are shown, with what to do.

The shared broker runs without the management plugin: these tests start a
private RabbitMQ node with it (3.x lane only). A quorum queue dead-lettering
at-least-once keeps a message it cannot route in ``messages_dlx``: that is
how a held message is made here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import aio_pika
import pytest
import structlog
from dependency_injector import providers

from semel.consumer.broker.management import ManagementError, QueueState, management_url_of
from semel.consumer.broker.topology import declare
from semel.consumer.container import Container, shutdown
from semel.consumer.names import Topology
from semel.consumer.ops.held import watch_held
from semel.consumer.ops.metrics import Metrics
from semel.consumer.plan import topology_of
from semel.settings import Settings
from tests.chaos.rabbit import RabbitNode, bindable
from tests.conftest import SettingsFactory, rabbitmq_lane
from tests.consumer.harness import eventually
from tests.tools.conftest import semel

pytestmark = pytest.mark.timeout(180)


class ManagedNode(RabbitNode):
    """A private node with the management plugin, its statistics refreshed twice a second."""

    management_port = 0

    @classmethod
    def _prepare(cls) -> RabbitNode:
        node = super()._prepare()
        port = next(p for p in iter(lambda: random.randint(10_000, 30_000), 0) if bindable(p))
        with (node.home / "rabbitmq.conf").open("a") as conf:
            conf.write(
                f"management.tcp.port = {port}\nmanagement.tcp.ip = 127.0.0.1\n"
                "collect_statistics_interval = 500\n"
            )
        (node.home / "enabled_plugins").write_text("[rabbitmq_management].\n")
        assert isinstance(node, ManagedNode)
        node.management_port = port
        return node

    @property
    def management_url(self) -> str:
        return f"http://guest:guest@127.0.0.1:{self.management_port}/"


@pytest.fixture(scope="module")
def managed_broker(pytestconfig: pytest.Config) -> Iterator[ManagedNode]:
    if rabbitmq_lane(pytestconfig) != "3":
        pytest.skip("the private management node is built for the 3.x lane")
    node = asyncio.run(ManagedNode.start())
    assert isinstance(node, ManagedNode)
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture
def managed_settings(make_settings: SettingsFactory, managed_broker: ManagedNode) -> Settings:
    run = uuid.uuid4().hex[:10]
    return make_settings(
        amqp_url=managed_broker.url, queue=f"t.queues.{run}", exchange=f"t.queues.{run}.events"
    )


async def _hold_one(connection: aio_pika.abc.AbstractConnection, settings: Settings) -> None:
    """Make the broker hold one message of Q for dead-lettering."""
    names = Topology(settings.queue)
    channel = await connection.channel(publisher_confirms=True)
    # Q's dead-letter target made unroutable: the broker keeps what it dead-letters.
    conflict = await channel.declare_queue(names.conflict_queue, passive=True)
    await conflict.unbind(names.retry_exchange, names.conflict_routing_key)
    message = aio_pika.Message(b"{}", headers={"Idempotency-Key": "k"})
    await channel.default_exchange.publish(message, routing_key=settings.queue)
    work = await channel.declare_queue(settings.queue, passive=True)
    delivery = await work.get(no_ack=False, timeout=5)
    await delivery.nack(requeue=False)


def api_queue(node: ManagedNode, name: str) -> dict[str, Any]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{node.management_port}/api/queues/%2F/{name}",
        headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="},  # guest:guest
    )
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
        body: dict[str, Any] = json.loads(response.read())
    return body


async def test_a_message_held_for_dead_lettering_is_reported_with_what_to_do(
    managed_broker: ManagedNode, managed_settings: Settings
) -> None:
    settings = managed_settings
    async with await aio_pika.connect(settings.amqp_url) as connection:
        await declare(connection, topology_of(settings))
        await _hold_one(connection, settings)

    async def held() -> bool:
        return int(api_queue(managed_broker, settings.queue).get("messages_dlx") or 0) == 1

    await eventually(held, 30, "the management API counts the held message")
    outcome = await semel(settings, "queues", "--management-url", managed_broker.management_url)

    assert outcome.code == 1, outcome
    (row,) = [line for line in outcome.stdout.splitlines() if line.startswith(settings.queue + " ")]
    assert row.split()[1:] == ["0", "0", "1"]  # ready, unacked, held
    assert "holds 1 message(s) of " + settings.queue in outcome.stderr
    assert "rabbitmq-upgrade drain" in outcome.stderr


async def test_nothing_held_is_exit_0_and_json_lists_every_queue(
    managed_broker: ManagedNode, managed_settings: Settings
) -> None:
    settings = managed_settings
    async with await aio_pika.connect(settings.amqp_url) as connection:
        await declare(connection, topology_of(settings))
    outcome = await semel(
        settings, "queues", "--json", "--management-url", managed_broker.management_url
    )
    assert outcome.code == 0, outcome
    listed = {row["name"]: row for row in json.loads(outcome.stdout)}
    names = Topology(settings.queue)
    assert set(listed) >= {settings.queue, names.conflict_queue, names.dead_letter_queue}
    assert all(row["exists"] and row["held_for_dead_lettering"] == 0 for row in listed.values())


def test_the_default_management_url_is_the_brokers_host_with_its_credentials() -> None:
    assert management_url_of("amqp://u:p@rabbit.internal:5672/prod") == (
        "http://u:p@rabbit.internal:15672/prod"
    )
    assert management_url_of("amqps://rabbit") == "https://guest:guest@rabbit:15672/"


async def test_an_unreachable_management_api_is_one_error_line(
    make_settings: SettingsFactory, rabbitmq_server: str
) -> None:
    port = next(p for p in iter(lambda: random.randint(10_000, 30_000), 0) if bindable(p))
    settings = make_settings(amqp_url=rabbitmq_server)
    outcome = await semel(settings, "queues", "--management-url", f"http://127.0.0.1:{port}/")
    assert outcome.code == 1
    assert outcome.stderr.startswith("semel: error: management API not reachable")


def held_sample(metrics: Metrics, queue: str) -> float | None:
    return metrics.registry.get_sample_value("semel_queue_messages_dlx", {"queue": queue})


async def test_the_held_count_is_a_metric_of_every_queue_when_the_api_is_configured(
    managed_broker: ManagedNode, managed_settings: Settings
) -> None:
    settings = managed_settings.model_copy(update={"management_url": managed_broker.management_url})
    names = Topology(settings.queue)
    async with await aio_pika.connect(settings.amqp_url) as connection:
        await declare(connection, topology_of(settings))
        await _hold_one(connection, settings)

    async def api_held() -> bool:
        return int(api_queue(managed_broker, settings.queue).get("messages_dlx") or 0) == 1

    await eventually(api_held, 30, "the management API counts the held message")
    container = Container()
    container.settings.override(providers.Object(settings))
    metrics = container.metrics()
    await container.held.async_()
    try:

        async def exported() -> bool:
            return held_sample(metrics, settings.queue) == 1

        await eventually(exported, 10, "semel_queue_messages_dlx of Q is 1")
        assert held_sample(metrics, names.conflict_queue) == 0
        assert held_sample(metrics, names.dead_letter_queue) == 0
    finally:
        await shutdown(container)


async def test_without_a_management_url_the_worker_never_asks(
    managed_settings: Settings,
) -> None:
    container = Container()
    container.settings.override(providers.Object(managed_settings))
    metrics = container.metrics()
    await container.held.async_()
    try:
        await asyncio.sleep(0)  # a watcher would have made its first look by now
        assert held_sample(metrics, managed_settings.queue) is None
    finally:
        await shutdown(container)


async def test_an_api_that_cannot_be_asked_is_said_once_and_the_watch_goes_on() -> None:
    looks: list[int] = []
    told: list[tuple[str, int]] = []

    def look(url: str, queues: list[str]) -> list[QueueState]:
        looks.append(1)
        if len(looks) < 3:
            raise ManagementError("management API not reachable: refused")
        return [QueueState(queues[0], exists=True, held_for_dead_lettering=2)]

    with structlog.testing.capture_logs() as logs:
        task = asyncio.create_task(
            watch_held(
                "http://x/", ["q"], lambda q, n: told.append((q, n)), interval=0.01, look=look
            )
        )
        try:
            await eventually(lambda: _true(bool(told)), 5, "a count after two failed looks")
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    assert told[0] == ("q", 2)
    warnings = [entry for entry in logs if entry["log_level"] == "warning"]
    assert len(warnings) == 1, logs


async def _true(value: bool) -> bool:
    return value
