"""An app of several handlers in one worker, on the real broker: each handler on its
queue, bound by its patterns; a fan-out runs each handler once per key; a handler's
own attempts and retry tier; a delivery no handler matches dead-lettered as
``no-handler``; duplicates ACKed without running anything."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import aio_pika
import orjson
import pytest
from aio_pika.exceptions import DeliveryError

from semel.consumer.commands.consume import run_consumer
from semel.consumer.container import Container
from semel.consumer.names import H_REASON
from semel.consumer.plan import QueuePlan, plans_for
from semel.settings import Settings, derived
from semel.stores.base import Status, Store
from tests.consumer import app_handlers
from tests.consumer.app_handlers import orders
from tests.consumer.conftest import ConsumerSettings
from tests.consumer.handlers import read_ledger
from tests.consumer.harness import Broker, eventually
from tests.consumer.test_delivery import status_is
from tests.tools.conftest import semel

pytestmark = [pytest.mark.parametrize("backend", ["sqlite", "redis"]), pytest.mark.timeout(90)]

APP = "tests.consumer.app_handlers:orders"


def queue_settings(settings: Settings, plan: QueuePlan) -> Settings:
    """Settings naming one of the app's queues, for the harness's depth and DLQ reads."""
    return derived(settings, queue=plan.worker.queue)


@contextlib.asynccontextmanager
async def app_consumer(
    settings: Settings, broker: Broker, plans: list[QueuePlan]
) -> AsyncIterator[asyncio.Task[int]]:
    """``semel consume`` of the app in this process; its queues deleted afterwards."""
    from dependency_injector import providers

    container = Container()
    container.settings.override(providers.Object(settings))
    stop = asyncio.Event()
    task = asyncio.create_task(run_consumer(container, stop))

    async def attached() -> bool:
        if task.done():
            task.result()
        counts = [await broker.consumers(plan.worker.queue) for plan in plans]
        return all(count > 0 for count in counts)

    try:
        await eventually(attached, 20, "a consumer on every handler's queue")
        yield task
        stop.set()
        assert await asyncio.wait_for(task, 30) == 0
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 30)
        for plan in plans:
            await broker.delete_topology(queue_settings(settings, plan))


async def publish(
    broker: Broker, settings: Settings, routing_key: str, body: dict[str, Any], key: str
) -> None:
    exchange = await broker.channel.get_exchange(settings.exchange, ensure=False)
    await exchange.publish(
        aio_pika.Message(
            orjson.dumps(body),
            headers={"Idempotency-Key": key},
            content_type="application/json",
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        ),
        routing_key=routing_key,
        mandatory=True,
    )


def runs(ledger: Path) -> Counter[str]:
    return Counter(entry["event"] for entry in read_ledger(ledger))


async def test_an_app_runs_each_handler_on_its_own_queue_once_per_key(
    consumer_settings: ConsumerSettings, broker: Broker, store: Store, ledger: Path
) -> None:
    settings = consumer_settings(handler=APP)
    plans = plans_for(orders, settings)
    by_name = {plan.routes.all[0].name: plan for plan in plans}
    assert [plan.worker.queue for plan in plans] == [
        f"{settings.queue}.charge",
        f"{settings.queue}.audit",
        f"{settings.queue}.notify",
    ]
    async with app_consumer(settings, broker, plans):
        await publish(broker, settings, "orders.paid", {"order_id": "o-1", "amount": 5}, "k1")
        await publish(broker, settings, "orders.eu.shipped", {"n": 1}, "k2")
        await publish(broker, settings, "orders.resent", {"n": 2}, "k3")
        await publish(broker, settings, "orders.eu.shipped", {"fail": True}, "k4")
        # A copy sent straight to notify's queue (the default exchange), with a
        # routing key none of notify's patterns matches.
        await broker.channel.default_exchange.publish(
            aio_pika.Message(b"{}", headers={"Idempotency-Key": "k5"}),
            routing_key=by_name["notify"].worker.queue,
        )
        with pytest.raises(DeliveryError):  # no handler's queue is bound: returned
            await publish(broker, settings, "orders.refunded", {}, "k6")

        async def settled() -> bool:
            done = [
                await store.get(key)
                for key in ("charge:k1", "audit:k1", "notify:k2", "notify:k3", "notify:k4")
            ]
            return all(r is not None and r.status is not Status.IN_PROGRESS for r in done)

        await eventually(settled, 30, "every key settled")
        # The fan-out's copies again: duplicates now, for both handlers.
        await publish(broker, settings, "orders.paid", {"order_id": "o-1", "amount": 5}, "k1")
        notify = queue_settings(settings, by_name["notify"])

        async def two_dead_letters() -> bool:
            return await broker.depth(f"{notify.queue}.dlq") == 2

        await eventually(two_dead_letters, 30, "notify's two dead letters")
        for plan in plans:
            queue = plan.worker.queue
            await eventually(partial(_empty, broker, queue), 15, f"{queue} drained")
        letters = {letter.key: letter for letter in await broker.dead_letters(notify)}
        for name in ("charge", "audit"):
            assert await broker.depth(f"{settings.queue}.{name}.dlq") == 0

    assert runs(ledger) == Counter(
        {"charge k1": 1, "audit k1": 1, "notify k2": 1, "notify k3": 1, "notify k4": 2}
    )
    charged = await store.get("charge:k1")
    assert charged is not None
    assert charged.result == {"charged": 5}
    shipped = await store.get("notify:k2")
    assert shipped is not None
    assert shipped.result == {"notified": "orders.eu.shipped"}
    assert await store.get("k1") is None  # an app's keys are kept under each handler's name
    assert letters["notify:k4"].headers[H_REASON] == "max-attempts"  # its own attempts: 2
    # No handler took it, so its key was never scoped, nor claimed.
    assert letters["k5"].headers[H_REASON] == "no-handler"
    assert "no handler for routing key" in letters["k5"].headers["x-semel-error"]


async def _empty(broker: Broker, queue: str) -> bool:
    return await broker.depth(queue) == 0 and await broker.consumers(queue) > 0


async def test_a_replayed_dead_letter_goes_back_to_its_handler(
    consumer_settings: ConsumerSettings, broker: Broker, store: Store, ledger: Path
) -> None:
    """``semel dlq replay`` of a handler's queue: the copy reaches the work queue through
    the default exchange, and still goes to its handler. Seen failing first: the
    replayed copy lost the producer's routing key and was dead-lettered again as
    ``no-handler``."""
    settings = consumer_settings(handler=APP)
    plans = plans_for(orders, settings)
    notify = derived(settings, queue=f"{settings.queue}.notify")
    app_handlers.mail_server_up.clear()
    try:
        async with app_consumer(settings, broker, plans):
            await publish(broker, settings, "orders.eu.shipped", {"fail": True}, "k1")

            async def dead_lettered() -> bool:
                return await broker.depth(f"{notify.queue}.dlq") == 1

            await eventually(dead_lettered, 30, "notify's dead letter")
            app_handlers.mail_server_up.set()
            done = await semel(notify, "dlq", "replay", "--all")
            assert done.code == 0, done.stderr
            await eventually(
                lambda: status_is(store, "notify:k1", Status.COMPLETED), 30, "k1 replayed"
            )
            assert await broker.depth(f"{notify.queue}.dlq") == 0
    finally:
        app_handlers.mail_server_up.clear()
    assert runs(ledger)["notify k1"] == 3  # two attempts, then the replay
